"""What the diagnosis says beside or instead of a cause: a data replay that leads over the
stream the resume point blamed (`Stage.LEAD`), a re-execution read from the steps a resumed
run recorded past the end (`Stage.NO_DIVERGENCE`), and the notes (`Note`)."""

from __future__ import annotations

from typing import Optional

from ..compare.accounting import BATCH_KEY, CONTENT_KEY, ids_of
from ..compare.step_problems import step_ranges
from ..rank.layout import OWNED_BY, WATCH, generator_site, section_of
from .at_resume import drawn_before_restore
from .classes import (
    DATA_ORDER,
    DATALOADER_WORKERS,
    RE_EXECUTED_STEPS,
    RESTORED_THEN_ADVANCED,
    UNAUDITED_INPUT,
    UNKNOWN,
    rng_before_iterator,
)
from .data_inputs import content_account, order_finding, order_words
from .evidence import Evidence
from .rules import Diagnosis, Finding, Note, Rule, Stage


def data_replayed(ev: Evidence) -> Optional[Finding]:
    """The resumed steps consumed, in order, the batches of steps before the split: a stream
    restored from the saved state draws no earlier part of the data again, so the replay is the data position's (the resumed
    epoch started over, its batches not skipped: HF Trainer's --ignore_data_skip), and it
    leads; the stream is a second finding."""
    item = content_account(ev)
    if item is None or not item.replayed or not item._replay_is_all():
        return None
    return order_finding(
        ev,
        item,
        "which a random stream restored from the saved state does not replay (the one that "
        "differs is a second finding, noted below)",
    )


def _first_fetch_after_every_restore(ev: Evidence) -> Optional[str]:
    """Where the resumed run's loader drew its permutation, when it drew it only after every
    restore before the first resumed step (its restarted iterator yielded no batch before the
    training loop asked for one: nothing was skipped); None otherwise, or when no loader's own
    generator was traced."""
    for rank in sorted(ev.res_sigs):
        _, res = ev.points(rank)
        draws = [
            d
            for d in (res or {}).get("draws", [])
            if OWNED_BY in (generator_site(d.get("stream", "")) or "")
        ]
        if not draws:
            return None
        if any(d.get("after_restores", 0) < (res or {}).get("restores", 0) for d in draws):
            return None
        return draws[0]["at"]
    return None


def epoch_not_skipped(ev: Evidence) -> Optional[Finding]:
    """The resumed steps consumed again samples the uninterrupted run consumed before the
    split, and the loader's restarted iterator drew its permutation only when the training
    loop fetched the first resumed step's batch, after every restore: no batch was skipped, so
    the epoch's batches consumed before the save come again. A stream that differs then (the
    permutation's seed drawn from it at that fetch) is a second finding."""
    at = _first_fetch_after_every_restore(ev)
    if at is None:
        return None
    for item in ev.accounts:
        if not item.repeated or not item.from_earlier:
            continue
        again = set(item.repeated)
        before = sorted({_last_before(ev, item.key, i) for i in again} - {None})
        after = _steps_holding(ev.res, item.key, again, lambda s: s > ev.split)
        evidence = {"key": item.key, "samples": len(again), "before": before, "again": after}
        return Finding(f"step {ev.step}", {**evidence, "fetched_at": at})
    return None


def _last_before(ev: Evidence, key: str, sample: int) -> Optional[int]:
    """The last step up to the split at which the uninterrupted run consumed `sample`: in
    the epoch the resume is in (a sample comes once an epoch)."""
    held = _steps_holding(ev.base, key, {sample}, lambda s: s <= ev.split)
    return held[-1] if held else None


def _steps_holding(runs: dict, key: str, ids: set, keep) -> list[int]:
    """The steps (of any rank) whose `key` holds one of `ids`."""
    return sorted(
        {
            step
            for steps in runs.values()
            for step, values in steps.items()
            if keep(step) and ids & set(ids_of(values.get(key)) or [])
        }
    )


def _not_skipped_words(f: Finding) -> str:
    return (
        f"the resumed run consumed again, at {_steps(f['again'])}, the samples the "
        f"uninterrupted run consumed at {_steps(f['before'])} before the split "
        f"({f['samples']} samples, {f['key']}); its restarted iterator drew its permutation only "
        f"when the loop fetched the first resumed batch ({f['fetched_at']}, after every "
        "restore), so the batches the saved steps consumed in this epoch were not skipped"
    )


def _steps(steps: list[int]) -> str:
    return f"step{'s' * (len(steps) > 1)} {step_ranges(steps)}"


