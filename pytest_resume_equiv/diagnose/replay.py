"""A replayed epoch, read from the data: the resumed epoch consumes, in order, the samples an
earlier epoch consumed at the same place. It names what a re-seeded (or never saved) shuffle
looks like to the user, whatever made the shuffle."""

from __future__ import annotations

from typing import Optional

from ..compare.accounting import DataAccount, identity_keys
from .evidence import Evidence


def replay_of(ev: Evidence, key: str = "") -> Optional[DataAccount]:
    """The data account of an identity key (`key`, or any recorded) whose resumed steps
    consumed an earlier epoch's samples, in a run that begins at the first divergent step,
    if any."""
    keys = [key] if key else identity_keys(ev.base_sigs)
    differing = {k for found in ev.differing.values() for k in found}
    for found in ev.accounts:
        if found.key not in keys or found.key not in differing or not found.replayed:
            continue
        steps = found.replayed[0]
        # the replay is what differs first, step after step, not a batch that happens to
        # repeat somewhere
        run_of = list(range(ev.step, ev.step + len(steps)))
        if found.epochs and steps == run_of and len(steps) >= min(2, ev.cmp.steps - ev.step + 1):
            return found
    return None


def replayed_epoch(ev: Evidence, rank: int, key: str = "") -> str:
    """`the resumed epoch 1 consumes the samples of epoch 0's steps 2-4, in order (at steps
    6-8)`, or "" when the data shows no replayed epoch."""
    found = replay_of(ev, key)
    return found.replay_words() if found is not None else ""
