"""Plan and run the launches of one resume test: uninterrupted baseline(s), then one resumed
launch per split, each compared with its baseline on every rank.

The plan is data (`ResumePlan`) so later strategies (shared baselines, concurrent resumes,
extra control launches) change how it is built or run, not what a test sees.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import os
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Protocol, Union

from .compare import Comparison, compare_runs
from .diagnose import Diagnosis, diagnose
from .launch import LaunchResult, LaunchSpec, RunningLaunch, Target
from .rank.layout import gate_path
from .settings import MarkerSpec
from .share import KEEP_FILE, RESULT_FILE
from .signature import Signature, SignatureError, StepWatcher, read_run

OWN_FILES = (RESULT_FILE, KEEP_FILE, os.path.basename(gate_path("")))
"""Files the plugin itself writes at the top of a run directory."""
PLACEHOLDERS = ("steps", "split", "splits", "run_dir", "checkpoint", "nproc", "world_size", "seed")
DEFAULT_CHECKPOINT = "{run_dir}/checkpoints/step_{split}"
_PLACEHOLDER_RE = re.compile(r"\{\{|\}\}|\{([A-Za-z_][A-Za-z0-9_]*)\}")


class ResumeEquivError(Exception):
    """A problem the test author must fix, or a failed launch; the message says which."""


def fill(template: str, values: Mapping[str, Any], where: str) -> str:
    """Substitute `{placeholder}`s; `{{`/`}}` are literal braces; unknown names are an error."""

    def sub(match: re.Match) -> str:
        if match.group(0) in ("{{", "}}"):
            return match.group(0)[0]
        name = match.group(1)
        if name not in PLACEHOLDERS:
            raise ResumeEquivError(
                f"unknown placeholder {{{name}}} in {where} {template!r}; valid placeholders: "
                + ", ".join(f"{{{p}}}" for p in PLACEHOLDERS)
                + " (write {{ and }} for literal braces)"
            )
        if name not in values or values[name] is None:
            raise ResumeEquivError(
                f"placeholder {{{name}}} in {where} {template!r} has no value here"
            )
        return str(values[name])

    return _PLACEHOLDER_RE.sub(sub, template)


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


def run_context(
    phase: str,
    run_dir: str,
    device_kind: str,
    backend: str,
    seed: int,
    steps: int = 0,
    split: int = 0,
    splits: Sequence[int] = (),
    checkpoint: Optional[str] = None,
    template: Optional[str] = None,
) -> dict[str, Any]:
    """The JSON run context every rank of a launch reads (see rank/context.py)."""
    return {
        "phase": phase,
        "run_dir": run_dir,
        "steps": steps,
        "split": split,
        "splits": list(splits),
        "checkpoint": checkpoint,
        "checkpoint_template": template,
        "device_kind": device_kind,
        "backend": backend,
        "seed": seed,
    }


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


@dataclass
class PlannedLaunch:
    spec: LaunchSpec
    splits: tuple[int, ...]
    baseline: Optional[PlannedLaunch] = None
    checkpoint: Optional[str] = None
    """Resumed launches: the checkpoint they load (checked to exist first)."""
    shared: bool = False
    """A baseline in the session's shared directory, run once for every test that has it."""
    source: Optional[PlannedLaunch] = None
    """Resumed launches: the launch that writes the checkpoint they load (the baseline, or
    the interrupted first launch of interrupt="stop"/"kill")."""
    kill_after: Optional[int] = None
    """interrupt="kill": SIGKILL this launch once every rank has recorded this step."""


@dataclass
class ResumePlan:
    baselines: list[PlannedLaunch]
    resumed: list[PlannedLaunch]
    controls: dict[str, PlannedLaunch] = field(default_factory=dict)
    """Per baseline, a second uninterrupted launch: run only when a resume diverged, to tell
    a resume bug from training that is not deterministic at all."""
    teeth: Optional[PlannedLaunch] = None
    """A resumed launch that perturbs every RNG stream after its first step (teeth check)."""
    interrupted: list[PlannedLaunch] = field(default_factory=list)
    """interrupt="stop"/"kill": the first launches whose checkpoints the resumed ones load."""

    @property
    def launches(self) -> list[PlannedLaunch]:
        return [*self.baselines, *self.interrupted, *self.resumed]


