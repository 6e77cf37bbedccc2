"""The causes the checks other than the plain resume ask for, each from the facts its check
measured: a chain link that restored exactly what its writer held (`Stage.SOURCE`), a resume
on another topology (`Stage.TOPOLOGY`), a resume after a crash inside the save
(`Stage.CRASH`), a trajectory judged against measured noise (`Stage.NOISE`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from ..compare.comparators import NOISE_FACTOR
from ..compare.diff import Comparison, Divergence
from ..compare.envelope import TopologyFacts
from ..compare.gate import GateFacts
from ..compare.noise import ROUNDING, relative_gap, rounding_level
from ..signature import Signature
from .classes import (
    BEYOND_MEASURED_NOISE,
    DATA_ORDER,
    FRESH_PROCESS,
    SAVED_WRONG_BY_ITS_WRITER,
    TORN_CHECKPOINT,
    UNKNOWN,
)
from .rules import Finding, Rule, Stage


def saved_wrong(gates: tuple[GateFacts, GateFacts]) -> Optional[Finding]:
    """The resumed run restored exactly what the launch that wrote its checkpoint held at the
    split (`gates[0]` held against that launch), yet that state is not the uninterrupted
    run's there (`gates[1]`): the checkpoint was saved wrong by that launch (a chain's earlier
    link saving a state taken before its own load). Never "not restored as saved": it was."""
    held, against = gates
    if not held.held or not against.failed or not against.differing:
        return None
    rank, keys = next(iter(sorted(against.differing.items())))
    return Finding(f"rank {rank}", {"writer": held.reference, "keys": keys[:4]})


def _saved_wrong_words(f: Finding) -> str:
    return (
        f"the resumed run restored exactly what {f['writer']} held at the split (its resume "
        f"point matched it bit for bit), yet that differs from the uninterrupted run's state "
        f"there ({', '.join(f['keys'])}): {f['writer']} saved a state that was not its live one "
        "(a state dict taken before its own load, or an object the load replaced)"
    )


def topology_data(check: tuple[Comparison, TopologyFacts]) -> Optional[Finding]:
    """Over the global batch the resumed run consumed other samples than the uninterrupted
    run on the other topology: a bug, whatever the values (other samples explain them)."""
    cmp, facts = check
    wrong = [item for item in facts.data if not item.exact]
    if cmp.equal or cmp.divergence is None or not wrong:
        return None
    a, b = facts.nproc
    notes = _topology_notes(facts, wrong, a, b)
    evidence = {"keys": [item.key for item in wrong], "nproc": [a, b]}
    evidence["order"] = next((item.order_words() for item in wrong if item.order_words()), "")
    return Finding("", evidence, "topology", notes)


def _topology_words(f: Finding) -> str:
    a, b = f["nproc"]
    order = f": {f['order']}" if f["order"] else ""
    return (
        f"data not equivalent on {b} rank{'s' * (b != 1)}: over the global batch the resumed "
        f"run consumed other samples ({', '.join(f['keys'])}, listed above{order}) than the "
        f"uninterrupted run on {a}: a bug, not numeric noise"
    )


def _topology_notes(facts: TopologyFacts, wrong: list, a: int, b: int) -> list[str]:
    """What the accounting shows about how: ranks sharing samples (the data is not sharded),
    or the resumed run starting from another place in the data."""
    if facts.shared:
        return [
            f"{facts.shared[0]}: the data is not sharded across ranks, so the global batch "
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


def topology_values(check: tuple[Comparison, TopologyFacts]) -> Optional[Finding]:
    """Every sample consumed exactly once at the same step, and a value beyond the topology's
    noise: per-rank state has no counterpart on another topology, so the cause is unknown."""
    cmp, _ = check
    div = cmp.divergence
    if cmp.equal or div is None:
        return None
    return Finding("", {"key": div.key, "step": div.step})


def _topology_values_words(f: Finding) -> str:
    return (
        f"every sample was consumed exactly once at the same step, but {f['key']!r} left the "
        f"topology's noise at step {f['step']}: cause unknown (per-rank state cannot be "
        "compared across topologies); resume on the same topology (without resume_nproc=) "
        "for a diagnosis"
    )


@dataclass(frozen=True)
class CrashedAt:
    """Where the crash killed the run (`point`) and what its resumed run did (`where`)."""

    point: str
    where: str


def torn_by_crash(crash: CrashedAt) -> Optional[Finding]:
    """A resume from what a crash left half-written: every part that differs after loading
    comes from it, so no one object's restore is to blame."""
    return Finding("", {"point": crash.point, "where": crash.where}, "crash")


def _torn_words(f: Finding) -> str:
    return (
        f"the resumed run loaded a checkpoint the crash at '{f['point']}' ({f['where']}) left "
        "torn or mixed (parts of it from different saves, or missing)"
    )


@dataclass(frozen=True)
class Judged:
    """A failed trajectory with what judged it: the gate, the comparison, and the noise's
    source (`resumed`: two resumed processes; `uninterrupted`: two uninterrupted runs)."""

    gate: Optional[GateFacts]
    cmp: Optional[Comparison]
    noise_source: str = ""
    runs: Optional[tuple[dict[int, Signature], dict[int, Signature]]] = None
    """(uninterrupted, resumed) signatures, where the rule reads every step."""


