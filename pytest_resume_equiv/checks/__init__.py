"""The checks of a resume test, one module per kind, and the one registry of them.

Adding a check is one module with a `Check` subclass (its `kind` registers it, so a verdict
read back from JSON finds its class) and one line in `CHECKS`. The order of
`CHECKS` is the order in which checks plan (their launches start in that order, after the
launches that load no checkpoint) and in which they see each other's verdicts.
"""

from __future__ import annotations

from typing import Optional

from ..golden import GoldenTarget
from ..launch.devices import Device
from ..plan import Planner, RunRequest
from ..settings import TestSettings
from .base import Check, Judging, Outcome, Plan, Verdict, kind_of
from .chain import ChainLink
from .compat import Compat, golden_only
from .control import Control
from .crash import Crash
from .direct import Direct
from .equivalent import Equivalent
from .golden import GoldenTrajectory
from .other_topology import OtherTopology
from .repeat import Repeat
from .resume import Resume
from .teeth import Teeth

CHECKS: tuple[type[Check], ...] = (
    Resume,
    Crash,
    ChainLink,
    OtherTopology,
    Teeth,
    Direct,
    Control,
    Repeat,
    GoldenTrajectory,
    Compat,
    Equivalent,
)

__all__ = ["CHECKS", "Check", "Judging", "Outcome", "Plan", "Verdict", "build_plan", "kind_of"]


def build_plan(
    settings: TestSettings,
    request: RunRequest,
    device: Device,
    root: str,
    shared_root: Optional[str] = None,
    golden: Optional[GoldenTarget] = None,
) -> Plan:
    """Every registered check plans the checks of its kind the test has, with their launches
    (`shared_root`: where uninterrupted launches other tests can reuse live; `golden`: the
    test's golden, with a store)."""
    planner = Planner(settings, request, device, root, shared_root, golden)
    checks: list[Check] = []
    kinds = (Compat,) if golden_only(planner) else CHECKS  # the stored checkpoints alone
    if planner.marker.configurations is not None:  # an equivalence test: nothing resumes
        kinds = (Equivalent,)
    for kind in kinds:
        checks += kind.plan(planner)
    return Plan(planner.ordered(), checks, planner.warnings)
