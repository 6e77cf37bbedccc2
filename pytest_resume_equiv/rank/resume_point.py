"""The resume point: everything the audit sees, right before the first resumed step, and at
the same program point of the uninterrupted run (right before the step after the split).

A resumed launch takes it at the first training forward of any `nn.Module` (a global forward
pre-hook; a forward under `no_grad` or `inference_mode`, an evaluation, is passed over), or
where the trainer calls `req.resume_point()`; the uninterrupted launch takes it at the first
training forward (or `resume_point()`) after `record(split)`, for each split: the same program
point in both, whether or not the trainer evaluates before its training step. Between the last
restore and that point (and in the uninterrupted run, between `record(split)` and that
point) every random draw is traced, so a stream that was restored and then advanced says by
which op, at which line.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Callable, Optional

from .restore import Entry, is_seed
from .trace import DrawTrace


class ResumePoint:
    """When the snapshot is due, whether the trainer marks the point itself, the forward hook
    that otherwise marks it, and the draw trace of the window before it. What the snapshot
    holds is the rank state's business (`RankState.take_resume_point`)."""

    def __init__(self, window: DrawTrace) -> None:
        self.window = window
        self.armed: Optional[int] = None
        """The split a snapshot is due for (None: none due)."""
        self.explicit = False
        """The trainer marks the point itself (`resume_point()`), so forward passes do not."""
        self.pending: Optional[dict[str, Any]] = None
        """The snapshot taken at the first forward while one was due: written at the next
        record, unless `resume_point()` comes first (a rank that evaluates before its training
        step calls it: both runs must snapshot at that call, not at the eval's forward)."""
        self.forward_marked = False
        """The window's first forward is marked in its trace (a trainer that calls
        `resume_point()` itself: its trace goes on to that call)."""
        self.early = False
        """The window opened at the split's optimizer step, before the split is armed (at
        its step line, automatic recording): a trainer's `resume_point()` call arms it."""
        self.hook: Any = None

    def install(self, resuming_after: Optional[int], on_forward: Callable[[Any], None]) -> None:
        """Arm a resumed launch (`resuming_after` its split) from the start; hook module
        forwards (once torch is imported): `on_forward(module)` at each while one is due."""
        if resuming_after is not None:
            self.armed = resuming_after
        torch = sys.modules.get("torch")
        if torch is not None and self.hook is None:

            def hook(module: Any, args: Any) -> None:
                if self.armed is None:
                    if self.early and self.explicit and not self.forward_marked:
                        self.forward_marked = True  # the window's first forward (an eval)
                        self.window.mark_forward()
                    return
                if not self.explicit and self.pending is None:
                    # an evaluation (no_grad / inference_mode) is not the step: a resumed
                    # run that evaluates first would otherwise snapshot another program
                    # point than the uninterrupted run's first training forward
                    if torch.is_grad_enabled():
                        on_forward(module)
                elif self.explicit and self.window.active and not self.forward_marked:
                    self.forward_marked = True
                    self.window.mark_forward()

            self.hook = torch.nn.modules.module.register_module_forward_pre_hook(hook)

    def uninstall(self) -> None:
        if self.hook is not None:
            self.hook.remove()
            self.hook = None
        self.window.stop()

    def on_restore(self, entry: Entry) -> None:
        """A resumed run's window opens where the resume begins: the first restore that is
        not the trainer seeding its streams before it reads the checkpoint."""
        if self.armed is not None and not self.window.active and not is_seed(entry["call"]):
            self.window.start()

    def after_record(self, step: int, resuming: bool, splits: tuple[int, ...]) -> None:
        """A split arms the uninterrupted run; a record while armed means no forward came
        first, and the point is given up (the per-step audit still compares)."""
        if self.armed is not None:
            self.window.stop()
            self.armed = None
        if not resuming and step in splits:
            self.armed = step
            if not self.early:  # the window's first forward is marked already
                self.forward_marked = False
            self.window.start()
        self.early = False

    def optimizer_stepped(self, step: int, resuming: bool, splits: tuple[int, ...]) -> None:
        """Automatic recording: the optimizer step that ends `step` ran. Its line is written
        at the next iteration's first forward, after the next batch was fetched; a split's
        window opens here, so the draws of that fetch are traced as after `record(split)`."""
        if not resuming and step in splits and self.armed is None:
            self.window.start()
            self.early, self.forward_marked = True, False

    def take(self) -> tuple[int, list[dict[str, Any]]]:
        """Disarm: (the split the snapshot is for, the draws traced in its window)."""
        split = self.armed
        assert split is not None, "take() with no resume point due"
        self.armed = None
        self.pending = None
        return split, self.window.stop()

    def hold(self) -> tuple[int, list[dict[str, Any]]]:
        """(the split a snapshot is due for, the draws traced in its window), staying armed
        for a `resume_point()` call; the trace ends here all the same (tracing a whole step
        would slow it down)."""
        assert self.armed is not None, "hold() with no resume point due"
        return self.armed, self.window.stop()


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