def re_executed(ev: Evidence) -> Optional[Finding]:
    """The resumed run recorded steps past steps= and its data shows why: from its first step
    it consumed, in order, the batches of the steps before the split, as many as it ran too
    many. It re-executed those steps (an epoch counter saved as the epoch the checkpoint was
    made in, so the resume runs that epoch again), not a later stop condition."""
    steps = ev.cmp.steps
    extra = sorted({s for by_step in ev.res.values() for s in by_step if s > steps})
    if not extra:
        return None
    for item in ev.accounts:
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
        evidence = {"first": first, "split": ev.split, "steps": steps, "what": what}
        evidence.update(last=list(shown[-1]), extra=len(extra), up_to=max(extra), back=back)
        return Finding("", evidence)
    return None


def _re_executed_words(f: Finding) -> str:
    first, split, last = f["first"], f["split"], f["last"]
    start = (
        "restarted from step 1: its epoch or step counter was not restored, or was saved as "
        "the epoch the checkpoint was made in"
        if first == 1
        else f"restarted at step {first}: the epoch (or step) counter it saved is that of "
        "the epoch the checkpoint was made in, already done"
    )
    return (
        f"the resumed run re-executed steps {step_ranges(range(first, split + 1))}: its "
        f"{f['what']} at steps {split + 1}-{last[0]} are those of steps {first}-{last[1]}, in "
        f"order, and it recorded {f['extra']} steps past steps={f['steps']} (up to "
        f"{f['up_to']}): it ran {f['back']} steps more than the uninterrupted run had left, so "
        f"it {start}"
    )


RULES = (
    Rule(
        "lead.data-replayed",
        (Stage.LEAD,),
        DATA_ORDER,
        data_replayed,
        order_words,
        over=(RESTORED_THEN_ADVANCED,),
    ),
    Rule(
        "lead.epoch-not-skipped",
        (Stage.LEAD,),
        DATA_ORDER,
        epoch_not_skipped,
        _not_skipped_words,
        after=("lead.data-replayed",),
        over=(RESTORED_THEN_ADVANCED, rng_before_iterator("cpu")),
    ),
    Rule(
        "no-divergence.re-executed-steps",
        (Stage.NO_DIVERGENCE,),
        RE_EXECUTED_STEPS,
        re_executed,
        _re_executed_words,
    ),
)


def inputs_effect(ev: Evidence, found: Diagnosis) -> str:
    """For a cause found elsewhere (a random stream that differs): the inputs that differ are
    its effect, not a data-order bug of their own. The batches a DataLoader yielded, when they
    match, say the samples were the same and changed after loading; otherwise inputs found
    nowhere are other samples or the same ones transformed, either drawn from that stream."""
    if not any(CONTENT_KEY in keys for keys in ev.differing.values()):
        return ""
    item = content_account(ev)
    short = _inputs_short(ev)
    if item is not None and item.key == BATCH_KEY and item.exact and short:
        step, n = short
        return (
            f"the model was given {n} input{'s' * (n > 1)} fewer at step {step} than in the "
            f"uninterrupted run ({CONTENT_KEY}: a micro-batch not run), while the batches "
            f"recorded from the DataLoader ({BATCH_KEY}) match: an effect of the cause above"
        )
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


def _inputs_short(ev: Evidence) -> Optional[tuple[int, int]]:
    """The first resumed step at which the model was given fewer inputs (rows, over every
    rank) than in the uninterrupted run, and how many fewer."""
    for step in sorted({s for steps in ev.res.values() for s in steps if s > ev.split}):
        counts = [
            sum(len(ids_of(runs[r].get(step, {}).get(CONTENT_KEY)) or []) for r in runs)
            for runs in (ev.base, ev.res)
        ]
        if counts[1] < counts[0]:
            return step, counts[0] - counts[1]
    return None


def only_other_ranks(ev: Evidence, found: Diagnosis) -> str:
    """Ranks whose own recorded values or random streams differ, when rank 0's do not (its
    watched parameters can differ only because gradients were all-reduced with theirs)."""
    ranks = sorted(
        r for r, keys in ev.differing.items() if any(section_of(k) != WATCH for k in keys)
    )
    if not ranks or 0 in ranks:
        return ""
    many = len(ranks) > 1
    return (
        f"rank 0's recorded values and random streams match; only "
        f"{'ranks' if many else 'rank'} {', '.join(map(str, ranks))} "
        f"{'differ' if many else 'differs'}: per-rank state (RNG, data cursor, extra_state) "
        "was probably saved from rank 0 only, or keyed by local rank instead of global rank"
    )


DATA_CLASSES = (DATA_ORDER, DATALOADER_WORKERS, UNAUDITED_INPUT, UNKNOWN)
NOTES = (
    Note(
        "note.drawn-before-restore",
        lambda ev, found: drawn_before_restore(ev),
        classes=DATA_CLASSES,
    ),
    Note("note.inputs-are-an-effect", inputs_effect, unless=DATA_CLASSES),
    Note("note.only-other-ranks", only_other_ranks),
)
"""In the order the report prints them."""
