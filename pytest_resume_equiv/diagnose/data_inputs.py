"""Causes read from what a divergent step consumed when the trainer recorded no sample ids:
automatic recording's account over the global batch (every rank's batch of a step together) of
the batches a DataLoader yielded (`auto:batch`: the samples) and of the model's inputs
(`auto:data`: the content). The batches equal and the inputs not, the samples changed after
loading; ids found nowhere in the uninterrupted run name nothing by themselves (other samples,
or the same samples transformed)."""

from __future__ import annotations

from typing import Optional

from ..compare.accounting import BATCH_KEY, CONTENT_KEY, DataAccount
from .classes import DATA_ORDER, UNAUDITED_INPUT, UNKNOWN
from .evidence import Evidence
from .rules import Finding, Rule, Stage

STAGES = (Stage.STEP, Stage.HELD)


def content_account(ev: Evidence) -> Optional[DataAccount]:
    """Automatic recording's account, when the trainer recorded no sample ids: of the batches
    a DataLoader yielded when one was seen, else of the model's inputs."""
    return next((item for item in ev.accounts if item.key in (BATCH_KEY, CONTENT_KEY)), None)


def _inputs_differ(ev: Evidence) -> bool:
    return any(k in keys for keys in ev.differing.values() for k in (BATCH_KEY, CONTENT_KEY))


def changed_after_loading(ev: Evidence) -> Optional[Finding]:
    """The loader yielded the uninterrupted run's batches and the model's inputs differ: the
    trainer changed the samples in its loop, from randomness the audit does not see."""
    if not _inputs_differ(ev):
        return None
    item = content_account(ev)
    if item is None or item.key != BATCH_KEY or 0 < item.first_different <= ev.step:
        return None
    return Finding(
        f"step {ev.step}", {"batches": BATCH_KEY, "inputs": CONTENT_KEY}, "after-loading"
    )


def _after_loading_words(f: Finding) -> str:
    return (
        f"the batches the DataLoader yielded are the uninterrupted run's ({f['batches']}), but "
        f"the model's inputs differ ({f['inputs']}) while every audited RNG stream matches: the "
        "samples were changed after loading, in the training loop (noise, an augmentation or a "
        "mask drawn there), from a random source the audit does not see (a generator of another "
        "library, a seed of its own)"
    )


def order_finding(ev: Evidence, item: DataAccount, streams: str) -> Finding:
    """The data order from an account: which step's batch was consumed again, lost at the
    resume, or replayed from an earlier place (`streams`: what the random streams say)."""
    words = item.order_words() or sample_words(item)
    replay = item.replay_words() if item._replay_is_all() else ""
    lost = item.first_different == ev.split + 1 and item.batches[:1] == [
        (ev.split + 1, ev.split + 2)
    ]
    variant = "lost-batch" if lost else "replayed" if replay else ""
    return Finding(
        f"step {ev.step}",
        {
            "key": item.key,
            "shows": replay if variant == "replayed" else words,
            "streams": streams,
            "split": ev.split,
        },
        variant,
    )


WHY = {
    "lost-batch": "one batch was lost at the resume: the number of batches skipped after "
    "resuming is one too many, or the batch for step {next} was drawn before the checkpoint "
    "was written (prefetched at the end of the step before) and is not in it",
    "replayed": "the resumed run started the data over from an earlier place: the loader's "
    "position (its epoch, its shuffling generator, the batches to skip) was not restored",
    "": "the data order was not restored (the number of batches skipped after resuming, or "
    "the loader's epoch or shuffling generator)",
}


def order_words(f: Finding) -> str:
    what = "the batches the DataLoader yielded" if f["key"] == BATCH_KEY else "the model's inputs"
    why = WHY[f.variant].format(next=f["split"] + 1)
    return f"{what} ({f['key']}, by content over every rank's batch) show {f['shows']}, {f['streams']}: {why}"


def inputs_order(ev: Evidence) -> Optional[Finding]:
    """Inputs (or loaded batches) that differ while every audited stream matches, with an
    account that shows their order: another step's batch, or samples moved."""
    if not _inputs_differ(ev):
        return None
    item = content_account(ev)
    if item is None or item.content_differs or not (item.order_words() or sample_words(item)):
        return None
    return order_finding(ev, item, "while every audited RNG stream matches")


def inputs_unknown(ev: Evidence) -> Optional[Finding]:
    """Inputs (or loaded batches) that differ with nothing to separate other samples from the
    same samples transformed: said so, with how to tell."""
    if not _inputs_differ(ev):
        return None
    item = content_account(ev)
    loaded = item is not None and item.key == BATCH_KEY
    return Finding(
        f"step {ev.step}", {"loaded": loaded, "found": new_inputs(item)}, variant="record-ids"
    )


def _unknown_words(f: Finding) -> str:
    key = BATCH_KEY if f["loaded"] else CONTENT_KEY
    what = "the batches the DataLoader yielded" if f["loaded"] else "the model's inputs"
    maybe = (
        "samples the loader transformed otherwise (an augmentation in the dataset or its "
        "workers, whose seeds a resume re-draws)"
        if f["loaded"]
        else "the same samples transformed otherwise (noise or an augmentation added after "
        "loading, from a source the audit does not see)"
    )
    return (
        f"{what} differ from the uninterrupted run's ({key}"
        f"{': ' + f['found'] if f['found'] else ''}) while every audited RNG stream matches: "
        "other samples (another order, or ones the uninterrupted run did not reach within its "
        f"steps) or {maybe}; what was recorded cannot tell which, so the cause is unknown"
    )


def sample_words(item: DataAccount) -> str:
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


def new_inputs(item: Optional[DataAccount]) -> str:
    if item is None or not item.unknown:
        return ""
    n = len(item.unknown)
    what = "sample" if item.key == BATCH_KEY else "input"
    return (
        f"from step {item.unknown_steps[0]} on, {n} {what}{'s' if n > 1 else ''} found "
        "nowhere in the uninterrupted run"
    )


ID = "data."
AFTER_LOADING, INPUTS_ORDER = ID + "changed-after-loading", ID + "inputs-order"
INPUT_RULES = (
    Rule(
        AFTER_LOADING,
        STAGES,
        UNAUDITED_INPUT,
        changed_after_loading,
        _after_loading_words,
        after=(ID + "worker-seeds", ID + "skipped-again", ID + "ids-order"),
    ),
    Rule(INPUTS_ORDER, STAGES, DATA_ORDER, inputs_order, order_words, (AFTER_LOADING,)),
    Rule(ID + "inputs-unknown", STAGES, UNKNOWN, inputs_unknown, _unknown_words, (INPUTS_ORDER,)),
)
"""Loaded batches that match say the samples changed after loading, before any order is
read from the inputs; unknown when nothing tells."""
