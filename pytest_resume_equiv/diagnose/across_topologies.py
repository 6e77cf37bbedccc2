"""The cause of a divergence on another topology: data before values (other samples explain
other values); beyond that the per-rank audit has no counterpart on another topology, so the
cause stays unknown unless the data says it."""

from __future__ import annotations

from typing import Optional

from ..compare.accounting import DataAccount
from ..compare.diff import Comparison
from ..compare.envelope import TopologyFacts
from .classes import DATA_ORDER, UNKNOWN
from .evidence import Diagnosis


def topology_diagnosis(cmp: Comparison, check: TopologyFacts) -> Optional[Diagnosis]:
    """Data before values: other samples explain other values. Beyond that the per-rank audit
    has no counterpart on another topology, so the cause stays unknown."""
    if cmp.equal or cmp.divergence is None:
        return None
    a, b = check.nproc
    wrong = [item for item in check.data if not item.exact]
    if wrong:
        keys = ", ".join(item.key for item in wrong)
        order = next((item.order_words() for item in wrong if item.order_words()), "")
        return Diagnosis(
            f"data not equivalent on {b} rank{'s' * (b != 1)}: over the global batch the resumed "
            f"run consumed other samples ({keys}, listed above"
            f"{': ' + order if order else ''}) than the uninterrupted run on {a}: a bug, not "
            "numeric noise. Fix: save the data position in global samples (steps x global "
            "batch), not per process, skip exactly those on any number of ranks, and restore "
            "the loader's epoch and shuffling generator before iterating",
            DATA_ORDER,
            _data_notes(check, wrong, a, b),
        )
    div = cmp.divergence
    return Diagnosis(
        f"every sample was consumed exactly once at the same step, but {div.key!r} left "
        f"the topology's noise at step {div.step}: cause unknown (per-rank state cannot be "
        "compared across topologies); resume on the same topology (without resume_nproc=) "
        "for a diagnosis",
        UNKNOWN,
    )


def _data_notes(check: TopologyFacts, wrong: list[DataAccount], a: int, b: int) -> list[str]:
    """What the accounting shows about how: ranks sharing samples (the data is not sharded),
    or the resumed run starting from another place in the data."""
    if check.shared:
        return [
            f"{check.shared[0]}: the data is not sharded across ranks, so the global batch "
            "changes with the number of ranks (a process group the loader does not use? "
            "accelerate on CPU runs distributed only with Accelerator(cpu=True))"
        ]
    if any(item.replayed or item.from_earlier for item in wrong):
        return [
            "the resumed run started from an earlier place in the data: a position saved as "
            f"one of {a} rank{'s' * (a != 1)}' own count means something else to {b}; save "
            "and skip it in global samples (steps x global batch), not per process"
        ]
    return []
