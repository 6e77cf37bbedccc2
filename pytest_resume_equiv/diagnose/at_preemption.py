"""The causes of a failed preempt point (`Stage.CRASH`, crash_mode="preempt"): a SIGTERM, then
a grace, then SIGKILL for what still ran. Read from what the preempted launch did (the facts
of checks/preemption.py: the ranks the grace's end killed, the handler's own writes after the
SIGTERM and the step they hold, where the SIGTERM came) and what the resumed run did.

Three causes, each from evidence its look-alikes lack: the save on SIGTERM had begun and was
still running when the grace ran out (killed inside it); the handler saved inside a step
(its writes came after the step before was recorded, before this one was) and the resume took
that checkpoint for the step the trainer was in; the handler's save completed within the
grace, yet the resume started from an older checkpoint. A preempt point that fails otherwise
(no handler: a kill's causes apply; killed with no save begun) is left to the rules before
and after these, or to the catch-all, which says what the crash left and no cause.
"""

from __future__ import annotations

from typing import Any, Optional

from .at_crash import AfterCrash
from .classes import SAVE_PAST_THE_GRACE, SAVED_INSIDE_A_STEP, SIGTERM_SAVE_NOT_FOUND
from .rules import Finding, Rule, Stage

CRASH_RULES = (
    "crash.torn-file-written-in-place",
    "crash.torn-file-read",
    "crash.marker-before-its-content",
    "crash.restarted-job-could-not-save",
)


def _preempted(crash: AfterCrash) -> Optional[dict[str, Any]]:
    return crash.preempted if isinstance(crash, AfterCrash) else None


def _writes(saved: list[str], limit: int = 3) -> str:
    shown = ", ".join(saved[:limit])
    return shown + (f", +{len(saved) - limit} more" if len(saved) > limit else "")


def killed_inside_the_save(crash: AfterCrash) -> Optional[Finding]:
    """A preempt point whose ranks were still running when the grace ran out (the watchdog
    SIGKILLed them) after the SIGTERM handler's save had begun (the launch logged writes after
    the SIGTERM beyond the rest of the split's save): the save on SIGTERM did not fit the
    grace and was killed inside it."""
    found = _preempted(crash)
    if not found or not found.get("killed") or not found.get("saved"):
        return None
    rank = found["killed"][0]
    return Finding(
        f"rank {rank}",
        {
            "grace": found["grace"],
            "step": found.get("saved_step"),
            "writes": len(found["saved"]),
            "last": found.get("last", {}).get(str(rank), ""),
            "stuck": found.get("stuck", {}).get(str(rank), ""),
            "outcome": crash.outcome,
        },
    )


def _killed_words(f: Finding) -> str:
    last = f" after {f['last']}" if f["last"] else ""
    stuck = f" ({f['stuck']})" if f["stuck"] else ""
    writes = "write" if f["writes"] == 1 else "writes"
    return (
        f"the save on SIGTERM (of step {f['step']}) did not finish within the {f['grace']:g} s "
        f"grace: it was killed inside it{last}{stuck}, {f['writes']} {writes} after the "
        f"SIGTERM; the resumed run found what it had written so far and "
        f"{f['outcome'] or 'failed'}"
    )


def saved_inside_a_step(crash: AfterCrash) -> Optional[Finding]:
    """The SIGTERM came inside a step (after its backward, before its optimizer step), the
    handler's writes came right then (their `after_step` is the step before: this one was
    never recorded), and the resumed run started after the step the trainer was in: it took
    a checkpoint holding the state of step k-1 for the checkpoint of step k."""
    found = _preempted(crash)
    if not found or not found.get("mid_step") or found.get("after_step") is None:
        return None
    before = int(found["after_step"])
    if crash.resumed_from != before + 1:
        return None
    return Finding(
        "",
        {
            "step": before + 1,
            "holds": before,
            "writes": _writes(found["saved"], limit=1),
            "outcome": crash.outcome,
            "closure": bool(found.get("closure")),
        },
    )


def inside_words(closure: bool) -> str:
    """Where inside its step a SIGTERM at the "step" point came (`closure`: the step's
    optimizer step was given a closure, which runs the forward and backward inside it)."""
    if closure:
        return "at the start of its optimizer step, before its closure's forward and backward"
    return "after its backward, before its optimizer step"


def _inside_words(f: Finding) -> str:
    return (
        f"the SIGTERM handler saved at once, inside step {f['step']} "
        f"({inside_words(f['closure'])}): its writes ({f['writes']}) came after step {f['holds']} "
        f"was recorded and before step {f['step']} was, and the resumed run took that "
        f"checkpoint for step "
        f"{f['step']}: it holds the state of step {f['holds']}, so step {f['step']}'s update "
        f"is lost; the resumed run {f['outcome']}"
    )


def save_not_found(crash: AfterCrash) -> Optional[Finding]:
    """The SIGTERM handler's save completed within the grace (it wrote after the SIGTERM,
    no rank was killed, every rank exited cleanly, at a step boundary), its step is among the
    completed checkpoints, and the resumed run started from an older one, or over, or
    refused: the resume never finds what the handler saves."""
    found = _preempted(crash)
    if not found or not found.get("completed_save") or found.get("saved_step") is None:
        return None
    step = int(found["saved_step"])
    if step not in crash.completed or f"lost the completed checkpoint of step {step}" not in (
        crash.outcome
    ):
        return None
    return Finding(
        "",
        {
            "step": step,
            "writes": _writes(found["saved"]),
            "exited_s": found.get("exited_s"),
            "outcome": crash.outcome,
        },
    )


def _not_found_words(f: Finding) -> str:
    within = f" in {f['exited_s']:.2f} s" if f["exited_s"] is not None else ""
    return (
        f"the SIGTERM handler saved step {f['step']} and every rank exited within the "
        f"grace{within} (its writes: {f['writes']}), yet the resumed run {f['outcome']}: "
        "its resume does not find the checkpoint the handler writes"
    )


RULES = (
    Rule(
        "crash.sigterm-save-past-the-grace",
        (Stage.CRASH,),
        SAVE_PAST_THE_GRACE,
        killed_inside_the_save,
        _killed_words,
        after=CRASH_RULES,
    ),
    Rule(
        "crash.sigterm-save-inside-a-step",
        (Stage.CRASH,),
        SAVED_INSIDE_A_STEP,
        saved_inside_a_step,
        _inside_words,
        after=CRASH_RULES,
    ),
    Rule(
        "crash.sigterm-save-not-found",
        (Stage.CRASH,),
        SIGTERM_SAVE_NOT_FOUND,
        save_not_found,
        _not_found_words,
        after=CRASH_RULES,
    ),
)
