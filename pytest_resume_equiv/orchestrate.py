"""Plan and run the launches of one resume test: uninterrupted baseline(s), then one resumed
launch per split, each compared with its baseline on every rank.

The plan is data (`ResumePlan`) so later strategies (shared baselines, concurrent resumes,
extra control launches) change how it is built or run, not what a test sees.
"""

from __future__ import annotations

import inspect
import os
import re
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Union

from .compare import Comparison, compare_runs
from .diagnose import Diagnosis, diagnose
from .launch import LaunchResult, LaunchSpec, Target, launch
from .settings import MarkerSpec
from .signature import Signature, SignatureError, read_run

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


@dataclass
class ResumePlan:
    baselines: list[PlannedLaunch]
    resumed: list[PlannedLaunch]
    controls: dict[str, PlannedLaunch] = field(default_factory=dict)
    """Per baseline, a second uninterrupted launch: run only when a resume diverged, to tell
    a resume bug from training that is not deterministic at all."""
    teeth: Optional[PlannedLaunch] = None
    """A resumed launch that perturbs every RNG stream after its first step (teeth check)."""

    @property
    def launches(self) -> list[PlannedLaunch]:
        return [*self.baselines, *self.resumed]


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

    def baseline_launch(name: str, splits: list[int]) -> tuple[PlannedLaunch, str]:
        run_dir = os.path.join(inputs.root, name)
        values = {**base_values, "split": splits[0], "run_dir": run_dir}
        template = fill(checkpoint, {**values, "split": "{split}"}, "checkpoint=")
        values["checkpoint"] = template.replace("{split}", str(splits[0]))
        args = [fill(a, values, "command argument") for a in argv]
        ctx = context("baseline", run_dir, splits[0], values["checkpoint"], template)
        return PlannedLaunch(make_spec(name, run_dir, args, ctx), tuple(splits)), template

    def resumed_launch(
        phase: str, name: str, split: int, base: PlannedLaunch, template: str
    ) -> PlannedLaunch:
        ckpt = template.replace("{split}", str(split))
        run_dir = os.path.join(inputs.root, name)
        values = {**base_values, "split": split, "run_dir": run_dir, "checkpoint": ckpt}
        args = [fill(a, values, "command argument") for a in argv]
        args += [fill(a, values, "resume_args argument") for a in extra_resume]
        ctx = context(phase, run_dir, split, ckpt, template)
        return PlannedLaunch(
            make_spec(name, run_dir, args, ctx), (split,), baseline=base, checkpoint=ckpt
        )

    for splits in groups.values():
        name = "baseline" if len(groups) == 1 else f"baseline-split{splits[0]}"
        base, template = baseline_launch(name, splits)
        baselines.append(base)
        controls[name] = baseline_launch(f"{name}-control", splits)[0]
        for split in splits:
            resumed.append(
                resumed_launch("resumed", f"resumed-split{split}", split, base, template)
            )
            if teeth is None and inputs.rng_mutation and spec.steps >= split + 2:
                teeth = resumed_launch("mutated", f"teeth-split{split}", split, base, template)
    return ResumePlan(baselines, resumed, controls, teeth)


@dataclass
class SplitVerdict:
    split: int
    launch: LaunchResult
    baseline: LaunchResult
    comparison: Comparison
    diagnosis: Optional[Diagnosis] = None


@dataclass
class ResumeOutcome:
    plan: ResumePlan
    launches: list[LaunchResult] = field(default_factory=list)
    verdicts: list[SplitVerdict] = field(default_factory=list)
    nondeterministic: Optional[Comparison] = None
    """Set when a second uninterrupted launch differed from the first."""
    toothless: Optional[Comparison] = None
    """Set when the teeth check's perturbed run still matched: the test cannot catch RNG bugs."""

    @property
    def resume_equal(self) -> bool:
        return bool(self.verdicts) and all(v.comparison.equal for v in self.verdicts)

    @property
    def equal(self) -> bool:
        """The test passes: every resume matched and the test has teeth."""
        return self.resume_equal and self.toothless is None


class LaunchFailed(ResumeEquivError):
    def __init__(self, message: str, result: LaunchResult) -> None:
        super().__init__(message)
        self.result = result


def read_signatures(result: LaunchResult) -> dict[int, Signature]:
    try:
        return read_run(result.spec.run_dir, result.spec.world_size)
    except SignatureError as exc:
        raise ResumeEquivError(
            f"the {result.spec.name} launch left an unreadable signature: {exc}"
        ) from None


