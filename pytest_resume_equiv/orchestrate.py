"""The roles of a resume test's launches, and what each finished launch means.

`run_plan` hands the plan to the scheduler and a `Judge` whose handlers say what each result
means: `on_uninterrupted_done` checks the checkpoints and decides whether the teeth check can
matter, `on_resumed_done` compares and diagnoses (and asks for the determinism control after
a divergence), `on_teeth_done` and `on_control_done` judge those checks. Each handler reads
only its job, its result and the signatures already read, so it is tested without torchrun.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable, Optional

from .accounting import DataAccount, account
from .compare import Comparison, compare_runs, is_audit_key
from .diagnose import Diagnosis, diagnose
from .errors import ResumeEquivError
from .launch import LaunchResult
from .plan import PlannedLaunch, ResumePlan
from .rank.layout import PLUGIN_FILES, RANK_DIRS
from .schedule import Job, Scheduler
from .settings import TestSettings
from .signature import Signature, SignatureError, read_run
from .topology import TopologyCheck, compare_topology, topology_diagnosis

Signatures = dict[int, Signature]


@dataclass
class SplitVerdict:
    split: int
    launch: LaunchResult
    uninterrupted: LaunchResult
    comparison: Comparison
    diagnosis: Optional[Diagnosis] = None
    uninterrupted_signatures: Signatures = field(default_factory=dict)
    signatures: Signatures = field(default_factory=dict)
    """Both runs' signatures as compared (for plots and reports, without reading them again)."""
    values_match: bool = False
    """Only audited state differs: every value the user recorded matched at every step."""
    data: list[DataAccount] = field(default_factory=list)
    """The samples the resumed run consumed against the uninterrupted run's (per id key)."""
    link: int = 0
    """chain=True: which resume of the chain (1, 2, ...); 0 outside a chain."""
    topology: Optional[TopologyCheck] = None
    """A resume on another topology: what it was held to (data, envelopes) and how it did."""
    direct: Optional[Comparison] = None
    """A chain link that diverged: a resume from the uninterrupted run's checkpoint at the
    same split, compared with the uninterrupted run (None when it did not run)."""


@dataclass
class TeethCheck:
    """Whether the test can catch an RNG resume bug at all."""

    status: str
    """"planned" (not run yet), "passed" (mutating the RNG changed the recorded values),
    "failed" (they still matched: the test has no teeth), "skipped" (it could not matter),
    "off" (not planned), "cancelled" (a resume diverged: the verdict is failed anyway)."""
    why: str = ""
    comparison: Optional[Comparison] = None


@dataclass
class ResumeOutcome:
    plan: ResumePlan
    launches: list[LaunchResult] = field(default_factory=list)
    verdicts: list[SplitVerdict] = field(default_factory=list)
    teeth: TeethCheck = field(default_factory=lambda: TeethCheck("planned"))
    nondeterministic: Optional[Comparison] = None
    """Set when a second uninterrupted launch differed from the first."""
    warnings: list[str] = field(default_factory=list)
    """What the author should know though it does not fail the test (latent streams, a
    training that changes nothing)."""
    ignored: list[str] = field(default_factory=list)
    """Audited items left out of the comparison (`ignore=`, `track(..., ignore=True)`)."""

    @property
    def resume_equal(self) -> bool:
        return bool(self.verdicts) and all(v.comparison.equal for v in self.verdicts)

    @property
    def equal(self) -> bool:
        """The test passes: every resume matched and the test has teeth."""
        return self.resume_equal and self.teeth.status != "failed"


class LaunchFailed(ResumeEquivError):
    def __init__(self, result: LaunchResult, role: str, note: str = "") -> None:
        super().__init__(f"the {result.spec.name} launch failed")
        self.result = result
        self.role = role
        self.note = note
        """What the plugin knows about why (e.g. its checkpoint came from a killed launch)."""


def read_signatures(result: LaunchResult) -> Signatures:
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


def rng_advances_after(signatures: Signatures, split: int) -> bool:
    """Whether any audited RNG stream moves after the first resumed step on some rank: if none
    does, an RNG restore bug cannot change the run, and a mutation could not either."""
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


