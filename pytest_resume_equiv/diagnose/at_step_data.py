"""Causes read from the sample ids a divergent step consumed (the trainer's own, or the
automatic ones), against the uninterrupted run's: a batch lost at the resume, a skip made
again, a replayed epoch, another order, unseeded loader workers; and an input the audit does
not see. Content without ids is read in data_inputs.py. Asked at any divergent step, whether
the resume point held or not (`Stage.STEP`, `Stage.HELD`)."""

from __future__ import annotations

from typing import Optional

from ..compare.accounting import BATCH_KEY, CONTENT_KEY, is_identity_key
from ..rank.layout import is_audit_key
from .classes import DATA_ORDER, DATALOADER_WORKERS, SKIPPED_AGAIN
from .data_inputs import INPUT_RULES
from .evidence import Evidence, is_content_key
from .replay import replayed_epoch
from .rules import Finding, Rule, Stage

STAGES = (Stage.STEP, Stage.HELD)


def _user(ev: Evidence, rank: int) -> list[str]:
    return [k for k in ev.differing[rank] if not is_audit_key(k)]


def lost_batch(ev: Evidence) -> Optional[Finding]:
    """The first resumed step consumed the batch of the step after it, while every RNG stream
    matched: one batch was lost at the resume. Two look-alikes make it and the signatures
    cannot tell them apart, so both are named: a skip count one too high, or a batch drawn
    before the checkpoint was written (a prefetch at the end of the step before) and not in
    it."""
    if ev.step != ev.split + 1:
        return None
    for rank in ev.differing:
        following = ev.base[rank].get(ev.step + 1, {})
        for key in (k for k in _user(ev, rank) if is_identity_key(k) or is_content_key(k)):
            ours = ev.res[rank][ev.step].get(key)
            if ours is not None and ours == following.get(key):
                what = "sample ids" if is_identity_key(key) else "sample content"
                return Finding(
                    ev.where(rank), {"key": key, "what": what, "step": ev.step}, "lost-batch"
                )
    return None


def _lost_words(f: Finding) -> str:
    return (
        f"{f['what']} differ ({f['key']}) while every audited RNG stream matches: the first "
        f"resumed step consumed the batch the uninterrupted run consumed at step "
        f"{f['step'] + 1}, so one batch was lost at the resume: the number of batches skipped "
        f"after resuming is one too many, or the batch for step {f['step']} was drawn before "
        "the checkpoint was written (prefetched at the end of the step before) and is not in it"
    )


def _skip_keys(ev: Evidence, rank: int) -> list[str]:
    """The identity key a skip made again shows in: a differing id the trainer recorded, else
    the automatic ids (the loader's batches, or the model's inputs)."""
    ids = [k for k in _user(ev, rank) if is_identity_key(k)]
    if ids:
        return ids[:1]
    loaded = BATCH_KEY if BATCH_KEY in ev.differing[rank] else CONTENT_KEY
    return [loaded] if loaded in ev.differing[rank] else []


def skipped_again(ev: Evidence) -> Optional[Finding]:
    """Every resumed step matched for a while, then one consumed a later step's samples: the
    skip that placed the resume right was made a second time (a persistent dataloader worker
    keeping the restored per-worker state into the next epoch)."""
    if ev.step <= ev.split + 1:
        return None
    for rank in ev.differing:
        for key in _skip_keys(ev, rank):
            ids = ev.res[rank][ev.step].get(key)
            later = [
                s for s, v in sorted(ev.base[rank].items()) if s > ev.step and v.get(key) == ids
            ]
            if later:
                return Finding(
                    ev.where(rank), {"key": key, "step": ev.step, "consumed_of": later[0]}
                )
    return None


def _again_words(f: Finding) -> str:
    return (
        f"the resumed run matched through step {f['step'] - 1}, then consumed the samples of "
        f"step {f['consumed_of']} ({f['key']}): it skipped ahead again after the resume had "
        "placed it right, so the skip made at the resume is applied a second time, typically "
        "by a persistent dataloader worker that keeps the restored per-worker state into the "
        "next epoch"
    )


def _differing_ids(ev: Evidence) -> Optional[tuple[int, str]]:
    for rank in ev.differing:
        ids = [k for k in _user(ev, rank) if is_identity_key(k)]
        if ids:
            return rank, ids[0]
    return None


