"""`{placeholder}` substitution, the one way commands and checkpoint paths are filled.

Both sides use it: the plugin fills commands and checkpoint templates when it plans the
launches, and a rank fills the checkpoint template again for `ctx.checkpoint_for(step)`.
One function means `{{` / `}}` are literal braces everywhere.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

PLACEHOLDERS = ("steps", "split", "splits", "run_dir", "checkpoint", "nproc", "world_size", "seed")
_PLACEHOLDER_RE = re.compile(r"\{\{|\}\}|\{([A-Za-z_][A-Za-z0-9_]*)\}")


class TemplateError(ValueError):
    """An unknown placeholder, or one with no value where it is used."""


def fill(template: str, values: Mapping[str, Any], where: str) -> str:
    """Substitute `{placeholder}`s from `values`; `{{`/`}}` are literal braces; an unknown
    name, or a known one without a value here, is a TemplateError naming `where`."""

    def sub(match: re.Match) -> str:
        if match.group(0) in ("{{", "}}"):
            return match.group(0)[0]
        name = match.group(1)
        if name not in PLACEHOLDERS:
            raise TemplateError(
                f"unknown placeholder {{{name}}} in {where} {template!r}; valid placeholders: "
                + ", ".join(f"{{{p}}}" for p in PLACEHOLDERS)
                + " (write {{ and }} for literal braces)"
            )
        if values.get(name) is None:
            raise TemplateError(f"placeholder {{{name}}} in {where} {template!r} has no value here")
        return str(values[name])

    return _PLACEHOLDER_RE.sub(sub, template)
