"""The resume check, one per split: the launch resumed from the checkpoint saved at the split
against the uninterrupted launch, on every rank, at every step after the split.

`judge_resume` is the whole judgement of one resume (compare, account, diagnose), pure, so
the offline `compare` judges a pair of kept run directories exactly as the test did.
"""

from __future__ import annotations

import os
from typing import Optional

from ..compare.comparators import Comparator, Run
from ..compare.diff import Comparison, format_comparison
from ..compare.gate import gate
from ..compare.loaded_step import loaded_step
from ..compare.noise import NoiseFacts
from ..compare.streams import same_streams
from ..diagnose import Diagnosis, diagnose_resume
from ..diagnose.classes import FRESH_PROCESS
from ..diagnose.evidence import touches
from ..diagnose.preflight import PreflightFacts, preflight_of
from ..errors import ResumeEquivError
from ..plan import PlannedLaunch, Planner
from ..rank.layout import AUTO, is_audit_key, section_of, target_file, watched_subject
from .base import Check, Judging, Outcome, Verdict
from .launches import resumed_from, source_of, uninterrupted_of
from .within_noise import rejudge


def format_diagnosis(diag: Diagnosis) -> list[str]:
    lines = [f"  likely cause ({diag.bug_class}): {diag.text()}"]
    lines += [f"  note: {note}" for note in diag.notes]
    return lines


def latent_warning(cmp: Comparison) -> str:
    """What a comparison let pass as latent (a stream nothing draws from), in words."""
    if not cmp.latent:
        return ""
    return (
        f"split {cmp.split}: {', '.join(cmp.latent[:4])} differ after the resume, but no "
        "compared step draws from them, so no recorded value changed: a latent difference "
        "(not restored, or restored from another state) that a longer run would see; restore "
        "it, or pass --resume-equiv-strict-latent to fail on it"
    )


def judge_resume(
    reference: Run,
    run: Run,
    split: int,
    comparator: Comparator,
    check: str,
    label: str,
    source: Optional[Run] = None,
) -> Verdict:
    """A resumed run against the run it must equal: the resume point gated exactly against
    the launch that wrote the checkpoint (`source`, when not the uninterrupted `reference`),
    the comparison of every later step, their facts (the data accounting) and the likely
    cause of a difference. A generator stream both runs hold in the same state under two names
    (made on two lines) is one stream (`same_streams`)."""
    run = same_streams(reference, run)
    source = same_streams(reference, source) if source is not None else None
    cmp = comparator.compare(reference, run, split)
    rules = comparator.rules
    held = gate(reference, source, run, split, rules)
    loaded = loaded_step(reference, run, split, source, held.held)
    verdict = Verdict(
        check,
        "passed" if cmp.equal and not held.failed and loaded is None else "failed",
        label,
        split,
        comparison=cmp,
        facts=[held] if loaded is None else [loaded, held],
        primary=True,
        signatures=(reference, run),
    )
    # against the uninterrupted run too, when the gate held against the launch that wrote it
    wrote = source is not None and held.held and not cmp.equal
    writer = gate(reference, None, run, split, rules) if wrote else None
    verdict.diagnosis = diagnose_resume(cmp, reference, run, held, writer)
    div = cmp.divergence
    if div is not None and is_audit_key(div.key):
        verdict.values_match = comparator.compare(reference, run, split, user_only=True).equal
    return verdict


def saved_again(signatures: Run, split: int, checkpoint: Optional[str]) -> str:
    """A warning when the run that saved the checkpoint at `split` wrote to it again later
    (its file events say so): the resumed run may load the later save."""
    if not checkpoint:
        return ""
    path = os.path.realpath(checkpoint)
    for rank, sig in sorted(signatures.items()):
        for event in sig.files:
            if (event.get("after_step") or 0) > split and touches(event, path):
                return (
                    f"split {split}: the run that saved {checkpoint} at step {split} wrote to it "
                    f"again after step {event['after_step']} (rank {rank}: {event['op']}): the "
                    "resumed run may load that later save; put {split} in the path the trainer "
                    'saves to, or use interrupt="stop"'
                )
    return ""


def wrote_what_it_loaded(signatures: Run, name: str) -> str:
    """A warning when a resumed launch wrote over (or deleted) a checkpoint file it had
    loaded: every launch that resumes from that checkpoint after it (the teeth check, other
    tests sharing the uninterrupted launch) loads what it wrote instead."""
    for rank, sig in sorted(signatures.items()):
        loaded = {
            os.path.realpath(path)
            for entry in sig.restores
            if (path := target_file(str(entry.get("what", "")))) is not None
        }
        for event in sig.files:
            if event.get("path") in loaded or event.get("to") in loaded:
                return (
                    f"the launch {name!r} wrote to a checkpoint file it had loaded (rank {rank}: "
                    f"{event['op']}({event['path']}) after step {event.get('after_step')}): "
                    "launches that resume from that checkpoint after it (the teeth check, other "
                    "tests sharing the uninterrupted launch) load what it wrote; let the resumed "
                    "run save under its own {run_dir}"
                )
    return ""


