"""How the steps automatic recording sees (rank/auto.py) become signature lines.

Each complete step is its own line, numbered from the launch's first step (a resumed launch's
is `split + 1`), until the trainer calls `record`: from then on it numbers the steps, and the
automatic values of the steps since its last call go into its next line. The rank learns that
only at the first call, so the automatic lines written before it are marked (layout.AUTOMATIC)
and the reader lets that call's line supersede them. The rank state (rank/context.py) holds one
of these when automatic recording is on, and hands it what it writes with.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable, Optional

from .auto import AutoRecorder, Step, counters
from .fingerprint import Later, deferred, one_transfer
from .inputs import sample_ids
from .sketch import pending, written

Write = Callable[[int, Mapping[str, Any], dict[str, Any], bool], None]
"""Writes one step line: its number, the trainer's values, the automatic values, and whether
automatic recording wrote it with no `record` call (the rank state's `write_step`)."""


class AutoLines:
    """The automatic steps of one rank, as lines (see the module's docstring)."""

    def __init__(
        self,
        write: Write,
        taken: Callable[[int], None],
        loaded: Optional[Callable[[dict[str, int]], None]] = None,
        first_after: Optional[int] = None,
        picks_checkpoint: bool = False,
    ) -> None:
        self.write = write
        self.taken = taken
        """Told the number of each step as its optimizer step runs: a save from there on is
        of that step, though its line is written only when the next iteration begins."""
        self.loaded = loaded
        """A resumed launch: told the step counters its load restored, before the first
        optimizer step."""
        self.first_after = first_after or 0
        """The steps are numbered from this one + 1 (a resumed launch's split)."""
        self.picks_checkpoint = picks_checkpoint
        """A resume after a crash: the trainer finds its checkpoint itself, so the steps go on
        from the one its optimizers' step counters say (from 1 when it loaded none)."""
        self.explicit = False
        """The trainer called `record`: it numbers the steps, automatic values go beside."""
        self.carried: list[Step] = []
        """Steps complete since the trainer's last `record` (their values go in its next)."""
        self.recorder = AutoRecorder(self.complete)
        self.recorder.taken = self._taken
        self.recorder.first_step_seen = self._first_step

    def complete(self, step: Step) -> None:
        """A step automatic recording saw complete: its own line, unless the trainer numbers
        the steps itself (`record`), which then carries its values."""
        if self.explicit:
            self.carried.append(step)
        else:
            self.write(step.number + self.first_after, {}, self.values([step]), True)

    def _taken(self, number: int) -> None:
        if not self.explicit:
            self.taken(number + self.first_after)

    def _first_step(self) -> None:
        """Before the first optimizer step: the counters the load restored (a resumed launch),
        which say which step the checkpoint is of."""
        if self.loaded is None:
            return
        found = counters(self.recorder.found, before_step=True)
        self.loaded(found)
        steps = {v for k, v in found.items() if k.startswith("optimizer")}
        if self.picks_checkpoint and len(steps) == 1:
            self.first_after = steps.pop()

    def record_values(self) -> dict[str, Any]:
        """The trainer's `record`: from now on it numbers the steps; its line holds the
        automatic values of the steps since its last call and of what the iteration under way
        has seen so far."""
        self.explicit = True
        steps, self.carried = self.carried, []
        pending = self.recorder.flush()
        steps += [pending] if pending is not None else []
        steps.append(self.recorder.counter.take_seen())
        return self.values(steps)

    def finish(self) -> None:
        """The user's code returned: the step taken and not yet written is."""
        last = self.recorder.flush()
        if last is not None and not self.explicit:
            self.complete(last)

    def values(self, steps: list[Step]) -> dict[str, Any]:
        """The `auto` section of a step line made of `steps` (several when the trainer's
        `record` comes less often than its optimizer steps)."""
        with one_transfer() as batch:  # the losses and inputs left on a device: one copy
            held = batch.resolve(
                {
                    "loss": [_deferred(v) for s in steps for v in s.losses],
                    "data": [
                        [(w, _deferred(f)) for w, f in inputs] for s in steps for inputs in s.inputs
                    ],
                    "batch": [
                        [(w, _deferred(f)) for w, f in batch] for s in steps for batch in s.batches
                    ],
                    "sketch": pending([s.notes for s in steps], _deferred),
                }
            )
        out: dict[str, Any] = {}
        if held["loss"]:
            out["loss"] = held["loss"]
        if held["data"]:
            out["data"] = [i for parts in held["data"] for i in sample_ids(parts)]
        if held["batch"]:
            out["batch"] = [i for parts in held["batch"] for i in sample_ids(parts)]
        out.update(written(held["sketch"], [s.notes for s in steps]))
        taken = [s for s in steps if s.optimizers]  # not what a record took before a step
        if taken and all(s.skipped for s in taken):
            out["skipped"] = True
        return out


def _deferred(value: Any) -> Any:
    return deferred(value) if isinstance(value, Later) else value
