"""The chain-link check (`chain=True`): each link resumes from the checkpoint the link before
saved (the first from the uninterrupted run's) and must equal the uninterrupted run. When a
later link breaks, the direct resume (`direct.py`) tells a stale checkpoint of the link
before from a load path that fails from that step on."""

from __future__ import annotations

from ..compare.diff import first_difference
from ..plan import Planner
from .base import Check, Judging, Outcome, Verdict
from .launches import one_group, resumed_from, uninterrupted_of
from .resume import ResumeLike, judge_resume


def link_label(link: int, split: int) -> str:
    if link == 1:
        return f"chain link 1 (resumed from step {split} of the uninterrupted run)"
    return (
        f"chain link {link} (resumed from step {split}, from the checkpoint chain link "
        f"{link - 1} saved)"
    )


def chain_text(outcome: Outcome, broke: Verdict) -> str:
    """Which link of a chain broke, and whether a resume from the uninterrupted run's own
    checkpoint at that step broke too: that separates a stale checkpoint written by the
    link before from a load path that fails from that step on."""
    links = [v for v in outcome.verdicts if v.link]
    held = [v.link for v in links if v.link < broke.link and v.equal]
    text = f"the chain broke at link {broke.link} of {len(links)} (resumed from step {broke.split})"
    if held:
        text += f"; link{'s' * (len(held) > 1)} {', '.join(map(str, held))} matched"
    direct = next(
        (v for v in outcome.checks if v.check == "direct" and v.split == broke.split), None
    )
    if direct is None or direct.comparison is None or broke.link == 1:
        return text
    before = broke.link - 1
    if direct.comparison.equal:
        return text + (
            f"; a resume from the uninterrupted run's checkpoint at step {broke.split} matches, "
            f"so the checkpoint chain link {before} saved after its own resume does not hold "
            "the state it trained with: the resumed run saves a stale object (a state dict "
            "taken before the load) or leaves something out of its save"
        )
    return text + (
        f"; a resume from the uninterrupted run's checkpoint at step {broke.split} diverges "
        f"too ({first_difference(direct.comparison)}): the load path fails from this step on, "
        "whoever saved the checkpoint"
    )


class ChainLink(ResumeLike):
    kind = "chain"

    @classmethod
    def plan(cls, planner: Planner) -> list[Check]:
        marker = planner.marker
        if not marker.chain:
            return []
        one_group(
            planner,
            "chain=True needs one uninterrupted launch that saves at every split, but the "
            "command differs per split (it uses {split}); use {splits}, or ctx.should_save(step)",
        )
        full = uninterrupted_of(planner, marker.splits[0])
        checks: list[Check] = []
        previous = full
        for link, split in enumerate(marker.splits, start=1):
            later = tuple(s for s in marker.splits if s > split)[:1]
            resumed = resumed_from(planner, split, full, previous, later)
            resumed.link = link
            checks.append(cls(split, full, resumed))
            previous = resumed
        return checks

    def judge(self, judge: Judging) -> tuple[Verdict, dict[str, str]]:
        reference, run = judge.signatures(self.reference), judge.signatures(self.resumed)
        label, source = link_label(self.resumed.link, self.split), self.source(judge)
        verdict = judge_resume(
            reference, run, self.split, judge.comparator, self.kind, label, source
        )
        return verdict, {}

    @classmethod
    def block(cls, verdict: Verdict, outcome: Outcome, kept: str) -> list[str]:
        """The first broken link opens with how the chain broke."""
        first = next((v for v in outcome.verdicts if v.link and v.failed), None)
        lead = [chain_text(outcome, verdict)] if first is verdict else []
        return lead + super().block(verdict, outcome, kept)
