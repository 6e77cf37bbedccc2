"""Data replayed: the resumed steps that consumed what the uninterrupted run had consumed at
earlier steps, and the epochs that replay spans.

Apart from the accounting of single samples (accounting.py) because it reads whole global
batches (every rank's ids of a step, as sets: on another number of ranks the same batch comes
in another rank order) and epochs: from a watched loader's epoch, or, without one, from the
data alone. What the words say of a replay is the data account's (`DataAccount.replay_words`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Optional

from ..rank.layout import watched_part
from ..signature import Signature


def replayed_steps(
    base: Mapping[int, Sequence[int]], res: Mapping[int, Sequence[int]], split: int
) -> Optional[tuple[list[int], list[int]]]:
    """The resumed steps whose ids equal the ids of earlier uninterrupted steps, in a run."""
    # as sets: on another number of ranks the same global batch comes in another rank order
    earlier = {tuple(sorted(ids)): s for s, ids in sorted(base.items()) if s <= split and ids}
    pairs = [
        (s, earlier[tuple(sorted(ids))])
        for s, ids in sorted(res.items())
        if tuple(sorted(ids)) in earlier
    ]
    if not pairs:
        return None
    return [s for s, _ in pairs], [b for _, b in pairs]


def watched_epochs(
    base: Mapping[int, Signature], res_steps: Sequence[int], base_steps: Sequence[int]
) -> Optional[tuple[int, int]]:
    """(epoch of the replayed steps, epoch the uninterrupted run was in at the resumed steps),
    read from a watched loader's epoch (`watch:<loader>.epoch`) on rank 0."""
    sig = base.get(0)
    if sig is None:
        return None
    steps = sig.by_step()

    def epoch(step: int) -> Optional[int]:
        for key, value in sorted(steps.get(step, {}).items()):
            if watched_part(key) == "epoch" and isinstance(value, dict):
                found = [v for k, v in sorted(value.items()) if k.endswith("epoch")]
                if found and isinstance(found[0], int):
                    return found[0]
        return None

    was, now = epoch(base_steps[0]), epoch(res_steps[0])
    return (was, now) if was is not None and now is not None and was != now else None


def epochs_from_ids(
    base: Mapping[int, Sequence[int]], res_steps: Sequence[int], base_steps: Sequence[int]
) -> Optional[tuple[int, int]]:
    """(epoch of the replayed steps, epoch of the resumed steps) from the data alone: an epoch
    is the steps of the uninterrupted run before its first sample comes back (every sample
    once), when the whole run has epochs of that length: each later one the same samples
    again, each once (None otherwise: a trainer with no epochs gets none named)."""
    seen: set[int] = set()
    ordered = sorted(base)
    length = 0
    for step in ordered:
        if seen & set(base[step]):
            break
        seen |= set(base[step])
        length += 1
    if not length or length == len(ordered):
        return None
    for start in range(length, len(ordered), length):
        # every later epoch is the same samples again, each once: a sample that merely comes
        # back (drawn with replacement, minGPT's sampler) makes no epochs
        ids = [i for step in ordered[start : start + length] for i in base[step]]
        whole = start + length <= len(ordered)
        if len(set(ids)) != len(ids) or not set(ids) <= seen or (whole and set(ids) != seen):
            return None
    first = ordered[0]
    was, now = (base_steps[0] - first) // length, (res_steps[0] - first) // length
    return (was, now) if was != now else None