@dataclass
class PlanInputs:
    """Everything the plan depends on, resolved by the plugin from marker and options."""

    spec: MarkerSpec
    root: str
    device_kind: str
    backend: str
    timeout: float
    env: dict[str, str]
    seed: int
    cwd: Optional[str] = None
    rng_mutation: bool = True
    shared_root: Optional[str] = None
    """Where baselines shared across the session's tests live (None: this test's own)."""


def build_plan(
    inputs: PlanInputs,
    command: Union[Sequence[str], Callable[..., Any]],
    checkpoint: str = DEFAULT_CHECKPOINT,
    resume_args: Sequence[str] = (),
) -> ResumePlan:
    spec = inputs.spec
    if not isinstance(checkpoint, (str, os.PathLike)):
        raise ResumeEquivError(f"checkpoint= must be a path template string, got {checkpoint!r}")
    checkpoint = os.fspath(checkpoint)
    base_values = {
        "steps": spec.steps,
        "splits": ",".join(map(str, spec.splits)),
        "nproc": spec.nproc,
        "world_size": spec.world_size,
        "seed": inputs.seed,
    }
    if callable(command):
        if resume_args:
            raise ResumeEquivError(
                "resume_args= applies to command mode only; use ctx.resuming in train(ctx)"
            )
        target = target_from_callable(command)
        argv: list[str] = []
    else:
        argv = argv_list(command, "command")
        target = None
    extra_resume = argv_list(resume_args, "resume_args")

    def make_spec(name: str, run_dir: str, args: list[str], context: dict) -> LaunchSpec:
        tgt = target if target is not None else target_from_argv(args)
        return LaunchSpec(
            name=name,
            target=tgt,
            run_dir=run_dir,
            nproc=spec.nproc,
            nnodes=spec.nnodes,
            timeout=inputs.timeout,
            context=context,
            env=dict(inputs.env),
            cwd=inputs.cwd,
        )

    def context(phase: str, run_dir: str, split: int, ckpt: Optional[str], template: str) -> dict:
        return run_context(
            phase,
            run_dir,
            inputs.device_kind,
            inputs.backend,
            inputs.seed,
            steps=spec.steps,
            split=split,
            splits=spec.splits,
            checkpoint=ckpt,
            template=template,
        )

    # One baseline serves every split whose formatted baseline command is the same.
    groups: dict[tuple[str, ...], list[int]] = {}
    for split in spec.splits:
        probe = {
            **base_values,
            "split": split,
            "run_dir": "{run_dir}",
            "checkpoint": "{checkpoint}",
        }
        key = tuple(fill(a, probe, "command argument") for a in argv)
        groups.setdefault(key, []).append(split)

    baselines: list[PlannedLaunch] = []
    resumed: list[PlannedLaunch] = []
    controls: dict[str, PlannedLaunch] = {}
    teeth: Optional[PlannedLaunch] = None
    interrupted: list[PlannedLaunch] = []

    def baseline_launch(
        name: str, splits: list[int], run_dir: str, phase: str = "baseline", steps: int = 0
    ) -> tuple[PlannedLaunch, str]:
        steps = steps or spec.steps
        values = {**base_values, "steps": steps, "split": splits[0], "run_dir": run_dir}
        values["splits"] = ",".join(map(str, splits))
        template = fill(checkpoint, {**values, "split": "{split}"}, "checkpoint=")
        values["checkpoint"] = template.replace("{split}", str(splits[0]))
        args = [fill(a, values, "command argument") for a in argv]
        ctx = context(phase, run_dir, splits[0], values["checkpoint"], template)
        ctx.update(steps=steps, splits=list(splits))
        return PlannedLaunch(make_spec(name, run_dir, args, ctx), tuple(splits)), template

    def shared_dir(name: str, splits: list[int]) -> Optional[str]:
        """The session-wide directory of this baseline: named by what the launch is."""
        if inputs.shared_root is None:
            return None
        probe = baseline_launch(name, splits, os.path.join(inputs.root, name))[0].spec
        return os.path.join(inputs.shared_root, launch_key(probe, inputs.root))

    def resumed_launch(
        phase: str, name: str, split: int, base: PlannedLaunch, source: PlannedLaunch, template: str
    ) -> PlannedLaunch:
        ckpt = template.replace("{split}", str(split))
        run_dir = os.path.join(inputs.root, name)
        values = {**base_values, "split": split, "run_dir": run_dir, "checkpoint": ckpt}
        args = [fill(a, values, "command argument") for a in argv]
        args += [fill(a, values, "resume_args argument") for a in extra_resume]
        ctx = context(phase, run_dir, split, ckpt, template)
        return PlannedLaunch(
            make_spec(name, run_dir, args, ctx),
            (split,),
            baseline=base,
            checkpoint=ckpt,
            source=source,
        )

    for splits in groups.values():
        name = "baseline" if len(groups) == 1 else f"baseline-split{splits[0]}"
        shared = shared_dir(name, splits)
        base, template = baseline_launch(name, splits, shared or os.path.join(inputs.root, name))
        base.shared = shared is not None
        baselines.append(base)
        control_dir = (
            f"{shared}-control" if shared else os.path.join(inputs.root, f"{name}-control")
        )
        controls[name] = baseline_launch(f"{name}-control", splits, control_dir)[0]
        controls[name].shared = shared is not None
        for split in splits:
            source, source_template = base, template
            if spec.interrupt != "continue":
                # A first launch of its own per split: it ends at the split ("stop") or is
                # killed right after recording the step after it ("kill").
                first = f"interrupted-split{split}"
                source, source_template = baseline_launch(
                    first,
                    [split],
                    os.path.join(inputs.root, first),
                    phase="interrupted",
                    steps=split if spec.interrupt == "stop" else spec.steps,
                )
                if spec.interrupt == "kill":
                    source.kill_after = split + 1
                interrupted.append(source)
            resumed.append(
                resumed_launch(
                    "resumed", f"resumed-split{split}", split, base, source, source_template
                )
            )
            if teeth is None and inputs.rng_mutation and spec.steps >= split + 2:
                teeth = resumed_launch(
                    "mutated", f"teeth-split{split}", split, base, source, source_template
                )
    return ResumePlan(baselines, resumed, controls, teeth, interrupted)


