"""Exactly-once data accounting: which samples the resumed run consumed, against the
uninterrupted run, over the global batch (every rank's ids of a step together).

Sample identities are the values recorded under `sample_ids`, `ids` or any key ending in
`_ids`: an int, a list of ints, or a small tensor of them (a tensor is kept with its values
up to 16 elements; a bigger one only by fingerprint, which cannot be accounted). Without ids,
automatic recording's ids are accounted the same way: those of the batches a DataLoader
yielded (`auto:batch`: each sample by its content where it left the loader) when a loader was
seen, else those of the model's inputs (`auto:data`). "The same samples at the same step, each
exactly once" holds with no sample ids, over the global batch on any number of ranks. The
loader's ids are the samples even where the trainer changes them in its loop (noise added to
a diffusion model's latents, an augmentation); the inputs' then differ from run to run by
what was added, and say nothing of the samples. An id found nowhere in the uninterrupted run
is no evidence by itself: other samples (ones the uninterrupted run had not reached within
its steps) and the same samples transformed otherwise both make one. Pure: data in, words
out. The same words hold when the resumed run has another number of ranks. Which resumed steps
replayed earlier ones, and in which epochs, is read by epochs.py.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

from ..rank.layout import AUTO, TENSOR_TAG, audit_key
from ..signature import Signature
from .epochs import epochs_from_ids, replayed_steps, watched_epochs
from .step_problems import step_ranges
from .tolerance import ignored

StepIds = dict[int, list[int]]
"""step -> the ids consumed at that step, every rank's in rank order."""


CONTENT_KEY = audit_key(AUTO, "data")
"""The input fingerprints automatic recording writes: each micro-batch by its content."""
BATCH_KEY = audit_key(AUTO, "batch")
"""The ids of the batches a DataLoader yielded (rank/loaded.py): each sample by its content
where it left the loader, before the trainer's loop changed it."""
AUTO_KEYS = (BATCH_KEY, CONTENT_KEY)
"""Automatic recording's ids, the loader's first: accounted when the trainer records none."""


def is_identity_key(key: str) -> bool:
    """Sample identities (`sample_ids`, `ids`, `*_ids`, or the input fingerprints): what a
    step consumed, which the values it computed follow from."""
    return key in ("ids", "sample_ids", *AUTO_KEYS) or key.endswith("_ids")


def ids_of(value: Any) -> Optional[list[int]]:
    """The sample ids an encoded value holds, or None when it holds none that can be read."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return [value]
    if isinstance(value, list) and all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    ):
        return list(value)
    if isinstance(value, dict) and TENSOR_TAG in value:
        values = value[TENSOR_TAG].get("values")
        if isinstance(values, list) and all(isinstance(v, (int, float)) for v in values):
            return [int(v) for v in values]
    return None


def global_ids(run: dict[int, Signature], key: str, steps: Iterable[int]) -> Optional[StepIds]:
    """Every rank's ids of each step, together; None if some value cannot be read."""
    by_rank = {rank: sig.by_step() for rank, sig in run.items()}
    out: StepIds = {}
    for step in steps:
        ids: list[int] = []
        for rank in sorted(by_rank):
            value = by_rank[rank].get(step, {}).get(key)
            found = ids_of(value) if value is not None else []
            if found is None:
                return None
            ids += found
        out[step] = ids
    return out


def identity_keys(run: dict[int, Signature]) -> list[str]:
    """The identity keys a run recorded; automatic recording's only when the trainer recorded
    no sample ids of its own (those say what a sample is, on any topology: the inputs of a
    rank's batch need not be a function of its samples' ids), and then the loader's batches
    when a loader was seen (the samples), else the model's inputs."""
    keys = {k for sig in run.values() for _, values in sig.steps for k in values}
    found = sorted(k for k in keys if is_identity_key(k))
    own = [k for k in found if k not in AUTO_KEYS]
    return own or [k for k in AUTO_KEYS if k in found][:1]