def nothing_trains(signatures: Signatures) -> str:
    """A warning when the uninterrupted run changes nothing: every recorded value is the same
    at every step, or the watched parameters never change. Such a test proves little."""
    for rank, sig in sorted(signatures.items()):
        steps = [values for _, values in sig.steps]
        if len(steps) < 2:
            continue
        user = {k for values in steps for k in values if ":" not in k}
        params = {k for values in steps for k in values if k.endswith(".params")}
        if user and all(len({repr(v.get(k)) for v in steps}) == 1 for k in user):
            return (
                f"rank {rank}: every value the uninterrupted run recorded ({', '.join(sorted(user))}) "
                "is the same at every step: nothing trains, and a resume test of it proves little"
            )
        if params and all(len({repr(v.get(k)) for v in steps}) == 1 for k in params):
            return (
                f"rank {rank}: the watched parameters never change in the uninterrupted run: "
                "nothing trains, and a resume test of it proves little"
            )
    return ""


def missing_checkpoint(planned: PlannedLaunch, source: LaunchResult) -> str:
    """Why `planned` cannot run: the checkpoint it loads was not written; what was."""
    assert planned.source is not None and planned.checkpoint is not None
    source_dir = planned.source.spec.run_dir
    found = []
    for dirpath, dirnames, filenames in os.walk(source_dir):
        dirnames[:] = [d for d in dirnames if d not in RANK_DIRS]
        filenames = [f for f in filenames if dirpath != source_dir or f not in PLUGIN_FILES]
        for entry in sorted(dirnames + filenames):
            found.append(os.path.relpath(os.path.join(dirpath, entry), source_dir))
    listing = ", ".join(sorted(found)[:12]) or "nothing but the plugin's own files"
    split = planned.splits[0]
    template = planned.source.spec.context.checkpoint_template
    if source.killed_after_step:
        who = (
            f"the interrupted run (SIGKILLed once every rank had recorded step "
            f"{source.killed_after_step}, interrupt='kill')"
        )
        advice = (
            "a checkpoint must be complete on disk before training goes on past it; one "
            "written in the background can be lost or torn when the job dies"
        )
    elif planned.source.role == "interrupted":
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


KILLED_SOURCE_NOTE = (
    "the checkpoint it loads was written by a launch SIGKILLed once every rank had recorded "
    "step {step} (interrupt='kill'): a checkpoint must be complete on disk before training "
    "goes on past it; one written in the background can be missing or torn when the job dies"
)


