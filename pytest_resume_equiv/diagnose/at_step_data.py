"""Causes read from the data a divergent step consumed: which samples (their ids) and what
they held (their content), against the uninterrupted run's: a prefetched batch lost at the save,
a skipped batch skipped again, another order or a replayed epoch, unseeded loader workers.
"""

from __future__ import annotations

from typing import Optional

from ..compare.accounting import is_identity_key
from ..rank.layout import (
    is_audit_key,
)
from .classes import (
    DATA_ORDER,
    DATALOADER_WORKERS,
    SKIPPED_AGAIN,
    UNAUDITED_INPUT,
)
from .evidence import (
    Diagnosis,
    Evidence,
    is_content_key,
)
from .replay import replayed_epoch


def consumed_data(ev: Evidence) -> Optional[Diagnosis]:
    """The data: which samples, and what they contain."""
    for rank, keys in ev.differing.items():
        user = [k for k in keys if not is_audit_key(k)]
        prefetched = _prefetched(
            ev, rank, [k for k in user if is_identity_key(k) or is_content_key(k)]
        )
        if prefetched is not None:
            return prefetched
        differing_ids = [k for k in user if is_identity_key(k)]
        if differing_ids:
            again = _skipped_again(ev, rank, differing_ids[0])
            if again is not None:
                return again
            return _data_order(ev, rank, differing_ids[0])
        recorded_ids = [
            k for k in ev.base[rank][ev.step] if not is_audit_key(k) and is_identity_key(k)
        ]
        content = [k for k in user if is_content_key(k)]
        if recorded_ids and content:
            return Diagnosis(
                f"{ev.where(rank)}: sample content differs ({', '.join(content)}) while the sample ids "
                f"({recorded_ids[0]}) and every audited RNG stream match: dataloader worker seeds "
                "(derived from a main-process RNG when the iterator is made) were not restored. "
                "Fix: restore the RNG the loader draws its base seed from before the iterator "
                "starts (or give the DataLoader a generator of its own, saved and restored)",
                DATALOADER_WORKERS,
            )
    return None


def _data_order(ev: Evidence, rank: int, key: str) -> Diagnosis:
    """Sample ids differ while every audited stream matches: from the data alone, a replay of
    an earlier epoch's place (the shuffle re-seeded or never saved), or another order."""
    replay = replayed_epoch(ev, rank, key)
    if replay:
        return Diagnosis(
            f"{ev.where(rank)}: {replay}: sample ids differ ({key}) while every audited RNG "
            "stream matches, so the resumed epoch was shuffled as an earlier one: the sampler "
            "epoch or permutation was not restored. Fix: restore the sampler's epoch before "
            "iterating (set_epoch(saved_epoch)) when its shuffle is seeded by the epoch; "
            "otherwise save the shuffling generator's state from before the epoch's "
            "permutation was drawn and set it before the iterator starts",
            DATA_ORDER,
        )
    return Diagnosis(
        f"{ev.where(rank)}: sample ids differ ({key}) while every audited RNG stream matches: "
        "the data order was not restored (the sampler's epoch or permutation, or the number "
        "of batches skipped after resuming). Fix: restore the loader's state before "
        "iterating (its epoch, its shuffling generator, and skip exactly the batches the "
        "saved steps consumed), or record the loader with watch() and the report names which",
        DATA_ORDER,
    )


def _prefetched(ev: Evidence, rank: int, inputs: list[str]) -> Optional[Diagnosis]:
    """The first resumed step consumed the batch of the step after it, while every RNG stream
    matched: one batch was lost at the resume. Two look-alikes make it, and the signatures
    cannot tell them apart, so both are named: a skip count one too high, or a batch drawn
    before the checkpoint was written (a prefetch at the end of the step before) and not in
    it, so the resumed run draws the next one in its place."""
    if ev.step != ev.split + 1:
        return None
    following = ev.base[rank].get(ev.step + 1, {})
    for key in inputs:
        ours = ev.res[rank][ev.step].get(key)
        if ours is not None and ours == following.get(key):
            what = "sample ids" if is_identity_key(key) else "sample content"
            return Diagnosis(
                f"{ev.where(rank)}: {what} differ ({key}) while every audited RNG stream "
                f"matches: the first resumed step consumed the batch the uninterrupted run "
                f"consumed at step {ev.step + 1}, so one batch was lost at the resume: the "
                "number of batches skipped after resuming is one too many, or the batch for "
                f"step {ev.step} was drawn before the checkpoint was written (prefetched at the "
                "end of the step before) and is not in it. Fix: skip exactly the batches "
                "consumed, and save a prefetched batch (or its indices) with the checkpoint, or "
                "fetch each batch at the top of its own step",
                DATA_ORDER,
            )
    return None


def _skipped_again(ev: Evidence, rank: int, key: str) -> Optional[Diagnosis]:
    """Every resumed step matched for a while, then one consumed a later step's samples: the
    skip that placed the resume right was made a second time."""
    if ev.step <= ev.split + 1:
        return None
    ids = ev.res[rank][ev.step].get(key)
    later = [
        s for s, values in sorted(ev.base[rank].items()) if s > ev.step and values.get(key) == ids
    ]
    if not later:
        return None
    return Diagnosis(
        f"{ev.where(rank)}: the resumed run matched through step {ev.step - 1}, then consumed "
        f"the samples of step {later[0]} ({key}): it skipped ahead again after the resume had "
        "placed it right, so the skip made at the resume is applied a second time, typically "
        "by a persistent dataloader worker that keeps the restored per-worker state into the "
        "next epoch. Fix: apply the resume's skip once and reset it in the worker (or restart "
        "the workers after the first epoch)",
        SKIPPED_AGAIN,
    )


def unseen_input(ev: Evidence, rank: int, user: list[str]) -> Diagnosis:
    """The weights were right when the first resumed step began, and the step still computed
    something else: an input the audit does not see."""
    ids = [k for k in ev.base[rank][ev.step] if not is_audit_key(k) and is_identity_key(k)]
    same = f", the sample ids ({ids[0]})" if ids else ""
    return Diagnosis(
        f"{ev.where(rank)}: at the resume point the weights{same} and every audited RNG stream "
        f"match the uninterrupted run, yet {', '.join(user)} already differ at the first resumed "
        "step: an input the audit does not see differs, such as the samples' content "
        "(augmentation drawn in dataloader workers, which a resume re-seeds) or an unwatched "
        "object. Fix: record the batch's content (e.g. x=batch) or watch() the object, and the "
        "report names which",
        UNAUDITED_INPUT,
    )
