"""What one `resume_equiv.run()` launches, as data: the planned launches and the checks that
judge them, and the identity that lets tests share an uninterrupted launch.

The planner does not know what the launches are for: every registered check
(`checks.CHECKS`) asks it for the launches it needs (a launch several checks need, like the
uninterrupted one, is planned once; `checks.build_plan`). The planner fills every placeholder of a command, a resume argument and a
checkpoint template, once, with `fill` (the ranks use the same function for
`ctx.checkpoint_for`); a launch's split and the checkpoint it loads are derived here and
carried by the launch.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from .errors import ResumeEquivError
from .golden import GoldenTarget
from .launch.devices import Device
from .launch.running import LaunchSpec, Target
from .launch.targets import Command, argv_list, fill, target_from_argv, target_from_callable
from .rank.launch_context import LaunchContext
from .settings import TestSettings

DEFAULT_CHECKPOINT = "{run_dir}/checkpoints/step_{split}"
DEFAULT_SEED = 1234


@dataclass(frozen=True)
class RunRequest:
    """What one `resume_equiv.run(...)` call asks for."""

    command: Command
    checkpoint: str = DEFAULT_CHECKPOINT
    resume_args: Sequence[str] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    seed: int = DEFAULT_SEED
    cwd: Optional[str] = None


@dataclass(eq=False)
class PlannedLaunch:
    spec: LaunchSpec
    role: str
    """What the launch is, in the words of reports (uninterrupted, resumed, teeth, ...): set
    by the check that plans it."""
    split: Optional[int] = None
    """A launch that loads a checkpoint: the step it resumes after."""
    saves: tuple[int, ...] = ()
    """A launch that saves checkpoints: the steps after which it saves."""
    reference: Optional[PlannedLaunch] = None
    """The launch this one is compared with (the uninterrupted one)."""
    source: Optional[PlannedLaunch] = None
    """The launch that writes the checkpoint this one loads."""
    checkpoint: Optional[str] = None
    """The checkpoint it loads (checked to exist before it runs)."""
    shared: bool = False
    """An uninterrupted launch in the session's shared directory, run once for every test
    that plans the same launch."""
    kill_after: Optional[int] = None
    """interrupt="kill": SIGKILL this launch once every rank has recorded this step."""
    after: tuple[PlannedLaunch, ...] = ()
    """Launches besides the reference and the source that must have exited before this one
    runs the user's code (one needed to judge it: a slot is better spent on that first)."""
    on_demand: bool = False
    """Started only when a check asks for it (after a divergence, say)."""
    link: int = 0
    """chain=True: which resume of the chain this is (1, 2, ...); 0 outside a chain."""
    judged_first: bool = False
    """The launches that need it wait until it has been judged, not only until it exited:
    its judging prepares what they run on (interrupt="crash": what the crash left is laid
    out, and rolled back for a power loss, in the restarted job's run directory)."""
    may_fail: bool = False
    """Its check judges how it ended, a failure too (interrupt="crash": the launch killed in
    the save, and the resumed one, which may refuse the torn checkpoint)."""

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def needs(self) -> tuple[PlannedLaunch, ...]:
        """The launches that must have exited before this one may run the user's code."""
        found = [p for p in (self.reference, self.source, *self.after) if p is not None]
        return tuple(dict.fromkeys(found))

    @property
    def loads(self) -> bool:
        return self.checkpoint is not None


def launch_key(spec: LaunchSpec, root: str) -> str:
    """What makes two uninterrupted launches the same launch, as a short hash; the test's own
    directory `root` is factored out of every path so tests can share. The timeout is not
    part of it: it bounds the launch, it does not change what the launch does."""
    identity = {
        "target": dataclasses.asdict(spec.target),
        "nproc": spec.nproc,
        "nnodes": spec.nnodes,
        "context": dataclasses.asdict(spec.context),
        "env": spec.env,
        "cwd": spec.cwd,
    }
    text = json.dumps(identity, sort_keys=True).replace(root, "{root}")
    return hashlib.sha256(text.encode()).hexdigest()[:20]


