"""Step numbering problems of a resumed run: re-executed, missing, shifted, duplicated or
out-of-order steps. They are reported on their own, before any value is compared: a value
diff between step 1 of one run and step 4 of the other would only confuse."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional

from ..rank.layout import is_audit_key
from ..signature import Signature


@dataclass(frozen=True)
class StepProblem:
    kind: str
    rank: int
    steps: tuple[int, ...]
    message: str


EARLY_STOP = (
    " (a data iterator saved exhausted at an epoch boundary, or a stop condition that counts "
    "from the resume?)"
)


def steps_text(steps: Sequence[int]) -> str:
    """'step 4' or 'steps 1-3, 5'."""
    return f"{'step' if len(set(steps)) == 1 else 'steps'} {step_ranges(steps)}"


def step_ranges(steps: Sequence[int]) -> str:
    """Compact step list: 1-3, 5, 7-8."""
    items = sorted(set(steps))
    parts: list[str] = []
    i = 0
    while i < len(items):
        j = i
        while j + 1 < len(items) and items[j + 1] == items[j] + 1:
            j += 1
        parts.append(str(items[i]) if i == j else f"{items[i]}-{items[j]}")
        i = j + 1
    return ", ".join(parts)


def _order_problems(sig: Signature, run: str) -> list[StepProblem]:
    problems = []
    counts = Counter(step for step, _ in sig.steps)
    dupes = sorted(step for step, n in counts.items() if n > 1)
    if dupes:
        problems.append(
            StepProblem(
                "duplicate",
                sig.rank,
                tuple(dupes),
                f"rank {sig.rank}: the {run} run recorded {steps_text(dupes)} more than once "
                "(record() must be called once per step)",
            )
        )
    order = [s for s, _ in sig.steps]
    if any(b < a for a, b in zip(order, order[1:])):
        problems.append(
            StepProblem(
                "out-of-order",
                sig.rank,
                tuple(order),
                f"rank {sig.rank}: the {run} run recorded steps out of order ({', '.join(map(str, order[:12]))})",
            )
        )
    return problems


NOTHING = (
    ": it recorded no step at all. A step is recorded at each torch optimizer step "
    "(automatic recording, on unless auto=False or --resume-equiv-auto=off) and at each "
    "pytest_resume_equiv.record(step, ...) call; this trainer made neither (auto off, or an "
    "optimizer that is no torch.optim.Optimizer: call record(), docs/guides/recording-more.md)"
)
"""Why a run that recorded nothing recorded nothing (a trainer tested with auto=False and
no record call looked as if only its later steps were missing)."""


def step_problems(
    rank: int, base: Signature, resumed: Signature, split: int, steps: int
) -> list[StepProblem]:
    problems = _order_problems(base, "uninterrupted") + _order_problems(resumed, "resumed")
    expected = set(range(split + 1, steps + 1))
    got = set(resumed.by_step())
    base_missing = sorted(expected - set(base.by_step()))
    if base_missing:
        problems.append(
            StepProblem(
                "uninterrupted-missing",
                rank,
                tuple(base_missing),
                f"rank {rank}: the uninterrupted run never recorded {steps_text(base_missing)} "
                f"(it must record every step 1-{steps})" + (NOTHING if not base.steps else ""),
            )
        )
    if got != expected:
        whole = _whole_run_problem(rank, got, expected, split)
        behind = _counter_behind(rank, got, split, steps) if auto_numbered(resumed) else None
        problems += (
            [whole]
            if whole
            else [behind]
            if behind
            else _resumed_step_problems(rank, got, split, steps)
        )
    return problems


def auto_numbered(sig: Signature) -> bool:
    """Steps numbered by automatic recording (rank/auto.py: a resumed launch's first step
    is `split + 1`, whatever the trainer's own counter says), not by `record` calls: a
    resumed launch that wrote its `loaded` line and recorded no value of the trainer's."""
    return sig.loaded is not None and not any(
        not is_audit_key(key) for _, values in sig.steps for key in values
    )


def _counter_behind(rank: int, got: set[int], split: int, steps: int) -> Optional[StepProblem]:
    """An automatically numbered resumed run that took k more optimizer steps than the
    uninterrupted run after the split (steps split+1 .. steps+k): the trainer's own step
    counter, which decides when it stops, resumed k behind the checkpoint's step, so in its
    own numbering it re-executed the k steps before the split."""
    extra = sorted(s for s in got if s > steps)
    if not extra or got != set(range(split + 1, steps + len(extra) + 1)) or len(extra) > split:
        return None
    replayed = list(range(split - len(extra) + 1, split + 1))
    took = (
        f"rank {rank}: the resumed run took {len(got)} optimizer steps after the split where "
        f"the uninterrupted run took {steps - split} (it recorded {steps_text(extra)}, past "
        f"steps={steps}): its step counter resumed at {split - len(extra)}, not {split}"
    )
    if len(extra) == 1:
        why = (
            f", so it re-executed step {split}, the step the checkpoint was saved after: the "
            "global step counter was saved or restored off by one"
        )
    else:
        why = (
            f", so it re-executed {steps_text(replayed)}, which the checkpoint saved at step "
            f"{split} had already done; the resume restarted from step {replayed[0]} instead "
            f"of continuing at step {split + 1} (step counter not restored?)"
        )
    return StepProblem("re-executed", rank, tuple(replayed), took + why)


def _whole_run_problem(
    rank: int, got: set[int], expected: set[int], split: int
) -> Optional[StepProblem]:
    """A resumed run that recorded nothing, or every step under another number."""
    if not got:
        return StepProblem(
            "missing",
            rank,
            tuple(sorted(expected)),
            f"rank {rank}: the resumed run recorded no steps (expected {step_ranges(expected)}): "
            f"it stopped right after loading{EARLY_STOP}, or it never calls "
            "pytest_resume_equiv.record(step, ...) once a run is resumed",
        )
    shift = min(got) - (split + 1)
    if shift and got == {s + shift for s in expected}:
        return StepProblem(
            "shifted",
            rank,
            tuple(sorted(got)),
            f"rank {rank}: the resumed run's step numbers are shifted by {shift:+d}: it recorded "
            f"steps {step_ranges(got)} where the uninterrupted run recorded "
            f"{step_ranges(expected)} after the split at step {split}; the step counter was "
            f"saved or restored off by {abs(shift)}",
        )
    return None


def _resumed_step_problems(rank: int, got: set[int], split: int, steps: int) -> list[StepProblem]:
    """Steps the resumed run did again (at or before the split), skipped, or ran past the end."""
    problems = []
    replayed = sorted(s for s in got if s <= split)
    if replayed == [split]:
        problems.append(
            StepProblem(
                "re-executed",
                rank,
                (split,),
                f"rank {rank}: the resumed run re-executed step {split}, the step the checkpoint "
                "was saved after: the global step counter was saved or restored off by one",
            )
        )
    elif replayed:
        problems.append(
            StepProblem(
                "re-executed",
                rank,
                tuple(replayed),
                f"rank {rank}: the resumed run re-executed {steps_text(replayed)}, which the "
                f"checkpoint saved at step {split} had already done; the resume restarted "
                f"from step {min(replayed)} instead of continuing at step {split + 1} "
                "(step counter not restored?)",
            )
        )
    expected = set(range(split + 1, steps + 1))
    missing = sorted(expected - got)
    if missing:
        early = missing[-1] == steps and got < expected
        problems.append(
            StepProblem(
                "missing",
                rank,
                tuple(missing),
                f"rank {rank}: the resumed run never recorded {steps_text(missing)} "
                f"(expected every step {split + 1}-{steps})"
                + (f": it stopped early{EARLY_STOP}" if early else ""),
            )
        )
    extra = sorted(s for s in got if s > steps)
    if extra:
        problems.append(
            StepProblem(
                "extra",
                rank,
                tuple(extra),
                f"rank {rank}: the resumed run recorded {steps_text(extra)}, past steps={steps}",
            )
        )
    return problems