def ids_replayed_epoch(ev: Evidence) -> Optional[Finding]:
    """Sample ids differ while every audited stream matches, and the resumed epoch consumes,
    in order, an earlier epoch's samples at the same place: the shuffle was re-seeded or
    never saved."""
    found = _differing_ids(ev)
    replay = replayed_epoch(ev, found[0], found[1]) if found else ""
    if not replay:
        return None
    return Finding(ev.where(found[0]), {"key": found[1], "replay": replay}, "replayed-epoch")


def _replayed_words(f: Finding) -> str:
    return (
        f"{f['replay']}: sample ids differ ({f['key']}) while every audited RNG stream matches, "
        "so the resumed epoch was shuffled as an earlier one: the sampler epoch or permutation "
        "was not restored"
    )


def ids_order(ev: Evidence) -> Optional[Finding]:
    """Sample ids differ while every audited stream matches, with no replay in them: the data
    order was not restored."""
    found = _differing_ids(ev)
    return Finding(ev.where(found[0]), {"key": found[1]}) if found else None


def _order_words(f: Finding) -> str:
    return (
        f"sample ids differ ({f['key']}) while every audited RNG stream matches: the data "
        "order was not restored (the sampler's epoch or permutation, or the number of batches "
        "skipped after resuming)"
    )


def worker_seeds(ev: Evidence) -> Optional[Finding]:
    """Sample content differs while the sample ids the trainer recorded and every audited
    stream match: the worker seeds (drawn from a main-process RNG when the iterator is made)."""
    if _differing_ids(ev) is not None:
        return None
    for rank, keys in ev.differing.items():
        recorded = [k for k in ev.base[rank][ev.step] if not is_audit_key(k) and is_identity_key(k)]
        content = [k for k in _user(ev, rank) if is_content_key(k)] or [
            k for k in keys if k == CONTENT_KEY
        ]
        if recorded and content:
            return Finding(ev.where(rank), {"content": content, "ids": recorded[0]})
    return None


def _workers_words(f: Finding) -> str:
    return (
        f"sample content differs ({', '.join(f['content'])}) while the sample ids ({f['ids']}) "
        "and every audited RNG stream match: dataloader worker seeds (derived from a "
        "main-process RNG when the iterator is made) were not restored"
    )


def unseen_input(ev: Evidence, rank: int, user: list[str]) -> Finding:
    """The weights were right when the first resumed step began, and the step still computed
    something else: an input the audit does not see."""
    ids = [k for k in ev.base[rank][ev.step] if not is_audit_key(k) and is_identity_key(k)]
    return Finding(ev.where(rank), {"values": user, "ids": ids[0] if ids else None})


def unseen_input_words(f: Finding) -> str:
    same = f", the sample ids ({f['ids']})" if f["ids"] else ""
    return (
        f"at the resume point the weights{same} and every audited RNG stream match the "
        f"uninterrupted run, yet {', '.join(f['values'])} already differ at the first resumed "
        "step: an input the audit does not see differs, such as the samples' content "
        "(augmentation drawn in dataloader workers, which a resume re-seeds) or an unwatched "
        "object"
    )


ID = "data."
LOST, AGAIN, REPLAYED = ID + "lost-batch", ID + "skipped-again", ID + "ids-replay-an-epoch"
ORDER, WORKERS = ID + "ids-order", ID + "worker-seeds"
AFTER = ("step.micro-batches", "step.accumulation-window", "step.lr-differs")
"""The rules every data rule is asked after: the micro-batches and the learning rate change
what a step computes before its data does."""
DATA_RULES = (
    Rule(LOST, STAGES, DATA_ORDER, lost_batch, _lost_words, AFTER),
    Rule(AGAIN, STAGES, SKIPPED_AGAIN, skipped_again, _again_words, (LOST,)),
    Rule(REPLAYED, STAGES, DATA_ORDER, ids_replayed_epoch, _replayed_words, (AGAIN,)),
    Rule(ORDER, STAGES, DATA_ORDER, ids_order, _order_words, (REPLAYED,)),
    Rule(WORKERS, STAGES, DATALOADER_WORKERS, worker_seeds, _workers_words, (LOST,)),
    *INPUT_RULES,
)
"""Ids before content: a batch lost, then a skip made again, then the epoch replayed, then
any other order; content that differs under ids that match is the workers'."""
