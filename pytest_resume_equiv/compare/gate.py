"""The resume point as an exact gate.

What a resumed run holds right before its first step (every watched object's fingerprints,
every audited random stream, the data loader's state, the step counters) must equal, bit for
bit, what the launch that wrote the checkpoint held at the same program point, and the first
resumed step must consume the same samples. A load is a copy: noise in the arithmetic (atomics,
split-K, another kernel) cannot change it. So the gate holds under every tolerance and every
measured noise, and a difference there is the resume's doing.

The reference is the launch that wrote the checkpoint: the uninterrupted run
(`interrupt="continue"`), or the interrupted launch itself (`"kill"` goes on past the split and
takes its snapshot at the same point). Where that launch took no snapshot there (`"stop"`
ends at the split), the uninterrupted run stands in for the parts no arithmetic touches
(random streams, counters, the loader, train/eval flags) and the float state is not gated.
Snapshots taken at different places (a forward of another module, another line) are not
compared: the gate then says it could not judge.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from ..rank.layout import RNG, section_of, subject_of
from ..signature import Signature
from . import facts
from .accounting import is_identity_key
from .restore_history import restore_history
from .tolerance import ComparisonRules, ignored, latent

Run = dict[int, Signature]

FLOAT_PARTS = ("params", "buffers", "state", "tensor", "value")
"""Watched parts that hold float contents: what another launch's arithmetic may change."""
SECTIONS = ("rng", "watch")


@facts.fact("gate")
@dataclass
class GateFacts:
    status: str
    """held | failed | unknown (no snapshot to judge, or snapshots of different places)."""
    reference: str = "the uninterrupted run"
    why: str = ""
    """unknown: why it could not judge; held: what it did not gate."""
    differing: dict[str, list[str]] = field(default_factory=dict)
    """rank -> the items that differ at the resume point."""
    compared: int = 0
    """Items compared on every rank together."""
    at: str = ""
    """Where the snapshots were taken (the lowest judged rank's)."""
    how: dict[str, dict[str, str]] = field(default_factory=dict)
    """rank -> differing item -> what the resumed run's restore log says of it: one of
    `RESTORE_EVIDENCE` (absent: the log cannot tell, as after an in-place load)."""

    @property
    def failed(self) -> bool:
        return self.status == "failed"

    @property
    def held(self) -> bool:
        return self.status == "held"

    def lines(self, label: str) -> list[str]:
        if not self.failed:
            return []
        where = "; ".join(f"rank {r}: {', '.join(keys[:6])}" for r, keys in self.differing.items())
        if all(is_identity_key(k) for keys in self.differing.values() for k in keys):
            return [
                f"{label}: at the resume point ({self.at}) every restored state equals "
                f"{self.reference}'s, but the first resumed step consumed other data: {where}. "
                "The resume did not put the data where it was"
            ]
        return [
            f"{label}: at the resume point ({self.at}) the resumed run's state differs from "
            f"{self.reference}'s at the same point: {where}. A load is a copy, so no noise "
            f"in the arithmetic explains this: {self._evidence()}"
        ]

    def _evidence(self) -> str:
        """What the restore log shows of the differing state, one clause per kind of
        evidence (never restored, restored then advanced, restored other); the old sentence
        only where every item was restored, and a neutral one where the log cannot tell."""
        grouped: dict[str, list[str]] = {}
        for rank, keys in self.differing.items():
            for key in keys:
                how = self.how.get(rank, {}).get(key, UNKNOWN)
                names = grouped.setdefault(how, [])
                if not is_identity_key(key) and subject_of(key) not in names:
                    names.append(subject_of(key))
        grouped = {how: names for how, names in grouped.items() if names}
        if not grouped or set(grouped) == {RESTORED_OTHER}:
            return "the resume restored something other than what was saved"
        clauses = []
        for how in (*RESTORE_EVIDENCE, UNKNOWN):
            names = grouped.get(how)
            if not names:
                continue
            listed = ", ".join(names[:6])
            was = "was" if len(names) == 1 else "were"
            clauses.append(
                {
                    NOTHING_RESTORED: "the resumed run's restore log holds no load and no "
                    "restore call before this point (seeding at most): nothing was restored, "
                    f"and {listed} {was} never restored",
                    NEVER_RESTORED: f"{listed} {was} never restored (no restore call names "
                    f"{'it' if len(names) == 1 else 'them'} before this point)",
                    ADVANCED: f"{listed} {was} restored and then advanced by random draws "
                    "before the first resumed step",
                    NOT_ADVANCED: f"{listed} {was} restored and not drawn from before this "
                    "point, where the uninterrupted run drew from "
                    f"{'it' if len(names) == 1 else 'them'} after the split",
                    RESTORED_OTHER: f"{listed} {was} restored to something other than what "
                    "was saved",
                    RESTORED_DIFFERS: f"{listed} {was} restored and "
                    f"{'differs' if len(names) == 1 else 'differ'} here (restored other than "
                    "saved, or changed after the restore)",
                    UNKNOWN: f"{listed} {'does' if len(names) == 1 else 'do'} not hold what "
                    "was saved",
                }[how]
            )
        return "; ".join(clauses)

    def summary(self, label: str) -> list[str]:
        return []

    def words(self) -> str:
        """One line for the plan summary and reports that list what was compared."""
        if self.held:
            extra = f"; {self.why}" if self.why else ""
            return f"resume point exact against {self.reference} ({self.compared} items){extra}"
        if self.failed:
            return f"resume point differs from {self.reference}'s"
        return f"resume point not gated: {self.why}"


