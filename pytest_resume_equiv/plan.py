"""What one `resume_equiv.run()` launches, as data: the planned launches of a resume test and
the identity that lets tests share an uninterrupted launch.

Every placeholder of a command, a resume argument or a checkpoint template is substituted
here, once, by `fill` (the ranks use the same function for `ctx.checkpoint_for`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

from .devices import Device
from .errors import ResumeEquivError
from .launch import LaunchSpec, Target
from .rank.context import LaunchContext
from .settings import TestSettings
from .targets import Command, argv_list, fill, target_from_argv, target_from_callable

DEFAULT_CHECKPOINT = "{run_dir}/checkpoints/step_{split}"
DEFAULT_SEED = 1234

ROLES = ("uninterrupted", "interrupted", "resumed", "teeth", "control", "topology", "direct")
"""uninterrupted: every step, saving at the splits; interrupted: the first launch of
interrupt="stop"/"kill"; resumed: from a checkpoint, compared with the uninterrupted launch;
teeth: a resumed launch with every RNG stream mutated after its first step; control: the
uninterrupted launch once more, run only after a divergence; topology: the uninterrupted
launch on the resumed launches' topology (resume_nproc=), whose difference from the
uninterrupted one is the topology's own numeric noise; direct: in a chain, a resume from the
uninterrupted launch's checkpoint at a later link's split, run only when that link diverged,
to tell a stale checkpoint of the link before from a load path that fails at that step."""


@dataclass(frozen=True)
class RunRequest:
    """What one `resume_equiv.run(...)` call asks for."""

    command: Command
    checkpoint: str = DEFAULT_CHECKPOINT
    resume_args: Sequence[str] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    seed: int = DEFAULT_SEED
    cwd: Optional[str] = None


@dataclass
class PlannedLaunch:
    spec: LaunchSpec
    role: str
    """One of ROLES."""
    splits: tuple[int, ...]
    uninterrupted: Optional[PlannedLaunch] = None
    """resumed / teeth / control: the uninterrupted launch this one is compared with."""
    source: Optional[PlannedLaunch] = None
    """resumed / teeth: the launch that writes the checkpoint this one loads (the
    uninterrupted launch, or the interrupted first launch of interrupt="stop"/"kill")."""
    checkpoint: Optional[str] = None
    """resumed / teeth: the checkpoint they load (checked to exist before they run)."""
    shared: bool = False
    """An uninterrupted launch in the session's shared directory, run once for every test
    that plans the same launch."""
    kill_after: Optional[int] = None
    """interrupt="kill": SIGKILL this launch once every rank has recorded this step."""
    envelope: Optional[PlannedLaunch] = None
    """resumed / teeth on another topology: the uninterrupted launch on that topology, whose
    difference from the uninterrupted one bounds theirs."""
    link: int = 0
    """chain=True: which resume of the chain this is (1, 2, ...); 0 outside a chain."""

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def needs(self) -> tuple[PlannedLaunch, ...]:
        """The launches that must have exited before this one may run the user's code (the
        envelope too: it is needed to judge this one, and a slot is better spent on it)."""
        return tuple(p for p in (self.uninterrupted, self.source, self.envelope) if p)


@dataclass
class ResumePlan:
    uninterrupted: list[PlannedLaunch]
    resumed: list[PlannedLaunch]
    interrupted: list[PlannedLaunch] = field(default_factory=list)
    teeth: Optional[PlannedLaunch] = None
    """A resumed launch that mutates every RNG stream after its first step (teeth check)."""
    teeth_off: str = ""
    """Why no teeth check is planned ("" when one is)."""
    warnings: list[str] = field(default_factory=list)
    """What the test author should know before the launches start."""
    controls: dict[str, PlannedLaunch] = field(default_factory=dict)
    """Per uninterrupted launch (by name), its rerun: run only when a resume diverged, to
    tell a resume bug from training that is not deterministic at all."""
    topology: list[PlannedLaunch] = field(default_factory=list)
    """resume_nproc= / resume_nnodes=: per uninterrupted launch, the same launch on the
    resumed launches' topology (the envelope of the topology's own numeric noise)."""
    direct: dict[str, PlannedLaunch] = field(default_factory=dict)
    """chain=True: per link after the first (by name), a resume from the uninterrupted
    launch's checkpoint at its split; run only when the link diverged."""

    @property
    def launches(self) -> list[PlannedLaunch]:
        """The launches that always run (teeth and controls only when they can matter)."""
        return [*self.uninterrupted, *self.topology, *self.interrupted, *self.resumed]

    @property
    def all_launches(self) -> list[PlannedLaunch]:
        teeth = [self.teeth] if self.teeth is not None else []
        return [*self.launches, *teeth, *self.controls.values(), *self.direct.values()]


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


