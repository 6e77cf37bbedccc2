"""What the plugin raises and warns, as a test author sees it."""

from __future__ import annotations


class ResumeEquivError(Exception):
    """A problem the test author must fix, or a failed launch; the message says which."""


class ResumeEquivWarning(UserWarning):
    """Something the test author should know that does not change the verdict."""


class SettingError(ValueError):
    """A bad option or marker value; the message names the value, its source and the valid
    choices."""
