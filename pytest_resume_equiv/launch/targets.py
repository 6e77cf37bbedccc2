"""What a run's command is, as the ranks run it: a module-level function or an argv list,
turned into a launch `Target`; and `fill`, the one substitution of placeholders, with its
errors as the test author's errors."""

from __future__ import annotations

import inspect
import os
from collections.abc import Mapping, Sequence
from typing import Any, Callable, Union

from ..errors import ResumeEquivError
from ..rank.template import TemplateError
from ..rank.template import fill as _fill
from .running import Target

Command = Union[Sequence[str], Callable[..., Any]]


def fill(template: str, values: Mapping[str, Any], where: str) -> str:
    """`rank.template.fill`, with its errors as the test author's errors."""
    try:
        return _fill(template, values, where)
    except TemplateError as exc:
        raise ResumeEquivError(str(exc)) from None


def argv_list(value: Any, what: str) -> list[str]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise ResumeEquivError(
            f"{what} must be a list of strings, got {type(value).__name__} {value!r}; "
            'e.g. ["-m", "mytrainer.train", "--max-steps={steps}"]'
        )
    bad = [v for v in value if not isinstance(v, (str, os.PathLike))]
    if bad:
        raise ResumeEquivError(f"{what} must hold only strings, got {bad[0]!r} in {list(value)!r}")
    return [os.fspath(v) for v in value]


def target_from_callable(fn: Callable[..., Any]) -> Target:
    """A module-level function, importable by name inside every rank."""
    name = getattr(fn, "__qualname__", "")
    module = getattr(fn, "__module__", None)
    if not module or "<" in name or module == "__main__":
        raise ResumeEquivError(
            f"{fn!r} must be a module-level function so every rank can import it by name "
            "(no lambdas, nested functions or functions defined in __main__)"
        )
    path = inspect.getsourcefile(fn)
    pythonpath: tuple[str, ...] = ()
    if path:
        # The directory from which `module` imports as this file: one level up per dot,
        # and one more for a package's __init__.py.
        root = os.path.dirname(os.path.abspath(path))
        depth = module.count(".") + (os.path.basename(path) == "__init__.py")
        for _ in range(depth):
            root = os.path.dirname(root)
        pythonpath = (root,)
    return Target("call", f"{module}:{name}", (), pythonpath)


def target_from_argv(argv: list[str], what: str = "command") -> Target:
    if not argv:
        raise ResumeEquivError(f"{what} is empty; give a script path or ['-m', 'module', ...]")
    if argv[0] == "-m":
        if len(argv) < 2:
            raise ResumeEquivError(f"{what} {argv!r}: '-m' needs a module name after it")
        return Target("module", argv[1], tuple(argv[2:]))
    if argv[0].startswith("-"):
        raise ResumeEquivError(
            f"{what} {argv!r} must start with a Python script path or '-m module' "
            "(torchrun options are set by the plugin)"
        )
    return Target("script", argv[0], tuple(argv[1:]))


def target_of(command: Command) -> Target:
    """What every rank runs for `command` (an argv list, or a module-level function)."""
    if callable(command):
        return target_from_callable(command)
    return target_from_argv(argv_list(command, "command"))