class _Planner:
    """Builds the launches of one plan; holds what every launch of it shares."""

    def __init__(
        self, settings: TestSettings, request: RunRequest, device: Device, root: str
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
        }

    def checkpoint_of(self, values: Mapping[str, Any]) -> str:
        return fill(self.checkpoint, values, "checkpoint=")

    def command(self, values: Mapping[str, Any], resumed: bool) -> list[str]:
        args = [fill(a, values, "command argument") for a in self.argv]
        if resumed:
            args += [fill(a, values, "resume_args argument") for a in self.resume_args]
        return args

    def spec(
        self, name: str, args: list[str], context: LaunchContext, resumed: bool = False
    ) -> LaunchSpec:
        marker = self.marker
        return LaunchSpec(
            name=name,
            target=self.target if self.target is not None else target_from_argv(args),
            run_dir=context.run_dir,
            nproc=marker.resumed_nproc if resumed else marker.nproc,
            nnodes=marker.resumed_nnodes if resumed else marker.nnodes,
            timeout=self.settings.timeout,
            context=context,
            env={**dict(self.marker.env), **self.request.env},
            cwd=self.request.cwd,
            launcher=self.settings.launcher,
            slurm_args=self.settings.slurm_args,
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
        )

    def saving(
        self, name: str, role: str, splits: Sequence[int], run_dir: str, steps: int
    ) -> PlannedLaunch:
        """A launch that saves a checkpoint at each of `splits` (uninterrupted, interrupted,
        control; not topology: the uninterrupted launch on the resumed launches' topology,
        whose checkpoints nothing loads)."""
        other = role == "topology"
        values = self.values(run_dir, splits[0], splits, steps, resumed=other)
        checkpoint = self.checkpoint_of(values)
        args = self.command({**values, "checkpoint": checkpoint}, resumed=False)
        phase = "interrupted" if role == "interrupted" else "uninterrupted"
        context = self.context(phase, values, checkpoint, splits, () if other else splits)
        return PlannedLaunch(self.spec(name, args, context, resumed=other), role, tuple(splits))

    def resuming(
        self,
        name: str,
        role: str,
        split: int,
        compared: PlannedLaunch,
        source: PlannedLaunch,
        save_at: Sequence[int] = (),
    ) -> PlannedLaunch:
        """A launch that loads `source`'s checkpoint at `split` (resumed, teeth); in a chain
        it saves at the later splits (`save_at`) for the next link."""
        source_values = {**source.spec.context.template_values, "split": split}
        checkpoint = self.checkpoint_of(source_values)
        run_dir = os.path.join(self.root, name)
        marker = self.marker
        values = self.values(run_dir, split, marker.splits, marker.steps, resumed=True)
        args = self.command({**values, "checkpoint": checkpoint}, resumed=True)
        context = dataclasses.replace(
            # a direct resume is a resumed launch to the trainer (ctx.resuming)
            self.context(
                "resumed" if role == "direct" else role, values, checkpoint, marker.splits, save_at
            ),
            template_values=source_values if not save_at else values,
        )
        return PlannedLaunch(
            self.spec(name, args, context, resumed=True),
            role,
            (split,),
            uninterrupted=compared,
            source=source,
            checkpoint=checkpoint,
        )

    def rolling_checkpoint_warning(self) -> list[str]:
        """A checkpoint path that is the same at every split, while the uninterrupted run
        goes on past the split: a later save to it replaces what the resumed run loads."""
        marker = self.marker
        if marker.interrupt != "continue":
            return []
        at = [self.values("\0run_dir", s, marker.splits, marker.steps) for s in (1, 2)]
        if self.checkpoint_of(at[0]) != self.checkpoint_of(at[1]):
            return []
        saves = ", ".join(map(str, marker.splits))
        return [
            f"checkpoint={self.checkpoint!r} is the same path at every split, and the "
            f"uninterrupted run saves there at step {saves} and goes on to step {marker.steps} "
            '(interrupt="continue"): a later save to that path replaces the checkpoint the '
            "resumed run loads, so it may resume from another step; put {split} in the path "
            '(the trainer saving to it), or use interrupt="stop"'
        ]

    def groups(self) -> list[list[int]]:
        """Splits that can share one uninterrupted launch: those whose command is the same
        once filled (always, when no argument uses `{split}`)."""
        groups: dict[tuple[str, ...], list[int]] = {}
        for split in self.marker.splits:
            probe = self.values("\0run_dir", split, self.marker.splits, self.marker.steps)
            probe["checkpoint"] = "\0checkpoint"
            groups.setdefault(tuple(self.command(probe, resumed=False)), []).append(split)
        return list(groups.values())


