"""The resume point: everything the audit sees, right before the first resumed step, and at
the same program point of the uninterrupted run (right before the step after the split).

A resumed launch takes it at the first forward of any `nn.Module` (a global forward pre-hook),
or where the trainer calls `req.resume_point()`; the uninterrupted launch takes it at the
first forward (or `resume_point()`) after `record(split)`, for each split. Between the last
restore and that point (and in the uninterrupted run, between `record(split)` and that
point) every random draw is traced, so a stream that was restored and then advanced says by
which op, at which line.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Optional

from . import restore, rng, trace, watch
from .context import RunContext

_state: dict[str, Any] = {"armed": None, "explicit": False, "hook": None}
"""armed: the split a snapshot is due for (None: none due); explicit: the trainer marks the
point itself (`resume_point()`), so forward passes do not."""
_window = trace.DrawTrace()


def install(ctx: RunContext) -> None:
    """Arm a resumed launch from the start; hook module forwards (once torch is imported)."""
    if ctx.resuming:
        _state["armed"] = ctx.split
        restore.on_restore(_open_window)
    torch = sys.modules.get("torch")
    if torch is not None and _state["hook"] is None:
        hooks = torch.nn.modules.module
        _state["hook"] = hooks.register_module_forward_pre_hook(_on_forward)


def _open_window(entry: dict[str, Any]) -> None:
    """A resumed run's window opens where the resume begins: the first restore that is not
    the trainer seeding its streams before it reads the checkpoint."""
    if _state["armed"] is not None and not _window.active and not restore.is_seed(entry["call"]):
        _window.start()


def after_record(ctx: RunContext, step: int, write: Any) -> None:
    """Called by `record`: a split arms the uninterrupted run; a record while armed means no
    forward came first, and the point is given up (the per-step audit still compares)."""
    if _state["armed"] is not None:
        _window.stop()
        _state["armed"] = None
    if not ctx.resuming and step in ctx.splits:
        _state["armed"] = step
        _window.start()


def mark(ctx: Optional[RunContext], write: Any, at: Optional[str] = None) -> None:
    """`req.resume_point()`: take the snapshot here if one is due."""
    _state["explicit"] = True
    if ctx is not None and _state["armed"] is not None:
        _take(ctx, write, at or trace.user_frame(2))


def _on_forward(module: Any, args: Any) -> None:
    if _state["armed"] is None or _state["explicit"]:
        return
    from .context import context
    from .record import writer

    ctx = context()
    if ctx is not None:
        _take(ctx, writer(), f"first forward of {type(module).__name__} at {trace.user_frame(2)}")


def _take(ctx: RunContext, write: Any, at: str) -> None:
    split = _state["armed"]
    _state["armed"] = None
    draws = _window.stop()
    checkpoint = ctx.checkpoint if ctx.resuming else _checkpoint_of(ctx, split)
    write.resume_point(
        {
            "split": split,
            "at": at,
            "time_ns": time.time_ns(),
            "rng": rng.audit(),
            "watch": watch.audit(),
            "checkpoint": fingerprint_files(checkpoint),
            "draws": draws,  # each knows how many restores came before it
            "restores": restore.count(),
        }
    )


def at_exit(ctx: RunContext, write: Any) -> None:
    """A resumed run that ends before any step (it loaded a state that says training is
    over): its state at the end stands for the resume point."""
    if ctx.resuming and _state["armed"] is not None:
        _take(ctx, write, "the end of the run (no step ran after the load)")


def _checkpoint_of(ctx: RunContext, split: int) -> Optional[str]:
    try:
        return ctx.checkpoint_for(split)
    except (RuntimeError, ValueError):
        return None


def fingerprint_files(path: Optional[str]) -> Optional[dict[str, Any]]:
    """How many files a checkpoint holds and when the last of them was written: compared
    with when the uninterrupted run reached its resume point, it tells a checkpoint written
    again after the save (a rolling path), at no cost of reading it."""
    if not path:
        return None
    if not os.path.exists(path):
        return {"path": path, "files": 0, "latest_ns": 0}
    mtimes = []
    walk = list(os.walk(path)) if os.path.isdir(path) else [("", [], [path])]
    for folder, _dirs, files in walk:
        for name in files:
            try:
                mtimes.append(os.stat(os.path.join(folder, name)).st_mtime_ns)
            except OSError:
                continue
    return {"path": path, "files": len(mtimes), "latest_ns": max(mtimes, default=0)}