def went_past(signatures: Run, split: int, name: str) -> str:
    """A warning when the launch that should stop at the split (interrupt="stop") trained on."""
    last = max((step for sig in signatures.values() for step, _ in sig.steps), default=0)
    if last <= split:
        return ""
    return (
        f'split {split}: the launch {name!r} (interrupt="stop") should end at step {split} but '
        f"recorded up to step {last}: its command ignores {{steps}} (which is the split in that "
        "launch); pass {steps} to the trainer's step limit (or read ctx.steps), so the "
        "checkpoint is the last thing it does"
    )


def recorded_automatically(runs: list[Run], split: int) -> list[str]:
    """What automatic recording recorded in runs with no call in the trainer: the `auto:` keys
    every run recorded at every step after `split` on every rank (a key one run could not
    record is no comparison), and the watched objects it found itself, in the order the
    audit names them."""
    steps = [values for run in runs for sig in run.values() for s, values in sig.steps if s > split]
    keys = {k for values in steps for k in values if section_of(k) == AUTO}
    found = {watched_subject(n) for run in runs for sig in run.values() for n in sig.found}
    return sorted(k for k in keys if all(k in values for values in steps)) + sorted(found)


def compared_words(verdict: Verdict) -> str:
    """The comparison in words; where the steps matched and the verdict failed all the same,
    what failed, so that a failure never reads "equal" alone."""
    cmp = verdict.comparison
    assert cmp is not None
    text = format_comparison(cmp, verdict.label)
    if verdict.failed and cmp.divergence is None and not cmp.problems:
        failed = [
            f.words()
            for f in verdict.every_fact
            if getattr(f, "failed", False) and hasattr(f, "words")
        ]
        text += ", but the test fails: " + ("; ".join(failed) or "see above")
    return text


def one_sided_warning(cmp: Comparison) -> str:
    """Automatic keys one run recorded and the other never could, in words."""
    if not cmp.one_sided:
        return ""
    return (
        f"split {cmp.split}: {', '.join(cmp.one_sided[:4])} recorded, while the other run "
        "recorded none at any compared step: its recorder saw no such input there (no "
        "DataLoader batch, or a forward whose inputs it cannot read), so it was not compared"
    )


def nothing_trains(signatures: Run) -> str:
    """A warning when the uninterrupted run changes nothing: every recorded value is the same
    at every step, or the watched parameters never change. Such a test proves little."""
    for rank, sig in sorted(signatures.items()):
        steps = [values for _, values in sig.steps]
        if len(steps) < 2:
            continue
        user = {k for values in steps for k in values if not is_audit_key(k)}
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


