"""Golden trajectories: the uninterrupted run's signatures (and, on request, its checkpoints)
kept per test and environment, so a change that moves both runs of a resume test alike, or a
checkpoint the previous release wrote that the new code cannot resume, fails a test.

Pure: no pytest, no torch at import; `checks/golden.py` and `checks/compat.py` use it.
"""

from .environment import Environment, current
from .meta import GOLDEN_FORMAT, GOLDEN_VERSION, GoldenError, GoldenMeta, git_commit, now
from .store import Golden, GoldenStore, folder_name, size_words
from .target import GoldenTarget

__all__ = [
    "GOLDEN_FORMAT",
    "GOLDEN_VERSION",
    "Environment",
    "Golden",
    "GoldenError",
    "GoldenMeta",
    "GoldenStore",
    "GoldenTarget",
    "current",
    "git_commit",
    "now",
    "size_words",
    "folder_name",
]
