"""What one rank knows about its launch, and the one object that holds what it records.

Each rank reads the `LaunchContext` the plugin handed it (rank/launch_context.py) back as its
`RunContext`: the same fields, plus its rank from torchrun's variables, its device, and the
calls a trainer makes on `ctx` in function mode.

`RankState` is everything one rank records: made once per process from that variable
(`current()`, or `reset()` in `bootstrap.main` and in in-process tests), it owns the run
context, the signature writer, the watched objects, the generator registry, the restore log
and the resume point with its draw trace. The modules it is made of (record, watch, rng,
restore, resume_point, trace) know nothing of each other: it hands each the part it needs.
It lives beside `RunContext` because `ctx.record(...)` is a method of the context.
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable, Optional

from .auto import AutoRecorder, counters
from .auto_lines import AutoLines
from .crasher import STEP, Crasher
from .encode import encode
from .files import Event, FileLog
from .fingerprint import one_transfer
from .launch_context import CONTEXT_ENV, LaunchContext
from .layout import AUTO, RNG, WATCH, generator_stream, section_names, stream_key
from .preflight import capture as preflight_capture
from .record import SignatureWriter, header
from .restore import RestoreLog
from .resume_point import ResumePoint, fingerprint_files
from .rng import Generators, mutate, seed_devices, seed_host_streams, streams
from .run_dir import replaced_path, signature_path
from .sketch import Sketch
from .trace import DrawTrace, user_frame
from .watch import Watched


@dataclass(frozen=True)
class RunContext(LaunchContext):
    """What one rank of one launch needs to know; `ctx` in function mode.

    `split` is the step the resumed launch starts after; in the uninterrupted launch it is
    the first of `splits`, the steps at which the trainer must save.
    """

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @property
    def device_index(self) -> int:
        """This rank's ordinal among the devices it sees: `local_rank`, modulo the visible
        count where fewer are visible (Slurm with one GPU per task shows each rank only its
        own, as ordinal 0). `device_count()` needs no initialised driver."""
        module = getattr(__import__("torch"), self.device_kind, None)
        try:
            count = int(module.device_count()) if module is not None else 0
        except Exception:  # noqa: BLE001 - a broken driver: keep the launch's numbering
            count = 0
        return self.local_rank % count if count > 0 else self.local_rank

    @property
    def device(self) -> Any:
        """`torch.device` this rank should use (its local accelerator, or the CPU)."""
        import torch

        if self.device_kind == "cpu":
            return torch.device("cpu")
        return torch.device(self.device_kind, self.device_index)

    def record(self, step: int, **values: Any) -> None:
        """`pytest_resume_equiv.record(step, **values)`."""
        current().record(step, values)

    def init_process_group(self, **kwargs: Any) -> None:
        """`torch.distributed.init_process_group` with this launch's backend
        (`process_group_backend`) and, on an accelerator, this rank's device set current and
        passed as `device_id`. Every argument the caller gives wins (`backend=` too)."""
        import torch.distributed as dist

        if self.device_kind != "cpu":
            getattr(__import__("torch"), self.device_kind).set_device(self.device_index)
            kwargs.setdefault("device_id", self.device)
        kwargs.setdefault("backend", self.process_group_backend)
        dist.init_process_group(**kwargs)


def read_context(environ: Mapping[str, str]) -> Optional[RunContext]:
    """The run context `environ` holds, or None when not running under the plugin."""
    raw = environ.get(CONTEXT_ENV)
    if not raw:
        return None
    launch = LaunchContext.from_json(raw)
    return RunContext(
        **{f.name: getattr(launch, f.name) for f in dataclasses.fields(LaunchContext)},
        rank=int(environ.get("RANK", "0")),
        local_rank=int(environ.get("LOCAL_RANK", "0")),
        world_size=int(environ.get("WORLD_SIZE", "1")),
    )


Capture = Callable[["RankState"], dict[str, Any]]


class RankState:
    """Everything one rank records (see the module's docstring). Without a run context
    (outside a test run) every call is a no-op."""

    def __init__(self, context: Optional[RunContext]) -> None:
        self.context = context
        self.writer: Optional[SignatureWriter] = None
        self.watched = Watched()
        self.generators = Generators()
        self.restores = RestoreLog()
        self.files = FileLog()
        self.files.listeners.append(self._file_event)
        self.early_files: list[Event] = []
        """File events before the signature was opened (written right after its header)."""
        self.crasher: Optional[Crasher] = None
        self.auto: Optional[AutoRecorder] = None
        """Automatic recording, when the launch has it on (installed with the rest)."""
        self.lines: Optional[AutoLines] = None
        """What automatic recording sees, as step lines (with `auto`)."""
        self.step_auto: dict[str, Any] = {}
        """The automatic values of the step line being written (the `auto` section)."""
        window = DrawTrace(lambda: self.restores.count, self.generators.identity_of)
        self.point = ResumePoint(window)

    def record(self, step: int, values: Mapping[str, Any]) -> None:
        """`record(step, **values)`: one step line, then what the step means for the resume
        point and the teeth check."""
        ctx = self.context
        if ctx is None:
            return
        if isinstance(step, bool) or not isinstance(step, int):
            raise TypeError(f"record(step=...) needs an int step number, got {step!r}")
        with one_transfer() as batch:
            encoded = batch.resolve(
                {
                    key: encode(value, f"record(step={step}) value {key!r}")
                    for key, value in values.items()
                }
            )
        auto = self.lines.record_values() if self.lines is not None else {}
        self.write_step(step, encoded, auto)

    def write_step(
        self, step: int, encoded: Mapping[str, Any], auto: dict[str, Any], automatic: bool = False
    ) -> None:
        """One step line (the trainer's values and the automatic ones; `automatic`: with no
        `record` call), then what the step means for the resume point and the teeth check."""
        ctx = self.context
        assert ctx is not None
        writer = self.open()
        if writer.records == 0:  # the training has set its knobs by its first step
            writer.preflight(preflight_capture())
        self.write_pending_point()
        if self.crasher is not None:
            self.crasher.on_record(step)
        self.step_auto = auto
        try:
            sections = self.capture()
        finally:
            self.step_auto = {}
        found = counters(self.auto.found) if self.auto is not None else {}
        writer.write_step(step, dict(encoded), sections, found, automatic)
        self.label(step)
        self.point.after_record(step, ctx.resuming, ctx.splits)
        if ctx.phase == "teeth" and writer.records == 1:
            # The teeth check: from here on every random stream is unrelated to the
            # uninterrupted run's, so a signature that still matches cannot depend on random
            # state at all.
            with self.restores.unlogged():
                mutate(self.generators)

    def label(self, step: int) -> None:
        """What the restore and file logs write from now on is of `step` (after it)."""
        self.restores.after_step = self.files.after_step = step

    def _auto_taken(self, number: int) -> None:
        """The optimizer step of automatic step `number` ran: a save from here on is of that
        step, and a split's draw trace starts here."""
        ctx = self.context
        assert ctx is not None
        self.label(number)
        self.point.optimizer_stepped(number, ctx.resuming, ctx.splits)

    def watch(self, objects: Mapping[str, Any]) -> None:
        if self.context is not None:
            self.watched.watch(**objects)

    def track(self, generator: Any, name: str, ignore: bool = False) -> None:
        if self.context is not None:
            self.generators.track(generator, name, ignore=ignore)

    def mark_resume_point(self, at: Optional[str] = None) -> None:
        """`resume_point()`: the trainer marks the point from now on (forwards no longer do);
        take the snapshot here if one is due."""
        if self.context is None:
            return
        if self.auto is not None:
            # the top of a step: the one before it is complete (written now, not at its next
            # training forward), so a split's point is due at this very call
            self.auto.boundary()
        self.point.explicit = True
        if self.point.armed is not None:
            first = self.point.pending
            self.take_resume_point(at or user_frame(2), forward_before=first)

    def capture(self) -> dict[str, Any]:
        """Every automatic section (layout.SECTIONS), as its capture function sees it now."""
        with one_transfer() as batch:  # the device values of the whole audit in one copy
            return batch.resolve({name: CAPTURES[name](self) for name in section_names()})

    def take_resume_point(
        self, at: str, forward_before: Optional[dict[str, Any]] = None, write: bool = True
    ) -> dict[str, Any]:
        """The snapshot that is due: every section, the checkpoint's files, the draws traced
        in the window (each knows how many restores came before it). Written now, or held
        (`write=False`: taken at a forward, while `resume_point()` may still come)."""
        ctx = self.context
        assert ctx is not None
        if self.auto is not None:
            self.auto.adopt_loaded()
        # after a held snapshot the trace has ended: its draws are those up to that forward
        split, draws = self.point.take() if write else self.point.hold()
        checkpoint = ctx.checkpoint if ctx.resuming else _checkpoint_of(ctx, split)
        snapshot = {"split": split, "at": at, "time_ns": time.time_ns(), **self.capture()}
        snapshot.update(
            checkpoint=fingerprint_files(checkpoint), draws=draws, restores=self.restores.count
        )
        if forward_before is not None:
            snapshot["forward_before"] = forward_before["at"]
        if write:
            self.open().resume_point(snapshot)
        return snapshot

    def write_pending_point(self) -> None:
        """A snapshot held since a forward, with no `resume_point()` after it: the point."""
        pending = self.point.pending
        if pending is not None:
            self.point.take()
            self.open().resume_point(pending)

    def _on_forward(self, module: Any) -> None:
        at = f"first forward of {type(module).__name__} at {user_frame(2)}"
        self.point.pending = self.take_resume_point(at, write=False)

    def _generator_restored(self, generator: Any, call: str) -> None:
        if not self.restores.nested:
            identity = self.generators.identity_of(generator)
            self.restores.log(f"Generator.{call}", stream_key(generator_stream(identity)))

    def open(self) -> SignatureWriter:
        """This rank's signature, opened (its header written) on first use: the bootstrap
        opens it before the user's code, so even a rank that never records leaves one."""
        if self.writer is None:
            ctx = self.context
            assert ctx is not None, "no signature outside a test run"
            first_line = header(
                rank=ctx.rank,
                local_rank=ctx.local_rank,
                world_size=ctx.world_size,
                phase=ctx.phase,
                split=ctx.split if ctx.resuming else None,
                splits=list(ctx.splits),
                steps=ctx.steps,
                device=ctx.device_kind,
            )
            path = signature_path(ctx.run_dir, ctx.rank)
            self.writer = SignatureWriter(path, first_line, self._drain_restores)
            atexit.register(self.close)
            for event in self.early_files:
                self.writer.file_event(event)
            self.early_files.clear()
        return self.writer

    def _file_event(self, event: Event) -> None:
        if self.writer is not None and self.writer.is_open:
            self.writer.file_event(event)
        elif self.writer is None:
            self.early_files.append(event)

    def _drain_restores(self) -> list[dict[str, Any]]:
        return self.restores.drain(self.watched.name_of)

    def close(self) -> None:
        """The footer (and the names left out of the audit); later records are an error."""
        if self.writer is not None:
            self.writer.close(self.generators.ignored_keys(), self.watched.found_as)

    def finish(self) -> None:
        """The user's code ended (the bootstrap): a resumed run that ran no step (it loaded a
        state that says training is over) takes its resume point now; then the footer."""
        ctx = self.context
        open_now = self.writer is not None and self.writer.is_open
        if open_now and self.lines is not None:
            self.lines.finish()
        if open_now:
            self.write_pending_point()
        if ctx is not None and open_now and ctx.resuming and self.point.armed is not None:
            self.take_resume_point("the end of the run (no step ran after the load)")
        self.close()

    def install(self, seed: Optional[int] = None) -> None:
        """Before the user's code (the bootstrap): audit every generator it creates, seed the
        global streams from `seed`, then log every restore call and watch for the resume
        point (the plugin's own seeding is not a restore)."""
        ctx = self.context
        assert ctx is not None, "install() outside a test run"
        try:
            self.generators.install(self._generator_restored)
        except ImportError:  # no torch: a plain Python trainer
            pass
        if ctx.device_kind == "npu":
            try:
                import torch_npu  # noqa: F401  (registers torch.npu: seeded, its setters wrapped)
            except ImportError:
                pass
        if seed is not None:  # after torch_npu: torch.npu's streams are seeded too
            seed_host_streams(seed)
        if "torch" in sys.modules:
            self.restores.install_torch()
            if "torch_npu" not in sys.modules:  # imported by the trainer (no autoload)
                self.restores.after_import("torch_npu", lambda _: self._npu_arrived(seed))
        self.restores.install_host()
        self.files.watch(ctx.run_dir, os.path.dirname(ctx.checkpoint) if ctx.checkpoint else None)
        if ctx.crash is not None:
            self.crasher = Crasher(ctx.crash, ctx.rank, ctx.splits, ctx.run_dir)
            self.files.listeners.append(self.crasher.on_event)  # after the signature's
            self.files.before_listeners.append(self.crasher.before_call)
            if ctx.crash.get("power"):  # the rollback brings back what renames replaced
                self.files.keep_into = replaced_path(ctx.run_dir)
            if ctx.crash.get("kind") == STEP:  # preempt: inside a step, before its update
                self.restores.after_import("torch.optim.optimizer", self.crasher.hook_steps)
        self.files.install()
        self.restores.after_import("torch.distributed.checkpoint", self.files.install_dcp)
        self.restores.after_import("safetensors.torch", self.files.install_safetensors)
        if ctx.resuming:
            self.restores.listeners.append(self.point.on_restore)
        if ctx.auto and "torch" in sys.modules:
            # before the resume point's forward hook: a step written at a forward arms it
            loaded = (
                (lambda found: self.open().loaded({"split": ctx.split, "counters": found}))
                if ctx.resuming
                else None
            )
            first = ctx.split if ctx.resuming else None
            self.lines = AutoLines(
                self.write_step, self._auto_taken, loaded, first, ctx.picks_checkpoint
            )
            self.auto = self.lines.recorder
            if ctx.equivalence:
                self.auto.sketch = Sketch(self.auto.counter.note, self._optimizers, self._models)
                self.auto.sketch.install_dropout(off=ctx.dropout == "off")
            self.auto.install()
            self.watched.found = self.auto.found.named
        self.point.install(ctx.split if ctx.resuming else None, self._on_forward)

    def _optimizers(self) -> list[Any]:
        return self.auto.found.of("optimizer") if self.auto is not None else []

    def _models(self) -> list[Any]:
        return self.auto.found.of("model") if self.auto is not None else []

    def _npu_arrived(self, seed: Optional[int]) -> None:
        """torch_npu imported by the trainer after `install` (torch's device autoload off):
        its streams start from the rank's seed as the others did (it cannot have seeded
        them before they existed), and its RNG setters are logged from now on."""
        if seed is not None:
            with self.restores.unlogged():
                seed_devices(seed, ("npu",))
        self.restores.install_devices(("npu",))

    def uninstall(self) -> None:
        """Undo `install` (a rank never needs it; an in-process test does)."""
        self.point.uninstall()
        if self.auto is not None:
            self.auto.uninstall()
        self.files.uninstall()
        self.restores.uninstall()
        self.restores.listeners.clear()
        self.generators.uninstall()


CAPTURES: dict[str, Capture] = {
    RNG: lambda state: streams(state.generators),
    WATCH: lambda state: state.watched.audit(),
    AUTO: lambda state: state.step_auto,
}
"""The capture function of every section layout.SECTIONS declares: a new section of a step
line (a GradScaler's scale, an EMA, FP8 scaling state) is one entry there and one here."""


def _checkpoint_of(ctx: RunContext, split: int) -> Optional[str]:
    try:
        return ctx.checkpoint_for(split)
    except (RuntimeError, ValueError):
        return None


_current: Optional[RankState] = None


def current() -> RankState:
    """This process's rank state, made from the environment on first use."""
    return _current if _current is not None else reset()


def reset(environ: Optional[Mapping[str, str]] = None) -> RankState:
    """Start this process's rank state afresh from `environ` (default: `os.environ`).

    `bootstrap.main` calls it first, so a rank forked from a process that imported the package
    never inherits that process's state; an in-process test calls it to become a rank (after
    setting RESUME_EQUIV_CONTEXT) and again to stop being one. The previous state's wrappers
    and hooks are removed; its signature file is left as it is (close it first).
    """
    global _current
    if _current is not None:
        _current.uninstall()
    _current = RankState(read_context(os.environ if environ is None else environ))
    return _current


def context() -> Optional[RunContext]:
    """The current rank's run context, or None when not running under the plugin."""
    return current().context
