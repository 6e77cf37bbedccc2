"""The launches several checks share, each planned once per test (by name) through the
planner: the uninterrupted launch of a group of splits, its determinism control, the first
launch of interrupt="stop"/"kill", and the uninterrupted launch on the resumed topology."""

from __future__ import annotations

import os
from typing import Optional

from ..errors import ResumeEquivError
from ..plan import PlannedLaunch, Planner


def uninterrupted_of(planner: Planner, split: int) -> PlannedLaunch:
    """The uninterrupted launch that saves at `split` (shared by the splits whose command is
    the same, and, in `shared_root`, by every test of the session that plans it)."""
    groups = planner.groups()
    splits = next(g for g in groups if split in g)
    name = "uninterrupted" if len(groups) == 1 else f"uninterrupted-split{splits[0]}"

    def build() -> PlannedLaunch:
        steps = planner.marker.steps
        own_dir = os.path.join(planner.root, name)
        probe = planner.saving(name, "uninterrupted", splits, own_dir, steps)
        launch = planner.saving(
            name, "uninterrupted", splits, planner.shared_dir(probe, own_dir), steps
        )
        launch.shared = planner.shared_root is not None
        return launch

    return planner.once(name, build)


def control_of(planner: Planner, full: PlannedLaunch, k: int = 1) -> PlannedLaunch:
    """`full` once more (the `k`-th time): run only when a check asks (after a divergence)."""
    name = f"{full.name}-control" + (str(k) if k > 1 else "")

    def build() -> PlannedLaunch:
        steps = planner.marker.steps
        run_dir = f"{full.spec.run_dir}-control" + (str(k) if k > 1 else "")
        launch = planner.saving(name, "control", full.saves, run_dir, steps)
        launch.reference, launch.shared, launch.on_demand = full, full.shared, True
        return launch

    return planner.once(name, build)


def interrupted_of(planner: Planner, split: int) -> PlannedLaunch:
    """A first launch of its own: it ends at the split ("stop") or is SIGKILLed once every
    rank has recorded the step after it ("kill")."""
    marker = planner.marker
    name = f"interrupted-split{split}"

    def build() -> PlannedLaunch:
        steps = split if marker.interrupt == "stop" else marker.steps
        run_dir = os.path.join(planner.root, name)
        launch = planner.saving(name, "interrupted", [split], run_dir, steps, "interrupted")
        if marker.interrupt == "kill":
            launch.kill_after = split + 1
        return launch

    return planner.once(name, build)


def source_of(planner: Planner, split: int) -> PlannedLaunch:
    """The launch whose checkpoint at `split` a resume loads."""
    if planner.marker.interrupt != "continue":
        return interrupted_of(planner, split)
    return uninterrupted_of(planner, split)


def on_resumed_topology(planner: Planner, full: PlannedLaunch) -> Optional[PlannedLaunch]:
    """On a topology change (`resume_nproc=`), `full` on the resumed launches' topology:
    its difference from `full` is the topology's own numeric noise."""
    marker = planner.marker
    if not marker.topology_changes:
        return None
    nodes = f"x{marker.resumed_nnodes}" if marker.resumed_nnodes > 1 else ""
    name = f"{full.name}-nproc{marker.resumed_nproc}{nodes}"

    def build() -> PlannedLaunch:
        own_dir = os.path.join(planner.root, name)
        splits, steps = list(full.saves), marker.steps

        def saving(run_dir: str) -> PlannedLaunch:
            return planner.saving(
                name, "topology", splits, run_dir, steps, saves=False, resumed_topology=True
            )

        launch = saving(planner.shared_dir(saving(own_dir), own_dir))
        launch.shared = planner.shared_root is not None
        return launch

    return planner.once(name, build)


def resumed_from(
    planner: Planner,
    split: int,
    reference: PlannedLaunch,
    source: PlannedLaunch,
    save_at: tuple[int, ...] = (),
    name: Optional[str] = None,
    role: str = "resumed",
    phase: str = "resumed",
) -> PlannedLaunch:
    """A launch from `source`'s checkpoint at `split`, compared with `reference`."""
    name = name or f"resumed-split{split}"

    def build() -> PlannedLaunch:
        return planner.resuming(name, role, split, reference, source, save_at, phase)

    return planner.once(name, build)


def one_group(planner: Planner, why: str) -> None:
    """Raise unless every split shares one uninterrupted launch (`why` needs it)."""
    if len(planner.groups()) > 1:
        raise ResumeEquivError(why)