class Planner:
    """Builds the launches of one plan; holds what every launch of it shares, and the
    launches planned so far (by name, so a launch several checks need is planned once)."""

    def __init__(
        self,
        settings: TestSettings,
        request: RunRequest,
        device: Device,
        root: str,
        shared_root: Optional[str] = None,
        golden: Optional[GoldenTarget] = None,
    ) -> None:
        if not isinstance(request.checkpoint, (str, os.PathLike)):
            raise ResumeEquivError(
                f"checkpoint= must be a path template string, got {request.checkpoint!r}"
            )
        self.settings = settings
        self.marker = settings.marker
        self.request = request
        self.device = device
        self.root = root
        self.shared_root = shared_root
        self.golden = golden
        """The test's golden (`--resume-equiv-golden`), None without a store."""
        self.checkpoint = os.fspath(request.checkpoint)
        if callable(request.command):
            if request.resume_args:
                raise ResumeEquivError(
                    "resume_args= applies to command mode only; use ctx.resuming in train(ctx)"
                )
            self.target: Optional[Target] = target_from_callable(request.command)
            self.argv: list[str] = []
        else:
            self.argv = argv_list(request.command, "command")
            self.target = None
        self.resume_args = argv_list(request.resume_args, "resume_args")
        self.planned: dict[str, PlannedLaunch] = {}
        self.warnings: list[str] = []

    def once(self, name: str, build: Callable[[], PlannedLaunch]) -> PlannedLaunch:
        """The launch named `name`, built on first use."""
        if name not in self.planned:
            launch = build()
            assert launch.name == name, (launch.name, name)
            self.planned[name] = launch
        return self.planned[name]

    def warn(self, text: str) -> None:
        if text not in self.warnings:
            self.warnings.append(text)

    def values(
        self, run_dir: str, split: int, splits: Sequence[int], steps: int, resumed: bool = False
    ) -> dict:
        """The placeholder values of one launch, `{checkpoint}` left to `checkpoint_of`;
        `resumed`: on the resumed launches' topology."""
        marker = self.marker
        return {
            "steps": steps,
            "split": split,
            "splits": ",".join(map(str, splits)),
            "run_dir": run_dir,
            "nproc": marker.resumed_nproc if resumed else marker.nproc,
            "world_size": marker.resumed_world_size if resumed else marker.world_size,
            "seed": self.request.seed,
            "variant": marker.configurations.name if marker.configurations else "",
        }

    def checkpoint_of(self, values: Mapping[str, Any]) -> str:
        return fill(self.checkpoint, values, "checkpoint=")

    def command(self, values: Mapping[str, Any], resumed: bool) -> list[str]:
        args = [fill(a, values, "command argument") for a in self.argv]
        if resumed:
            args += [fill(a, values, "resume_args argument") for a in self.resume_args]
        return args

    def spec(
        self,
        name: str,
        args: list[str],
        context: LaunchContext,
        values: Mapping[str, Any],
        resumed: bool = False,
    ) -> LaunchSpec:
        """`values`: the launch's placeholder values, which fill `cwd=` as they fill the
        command."""
        marker = self.marker
        cwd = self.request.cwd
        return LaunchSpec(
            name=name,
            target=self.target if self.target is not None else target_from_argv(args),
            run_dir=context.run_dir,
            nproc=marker.resumed_nproc if resumed else marker.nproc,
            nnodes=marker.resumed_nnodes if resumed else marker.nnodes,
            timeout=self.settings.timeout,
            context=context,
            env={**dict(self.marker.env), **self.request.env},
            cwd=fill(cwd, values, "cwd=") if cwd is not None else None,
            launcher=self.settings.launcher,
            fork_server=self.settings.fork_server == "on",
            preload=self.settings.preload,
        )

    def context(
        self,
        phase: str,
        values: dict,
        checkpoint: str,
        splits: Sequence[int],
        save_at: Sequence[int] = (),
    ) -> LaunchContext:
        return LaunchContext(
            save_at=tuple(save_at),
            phase=phase,
            run_dir=values["run_dir"],
            device_kind=self.device.kind,
            backend=self.device.backend,
            seed=self.request.seed,
            steps=values["steps"],
            split=values["split"],
            splits=tuple(splits),
            checkpoint=checkpoint,
            checkpoint_template=self.checkpoint,
            template_values=values,
            auto=self.settings.auto,
        )

    def saving(
        self,
        name: str,
        role: str,
        splits: Sequence[int],
        run_dir: str,
        steps: int,
        phase: str = "uninterrupted",
        saves: bool = True,
        resumed_topology: bool = False,
    ) -> PlannedLaunch:
        """A launch from step 1 that saves a checkpoint at each of `splits` (unless not
        `saves`: nothing loads its checkpoints), on the resumed launches' topology when
        `resumed_topology`."""
        values = self.values(run_dir, splits[0], splits, steps, resumed=resumed_topology)
        checkpoint = self.checkpoint_of(values)
        args = self.command({**values, "checkpoint": checkpoint}, resumed=False)
        save_at = tuple(splits) if saves else ()
        context = self.context(phase, values, checkpoint, splits, save_at)
        spec = self.spec(
            name, args, context, {**values, "checkpoint": checkpoint}, resumed=resumed_topology
        )
        return PlannedLaunch(spec, role, saves=save_at)

    def resuming(
        self,
        name: str,
        role: str,
        split: int,
        reference: PlannedLaunch,
        source: PlannedLaunch,
        save_at: Sequence[int] = (),
        phase: Optional[str] = None,
        own_root: bool = False,
    ) -> PlannedLaunch:
        """A launch that loads `source`'s checkpoint at `split`, compared with `reference`;
        in a chain it saves at the later splits (`save_at`) for the next link. `own_root`
        (interrupt="crash"): it resumes from its own run directory, where its check lays out
        what `source` left before it runs, so `{checkpoint}` and `ctx.checkpoint_for` name
        its own folders and it saves where it resumed, as a restarted job does."""
        run_dir = os.path.join(self.root, name)
        marker = self.marker
        values = self.values(run_dir, split, marker.splits, marker.steps, resumed=True)
        source_values = {
            **(values if own_root else source.spec.context.template_values),
            "split": split,
        }
        checkpoint = self.checkpoint_of(source_values)
        args = self.command({**values, "checkpoint": checkpoint}, resumed=True)
        context = dataclasses.replace(
            self.context(phase or role, values, checkpoint, marker.splits, save_at),
            template_values=source_values if not save_at else values,
        )
        return PlannedLaunch(
            self.spec(name, args, context, {**values, "checkpoint": checkpoint}, resumed=True),
            role,
            split=split,
            saves=tuple(save_at),
            reference=reference,
            source=source,
            checkpoint=checkpoint,
        )

    def shared_dir(self, probe: PlannedLaunch, own_dir: str) -> str:
        """A launch's own directory, or its place in the session's shared directory."""
        if self.shared_root is None:
            return own_dir
        return os.path.join(self.shared_root, launch_key(probe.spec, self.root))

    def groups(self) -> list[list[int]]:
        """Splits that can share one uninterrupted launch: those whose command is the same
        once filled (always, when no argument uses `{split}`)."""
        groups: dict[tuple[str, ...], list[int]] = {}
        for split in self.marker.splits:
            probe = self.values("\0run_dir", split, self.marker.splits, self.marker.steps)
            probe["checkpoint"] = "\0checkpoint"
            groups.setdefault(tuple(self.command(probe, resumed=False)), []).append(split)
        return list(groups.values())

    def ordered(self) -> list[PlannedLaunch]:
        """The launches in start order: those that read no checkpoint first."""
        return sorted(self.planned.values(), key=lambda p: p.loads)
