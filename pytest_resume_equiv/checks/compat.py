"""Checkpoint compatibility (`golden_checkpoint=True`): the current code resumes from the
checkpoint the golden holds (written by the code that made the golden: the previous release,
the commit before a refactor), and must give the golden trajectory. A loader that skips a
renamed key, or a dropped field that falls back to a default, passes a resume test of its
own checkpoints and fails here, with the resume point's diagnosis.

The stored checkpoint is copied into the launch's own directory before it runs (the store is
never written by a test) and only the user's trainer opens it.

`--resume-equiv-golden-only`: for a test whose golden holds its checkpoints, these launches
are the whole test (one launch per split, no uninterrupted run).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from typing import Optional

from ..compare.gate import GateFacts
from ..errors import ResumeEquivError
from ..golden import Golden
from ..plan import PlannedLaunch, Planner
from .base import Check, Judging, Outcome, Verdict
from .golden import read_golden
from .launches import uninterrupted_of
from .resume import ResumeLike, judge_resume

LABEL = "checkpoint compatibility"
GOLDEN_RUN = "the golden run (it wrote the stored checkpoint)"


def stored_golden(planner: Planner) -> Optional[Golden]:
    """The test's golden when it is to resume its checkpoints: a normal (not update) run of a
    `golden_checkpoint=True` test whose golden exists."""
    target = planner.golden
    if target is None or target.update or not planner.marker.golden_checkpoint:
        return None
    marker = planner.marker
    if marker.topology_changes or marker.chain:
        raise ResumeEquivError(
            "golden_checkpoint=True resumes on the uninterrupted topology and not in a chain "
            "(drop resume_nproc/resume_nnodes/chain, or golden_checkpoint)"
        )
    return target.load()


def golden_only(planner: Planner) -> bool:
    """`--resume-equiv-golden-only` applies: the golden holds a checkpoint for every split."""
    target = planner.golden
    if target is None or not target.only:
        return False
    golden = stored_golden(planner)
    return golden is not None and all(golden.checkpoint(s) for s in planner.marker.splits)


def stage(planner: Planner, golden: Golden, split: int, name: str) -> PlannedLaunch:
    """A resumed launch from the golden's checkpoint at `split`, copied first to where the
    checkpoint template puts it for a source directory of the test's own."""
    stored = golden.checkpoint(split)
    assert stored is not None
    source_dir = os.path.join(planner.root, f"{name}-source")
    source = planner.saving(f"{name}-source", "golden", [split], source_dir, planner.marker.steps)
    launch = planner.resuming(name, "compat", split, source, source, phase="resumed")
    launch.reference = launch.source = None  # the golden: nothing to wait for
    path = os.path.abspath(launch.checkpoint or "")
    if os.path.commonpath([path, os.path.abspath(source_dir)]) != os.path.abspath(source_dir):
        raise ResumeEquivError(
            f"golden_checkpoint=True copies the stored checkpoint to where checkpoint= puts it, "
            f"and {planner.checkpoint!r} is not under {{run_dir}} (it fills to {path}): put "
            "the checkpoint in the run directory, e.g. '{run_dir}/checkpoints/step_{split}'"
        )
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if os.path.isdir(stored):
        shutil.copytree(stored, path, symlinks=True, dirs_exist_ok=True)
    else:
        shutil.copyfile(stored, path)
    return planner.once(name, lambda: launch)