def build_plan(
    settings: TestSettings,
    request: RunRequest,
    device: Device,
    root: str,
    shared_root: Optional[str] = None,
) -> ResumePlan:
    """The launches of one run: per group of splits an uninterrupted launch (in `shared_root`
    when given, so other tests can reuse it), its control and, on a topology change, its twin
    on the resumed topology; per split a resumed launch (and an interrupted first launch
    unless interrupt="continue"; in a chain, each resumed launch loads the previous one's
    checkpoint); at most one teeth check."""
    planner = _Planner(settings, request, device, root)
    marker = settings.marker
    plan = ResumePlan([], [])
    groups = planner.groups()
    if marker.chain and len(groups) > 1:
        raise ResumeEquivError(
            "chain=True needs one uninterrupted launch that saves at every split, but the "
            "command differs per split (it uses {split}); use {splits}, or ctx.should_save(step)"
        )
    for splits in groups:
        name = "uninterrupted" if len(groups) == 1 else f"uninterrupted-split{splits[0]}"
        full = _uninterrupted(planner, plan, name, splits, shared_root)
        envelope = _topology(planner, plan, name, splits, shared_root)
        previous: Optional[PlannedLaunch] = None
        for split in splits:
            source = full
            if marker.chain and previous is not None:
                source = previous
            elif marker.interrupt != "continue":
                source = _interrupted(planner, split)
                plan.interrupted.append(source)
            later = [s for s in splits if s > split][:1] if marker.chain else []
            resumed = planner.resuming(
                f"resumed-split{split}", "resumed", split, full, source, later
            )
            resumed.envelope = envelope
            resumed.link = len(plan.resumed) + 1 if marker.chain else 0
            if resumed.link > 1:
                name = f"resumed-split{split}-direct"
                plan.direct[resumed.name] = planner.resuming(name, "direct", split, full, full)
            plan.resumed.append(resumed)
            previous = resumed
            if plan.teeth is None and settings.rng_mutation and marker.steps >= split + 2:
                plan.teeth = planner.resuming(f"teeth-split{split}", "teeth", split, full, source)
                plan.teeth.envelope = envelope
    plan.warnings += planner.rolling_checkpoint_warning()
    if plan.teeth is None:
        plan.teeth_off = (
            f"rng_mutation=False from {settings.sources['rng_mutation']}"
            if not settings.rng_mutation
            else "needs steps >= split + 2 (a step after the mutated one to compare)"
        )
    return plan


def _run_dir(planner: _Planner, probe: PlannedLaunch, own_dir: str, shared_root: Optional[str]):
    """A launch's own directory, or its place in the session's shared directory."""
    if shared_root is None:
        return own_dir
    return os.path.join(shared_root, launch_key(probe.spec, planner.root))


def _uninterrupted(
    planner: _Planner, plan: ResumePlan, name: str, splits: list[int], shared_root: Optional[str]
) -> PlannedLaunch:
    """The uninterrupted launch of `splits` and its determinism control."""
    steps = planner.marker.steps
    own_dir = os.path.join(planner.root, name)
    probe = planner.saving(name, "uninterrupted", splits, own_dir, steps)
    run_dir = _run_dir(planner, probe, own_dir, shared_root)
    full = planner.saving(name, "uninterrupted", splits, run_dir, steps)
    control = planner.saving(f"{name}-control", "control", splits, f"{run_dir}-control", steps)
    control.uninterrupted = full
    full.shared = control.shared = shared_root is not None
    plan.uninterrupted.append(full)
    plan.controls[name] = control
    return full


def _topology(
    planner: _Planner, plan: ResumePlan, name: str, splits: list[int], shared_root: Optional[str]
) -> Optional[PlannedLaunch]:
    """On a topology change, the uninterrupted launch on the resumed topology."""
    marker = planner.marker
    if not marker.topology_changes:
        return None
    name = f"{name}-nproc{marker.resumed_nproc}" + (
        f"x{marker.resumed_nnodes}" if marker.resumed_nnodes > 1 else ""
    )
    own_dir = os.path.join(planner.root, name)
    probe = planner.saving(name, "topology", splits, own_dir, marker.steps)
    launch = planner.saving(
        name, "topology", splits, _run_dir(planner, probe, own_dir, shared_root), marker.steps
    )
    launch.shared = shared_root is not None
    plan.topology.append(launch)
    return launch


def _interrupted(planner: _Planner, split: int) -> PlannedLaunch:
    """A first launch of its own: it ends at the split ("stop") or is SIGKILLed once every
    rank has recorded the step after it ("kill")."""
    marker = planner.marker
    name = f"interrupted-split{split}"
    steps = split if marker.interrupt == "stop" else marker.steps
    launch = planner.saving(name, "interrupted", [split], os.path.join(planner.root, name), steps)
    if marker.interrupt == "kill":
        launch.kill_after = split + 1
    return launch