@dataclass
class DataAccount:
    """How the resumed run's samples compare with the uninterrupted run's after the split."""

    key: str
    missing: list[int] = field(default_factory=list)
    """Consumed by the uninterrupted run after the split, never by the resumed run."""
    fewer: list[int] = field(default_factory=list)
    """Consumed by both, but less often by the resumed run."""
    repeated: list[int] = field(default_factory=list)
    """Consumed more often by the resumed run."""
    twice: bool = True
    """Every repeated id was consumed at most once by the uninterrupted run."""
    from_earlier: bool = False
    """Every repeated id is one the uninterrupted run consumed before the split: the resumed
    run started from an earlier place in the data."""
    moved: list[int] = field(default_factory=list)
    """Consumed by both, but at another step."""
    replayed: Optional[tuple[list[int], list[int]]] = None
    """(resumed steps, uninterrupted steps) when the resumed run consumed, at those steps,
    what the uninterrupted run had consumed at earlier steps: data replayed."""
    epochs: Optional[tuple[int, int]] = None
    """(replayed epoch, epoch it was replayed in), when a watched loader tells the epochs."""
    batches: list[tuple[int, int]] = field(default_factory=list)
    """(resumed step, uninterrupted step) for each resumed step that consumed the whole global
    batch of another uninterrupted step (the same samples, all ranks' together): a batch
    repeated (an earlier step's) or consumed ahead (a later one's)."""
    unconsumed: list[int] = field(default_factory=list)
    """Uninterrupted steps after the split none of whose samples the resumed run consumed:
    their batch was never consumed (skipped)."""
    unknown: list[int] = field(default_factory=list)
    """Input ids (`auto:data`) the resumed run consumed that the uninterrupted run consumed at
    no step: content it never saw (kept out of `repeated`: they were seen once, not twice)."""
    unknown_steps: list[int] = field(default_factory=list)
    """The resumed steps that consumed those."""
    alike: list[tuple[int, int]] = field(default_factory=list)
    """(resumed step, another uninterrupted step) where the batch a resumed step consumed was
    consumed by the uninterrupted run at several steps (the same inputs each epoch): which
    one it was is a reading, and the words say so."""
    first_different: int = 0
    """The first resumed step whose global batch differs from the uninterrupted run's (0: none)."""
    alien_steps: list[int] = field(default_factory=list)
    """The resumed steps none of whose ids the uninterrupted run consumed at any step."""

    @property
    def exact(self) -> bool:
        return not (self.missing or self.fewer or self.repeated or self.moved or self.unknown)

    @property
    def content_differs(self) -> bool:
        """The first resumed step whose batch differs holds ids the uninterrupted run never
        consumed and no whole batch of another step: other samples (ones it had not reached
        within its steps, another shuffle) or the same samples transformed otherwise, which the
        ids alone cannot tell apart. Ids past the end of the uninterrupted run's data, consumed
        after a skip, come after such a step, not at it."""
        first = self.first_different
        return bool(self.unknown_steps) and self.unknown_steps[0] == first in self.alien_steps

    def order_words(self) -> str:
        """Which step's batch was repeated or never consumed, from the global batches: `step 4
        consumed the batch of step 3 again, and each later step the batch of the step before
        its own (the batch of step 6 was never consumed)`; "" when the batches show none."""
        if self.content_differs:
            return ""
        moved = [(s, t) for s, t in self.batches if s != t]
        never = [s for s in self.unconsumed if all(s != t for _, t in moved)]
        if not moved:
            return f"{_batch_of(never)} never consumed" if never else ""
        s, t = moved[0]
        again = " again" if t < s else ""
        first = f"step {s} consumed the batch of step {t}{again}"
        same = dict(self.alike).get(s)
        if same is not None:
            first += f" (the same inputs as step {same}'s)"
        shift = t - s
        rest = moved[1:]
        steps = [a for a, _ in moved]
        if (
            rest
            and all(b - a == shift for a, b in rest)
            and steps == list(range(s, s + len(steps)))
        ):
            where = "after" if shift > 0 else "before"
            gap = "the step" if abs(shift) == 1 else f"the step {abs(shift)} steps"
            first += f", and each later step the batch of {gap} {where} its own"
        elif rest:
            first += "; " + "; ".join(
                f"step {a} the batch of step {b}{' again' if b < a else ''}" for a, b in rest[:3]
            )
        if never and shift > 0 and never[0] < s + shift:
            return f"{_batch_of(never)} never consumed: {first}"
        if never:
            return f"{first} ({_batch_of(never)} never consumed)"
        return first

    def replay_words(self) -> str:
        """The replay in words: `the resumed epoch 1 consumes the samples of epoch 0's steps
        2-4, in order (at steps 6-8)`; "" when the data was not replayed."""
        if not self.replayed:
            return ""
        res, base = self.replayed
        order = ", in order" if len({r - b for r, b in zip(res, base)}) == 1 else ""
        if self.epochs:
            was, now = self.epochs
            return (
                f"the resumed epoch {now} consumes the samples of epoch {was}'s {_steps(base)}"
                f"{order} (at {_steps(res)})"
            )
        return f"the resumed run consumed at {_steps(res)} the samples of {_steps(base)}{order}"

    def text(self) -> str:
        """In words, for the report: which ids, and what it looks like."""
        if self.key in AUTO_KEYS:
            return self._content_text()
        if self.exact:
            return f"data ({self.key}): every sample consumed exactly once, at the same step"
        parts = []
        if self.missing:
            parts.append(f"ids {_ids(self.missing)} never seen")
        if self.fewer:
            parts.append(f"ids {_ids(self.fewer)} seen fewer times than in the uninterrupted run")
        if self.repeated:
            more = "twice or more" if self.twice else "more often than in the uninterrupted run"
            parts.append(f"ids {_ids(self.repeated)} seen {more}")
        if self.moved:
            parts.append(f"ids {_ids(self.moved)} consumed at another step")
        text = f"data ({self.key}) after the resume: " + ", ".join(parts)
        if self.replayed and self.epochs:
            res, base = self.replayed
            text += (
                f" (epoch {self.epochs[0]}'s order replayed in epoch {self.epochs[1]}: the "
                f"resumed run consumed at {_steps(res)} the samples of {_steps(base)})"
            )
        elif self.replayed:
            res, base = self.replayed
            text += (
                f" (the resumed run consumed at {_steps(res)} the samples of "
                f"{_steps(base)}: an earlier part of the data replayed)"
            )
        return text

    def _content_text(self) -> str:
        """Automatic recording's account: samples counted, not listed (an id made of a content
        hash means nothing to a reader); a replay names its steps."""
        name = (
            "data (the batches the DataLoader yielded, by content)"
            if self.key == BATCH_KEY
            else "data (the model's inputs, by content)"
        )
        if self.exact:
            return f"{name}: every sample consumed exactly once, at the same step"
        if self.content_differs:
            n = len(self.unknown)
            what = "sample" if self.key == BATCH_KEY else "input"
            return (
                f"{name} after the resume: {_steps(self.unknown_steps)} consumed {n} "
                f"{what}{'s' if n > 1 else ''} found nowhere in the uninterrupted run: other "
                "samples (ones the uninterrupted run did not reach within its steps, or another "
                "shuffle) or the same samples transformed otherwise; their content alone cannot "
                "tell which"
            )
        parts = []
        for ids, what in (
            (self.missing, "never seen"),
            (self.fewer, "seen fewer times than in the uninterrupted run"),
            (self.repeated, "seen twice or more" if self.twice else "seen more often"),
            (self.moved, "consumed at another step"),
        ):
            if ids:
                parts.append(f"{len(ids)} sample{'s' if len(ids) > 1 else ''} {what}")
        if self.unknown:
            n = len(self.unknown)
            parts.append(
                f"{n} sample{'s' if n > 1 else ''} the uninterrupted run never consumed (at "
                f"{_steps(self.unknown_steps)}: past its data, or samples it did not reach "
                "within its steps)"
            )
        text = f"{name} after the resume: " + ", ".join(parts)
        if self.replayed and self._replay_is_all():
            text += f" ({self.replay_words()}: an earlier part of the data replayed)"
        elif self.order_words():
            text += f": {self.order_words()}"
        return text

    def _replay_is_all(self) -> bool:
        """Whether the replay of earlier steps explains every batch that moved."""
        moved = [(s, t) for s, t in self.batches if s != t]
        return bool(self.replayed) and [s for s, _ in moved] == list(self.replayed[0])