def rounding_throughout(judged: Judged) -> Optional[Finding]:
    """The state loaded exactly (the gate held), and every value that differs after the
    split, at every step, on every rank, differs at rounding level only (or only below what
    its statistics resolve), the losses included: the resumed process computes otherwise (a
    reduction in another order, a kernel, a code path of its own), and nothing it restored or
    missed moves the training. State the audit does not see moves values materially, and its
    effect grows over the steps; this does neither."""
    held, cmp = judged.gate, judged.cmp
    if held is None or not held.held or cmp is None or cmp.divergence is None or not judged.runs:
        return None
    worst, keys = 0.0, set()
    for rank, sig in judged.runs[1].items():
        theirs = judged.runs[0].get(rank)
        base = theirs.by_step() if theirs is not None else {}
        for step, values in sig.by_step().items():
            for key, value in values.items() if step > cmp.split else ():
                other = base.get(step, {}).get(key)
                if other == value or key in cmp.ignored:
                    continue
                gap = relative_gap(other, value)
                if gap is None or gap > ROUNDING:
                    return None
                worst, keys = max(worst, gap), keys | {key}
    if not keys:
        return None
    evidence = {"reference": held.reference, "keys": sorted(keys)[:4], "gap": worst}
    return Finding("", {**evidence, **_divergence(cmp.divergence)})


def _throughout_words(f: Finding) -> str:
    return (
        f"the state loaded exactly (the resume point equals {f['reference']}'s bit for bit), "
        f"and the resumed process computes step {f['step']} differently at rounding level "
        f"({f['key']} on rank {f['rank']}), and every later step too: every value that differs "
        f"stays at rounding level (at most relative {f['gap']:.1g}: {', '.join(f['keys'])}), "
        "another reduction order, kernel or code path in the resumed process, not a restore bug"
    )


def fresh_process(judged: Judged) -> Optional[Finding]:
    """The state loaded exactly and the very first resumed step computes something else, at
    rounding level: a fresh process computing differently (another kernel, autotuning), not a
    restore bug."""
    held, cmp = judged.gate, judged.cmp
    if held is None or not held.held or cmp is None or cmp.divergence is None:
        return None
    div = cmp.divergence
    if div.step != cmp.split + 1 or not rounding_level(div.expected, div.actual):
        return None
    return Finding("", {"reference": held.reference, **_divergence(div)})


def _divergence(div: Divergence) -> dict[str, Any]:
    return {"key": div.key, "step": div.step, "rank": div.rank}


def _fresh_words(f: Finding) -> str:
    return (
        f"the state loaded exactly (the resume point equals {f['reference']}'s bit for bit), "
        f"and the resumed process computes step {f['step']} differently at rounding level "
        f"({f['key']} on rank {f['rank']}): kernel selection or autotuning in a fresh process "
        "(cudnn.benchmark, Triton/Inductor autotuning, another reduction order), not a restore "
        "bug"
    )


def beyond_noise(judged: Judged) -> Optional[Finding]:
    """The resume point matched exactly, and a value left the measured noise: the cause is
    unknown (state the audit does not see, or noise wider than measured)."""
    div = judged.cmp.divergence if judged.cmp is not None else None
    return Finding("", {**(_divergence(div) if div else {}), "between": judged.noise_source})


def _beyond_words(f: Finding) -> str:
    where = (
        f"{f['key']!r} at step {f['step']}, rank {f['rank']}"
        if "key" in f.evidence
        else "the steps recorded"
    )
    between = "resumed processes" if f["between"] == "resumed" else "uninterrupted runs"
    return (
        f"the resume point matched exactly, but {where} left {NOISE_FACTOR:g}x the noise "
        f"measured between {between}: cause unknown: state the audit does not see differs "
        "after the resume (record or watch() it), or the noise is larger than the runs "
        "measured it (more runs: --resume-equiv-noise-runs)"
    )


RULES = (
    Rule(
        "source.saved-wrong-by-its-writer",
        (Stage.SOURCE,),
        SAVED_WRONG_BY_ITS_WRITER,
        saved_wrong,
        _saved_wrong_words,
    ),
    Rule(
        "topology.data-not-equivalent",
        (Stage.TOPOLOGY,),
        DATA_ORDER,
        topology_data,
        _topology_words,
    ),
    Rule(
        "topology.values-beyond-noise",
        (Stage.TOPOLOGY,),
        UNKNOWN,
        topology_values,
        _topology_values_words,
        after=("topology.data-not-equivalent",),
    ),
    Rule(
        "crash.torn-by-the-crash",
        (Stage.CRASH,),
        TORN_CHECKPOINT,
        torn_by_crash,
        _torn_words,
        always=True,
    ),
    Rule(
        "fresh-process.rounding-level-throughout",
        (Stage.FRESH_PROCESS,),
        FRESH_PROCESS,
        rounding_throughout,
        _throughout_words,
    ),
    Rule(
        "fresh-process.rounding-level",
        (Stage.FRESH_PROCESS,),
        FRESH_PROCESS,
        fresh_process,
        _fresh_words,
        after=("fresh-process.rounding-level-throughout",),
    ),
    Rule(
        "noise.beyond-measured-noise",
        (Stage.NOISE,),
        BEYOND_MEASURED_NOISE,
        beyond_noise,
        _beyond_words,
        always=True,
    ),
)
