"""The draws traced on a stream before the first resumed step, as the stream rules read them:
how many of which op at which line, whether they shuffle the data, and which fixes an advance
by such draws supports."""

from __future__ import annotations

from collections import Counter
from typing import Optional

from ..compare.accounting import BATCH_KEY, CONTENT_KEY, ids_of, is_identity_key
from ..rank.layout import OWNED_BY, generator_site
from ..rank.trace import FORWARD
from .subject import Subject

SHUFFLE_OPS = ("randperm",)
"""Draws that make a permutation: what a shuffle of the data draws."""


def to_forward(point: Optional[dict]) -> Optional[dict]:
    """The uninterrupted run's window up to its first forward: what a resumed run whose
    trace ended at its first forward (before its `resume_point()` call) is compared with."""
    if point is None:
        return None
    draws = point.get("draws", [])
    cut = next((i for i, d in enumerate(draws) if d.get("op") == FORWARD), len(draws))
    return {**point, "draws": draws[:cut]}


def base_window(s: Subject) -> Optional[dict]:
    """The uninterrupted run's window to compare the resumed run's draws on `s` with: up to
    its first forward when the resumed run's trace ended there."""
    return to_forward(s.base) if (s.res or {}).get("forward_before") else s.base


def draws_on(
    point: Optional[dict], stream: str, after: int = -1, since_ns: Optional[int] = None
) -> Counter:
    """(op, line) -> how many draws on `stream` the window holds after log entry `after`
    (and after `since_ns`, when given)."""
    draws = (point or {}).get("draws", [])
    return Counter(
        (d["op"], d["at"])
        for d in draws
        if d.get("stream") == stream
        and d.get("after_restores", 0) > after
        and (since_ns is None or d.get("time_ns", 0) > since_ns)
    )


def shuffles_data(s: Subject) -> bool:
    """Evidence that the stream shuffles the data, before a replayed epoch is blamed on it:
    torch made it for a sampler, or it drew a permutation before the first forward. A
    generator that draws timesteps or noise replays its draws too when it is not restored,
    and ids recorded from them look like a replayed epoch; that is not a shuffle."""
    site = generator_site(s.name)
    if site is not None and OWNED_BY in site:
        return True
    return any(
        d.get("op") in SHUFFLE_OPS and d.get("stream") == s.name
        for point in (s.base, s.res)
        for d in (point or {}).get("draws", [])
    )


def advance_fixes(s: Subject) -> str:
    """The fixes of a stream restored and then advanced, most likely first: who drew decides
    the order (an iterator starting, its seed draws alone, explains other samples by itself;
    a prefetched batch comes after its fix, and only when the first batch differs)."""
    extra_draws = [
        d
        for d in (s.res or {}).get("draws", [])
        if d.get("stream") == s.name and d.get("after_restores", 0) > s.last_restore
    ]
    seeds = [d for d in extra_draws if d.get("op") == "random_" and d.get("shape") == []]
    loader_only = bool(seeds) and len(seeds) == len(extra_draws)
    fixes = ["restore the stream after that code runs"]
    own = "give that code a generator of its own"
    if seeds:  # a seed drawn from the stream: a DataLoader iterator starting there
        own = (
            f"give the DataLoader started at {seeds[0]['at']} a generator of its own "
            "(DataLoader(generator=g), seeded from (seed, epoch) at each epoch's start, or "
            "its state from the epoch's start saved and restored: its state at the save does "
            "not give the epoch's order back)"
        )
    fixes.insert(0 if loader_only else 1, own)
    other_batch = first_batch_differs(s)
    if other_batch is True:
        fixes.insert(
            1 if loader_only else 0,
            "if that code fetches the first batch, the batch prefetched before the save is "
            "not in the checkpoint (the first resumed step consumed other samples): save it "
            "with the checkpoint, or fetch each batch at the top of its own step",
        )
    elif other_batch is None:
        fixes.append(
            "if that code fetches the first batch, save the batch prefetched before the save "
            "with the checkpoint"
        )
    return "; otherwise ".join(fixes)


def first_batch_differs(s: Subject) -> Optional[bool]:
    """Whether the first resumed step consumed other samples than the uninterrupted run's
    (only then can a batch prefetched before the save have been lost); None when no sample ids
    were recorded, or when only content fingerprints were (the loader's batches `auto:batch`,
    else the model's inputs `auto:data`) and none of the first batch's is anywhere in the
    uninterrupted run: content drawn from the very stream that differs (an augmentation)
    changes every sample, so other samples and the same ones made otherwise cannot be told
    apart."""
    first = s.ev.split + 1
    ours = s.ev.res.get(s.rank, {}).get(first, {})
    theirs = s.ev.base.get(s.rank, {}).get(first, {})
    keys = [k for k in ours if is_identity_key(k)]
    if not keys:
        return None
    own = [k for k in keys if k not in (CONTENT_KEY, BATCH_KEY)]
    if own:
        return any(ours[k] != theirs.get(k) for k in own)
    key = BATCH_KEY if BATCH_KEY in keys else CONTENT_KEY
    if ours[key] == theirs.get(key):
        return False
    seen = {
        i for values in s.ev.base.get(s.rank, {}).values() for i in ids_of(values.get(key)) or []
    }
    return True if seen & set(ids_of(ours[key]) or []) else None