def launch_key(spec: LaunchSpec, root: str) -> str:
    """What makes two uninterrupted launches the same launch, as a short hash; the test's own
    directory `root` is factored out of every path so tests can share."""
    identity = {
        "target": dataclasses.asdict(spec.target),
        "nproc": spec.nproc,
        "nnodes": spec.nnodes,
        "timeout": spec.timeout,
        "context": spec.context,
        "env": spec.env,
        "cwd": spec.cwd,
    }
    text = json.dumps(identity, sort_keys=True).replace(root, "{root}")
    return hashlib.sha256(text.encode()).hexdigest()[:20]


@dataclass
class SplitVerdict:
    split: int
    launch: LaunchResult
    baseline: LaunchResult
    comparison: Comparison
    diagnosis: Optional[Diagnosis] = None
    baseline_signatures: dict[int, Signature] = field(default_factory=dict)
    signatures: dict[int, Signature] = field(default_factory=dict)
    """Both runs' signatures as compared (for plots and reports, without reading them again)."""


@dataclass
class ResumeOutcome:
    plan: ResumePlan
    launches: list[LaunchResult] = field(default_factory=list)
    verdicts: list[SplitVerdict] = field(default_factory=list)
    nondeterministic: Optional[Comparison] = None
    """Set when a second uninterrupted launch differed from the first."""
    toothless: Optional[Comparison] = None
    """Set when the teeth check's perturbed run still matched: the test cannot catch RNG bugs."""
    teeth_skipped: str = ""
    """Why a planned teeth check did not run (it could not have mattered)."""

    @property
    def resume_equal(self) -> bool:
        return bool(self.verdicts) and all(v.comparison.equal for v in self.verdicts)

    @property
    def equal(self) -> bool:
        """The test passes: every resume matched and the test has teeth."""
        return self.resume_equal and self.toothless is None