class Judge:
    """The handlers: what each finished launch means, and which launches follow from it."""

    def __init__(
        self,
        plan: ResumePlan,
        settings: TestSettings,
        scheduler: Scheduler,
        outcome: Optional[ResumeOutcome] = None,
    ) -> None:
        self.plan = plan
        self.settings = settings
        self.scheduler = scheduler
        self.outcome = outcome if outcome is not None else ResumeOutcome(plan)
        if plan.teeth is None:
            self.outcome.teeth = TeethCheck("off", plan.teeth_off)
        self.uninterrupted: dict[str, tuple[LaunchResult, Signatures]] = {}
        self.envelopes: dict[str, Signatures] = {}
        """Uninterrupted launches on the resumed topology, by name."""
        self.killed_after: dict[str, int] = {}
        self.controlled: set[str] = set()
        """Uninterrupted launches whose determinism control was asked for."""
        for planned in [*plan.launches, *([plan.teeth] if plan.teeth else [])]:
            scheduler.add(planned)

    def on_done(self, job: Job, result: LaunchResult) -> None:
        """Dispatch on the launch's role, after the checks every launch gets."""
        planned = job.planned
        self.outcome.launches.append(result)
        if not result.ok and not result.killed_after_step:
            source = planned.source
            killed = self.killed_after.get(source.name, 0) if source is not None else 0
            note = KILLED_SOURCE_NOTE.format(step=killed) if killed else ""
            raise LaunchFailed(result, planned.role, note)
        handler: Callable[[PlannedLaunch, LaunchResult], None] = getattr(
            self, f"on_{planned.role}_done"
        )
        handler(planned, result)

    def _check_checkpoints(self, source: PlannedLaunch, result: LaunchResult) -> None:
        """Before any launch loads a checkpoint `source` wrote, it must exist."""
        for resumed in [*self.plan.resumed, *([self.plan.teeth] if self.plan.teeth else [])]:
            if resumed.source is source and not os.path.exists(resumed.checkpoint or ""):
                raise ResumeEquivError(missing_checkpoint(resumed, result))

    def on_interrupted_done(self, planned: PlannedLaunch, result: LaunchResult) -> None:
        if result.killed_after_step:
            self.killed_after[planned.name] = result.killed_after_step
        self._check_checkpoints(planned, result)

    def on_uninterrupted_done(self, planned: PlannedLaunch, result: LaunchResult) -> None:
        self._check_checkpoints(planned, result)
        signatures = read_signatures(result)
        self.uninterrupted[planned.name] = (result, signatures)
        idle = nothing_trains(signatures)
        if idle:
            self._warn(idle)
        teeth = self.plan.teeth
        if teeth is not None and teeth.uninterrupted is planned:
            if not rng_advances_after(signatures, teeth.splits[0]):
                self._teeth_done(
                    "skipped",
                    "no audited RNG stream advances after the split: nothing random for a "
                    "resume to get wrong",
                )

    def on_topology_done(self, planned: PlannedLaunch, result: LaunchResult) -> None:
        self.envelopes[planned.name] = read_signatures(result)

    def on_resumed_done(self, planned: PlannedLaunch, result: LaunchResult) -> None:
        assert planned.uninterrupted is not None
        self._check_checkpoints(planned, result)  # a chain's next link loads its checkpoint
        base_result, base = self.uninterrupted[planned.uninterrupted.name]
        signatures = read_signatures(result)
        split = planned.splits[0]
        if planned.envelope is not None:
            verdict = self._on_other_topology(planned, result, base_result, base, signatures)
        else:
            verdict = self._compare(result, base_result, base, signatures, split)
        verdict.link = planned.link
        self.outcome.verdicts.append(verdict)
        comparison = verdict.comparison
        if not comparison.equal:
            self._teeth_done("cancelled", f"the resume from step {split} diverged")
            if planned.name in self.plan.direct:
                self.scheduler.add(self.plan.direct[planned.name])
        name = planned.uninterrupted.name
        if comparison.divergence is not None and name not in self.controlled:
            # Blame the resume only if training is deterministic without one.
            self.controlled.add(name)
            self.scheduler.add(self.plan.controls[name])

    def _compare(
        self,
        result: LaunchResult,
        base_result: LaunchResult,
        base: Signatures,
        signatures: Signatures,
        split: int,
    ) -> SplitVerdict:
        """A resume on the uninterrupted run's own topology: every rank, value by value."""
        marker = self.settings.marker
        ignore = (*marker.ignore, *[n for sig in signatures.values() for n in sig.ignored])
        comparison = compare_runs(
            base,
            signatures,
            split,
            marker.steps,
            marker.tolerance,
            ignore=ignore,
            strict_latent=self.settings.strict_latent,
        )
        self._note(comparison, split, signatures)
        verdict = SplitVerdict(split, result, base_result, comparison, None, base, signatures)
        verdict.data = account(base, signatures, split, marker.steps)
        verdict.diagnosis = diagnose(comparison, base, signatures)
        if comparison.divergence is not None:
            if is_audit_key(comparison.divergence.key):
                values = compare_runs(base, signatures, split, marker.steps, user_only=True)
                verdict.values_match = values.equal
        return verdict

    def _on_other_topology(
        self,
        planned: PlannedLaunch,
        result: LaunchResult,
        base_result: LaunchResult,
        base: Signatures,
        signatures: Signatures,
    ) -> SplitVerdict:
        """A resume on another topology: data exact over the global batch, global values
        within the topology's own noise (`topology.py`)."""
        assert planned.envelope is not None
        marker = self.settings.marker
        split = planned.splits[0]
        other = self.envelopes[planned.envelope.name]
        comparison, check = compare_topology(
            base, other, signatures, split, marker.steps, marker.tolerance
        )
        verdict = SplitVerdict(split, result, base_result, comparison, None, base, signatures)
        verdict.topology, verdict.data = check, check.data
        verdict.diagnosis = topology_diagnosis(comparison, check)
        self._warn(check.unchecked())
        return verdict

    def on_teeth_done(self, planned: PlannedLaunch, result: LaunchResult) -> None:
        assert planned.uninterrupted is not None
        _, base = self.uninterrupted[planned.uninterrupted.name]
        marker = self.settings.marker
        split, signatures = planned.splits[0], read_signatures(result)
        if planned.envelope is not None:
            other = self.envelopes[planned.envelope.name]
            check, _ = compare_topology(
                base, other, signatures, split, marker.steps, marker.tolerance, skip_steps=1
            )
        else:
            check = compare_runs(
                base,
                signatures,
                split,
                marker.steps,
                marker.tolerance,
                user_only=True,
                skip_steps=1,
            )
        if check.equal:
            self.outcome.teeth = TeethCheck(
                "failed", "the recorded values still matched with every RNG stream mutated", check
            )
        else:
            self.outcome.teeth = TeethCheck(
                "passed", "mutating every RNG stream changed the recorded values", check
            )

    def on_direct_done(self, planned: PlannedLaunch, result: LaunchResult) -> None:
        assert planned.uninterrupted is not None
        _, base = self.uninterrupted[planned.uninterrupted.name]
        split, marker = planned.splits[0], self.settings.marker
        for verdict in self.outcome.verdicts:
            if verdict.link and verdict.split == split:
                verdict.direct = compare_runs(
                    base, read_signatures(result), split, marker.steps, marker.tolerance
                )

    def on_control_done(self, planned: PlannedLaunch, result: LaunchResult) -> None:
        assert planned.uninterrupted is not None
        _, base = self.uninterrupted[planned.uninterrupted.name]
        marker = self.settings.marker
        check = compare_runs(base, read_signatures(result), 0, marker.steps, marker.tolerance)
        if not check.equal and self.outcome.nondeterministic is None:
            self.outcome.nondeterministic = check

    def _note(self, cmp: Comparison, split: int, signatures: Signatures) -> None:
        """What the comparison let pass, for the warnings and the report."""
        for name in [n for sig in signatures.values() for n in sig.ignored] + cmp.ignored:
            if name not in self.outcome.ignored:
                self.outcome.ignored.append(name)
        if cmp.latent:
            self._warn(
                f"split {split}: {', '.join(cmp.latent[:4])} differ after the resume, but no "
                "compared step draws from them, so no recorded value changed: a latent "
                "difference (not restored, or restored from another state) that a longer run "
                "would see; restore it, or pass --resume-equiv-strict-latent to fail on it"
            )

    def _warn(self, text: str) -> None:
        if text and text not in self.outcome.warnings:
            self.outcome.warnings.append(text)

    def _teeth_done(self, status: str, why: str) -> None:
        """The teeth check ends without running: it could not matter, or no longer can."""
        if self.plan.teeth is not None and self.outcome.teeth.status == "planned":
            self.scheduler.cancel(self.plan.teeth)
            self.outcome.teeth = TeethCheck(status, why)


def run_plan(
    plan: ResumePlan,
    settings: TestSettings,
    scheduler: Scheduler,
    outcome: Optional[ResumeOutcome] = None,
) -> ResumeOutcome:
    """Run every launch the plan needs and judge them; raises LaunchFailed / ResumeEquivError
    on anything but a comparison. Pass `outcome` to keep what ran so far when it raises."""
    judge = Judge(plan, settings, scheduler, outcome)
    scheduler.run(judge.on_done)
    judge.outcome.verdicts.sort(key=lambda v: v.split)
    return judge.outcome
