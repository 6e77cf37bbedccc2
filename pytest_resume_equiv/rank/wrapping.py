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
        before: Optional[Callable[[], None]] = None,
    ) -> None:
        """Replace `owner.attribute`: after the original returns, the outermost call runs
        `report(*args, **kwargs)` (what happened, not what was tried) unless `skip()`, asked
        before the call, says it is none of the log's business; `before()` runs first in an
        outermost call (what happened up to it is over)."""
        original = getattr(owner, attribute, None)
        if original is None or self.patches.holds(owner, attribute):
            return
        depth = self.depth

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

        self.patches.replace(owner, attribute, watched)

    def unwrap(self) -> None:
        self.patches.restore()