class ResumeLike(Check):
    """A resume the test proves: what its verdict reads like (resume, chain link, topology)."""

    def __init__(self, split: int, reference: PlannedLaunch, resumed: PlannedLaunch) -> None:
        source = resumed.source
        others = [source] if source is not None and source is not reference else []
        super().__init__([reference, resumed, *others])
        self.split = split
        self.reference = reference
        self.resumed = resumed

    def on_done(self, launch: PlannedLaunch, judge: Judging) -> None:
        if launch is self.reference:
            judge.warn(nothing_trains(judge.signatures(launch)))
        if launch is self.resumed.source:
            self.warn_about_source(launch, judge)
        if launch is self.resumed:
            judge.warn(wrote_what_it_loaded(judge.signatures(launch), launch.name))
            self.judged(judge, *self.judge(judge))

    def warn_about_source(self, launch: PlannedLaunch, judge: Judging) -> None:
        """What the launch that saved the checkpoint did that may spoil it: saved to it again
        later, or went on past the split where it should have stopped. Best effort: a launch
        killed before it wrote its signature is the resumed launch's to report."""
        try:
            signatures = judge.signatures(launch)
        except ResumeEquivError:
            return
        judge.warn(saved_again(signatures, self.split, self.resumed.spec.context.checkpoint))
        stops = launch is not self.reference and launch.role == "interrupted"
        if stops and not launch.kill_after:
            judge.warn(went_past(signatures, self.split, launch.name))

    def judge(self, judge: Judging) -> tuple[Verdict, dict[str, str]]:
        """The resumed launch finished: its verdict, and the run directories it was compared
        with besides the uninterrupted one."""
        raise NotImplementedError

    def source(self, judge: Judging) -> Optional[Run]:
        """The signatures of the launch that wrote the checkpoint, when it is not the
        uninterrupted one (the interrupted launch, a chain's link before)."""
        source = self.resumed.source
        if source is None or source is self.reference:
            return None
        return judge.signatures(source)

    def judged(self, judge: Judging, verdict: Verdict, runs: dict[str, str]) -> None:
        """Fill in where the judged runs are (`runs`: others it was compared with), note what
        was let pass, and reach `verdict`."""
        result = judge.result(self.resumed)
        verdict.launch, verdict.rerun = self.resumed.name, result.command
        verdict.runs = {
            "uninterrupted": self.reference.spec.run_dir,
            "resumed": self.resumed.spec.run_dir,
            **runs,
        }
        verdict.link = self.resumed.link
        if verdict.diagnosis is not None and verdict.diagnosis.bug_class == FRESH_PROCESS:
            verdict.facts.append(self.preflight(judge))
        cmp = verdict.comparison
        if cmp is not None:
            run = judge.signatures(self.resumed)
            judge.note_ignored([n for sig in run.values() for n in sig.ignored] + cmp.ignored)
            reference = judge.signatures(self.reference)
            judge.note_automatic(recorded_automatically([reference, run], self.split))
            judge.warn(latent_warning(cmp))
            judge.warn(one_sided_warning(cmp))
        self.reach(judge, verdict)
        for other in judge.verdicts():  # noise measured before this resume finished
            self.on_verdict(other, judge)

    def noise_for(self, verdict: Verdict) -> Optional[NoiseFacts]:
        """The noise `verdict` measured for this resume, if it did: its uninterrupted run's
        (the determinism control), or its own resumed process's (the repeat)."""
        if verdict.check == "control" and verdict.status == "passed":
            ours = verdict.runs.get("uninterrupted", self.reference.spec.run_dir)
            if ours != self.reference.spec.run_dir:
                return None
        elif not (verdict.check == "repeat" and verdict.split == self.split):
            return None
        return next((f for f in verdict.facts if isinstance(f, NoiseFacts)), None)

    def on_verdict(self, verdict: Verdict, judge: Judging) -> None:
        """Measured noise arrived: a failed exact judgement is judged again within it."""
        mine = self.verdict
        if mine is None or not mine.failed or judge.settings.noise == "off":
            return
        noise = self.noise_for(verdict)
        if noise is None or (noise.source == "uninterrupted" and not noise.noisy):
            return
        reference, run = judge.signatures(self.reference), judge.signatures(self.resumed)
        again = rejudge(mine, noise, reference, run, judge.rules)
        if again is not mine:
            again.facts = [*again.facts, self.preflight(judge)]
            self.reach(judge, again)

    def preflight(self, judge: Judging) -> PreflightFacts:
        """What the launches it compared recorded of their determinism knobs."""
        names = (self.reference, self.resumed)
        return preflight_of({p.name: judge.signatures(p) for p in names})

    @classmethod
    def headline(cls, verdict: Verdict) -> list[str]:
        summary = [line for item in verdict.every_fact for line in item.summary(verdict.label)]
        if summary:
            return summary
        assert verdict.comparison is not None
        return [compared_words(verdict).splitlines()[0]]

    @classmethod
    def proved(cls, verdict: Verdict) -> str:
        if verdict.status == "abstained":
            return f"{verdict.label} abstained ({verdict.why})"
        if not verdict.equal or verdict.comparison is None or verdict.failed:
            return ""
        steps = verdict.comparison.compared_steps
        return f"{verdict.label} equal over {steps} steps" + (
            f" ({verdict.why})" if verdict.why else ""
        )

    @classmethod
    def block(cls, verdict: Verdict, outcome: Outcome, kept: str) -> list[str]:
        """Which samples first (another batch explains other values), the first divergence
        with its context, and the likely cause (withheld when training is not deterministic
        even without a resume)."""
        cmp = verdict.comparison
        assert cmp is not None
        lines = [line for item in verdict.every_fact for line in item.lines(verdict.label)]
        lines.append(compared_words(verdict))
        div = cmp.divergence
        if verdict.values_match and div is not None:
            lines.append(
                f"  every value you recorded matches through step {cmp.steps}; the audited "
                f"{div.key} differs from step {div.step} on, so whatever draws from it or is "
                "computed from it later will differ"
            )
        if verdict.diagnosis is not None and getattr(outcome, "nondeterministic", None) is None:
            lines += format_diagnosis(verdict.diagnosis)
        return lines


class Resume(ResumeLike):
    """A resume on the uninterrupted run's own topology, not in a chain."""

    kind = "resume"

    @classmethod
    def plan(cls, planner: Planner) -> list[Check]:
        marker = planner.marker
        if marker.chain or marker.topology_changes or marker.interrupt == "crash":
            return []  # the chain, topology and crash checks plan those resumes
        checks: list[Check] = []
        for split in marker.splits:
            full = uninterrupted_of(planner, split)
            resumed = resumed_from(planner, split, full, source_of(planner, split))
            checks.append(cls(split, full, resumed))
        return checks

    def judge(self, judge: Judging) -> tuple[Verdict, dict[str, str]]:
        reference, run = judge.signatures(self.reference), judge.signatures(self.resumed)
        label, source = f"split {self.split}", self.source(judge)
        verdict = judge_resume(
            reference, run, self.split, judge.comparator, self.kind, label, source
        )
        return verdict, {}
