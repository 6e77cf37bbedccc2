"""A resume judged again within measured noise, once a check measured it: the determinism
control (the uninterrupted run does not reproduce itself) or the resumed-process repeat (two
resumed processes from one checkpoint).

The gate's result always stands: a resume point that differs is a failure whatever the noise.
After a gate that held, the trajectory passes within NOISE_FACTOR times the noise, fails
beyond it (the cause then unknown: nothing at the resume point explains it), or abstains when
the noise is too wide to tell a bug from it (or wider than the test's own tolerance).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from ..compare.comparators import NOISE_FACTOR, Measured, Run
from ..compare.gate import GateFacts
from ..compare.noise import NoiseFacts, scaled_to, split_value
from ..compare.tolerance import ComparisonRules
from ..diagnose import Diagnosis, Stage, cause, diagnose
from ..diagnose.at_check import Judged
from ..rank.layout import is_audit_key
from .base import Verdict


def gate_of(verdict: Verdict) -> Optional[GateFacts]:
    return next((f for f in verdict.facts if isinstance(f, GateFacts)), None)


def fresh_process(verdict: Verdict) -> Optional[Diagnosis]:
    """The resumed process's own compute, when the verdict's facts show it (diagnose/at_check.py)."""
    judged = Judged(gate_of(verdict), verdict.comparison, runs=verdict.signatures)
    return cause(Stage.FRESH_PROCESS, judged)


def on_cpu(run: Run) -> bool:
    return all(sig.header.get("device") == "cpu" for sig in run.values())


def _repeated_exactly(verdict: Verdict, reference: Run, run: Run, noise: NoiseFacts) -> Verdict:
    """Two resumed processes agree bit for bit and differ from the uninterrupted run, on the
    CPU, where a fresh process picks no other kernel: the difference is the resume's (state the
    audit does not see: gradient buffers, a micro-step counter), so the ordinary diagnosis
    speaks; unless every difference stays at rounding level (the resumed process's own code
    path sums in another order, deterministically): that is no restore bug, and no exact
    judgement can pass it either, so the verdict abstains, saying so."""
    cmp = verdict.comparison
    assert cmp is not None
    own = fresh_process(verdict)
    if own is not None and own.rule == "fresh-process.rounding-level-throughout":
        return _abstain(
            verdict,
            "a second resumed process repeats this run bit for bit, and every difference from "
            "the uninterrupted run stays at rounding level after the exact resume point: "
            f"{own.cause}",
            noise,
        )
    diagnosis = diagnose(cmp, reference, run)
    diagnosis.notes.append(
        "a second resumed process from the same checkpoint repeats this run bit for bit, on the "
        "CPU, where a fresh process picks no other kernel: not noise"
    )
    return dataclasses.replace(
        verdict, diagnosis=diagnosis, facts=[*verdict.facts, noise], why="repeated exactly"
    )


def _user_numbers(reference: Run, split: int) -> list[str]:
    """The keys the user recorded that hold numbers after the split (what noise can move)."""
    keys: set[str] = set()
    for sig in reference.values():
        for step, values in sig.steps:
            if step > split:
                keys |= {k for k, v in values.items() if not is_audit_key(k) and split_value(v)[0]}
    return sorted(keys)


def _abstain(verdict: Verdict, why: str, noise: NoiseFacts) -> Verdict:
    return dataclasses.replace(
        verdict, status="abstained", why=why, facts=[*verdict.facts, noise], diagnosis=None
    )


def _why_abstain(
    noise: NoiseFacts, keys: list[str], rules: ComparisonRules, verdict: Verdict
) -> str:
    if noise.source == "resumed" and not noise.noisy:
        cause = fresh_process(verdict)
        div = verdict.comparison.divergence if verdict.comparison else None
        step = div.step if div is not None else "?"
        return (
            f"the resumed process repeats itself exactly but computes step {step} differently "
            "from the uninterrupted one"
            + (" at rounding level" if cause else "")
            + ": there is no noise to judge the trajectory against (the resume point held)"
        )
    wide = noise.too_wide(keys)
    if wide:
        spread = ", ".join(f"{k} {noise.relative[k]:.2g}" for k in wide[:3])
        return (
            f"the measured noise is too wide to tell a bug from it (relative spread {spread}); "
            "the resume point held exactly"
        )
    if not rules.tolerance.exact:
        split = verdict.split or 0
        beyond = [k for k in keys if _beyond_tolerance(noise, k, rules, split)]
        if beyond:
            return (
                f"the measured noise of {', '.join(beyond[:3])} exceeds tolerance="
                f"{rules.tolerance.describe()}: widen it, or make the training deterministic; "
                "the resume point held exactly"
            )
    return ""


def _beyond_tolerance(noise: NoiseFacts, key: str, rules: ComparisonRules, split: int) -> bool:
    """Whether the noise of `key` is larger somewhere than the test's tolerance allows there
    (the value's size estimated from the key's relative spread)."""
    relative = noise.relative.get(key, 0.0)
    for keys in noise.spread.values():
        for step, spread in keys.get(key, {}).items():
            if int(step) <= split:
                continue
            given = rules.tolerance.for_key(key, int(step), split)
            size = spread / relative if relative else 0.0
            if given is None or spread > given[1] + given[0] * size:
                return True
    return False


def rejudge(
    verdict: Verdict, noise: NoiseFacts, reference: Run, run: Run, rules: ComparisonRules
) -> Verdict:
    """`verdict` (a failed exact judgement) within `noise`."""
    held = gate_of(verdict)
    if held is not None and held.failed:
        note = f"measured noise: {noise.describe()}; the resume point differs all the same"
        return dataclasses.replace(verdict, why=note)
    if noise.unjudgeable:
        return verdict
    split = verdict.split or 0
    if noise.source == "resumed" and not noise.noisy and on_cpu(run):
        return _repeated_exactly(verdict, reference, run, noise)
    if noise.source == "resumed":
        noise = scaled_to(noise, reference, run)
    why = _why_abstain(noise, _user_numbers(reference, split), rules, verdict)
    if why:
        return _abstain(verdict, why, noise)
    cmp = Measured(rules, noise).compare(reference, run, split)
    judged = dataclasses.replace(verdict, comparison=cmp, facts=[*verdict.facts, noise])
    if cmp.equal:
        judged.status, judged.diagnosis = "passed", None
        judged.why = f"within {NOISE_FACTOR:g}x the measured noise ({noise.describe()})"
        return judged
    judged.status, judged.why = "failed", f"beyond {NOISE_FACTOR:g}x the measured noise"
    judged.diagnosis = cause(Stage.NOISE, Judged(held, cmp, noise.source))
    return judged