def _missing_checkpoint(planned: PlannedLaunch) -> str:
    assert planned.baseline is not None and planned.checkpoint is not None
    base_dir = planned.baseline.spec.run_dir
    found = []
    for dirpath, dirnames, filenames in os.walk(base_dir):
        dirnames[:] = [d for d in dirnames if d not in ("logs", "pids", "status", "signatures")]
        for entry in sorted(dirnames + filenames):
            found.append(os.path.relpath(os.path.join(dirpath, entry), base_dir))
    listing = ", ".join(sorted(found)[:12]) or "nothing but the plugin's own files"
    split = planned.splits[0]
    return (
        f"the uninterrupted run did not save a checkpoint at {planned.checkpoint} "
        f"(from checkpoint={planned.baseline.spec.context['checkpoint_template']!r}, split={split}); "
        f"the trainer must save there after step {split}, or pass checkpoint= with the path it "
        f"does use. The uninterrupted run directory holds: {listing}"
    )


def execute(
    plan: ResumePlan,
    spec: MarkerSpec,
    run: Callable[[LaunchSpec], LaunchResult] = launch,
    on_launch: Optional[Callable[[LaunchResult], None]] = None,
    parallel: int = 1,
) -> ResumeOutcome:
    """Run the plan; raises LaunchFailed / ResumeEquivError on anything but a comparison.

    `parallel` is how many launches the machine runs at once without slowing each other;
    the teeth check then runs beside the resumed launch of its split.
    """
    outcome = ResumeOutcome(plan)
    lock = threading.Lock()

    def go(planned: PlannedLaunch) -> LaunchResult:
        result = run(planned.spec)
        with lock:
            outcome.launches.append(result)
            if on_launch is not None:
                on_launch(result)
        if not result.ok:
            raise LaunchFailed(f"the {planned.spec.name} launch failed", result)
        return result

    base_results: dict[str, tuple[LaunchResult, dict[int, Signature]]] = {}
    for planned in plan.baselines:
        result = go(planned)
        base_results[planned.spec.name] = (result, read_signatures(result))

    teeth_future: Optional[Future] = None
    with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        for planned in plan.resumed:
            assert planned.baseline is not None and planned.checkpoint is not None
            if not os.path.exists(planned.checkpoint):
                raise ResumeEquivError(_missing_checkpoint(planned))
            if (
                plan.teeth is not None
                and teeth_future is None
                and parallel > 1
                and plan.teeth.splits == planned.splits
            ):
                teeth_future = pool.submit(go, plan.teeth)
            base_result, base_sigs = base_results[planned.baseline.spec.name]
            result = go(planned)
            res_sigs = read_signatures(result)
            split = planned.splits[0]
            comparison = compare_runs(base_sigs, res_sigs, split, spec.steps, spec.tolerance)
            verdict = SplitVerdict(split, result, base_result, comparison)
            if comparison.divergence is not None:
                verdict.diagnosis = diagnose(comparison, _steps(base_sigs), _steps(res_sigs))
            outcome.verdicts.append(verdict)

        if outcome.resume_equal and plan.teeth is not None:
            teeth = plan.teeth
            assert teeth.baseline is not None
            teeth_result = teeth_future.result() if teeth_future is not None else go(teeth)
            base_sigs = base_results[teeth.baseline.spec.name][1]
            check = compare_runs(
                base_sigs,
                read_signatures(teeth_result),
                teeth.splits[0],
                spec.steps,
                spec.tolerance,
                user_only=True,
                skip_steps=1,
            )
            if check.equal:
                outcome.toothless = check
        elif teeth_future is not None:
            teeth_future.cancel()

    if not outcome.resume_equal:
        # Blame the resume only if training is deterministic without one.
        diverged = {
            v.baseline.spec.name for v in outcome.verdicts if v.comparison.divergence is not None
        }
        for name in sorted(diverged):
            control = go(plan.controls[name])
            check = compare_runs(
                base_results[name][1], read_signatures(control), 0, spec.steps, spec.tolerance
            )
            if not check.equal:
                outcome.nondeterministic = check
                break
    return outcome


def _steps(signatures: dict[int, Signature]) -> dict[int, dict[int, dict[str, Any]]]:
    return {rank: sig.by_step() for rank, sig in signatures.items()}