NEVER_RESTORED = "never restored"
NOTHING_RESTORED = "nothing restored"
ADVANCED = "restored then advanced"
NOT_ADVANCED = "restored, not advanced"
RESTORED_OTHER = "restored other"
RESTORED_DIFFERS = "restored, differs"
UNKNOWN = "unknown"
RESTORE_EVIDENCE = (
    NOTHING_RESTORED,
    NEVER_RESTORED,
    ADVANCED,
    NOT_ADVANCED,
    RESTORED_OTHER,
    RESTORED_DIFFERS,
)


def restore_evidence(res: Signature, point: dict[str, Any], base: dict[str, Any], key: str) -> str:
    """What the resumed run's restore log (up to its resume point `point`) says of a
    differing item: no entry but seeding (`NOTHING_RESTORED`: a restart); none that names it
    (`NEVER_RESTORED`; `UNKNOWN` for a watched object after a load that writes in place,
    DCP's, which restores unlogged); a random stream drawn from after its last restore
    (`ADVANCED`), or not, while the uninterrupted run drew from it before its own snapshot
    `base` (`NOT_ADVANCED`); else `RESTORED_OTHER`. A watched object that was restored is
    `RESTORED_DIFFERS`: whether it was changed after its restore (a scheduler stepped) the
    log does not say. Seeding counts as a restore only after
    the first load (seeding at the start is initialisation)."""
    history = restore_history(res.restores, point)
    if history.only_seeding:  # seeding with no load is initialisation
        return NOTHING_RESTORED
    subject = subject_of(key)
    mine = history.of(subject).restoring
    if not mine:
        return UNKNOWN if history.in_place and section_of(key) != RNG else NEVER_RESTORED
    if section_of(key) != RNG:
        return RESTORED_DIFFERS
    if any(
        d.get("stream") == subject and d.get("after_restores", 0) > mine[-1]
        for d in point.get("draws", [])
    ):
        return ADVANCED
    if any(d.get("stream") == subject for d in base.get("draws", [])):
        return NOT_ADVANCED
    return RESTORED_OTHER


def _items(point: dict[str, Any], floats: bool) -> dict[str, Any]:
    """The snapshot's gated items as audit keys (`rng:cpu`, `watch:model.params`)."""
    items = {}
    for section in SECTIONS:
        for name, value in (point.get(section) or {}).items():
            if section == "watch" and not floats and name.rsplit(".", 1)[-1] in FLOAT_PARTS:
                continue
            items[f"{section}:{name}"] = value
    return items


def _rank_gate(
    rank: int,
    ref: Signature,
    res: Signature,
    split: int,
    rules: ComparisonRules,
    floats: bool,
) -> tuple[Optional[list[str]], int, str]:
    """(the differing items or None when this rank cannot be judged, items compared, where
    or why not)."""
    a, b = ref.resume_point(split), res.resume_point(split)
    if a is None or b is None:
        run = "the resumed run" if b is None else "the reference run"
        return None, 0, f"{run} took no snapshot at the resume point on rank {rank}"
    if a.get("at") != b.get("at"):
        return (
            None,
            0,
            (
                f"rank {rank}'s snapshots were taken at different places ({a.get('at')} and "
                f"{b.get('at')}): not the same program point"
            ),
        )
    x, y = _items(a, floats), _items(b, floats)
    names = [*rules.ignore, *ref.ignored, *res.ignored]
    keys = [k for k in sorted(set(x) | set(y)) if not ignored(k, names)]
    base_steps, res_steps = ref.by_step(), res.by_step()
    first = res_steps.get(split + 1, {})
    ids = [k for k in first if is_identity_key(k) and not ignored(k, names)]
    differing = [
        k
        for k in keys
        if x.get(k) != y.get(k)
        and (rules.strict_latent or not latent(k, base_steps, res_steps, split))
    ]
    differing += [k for k in ids if base_steps.get(split + 1, {}).get(k) != first.get(k)]
    return differing, len(keys) + len(ids), str(b.get("at", ""))


def _evidence_of(ref: Signature, res: Signature, split: int, keys: list[str]) -> dict[str, str]:
    point, base = res.resume_point(split) or {}, ref.resume_point(split) or {}
    return {k: restore_evidence(res, point, base, k) for k in keys if not is_identity_key(k)}


def gate(
    reference: Run,
    source: Optional[Run],
    run: Run,
    split: int,
    rules: ComparisonRules,
) -> GateFacts:
    """Judge the resumed `run`'s resume point against the launch that wrote its checkpoint
    (`source`; None: the uninterrupted `reference` wrote it)."""
    against, floats, name, why = reference, True, "the uninterrupted run", ""
    if source is not None:
        took = all(s.resume_point(split) is not None for s in source.values())
        if took:
            against, name = source, "the interrupted launch"
        else:
            floats = False
            why = (
                "the interrupted launch took no snapshot at that point, so its float state "
                "(parameters, buffers, optimizer state) is not gated"
            )
    result = GateFacts("held", name, why)
    reasons = []
    for rank, sig in sorted(run.items()):
        ref = against.get(rank)
        if ref is None:
            continue
        differing, compared, where = _rank_gate(rank, ref, sig, split, rules, floats)
        if differing is None:
            reasons.append(where)
            continue
        result.compared += compared
        result.at = result.at or where
        if differing:
            result.differing[str(rank)] = differing
            result.how[str(rank)] = _evidence_of(ref, sig, split, differing)
    if result.differing:
        result.status = "failed"
    elif not result.compared:
        result.status, result.why = "unknown", reasons[0] if reasons else "no rank to judge"
    elif reasons:
        result.why = "; ".join(filter(None, [why, *reasons]))
    return result