class LaunchFailed(ResumeEquivError):
    def __init__(
        self, message: str, result: LaunchResult, role: str = "baseline", note: str = ""
    ) -> None:
        super().__init__(message)
        self.result = result
        self.role = role
        self.note = note
        """What the plugin knows about why (e.g. its checkpoint came from a killed launch)."""


def read_signatures(result: LaunchResult) -> dict[int, Signature]:
    try:
        signatures = read_run(result.spec.run_dir, result.spec.world_size)
    except SignatureError as exc:
        raise ResumeEquivError(
            f"the {result.spec.name} launch left an unreadable signature: {exc}"
        ) from None
    for outcome in result.ranks:
        sig = signatures.get(outcome.rank)
        if sig is not None and outcome.ok and not sig.complete:
            how = "ends in the middle of a line" if sig.truncated_tail else "has no footer"
            raise ResumeEquivError(
                f"the {result.spec.name} launch left a truncated signature: {sig.path} {how} "
                f"although rank {outcome.rank} finished normally (the footer is written when "
                "the rank ends); the disk filled up, or something else wrote to the file"
            )
    return signatures


def _missing_checkpoint(planned: PlannedLaunch, source: LaunchResult) -> str:
    assert planned.source is not None and planned.checkpoint is not None
    source_dir = planned.source.spec.run_dir
    found = []
    for dirpath, dirnames, filenames in os.walk(source_dir):
        dirnames[:] = [d for d in dirnames if d not in ("logs", "pids", "status", "signatures")]
        filenames = [f for f in filenames if dirpath != source_dir or f not in OWN_FILES]
        for entry in sorted(dirnames + filenames):
            found.append(os.path.relpath(os.path.join(dirpath, entry), source_dir))
    listing = ", ".join(sorted(found)[:12]) or "nothing but the plugin's own files"
    split = planned.splits[0]
    template = planned.source.spec.context["checkpoint_template"]
    if source.killed_on_purpose:
        who = (
            f"the interrupted run (SIGKILLed once every rank had recorded step "
            f"{source.killed_on_purpose}, interrupt='kill')"
        )
        advice = (
            "a checkpoint must be complete on disk before training goes on past it; one "
            "written in the background can be lost or torn when the job dies"
        )
    elif planned.source.spec.context["phase"] == "interrupted":
        who = f"the interrupted run (ended at step {split}, interrupt='stop')"
        advice = f"the trainer must save there after step {split}"
    else:
        who = "the uninterrupted run"
        advice = (
            f"the trainer must save there after step {split}, or pass checkpoint= with the "
            "path it does use"
        )
    return (
        f"{who} did not save a checkpoint at {planned.checkpoint} "
        f"(from checkpoint={template!r}, split={split}); {advice}. "
        f"Its run directory holds: {listing}"
    )


class Handle(Protocol):
    """A started launch as the scheduler sees it (RunningLaunch, a shared baseline, a fake)."""

    @property
    def running(self) -> bool: ...

    def open_gate(self) -> None: ...

    def poll(self) -> Optional[LaunchResult]: ...

    def kill(self) -> None: ...


Starter = Callable[[PlannedLaunch, bool], Optional[Handle]]
"""Start a planned launch, gated (waiting for `open_gate()`) or not; None: not now (no free
device yet), ask again later."""


def _start_launch(planned: PlannedLaunch, gated: bool) -> Handle:
    return RunningLaunch(planned.spec, gated=gated)


@dataclass
class _Job:
    planned: PlannedLaunch
    role: str  # baseline | resumed | teeth | control
    against: str = ""
    """The baseline this launch is compared with (its name)."""
    handle: Optional[Handle] = None
    done: bool = False
    watcher: Optional[StepWatcher] = None
    """Follows the launch's signatures (interrupt="kill", progress lines)."""
    began: float = 0.0
    """When its gate opened."""