def account(
    base: dict[int, Signature],
    res: dict[int, Signature],
    split: int,
    steps: int,
    ignore: Sequence[str] = (),
) -> list[DataAccount]:
    """One account per identity key both runs recorded (none when no ids were recorded), but
    for keys an `ignore=` pattern names."""
    after = range(split + 1, steps + 1)
    found = []
    for key in identity_keys(base):
        if ignored(key, ignore):
            continue
        ours = global_ids(res, key, after)
        theirs = global_ids(base, key, range(1, steps + 1))
        if ours is None or theirs is None:
            continue
        item = _account(key, theirs, ours, split)
        if item.replayed:
            item.epochs = watched_epochs(base, *item.replayed) or epochs_from_ids(
                theirs, *item.replayed
            )
        found.append(item)
    return found


def _account(key: str, base: StepIds, res: StepIds, split: int) -> DataAccount:
    after = [s for s in base if s > split]
    expected = Counter(i for s in after for i in base[s])
    got = Counter(i for s in res for i in res[s])
    result = DataAccount(key)
    result.missing = sorted(i for i in expected if not got[i])
    result.fewer = sorted(i for i in expected if 0 < got[i] < expected[i])
    result.repeated = sorted(i for i in got if got[i] > expected[i])
    result.twice = all(expected[i] <= 1 for i in result.repeated)
    before = {i for s, ids in base.items() if s <= split for i in ids}
    result.from_earlier = bool(result.repeated) and set(result.repeated) <= before
    moved: set[int] = set()
    for step, ids in res.items():
        # consumed at this step by the resumed run only, though the uninterrupted run
        # consumed it after the split (at another step)
        moved |= set((Counter(ids) - Counter(base.get(step, []))).elements()) & set(expected)
    result.moved = sorted(moved - set(result.repeated) - set(result.fewer))
    result.replayed = replayed_steps(base, res, split)
    if key in AUTO_KEYS:
        _by_batch(result, base, res, split)
    return result


