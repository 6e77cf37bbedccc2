"""One way to watch a call: replace it with a function that runs the original, then reports
what it did, only for the outermost of nested watched calls of one thread (`torch.save`
opens its file; `load_state_dict` of a module calls its children's).

The restore log (`restore.py`), the file-event log (`files.py`) and automatic recording
(`auto.py`) watch calls so; the replacing itself is `patches.Patches`'.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any, Callable, Optional

from .patches import Patches


class Wrapper:
    """The calls one log has wrapped (to undo them), and the nesting depth per thread.
    `module`: the wrapping module's `__name__` (its row of `patches.PATCHES`)."""

    def __init__(self, module: str) -> None:
        self.depth = threading.local()
        self.patches = Patches(module)

    @property
    def nested(self) -> bool:
        """Inside a watched call of this thread now."""
        return getattr(self.depth, "n", 0) > 0

    @contextlib.contextmanager
    def unreported(self) -> Iterator[None]:
        """Watched calls made in here are nested ones: not reported (the plugin's own)."""
        outer = getattr(self.depth, "n", 0)
        self.depth.n = outer + 1
        try:
            yield
        finally:
            self.depth.n = outer

    def wrap(
        self,
        owner: Any,
        attribute: str,
        report: Callable[..., None],
        skip: Optional[Callable[[], bool]] = None,
        before: Optional[Callable[..., None]] = None,
        sees_arguments: bool = False,
        failed: Optional[Callable[..., None]] = None,
    ) -> None:
        """Replace `owner.attribute`: after the original returns, the outermost call runs
        `report(*args, **kwargs)` (what happened, not what was tried) unless `skip()`, asked
        before the call, says it is none of the log's business; `before()` runs first in an
        outermost call (what happened up to it is over; `before(*args, **kwargs)` when
        `sees_arguments`); `failed(exc, *args, **kwargs)` runs
        when the outermost call raises `exc` (an Exception), before it propagates."""
        original = getattr(owner, attribute, None)
        if original is None or self.patches.holds(owner, attribute):
            return
        depth = self.depth

        def watched(*args: Any, **kwargs: Any) -> Any:
            outer = getattr(depth, "n", 0)
            if outer == 0 and before is not None:
                before(*args, **kwargs) if sees_arguments else before()
            skipped = outer == 0 and skip is not None and skip()
            depth.n = outer + 1
            try:
                result = original(*args, **kwargs)
            except Exception as exc:
                if outer == 0 and failed is not None and not skipped:
                    failed(exc, *args, **kwargs)
                raise
            finally:
                depth.n = outer
            if outer == 0 and not skipped:
                report(*args, **kwargs)
            return result

        self.patches.replace(owner, attribute, watched)

    def unwrap(self) -> None:
        self.patches.restore()


FAILED_CALL = "_resume_equiv_call"
"""The attribute of an exception that says which watched call it came out of."""


def tag_failure(exc: BaseException, call: dict[str, Any]) -> None:
    """Say on `exc` which watched call raised it (`call`: `op`, `path`, ...), unless a call
    nested in it already did (the innermost says most: `open` inside `torch.load`)."""
    if getattr(exc, FAILED_CALL, None) is None:
        try:
            setattr(exc, FAILED_CALL, call)
        except (AttributeError, TypeError):  # an exception type without a __dict__
            pass


def tagging(
    op: str, path: Callable[..., str], after_step: Callable[[], Any]
) -> Callable[..., None]:
    """A `failed` for `Wrapper.wrap` that tags the exception with `op`, the path the call
    names (`path(*args, **kwargs)`, best effort) and the step it came after."""

    def failed(exc: BaseException, *args: Any, **kwargs: Any) -> None:
        try:
            where = path(*args, **kwargs)
        except Exception:
            where = ""
        error = f"{type(exc).__name__}: {exc}"
        tag_failure(exc, {"op": op, "path": where, "after_step": after_step(), "error": error})

    return failed


def failure_of(exc: Optional[BaseException]) -> Optional[dict[str, Any]]:
    """The watched call `exc` came out of: its own tag, or that of the exception it was
    raised from or while handling (a trainer that wraps an OSError in its own error)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        call = getattr(exc, FAILED_CALL, None)
        if isinstance(call, dict):
            return call
        exc = exc.__cause__ or exc.__context__
    return None