def rng_advances_after(signatures: dict[int, Signature], split: int) -> bool:
    """Whether any audited RNG stream moves after the first resumed step on some rank: if none
    does, an RNG restore bug cannot change the run, and a perturbation could not either."""
    for sig in signatures.values():
        steps = sig.by_step()
        ordered = sorted(s for s in steps if s >= split + 1)
        audited = False
        for before, after in zip(ordered, ordered[1:]):
            for key, value in steps[after].items():
                if key.startswith("rng:"):
                    audited = True
                    if steps[before].get(key) != value:
                        return True
        if not audited:
            return True  # nothing audited (too few steps, or audit off): keep the check
    return False


def execute(
    plan: ResumePlan,
    spec: MarkerSpec,
    start: Starter = _start_launch,
    on_launch: Optional[Callable[[LaunchResult], None]] = None,
    parallel: int = 1,
    prefetch: int = 1,
    poll_interval: float = 0.02,
    on_progress: Optional[Callable[[str], None]] = None,
    progress_every: float = 5.0,
) -> ResumeOutcome:
    """Run the plan; raises LaunchFailed / ResumeEquivError on anything but a comparison.

    At most `parallel` launches run the user's code at once (what the machine holds without
    slowing each one down); up to `prefetch` more are started gated, so their interpreters and
    imports overlap the launch they wait for. A resumed launch's gate opens only after its
    baseline has exited and its checkpoint exists. The teeth check runs last and only where
    it can matter; the determinism control only after a divergence. Whatever ends the run
    (a failure, Ctrl-C), every started launch is killed before this returns.
    """
    outcome = ResumeOutcome(plan)
    base_results: dict[str, tuple[LaunchResult, dict[int, Signature]]] = {}
    jobs = [_Job(p, "baseline") for p in plan.baselines]
    jobs += [_Job(p, "interrupted") for p in plan.interrupted]
    jobs += [_Job(p, "resumed", _base_name(p)) for p in plan.resumed]
    if plan.teeth is not None:
        jobs.append(_Job(plan.teeth, "teeth", _base_name(plan.teeth)))
    diverged: set[str] = set()
    finished: set[str] = set()
    killed_sources: dict[str, int] = {}

    def ready(job: _Job) -> bool:
        """A launch may run its code once the launches it reads from have exited."""
        needs = (job.planned.baseline, job.planned.source)
        return all(p is None or p.spec.name in finished for p in needs)

    def finish(job: _Job, result: LaunchResult) -> None:
        job.done = True
        outcome.launches.append(result)
        if on_launch is not None:
            on_launch(result)
        if not result.ok and not result.killed_on_purpose:
            note = ""
            source = job.planned.source
            killed = killed_sources.get(source.spec.name, 0) if source is not None else 0
            if killed:
                note = (
                    f"the checkpoint it loads was written by a launch SIGKILLed once every rank "
                    f"had recorded step {killed} (interrupt='kill'): a checkpoint must be "
                    "complete on disk before training goes on past it; one written in the "
                    "background can be missing or torn when the job dies"
                )
            raise LaunchFailed(f"the {job.planned.spec.name} launch failed", result, job.role, note)
        finished.add(job.planned.spec.name)
        if result.killed_on_purpose:
            killed_sources[job.planned.spec.name] = result.killed_on_purpose
        for other in jobs:
            if other.planned.source is job.planned and other.role == "resumed":
                if not os.path.exists(other.planned.checkpoint or ""):
                    raise ResumeEquivError(_missing_checkpoint(other.planned, result))
        if job.role == "interrupted":
            return
        signatures = read_signatures(result)
        if job.role == "baseline":
            base_results[job.planned.spec.name] = (result, signatures)
            for other in jobs:
                if other.planned.baseline is job.planned and other.role == "teeth":
                    if not rng_advances_after(signatures, other.planned.splits[0]):
                        outcome.teeth_skipped = (
                            "no audited RNG stream advances after the split: "
                            "nothing random for a resume to get wrong"
                        )
                        cancel(other)
            return
        base_name = job.against
        base_result, base_sigs = base_results[base_name]
        split = job.planned.splits[0]
        if job.role == "resumed":
            comparison = compare_runs(base_sigs, signatures, split, spec.steps, spec.tolerance)
            verdict = SplitVerdict(
                split, result, base_result, comparison, None, base_sigs, signatures
            )
            if comparison.divergence is not None:
                verdict.diagnosis = diagnose(comparison, _steps(base_sigs), _steps(signatures))
            outcome.verdicts.append(verdict)
            if not comparison.equal:
                for other in jobs:
                    if other.role == "teeth":
                        cancel(other)
            if comparison.divergence is not None and base_name not in diverged:
                # Blame the resume only if training is deterministic without one.
                diverged.add(base_name)
                jobs.append(_Job(plan.controls[base_name], "control", base_name))
        elif job.role == "teeth":
            check = compare_runs(
                base_sigs,
                signatures,
                split,
                spec.steps,
                spec.tolerance,
                user_only=True,
                skip_steps=1,
            )
            if check.equal:
                outcome.toothless = check
        elif job.role == "control":
            check = compare_runs(base_sigs, signatures, 0, spec.steps, spec.tolerance)
            if not check.equal and outcome.nondeterministic is None:
                outcome.nondeterministic = check

    def cancel(job: _Job) -> None:
        if job.handle is not None:
            job.handle.kill()
        job.done = True

    def watcher(job: _Job) -> StepWatcher:
        if job.watcher is None:
            job.watcher = StepWatcher(job.planned.spec.run_dir, job.planned.spec.world_size)
        return job.watcher

    def progress(job: _Job, event: str) -> None:
        if on_progress is None:
            return
        spec = job.planned.spec
        watcher(job).refresh()
        recorded = watcher(job).lowest
        elapsed = time.monotonic() - job.began if job.began else 0.0
        on_progress(
            f"{spec.name} ({job.role}, {spec.world_size} ranks): {event}, "
            f"step {recorded}/{spec.context['steps']} recorded on every rank, {elapsed:.1f}s"
        )

    last_report = time.monotonic()

    try:
        while not all(job.done for job in jobs):
            active = [j for j in jobs if j.handle is not None and not j.done]
            for job in jobs:
                if job.done or job.handle is not None:
                    continue
                if len(active) >= parallel + prefetch:
                    break
                if sum(not j.handle.running for j in active) >= prefetch and not (
                    ready(job) and len(active) < parallel
                ):
                    break
                handle = start(job.planned, True)
                if handle is None:
                    break
                job.handle = handle
                job.began = time.monotonic() if handle.running else 0.0
                active.append(job)
            running = sum(1 for j in active if j.handle.running)
            for job in active:
                if not job.handle.running and ready(job) and running < parallel:
                    job.handle.open_gate()
                    job.began = time.monotonic()
                    running += 1
                    progress(job, "running")
            if on_progress is not None and time.monotonic() - last_report > progress_every:
                last_report = time.monotonic()
                for job in active:
                    if job.handle.running and not job.done:
                        progress(job, "running")
            progressed = False
            for job in active:
                if job.done or not job.handle.running:
                    continue
                result = job.handle.poll()
                kill_after = job.planned.kill_after
                if result is None and kill_after is not None:
                    if watcher(job).recorded_through(kill_after):
                        job.handle.kill()  # SIGKILL: the interruption this launch is for
                        result = job.handle.poll()
                        if result is not None:
                            result.killed_on_purpose = kill_after
                if result is not None:
                    progress(job, "ok" if result.ok else "ended")
                    finish(job, result)
                    progressed = True
            if not progressed:
                time.sleep(poll_interval)
    finally:
        for job in jobs:
            if job.handle is not None:
                job.handle.kill()
    outcome.verdicts.sort(key=lambda v: v.split)
    return outcome


def _base_name(planned: PlannedLaunch) -> str:
    assert planned.baseline is not None
    return planned.baseline.spec.name


def _steps(signatures: dict[int, Signature]) -> dict[int, dict[int, dict[str, Any]]]:
    return {rank: sig.by_step() for rank, sig in signatures.items()}
