"""The equivalence check (`@equivalent`): the test's training run as the baseline
configuration and as one variant (another number of ranks, other arguments: accumulation, a
parallelism), every optimizer step compared over the global batch
(`compare/configurations.py`). The baseline is planned like an uninterrupted launch: the
items of one test (and the tests of a session) that run the same baseline share it."""

from __future__ import annotations

import copy
import dataclasses
import os
from typing import Optional

from ..compare.configurations import ConfigurationFacts, compare_configurations
from ..configurations import Configuration
from ..diagnose import Diagnosis, diagnose_configurations
from ..diagnose.classes import DRAWN_BY_CONSTRUCTION
from ..plan import PlannedLaunch, Planner
from .base import Check, Judging, Outcome, Verdict
from .resume import format_diagnosis


def status_of(found: ConfigurationFacts, diagnosis: Optional[Diagnosis]) -> str:
    """passed when equal; abstained when dropout's masks explain the difference (they differ
    by construction); else failed."""
    if found.equal:
        return "passed"
    if diagnosis is not None and diagnosis.bug_class == DRAWN_BY_CONSTRUCTION:
        return "abstained"
    return "failed"


def explained(found: ConfigurationFacts, diagnosis: Optional[Diagnosis], label: str) -> list[str]:
    """What the comparison found, then its likely cause (the report's and `compare`'s)."""
    return [*found.lines(label), *(format_diagnosis(diagnosis) if diagnosis else [])]


def _launch(planner: Planner, name: str, role: str, config: Configuration) -> PlannedLaunch:
    """`config`'s launch of the whole training, saving nothing; a baseline in the session's
    shared directory (its key is what it runs), a variant in the test's own."""
    marker = planner.marker
    own = copy.copy(planner)
    # the baseline is the same launch for every variant: no variant in its values
    own.marker = dataclasses.replace(
        marker,
        nproc=config.nproc,
        nnodes=config.nnodes,
        env=(*marker.env, *config.env),
        configurations=marker.configurations if role != "baseline" else None,
    )
    own.argv = [*planner.argv, *config.args]
    conf = marker.configurations
    assert conf is not None

    def build(run_dir: str) -> PlannedLaunch:
        launch = own.saving(name, role, [0], run_dir, marker.steps, saves=False)
        context = dataclasses.replace(
            launch.spec.context,
            variant="" if role == "baseline" else conf.name,
            args=config.args,
            equivalence=True,
            dropout=conf.dropout,
        )
        launch.spec = dataclasses.replace(launch.spec, context=context)
        return launch

    def planned() -> PlannedLaunch:
        own_dir = os.path.join(planner.root, name)
        if role != "baseline":
            return build(own_dir)
        launch = build(planner.shared_dir(build(own_dir), own_dir))
        launch.shared = planner.shared_root is not None
        return launch

    return planner.once(name, planned)


class Equivalent(Check):
    kind = "equivalent"

    def __init__(self, baseline: PlannedLaunch, variant: PlannedLaunch, name: str) -> None:
        super().__init__([baseline, variant])
        self.baseline, self.variant, self.name = baseline, variant, name
        self.done: set[str] = set()

    @classmethod
    def plan(cls, planner: Planner) -> list[Check]:
        conf = planner.marker.configurations
        if conf is None:
            return []
        baseline = _launch(planner, "baseline", "baseline", conf.baseline)
        variant = _launch(planner, f"variant-{conf.name}", "variant", conf.variant)
        variant.reference = baseline
        return [cls(baseline, variant, conf.name)]

    def on_done(self, launch: PlannedLaunch, judge: Judging) -> None:
        self.done.add(launch.name)
        if self.done != {self.baseline.name, self.variant.name} or self.verdict is not None:
            return
        conf = judge.settings.marker.configurations
        assert conf is not None
        baseline, variant = judge.signatures(self.baseline), judge.signatures(self.variant)
        found = compare_configurations(
            baseline,
            variant,
            judge.settings.marker.steps,
            (conf.baseline.describe(), f"{conf.name} ({conf.variant.describe()})"),
            judge.settings.marker.tolerance,
            judge.settings.marker.ignore,
        )
        diagnosis = diagnose_configurations(found)
        verdict = Verdict(
            self.kind,
            status_of(found, diagnosis),
            f"variant {conf.name}",
            None,  # nothing resumes: no split
            diagnosis=diagnosis,
            facts=[found],
            primary=True,
            launch=self.variant.name,
        )
        if verdict.status == "abstained":
            assert diagnosis is not None  # abstained: dropout's draws explain the difference
            verdict.why = diagnosis.cause
        verdict.signatures = (baseline, variant)  # the plot of both trajectories
        verdict.runs = {
            "baseline": self.baseline.spec.run_dir,
            "variant": self.variant.spec.run_dir,
        }
        verdict.rerun = judge.result(self.variant).command
        self.reach(judge, verdict)

    @classmethod
    def _facts(cls, verdict: Verdict) -> Optional[ConfigurationFacts]:
        return next((f for f in verdict.facts if isinstance(f, ConfigurationFacts)), None)

    @classmethod
    def headline(cls, verdict: Verdict) -> list[str]:
        found = cls._facts(verdict)
        if found is None:
            return super().headline(verdict)
        return explained(found, verdict.diagnosis, verdict.label)

    @classmethod
    def proved(cls, verdict: Verdict) -> str:
        found = cls._facts(verdict)
        if found is None:
            return super().proved(verdict)
        if found.differences:
            first = found.differences[0]
            return (
                f"{verdict.label} differs from the baseline from step {first.step} ({first.what})"
            )
        return f"{verdict.label} equal to the baseline over {found.steps} steps"

    @classmethod
    def head(cls, verdict: Verdict, outcome: Outcome) -> list[str]:
        found = cls._facts(verdict)
        if found is not None and found.short:
            return ["the trainer ran fewer optimizer steps than the marker's steps="]
        return ["the variant does not train the same model as the baseline"]

    @classmethod
    def block(cls, verdict: Verdict, outcome: Outcome, kept: str) -> list[str]:
        found = cls._facts(verdict)
        if found is None:
            return super().block(verdict, outcome, kept)
        return explained(found, verdict.diagnosis, verdict.label)

    @classmethod
    def words(cls, verdict: Verdict) -> str:
        found = cls._facts(verdict)
        first = found.differences[0].text() if found and found.differences else verdict.why
        return f"{verdict.label}: {first}"