def _by_batch(result: DataAccount, base: StepIds, res: StepIds, split: int) -> None:
    """The input ids' account by whole global batches: inputs found nowhere in the
    uninterrupted run (kept apart from the repeated ones), the batch each resumed step
    consumed, the batches never consumed. Content ids say nothing of one sample alone, but a
    step's whole batch, every rank's together, is the same on any number of ranks."""
    everywhere = {i for ids in base.values() for i in ids}
    result.unknown = sorted(i for ids in res.values() for i in ids if i not in everywhere)
    result.unknown_steps = sorted(s for s, ids in res.items() if set(ids) - everywhere)
    result.alien_steps = sorted(s for s, ids in res.items() if ids and not set(ids) & everywhere)
    result.repeated = [i for i in result.repeated if i in everywhere]
    before = {i for s, ids in base.items() if s <= split for i in ids}
    result.from_earlier = bool(result.repeated) and set(result.repeated) <= before
    result.first_different = next(
        (s for s, ids in sorted(res.items()) if sorted(ids) != sorted(base.get(s, []))), 0
    )
    where: dict[tuple[int, ...], list[int]] = {}
    for step, ids in sorted(base.items()):
        if ids:
            where.setdefault(tuple(sorted(ids)), []).append(step)
    shift: Optional[int] = None
    for step, ids in sorted(res.items()):
        found = where.get(tuple(sorted(ids)), [])
        if found and step not in found:
            # the same inputs at several steps (an epoch without shuffle): the one that keeps
            # the previous step's shift, else the nearest, an earlier one on a tie
            chosen = min(found, key=lambda s: (s - step != shift, abs(s - step), s))
            result.batches.append((step, chosen))
            others = [s for s in found if s != chosen]
            if others:
                result.alike.append((step, others[0]))
            shift = chosen - step
    consumed = {i for ids in res.values() for i in ids}
    result.unconsumed = [
        s for s, ids in sorted(base.items()) if s > split and ids and not set(ids) & consumed
    ]


def _batch_of(steps: list[int]) -> str:
    """`the batch of step 4 was` / `the batches of steps 4-5, 7 were`."""
    if len(steps) == 1:
        return f"the batch of step {steps[0]} was"
    return f"the batches of {_steps(steps)} were"


def _ids(ids: list[int]) -> str:
    return step_ranges(ids)


def _steps(steps: list[int]) -> str:
    return ("step " if len(steps) == 1 else "steps ") + step_ranges(steps)


def shared_across_ranks(run: dict[int, Signature], key: str) -> Optional[tuple[int, list[int]]]:
    """The first step at which several ranks consumed the same sample, and those ids: the
    ranks are not sharding the data (or are a tensor-parallel group that shares batches)."""
    if len(run) < 2:
        return None
    by_rank = [sig.by_step() for _, sig in sorted(run.items())]
    for step in sorted({s for steps in by_rank for s in steps}):
        seen: Counter = Counter()
        for steps in by_rank:
            seen.update(set(ids_of(steps.get(step, {}).get(key)) or []))
        shared = sorted(i for i, n in seen.items() if n > 1)
        if shared:
            return step, shared
    return None