class Compat(Check):
    kind = "compat"
    label = LABEL

    def __init__(
        self, split: int, golden: Golden, launch: Optional[PlannedLaunch], only: bool, why=""
    ) -> None:
        super().__init__([launch] if launch is not None else [])
        self.split, self.golden, self.launch, self.only = split, golden, launch, only
        self.missing = why

    @classmethod
    def plan(cls, planner: Planner) -> list[Check]:
        golden = stored_golden(planner)
        if golden is None:
            return []  # no golden: the trajectory check says so
        only = golden_only(planner)
        if not only:
            uninterrupted_of(planner, planner.marker.splits[0])  # started first, as before
        checks: list[Check] = []
        for split in planner.marker.splits:
            if golden.checkpoint(split) is None:
                have = ", ".join(map(str, sorted(golden.meta.checkpoints))) or "none"
                why = (
                    f"the golden holds no checkpoint at split {split} (it has: {have}); run "
                    "with --resume-equiv-update-golden"
                )
                checks.append(cls(split, golden, None, only, why))
                continue
            launch = stage(planner, golden, split, f"golden-resumed-split{split}")
            checks.append(cls(split, golden, launch, only))
        return checks

    def on_done(self, launch: PlannedLaunch, judge: Judging) -> None:
        reference = read_golden(self.golden, self.golden.meta.world_size)
        run = judge.signatures(launch)
        label = f"{LABEL}, split {self.split}"
        verdict = judge_resume(reference, run, self.split, judge.comparator, self.kind, label)
        verdict.facts = [
            dataclasses.replace(f, reference=GOLDEN_RUN) if isinstance(f, GateFacts) else f
            for f in verdict.facts
        ]
        verdict.primary = self.only
        verdict.why = ("golden-only: " if self.only else "") + (
            f"the checkpoint was {self.golden.meta.written_by()}"
        )
        verdict.launch, verdict.rerun = launch.name, judge.result(launch).command
        verdict.runs = {"golden": self.golden.path, "resumed": launch.spec.run_dir}
        self.reach(judge, verdict)

    def final(self) -> Optional[Verdict]:
        if self.verdict is not None or not self.missing:
            return self.verdict
        verdict = Verdict(self.kind, "failed", f"{LABEL}, split {self.split}", self.split)
        verdict.why, verdict.primary = self.missing, self.only
        verdict.runs = {"golden": self.golden.path}
        return verdict

    @classmethod
    def headline(cls, verdict: Verdict) -> list[str]:
        if verdict.comparison is None:
            return [f"{verdict.label} {verdict.status}: {verdict.why}"]
        return [f"{line} ({verdict.why})" for line in ResumeLike.headline(verdict)[:1]]

    @classmethod
    def proved(cls, verdict: Verdict) -> str:
        return f"{verdict.label} {verdict.status} ({verdict.why})"

    @classmethod
    def head(cls, verdict: Verdict, outcome: Outcome) -> list[str]:
        """Beside a failed resume, this failure opens the report (it is not a resume's)."""
        if not verdict.failed:
            return []
        if verdict.primary:  # golden-only: no uninterrupted run to be equivalent to
            return ["resumed from the golden's checkpoint, the run is not the golden trajectory"]
        return cls.block(verdict, outcome, "kept")

    @classmethod
    def block(cls, verdict: Verdict, outcome: Outcome, kept: str) -> list[str]:
        if verdict.comparison is None:
            return [f"{verdict.label}: {verdict.why}"]
        why = verdict.why.removeprefix("golden-only: ")
        lines = [
            f"{verdict.label}: the current code resumed from the golden's checkpoint ({why}) "
            "and does not continue the golden trajectory: a checkpoint the previous code "
            "wrote does not load as it was saved"
        ]
        for line in ResumeLike.block(verdict, outcome, kept):
            lines.append(line.replace("[- uninterrupted]", "[- golden]       "))
        lines.append(f"  golden: {verdict.runs.get('golden', '')}")
        if not verdict.primary:  # a resume's report names its runs and the rerun line itself
            lines += [
                f"  resumed: {verdict.runs.get('resumed', '')} ({kept})",
                f"  rerun the resumed launch by hand:\n    {verdict.rerun}",
            ]
        return lines

    @classmethod
    def words(cls, verdict: Verdict) -> str:
        first = verdict.first_difference()
        return f"{verdict.label}: {first or verdict.why}"
