"""One way to watch a call: replace it with a function that runs the original, then reports
what it did, only for the outermost of nested watched calls of one thread (`torch.save`
opens its file; `load_state_dict` of a module calls its children's).

The restore log (`restore.py`) and the file-event log (`files.py`) both watch calls so.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator
from typing import Any, Callable, Optional


class Wrapper:
    """The calls one log has wrapped (to undo them), and the nesting depth per thread."""

    def __init__(self) -> None:
        self.depth = threading.local()
        self.wrapped: dict[str, tuple[Any, str, Any]] = {}

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
        before: Optional[Callable[[], None]] = None,
    ) -> None:
        """Replace `owner.attribute`: after the original returns, the outermost call runs
        `report(*args, **kwargs)` (what happened, not what was tried) unless `skip()`, asked
        before the call, says it is none of the log's business; `before()` runs first in an
        outermost call (what happened up to it is over)."""
        key = f"{id(owner)}.{attribute}"
        original = getattr(owner, attribute, None)
        if original is None or key in self.wrapped:
            return
        depth = self.depth

        @functools.wraps(original)
        def watched(*args: Any, **kwargs: Any) -> Any:
            outer = getattr(depth, "n", 0)
            if outer == 0 and before is not None:
                before()
            skipped = outer == 0 and skip is not None and skip()
            depth.n = outer + 1
            try:
                result = original(*args, **kwargs)
            finally:
                depth.n = outer
            if outer == 0 and not skipped:
                report(*args, **kwargs)
            return result

        setattr(owner, attribute, watched)
        self.wrapped[key] = (owner, attribute, original)

    def unwrap(self) -> None:
        for owner, attribute, original in reversed(list(self.wrapped.values())):
            setattr(owner, attribute, original)
        self.wrapped.clear()
