"""Causes read from the data a divergent step consumed: which samples (their ids) and what
they held (their content), against the uninterrupted run's: a prefetched batch lost at the save,
a skipped batch skipped again, another order or a replayed epoch, unseeded loader workers, a
resumed run that re-executed the steps before the split.

Without sample ids, automatic recording's ids say the same over the global batch (every
rank's batch of a step together): which step's batch was consumed again or never, on any
number of ranks. The batches a DataLoader yielded (`auto:batch`) are the samples; the model's
inputs (`auto:data`) are the content check: the batches equal and the inputs not, the trainer
changed the samples after loading (noise, an augmentation in its loop). Ids found nowhere in
the uninterrupted run name nothing by themselves (other samples, ones it never reached within
its steps, or the same samples transformed): an augmentation is named only on evidence that
separates it, batches that match or a random stream that differs.
"""

from __future__ import annotations

from typing import Optional

from ..compare.accounting import BATCH_KEY, CONTENT_KEY, DataAccount, account, is_identity_key
from ..compare.step_problems import step_ranges
from ..rank.layout import (
    is_audit_key,
)
from .classes import (
    DATA_ORDER,
    DATALOADER_WORKERS,
    RE_EXECUTED_STEPS,
    SKIPPED_AGAIN,
    UNAUDITED_INPUT,
    UNKNOWN,
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
        # the content the trainer recorded, or the model's inputs recorded automatically
        content = [k for k in user if is_content_key(k)] or [k for k in keys if k == CONTENT_KEY]
        if recorded_ids and content:
            return Diagnosis(
                f"{ev.where(rank)}: sample content differs ({', '.join(content)}) while the sample ids "
                f"({recorded_ids[0]}) and every audited RNG stream match: dataloader worker seeds "
                "(derived from a main-process RNG when the iterator is made) were not restored. "
                "Fix: restore the RNG the loader draws its base seed from before the iterator "
                "starts (or give the DataLoader a generator of its own, saved and restored)",
                DATALOADER_WORKERS,
            )
        loaded = BATCH_KEY if BATCH_KEY in keys else CONTENT_KEY
        if loaded in keys:  # automatic ids alone: a later step's, after a match
            again = _skipped_again(ev, rank, loaded)
            if again is not None:
                return again
    if any(k in keys for keys in ev.differing.values() for k in (BATCH_KEY, CONTENT_KEY)):
        return from_inputs(ev)
    return None


def content_account(ev: Evidence) -> Optional[DataAccount]:
    """Automatic recording's account, when the trainer recorded no sample ids: of the batches
    a DataLoader yielded when one was seen, else of the model's inputs."""
    found = account(ev.base_sigs, ev.res_sigs, ev.split, ev.cmp.steps, ev.cmp.ignored)
    return next((item for item in found if item.key in (BATCH_KEY, CONTENT_KEY)), None)


RECORD_IDS = (
    "Fix: to tell them apart, record each batch's sample ids (req.record(step, "
    "sample_ids=...), docs/guides/recording-more.md), or give the model its samples through a "
    "torch DataLoader, whose batches are recorded by themselves, and the report names the cause"
)
"""How to tell other samples from the same samples transformed, when nothing recorded can."""


def _unknown(ev: Evidence, item: Optional[DataAccount]) -> Diagnosis:
    """Inputs (or loaded batches) that differ with nothing to separate other samples from the
    same samples transformed: said so, with how to tell."""
    loaded = item is not None and item.key == BATCH_KEY
    key = BATCH_KEY if loaded else CONTENT_KEY
    what = "the batches the DataLoader yielded" if loaded else "the model's inputs"
    found = _new_inputs(item)
    maybe = (
        "samples the loader transformed otherwise (an augmentation in the dataset or its "
        "workers, whose seeds a resume re-draws)"
        if loaded
        else "the same samples transformed otherwise (noise or an augmentation added after "
        "loading, from a source the audit does not see)"
    )
    return Diagnosis(
        f"step {ev.step}: {what} differ from the uninterrupted run's ({key}"
        f"{': ' + found if found else ''}) while every audited RNG stream matches: other "
        "samples (another order, or ones the uninterrupted run did not reach within its steps) "
        f"or {maybe}; what was recorded cannot tell which, so the cause is unknown. " + RECORD_IDS,
        UNKNOWN,
    )


def _changed_after_loading(ev: Evidence) -> Diagnosis:
    """The loader yielded the uninterrupted run's batches and the model's inputs differ: the
    trainer changed the samples in its loop, from randomness the audit does not see."""
    return Diagnosis(
        f"step {ev.step}: the batches the DataLoader yielded are the uninterrupted run's "
        f"({BATCH_KEY}), but the model's inputs differ ({CONTENT_KEY}) while every audited RNG "
        "stream matches: the samples were changed after loading, in the training loop (noise, "
        "an augmentation or a mask drawn there), from a random source the audit does not see "
        "(a generator of another library, a seed of its own). Fix: draw that randomness from "
        "torch's RNG or a torch.Generator, and save and restore its state with the checkpoint",
        UNAUDITED_INPUT,
    )


def from_inputs(ev: Evidence) -> Diagnosis:
    """The model's inputs (`auto:data`) differ at this step while every audited RNG stream
    matches. The batches a DataLoader yielded say which samples they were: the same (the
    samples changed after loading), or others (their order, read over the global batch). With
    no loader seen, the inputs' own account: their order when another step's batch or samples
    show it, else unknown (other samples, or the same samples transformed)."""
    item = content_account(ev)
    if item is not None and item.key == BATCH_KEY and not 0 < item.first_different <= ev.step:
        return _changed_after_loading(ev)
    if item is None or item.content_differs or not (item.order_words() or _sample_words(item)):
        return _unknown(ev, item)
    return data_order(ev, item)


def data_order(
    ev: Evidence, item: DataAccount, streams: str = "while every audited RNG stream matches"
) -> Diagnosis:
    """The data order, from automatic recording's account: which step's batch was consumed
    again, lost at the resume, or replayed from an earlier place (`streams`: what the random
    streams say beside it)."""
    where = f"step {ev.step}"
    # no whole batch moved (a batch of several micro-batches, shifted by one of them): the
    # samples say it still, counted
    words = item.order_words() or _sample_words(item)
    replay = item.replay_words() if item._replay_is_all() else ""
    if item.first_different == ev.split + 1 and item.batches[:1] == [(ev.split + 1, ev.split + 2)]:
        why = (
            "one batch was lost at the resume: the number of batches skipped after resuming "
            f"is one too many, or the batch for step {ev.split + 1} was drawn before the "
            "checkpoint was written (prefetched at the end of the step before) and is not in "
            "it. Fix: skip exactly the batches consumed, and save a prefetched batch (or its "
            "indices) with the checkpoint, or fetch each batch at the top of its own step"
        )
    elif replay:
        words = replay
        why = (
            "the resumed run started the data over from an earlier place: the loader's "
            "position (its epoch, its shuffling generator, the batches to skip) was not "
            "restored. Fix: restore the loader's state before iterating (its epoch, its "
            "shuffling generator) and skip exactly the batches the saved steps consumed"
        )
    else:
        why = (
            "the data order was not restored (the number of batches skipped after resuming, "
            "or the loader's epoch or shuffling generator). Fix: skip exactly the batches the "
            "saved steps consumed (a counter of batches saved with the checkpoint, not "
            "recomputed), and restore the loader's epoch and shuffling generator before "
            "iterating"
        )
    what = "the batches the DataLoader yielded" if item.key == BATCH_KEY else "the model's inputs"
    return Diagnosis(
        f"{where}: {what} ({item.key}, by content over every rank's batch) "
        f"show {words}, {streams}: {why}",
        DATA_ORDER,
    )


def replay_leads(ev: Evidence, beside: Diagnosis) -> Optional[Diagnosis]:
    """A stream restored and then advanced (`beside`), while the resumed steps consumed, in
    order, the batches of steps before the split: a stream restored from the saved state
    draws no earlier part of the data again, so the replay is the data position's (the
    resumed epoch started over, its batches not skipped: HF Trainer's --ignore_data_skip),
    and it leads; the advance is a note."""
    item = content_account(ev)
    if item is None or not item.replayed or not item._replay_is_all():
        return None
    found = data_order(
        ev,
        item,
        "which a random stream restored from the saved state does not replay (the one that "
        "differs is a second finding, noted below)",
    )
    found.notes.append(f"also: {beside.cause}")
    return found


def _sample_words(item: DataAccount) -> str:
    """The samples that moved, counted: `2 samples never seen and 4 consumed at another
    step`; "" when none did."""
    parts = [
        f"{len(ids)} sample{'s' if len(ids) > 1 else ''} {what}"
        for ids, what in (
            (item.missing, "never seen"),
            (item.repeated, "seen twice or more"),
            (item.moved, "consumed at another step"),
        )
        if ids
    ]
    return " and ".join(parts)


def _new_inputs(item: Optional[DataAccount]) -> str:
    if item is None or not item.unknown:
        return ""
    n = len(item.unknown)
    what = "sample" if item.key == BATCH_KEY else "input"
    return (
        f"from step {item.unknown_steps[0]} on, {n} {what}{'s' if n > 1 else ''} found "
        "nowhere in the uninterrupted run"
    )


def inputs_note(ev: Evidence, found: Diagnosis) -> str:
    """For a cause found elsewhere (a random stream that differs): the inputs that differ are
    its effect, not a data-order bug of their own. The batches a DataLoader yielded, when they
    match, say the samples were the same and changed after loading; otherwise inputs found
    nowhere are other samples or the same ones transformed, either drawn from that stream."""
    if found.bug_class in (DATA_ORDER, UNAUDITED_INPUT, DATALOADER_WORKERS, UNKNOWN):
        return ""
    if not any(CONTENT_KEY in keys for keys in ev.differing.values()):
        return ""
    item = content_account(ev)
    if item is not None and item.key == BATCH_KEY and item.exact:
        return (
            f"the batches the DataLoader yielded ({BATCH_KEY}) are the uninterrupted run's at "
            f"every step, the model's inputs ({CONTENT_KEY}) are not: the samples were changed "
            "after loading (noise or an augmentation in the loop), an effect of the cause above "
            "where they draw from it"
        )
    if item is None or not item.content_differs:
        return ""
    what = "batches the DataLoader yielded" if item.key == BATCH_KEY else "model's inputs"
    return (
        f"the {what} ({item.key}) hold content found nowhere in the uninterrupted run from "
        f"step {item.unknown_steps[0]} on: other samples, or the same samples transformed "
        "otherwise; either may be an effect of the cause above where they draw from it"
    )


def re_executed(ev: Evidence) -> Optional[Diagnosis]:
    """The resumed run recorded steps past steps= and its data shows why: from its first step
    it consumed, in order, the batches of the steps before the split, as many as it ran too
    many. It re-executed those steps (an epoch counter saved as the epoch the checkpoint was
    made in, so the resume runs that epoch again), not a later stop condition."""
    steps = ev.cmp.steps
    # read from the records, whatever the step problems call them (steps past the end, or a
    # step counter resumed behind)
    extra = sorted({s for by_step in ev.res.values() for s in by_step if s > steps})
    if not extra:
        return None
    for item in account(ev.base_sigs, ev.res_sigs, ev.split, steps, ev.cmp.ignored):
        pairs = item.batches or (list(zip(*item.replayed)) if item.replayed else [])
        first = dict(pairs).get(ev.split + 1)
        if first is None or first > ev.split:
            continue
        back = ev.split + 1 - first
        shown = [(s, t) for s, t in pairs if s - t == back]
        in_order = [(ev.split + 1 + k, first + k) for k in range(len(shown))]
        if max(extra) != steps + back or shown != in_order:
            continue
        what = "inputs by content" if item.key == CONTENT_KEY else f"sample ids ({item.key})"
        last = shown[-1]
        start = (
            "restarted from step 1: its epoch or step counter was not restored, or was saved as "
            "the epoch the checkpoint was made in"
            if first == 1
            else f"restarted at step {first}: the epoch (or step) counter it saved is that of "
            "the epoch the checkpoint was made in, already done"
        )
        return Diagnosis(
            f"the resumed run re-executed steps {step_ranges(range(first, ev.split + 1))}: its "
            f"{what} at steps {ev.split + 1}-{last[0]} are those of steps {first}-{last[1]}, in "
            f"order, and it recorded {len(extra)} steps past steps={steps} (up to {max(extra)}): "
            f"it ran {back} steps more than the uninterrupted run had left, so it {start}. "
            "Fix: save the number of the next epoch to run (epoch + 1, or the step count) with "
            "the checkpoint and resume from it",
            RE_EXECUTED_STEPS,
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
