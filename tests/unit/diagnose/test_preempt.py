"""Stage.CRASH for a preempt point (diagnose/at_preemption.py): the save on SIGTERM killed at
the end of the grace, a save made inside a step, and a save the resume never finds; each told
apart from the preempt points that look like it."""

import dataclasses

from pytest_resume_equiv.diagnose import Stage, cause
from pytest_resume_equiv.diagnose.at_crash import AfterCrash

from .builders import fires, look_alike, named

PAST_GRACE = "crash.sigterm-save-past-the-grace"
INSIDE_STEP = "crash.sigterm-save-inside-a-step"
NOT_FOUND = "crash.sigterm-save-not-found"
CATCH_ALL = "crash.torn-by-the-crash"
MIXED = (
    "resumed from a torn or mixed checkpoint of step 4: the state after loading differs from "
    "the uninterrupted run's at step 4 (rank 0: watch:model.params)"
)


def preempted(**facts):
    return {
        "grace": 0.5,
        "sigterm": "handler",
        "after_step": 4,
        "inside_step": True,
        "killed": [],
        "exited_s": 0.3,
        "saved": [],
        "saved_step": None,
        "mid_step": False,
        "completed_save": False,
        "last": {},
        "stuck": {},
        **facts,
    }


def point(outcome=MIXED, resumed_from=4, completed=(2, 4), **facts):
    return AfterCrash(
        "step (preempt)",
        "rank 0: SIGTERM inside step 5, before its optimizer step",
        resumed_from=resumed_from,
        completed=completed,
        outcome=outcome,
        preempted=preempted(**facts),
    )


KILLED = dict(
    killed=[0],
    exited_s=None,
    saved=["torch.save(checkpoints/model.pt)"],
    saved_step=5,
    last={"0": "torch.save(checkpoints/model.pt)"},
    stuck={"0": "stuck in zoo/preemptzoo.py:127 in save_in_place"},
)


@fires(PAST_GRACE)
def test_a_save_on_sigterm_killed_at_the_end_of_the_grace_is_past_the_grace():
    named(
        cause(Stage.CRASH, point(**KILLED)),
        PAST_GRACE,
        "save on SIGTERM past the grace",
        "rank 0: the save on SIGTERM (of step 5) did not finish within the 0.5 s grace: it was "
        "killed inside it after torch.save(checkpoints/model.pt) (stuck in "
        "zoo/preemptzoo.py:127 in save_in_place), 1 write after the SIGTERM; the resumed run "
        "found what it had written so far and resumed from a torn or mixed checkpoint of step 4",
        "make the save on SIGTERM fit the grace with room to spare",
    )


@look_alike(PAST_GRACE, wins=CATCH_ALL)
def test_ranks_killed_at_the_grace_before_any_save_began_have_no_named_cause():
    """Killed at the end of the grace, but nothing was written after the SIGTERM (a rank
    stuck elsewhere): what differs is said, no cause is named."""
    stuck = point(**{**KILLED, "saved": [], "saved_step": None})
    d = cause(Stage.CRASH, stuck)
    assert d is not None and d.rule == CATCH_ALL, d and d.rule


@fires(INSIDE_STEP)
def test_a_handler_that_saves_inside_a_step_labels_the_step_before_as_this_one():
    facts = dict(saved=["torch.save(checkpoints/tmp-step_5/model.pt)", "x"], saved_step=4)
    named(
        cause(
            Stage.CRASH,
            point(
                "resumed from step 5, then diverged (step 6, rank 0, 'loss')",
                resumed_from=5,
                mid_step=True,
                **facts,
            ),
        ),
        INSIDE_STEP,
        "saved inside a step",
        "the SIGTERM handler saved at once, inside step 5 (after its backward, before its "
        "optimizer step): its writes (torch.save(checkpoints/tmp-step_5/model.pt), +1 more) "
        "came after step 4 was recorded and before step 5 was, and the resumed run took that "
        "checkpoint for step 5: it holds the state of step 4, so step 5's update is lost",
        "in the SIGTERM handler only set a flag",
    )


@look_alike(INSIDE_STEP, wins=CATCH_ALL)
def test_a_save_inside_a_step_that_the_resume_did_not_take_for_that_step_is_not_blamed():
    """The handler saved inside step 5, but the resume started from step 4 (it took another
    checkpoint): the save inside the step is not what the resume read."""
    other = point(resumed_from=4, mid_step=True, saved=["x"], saved_step=4)
    d = cause(Stage.CRASH, other)
    assert d is not None and d.rule == CATCH_ALL, d and d.rule


LOST = "resumed from step 4: lost the completed checkpoint of step 5"
SAVED = dict(
    saved=["torch.save(checkpoints/preempt/model.pt)", "open(checkpoints/preempt/step)"],
    saved_step=5,
    completed_save=True,
    inside_step=True,
)


@fires(NOT_FOUND)
def test_a_handler_save_that_completed_and_that_the_resume_passed_over_is_not_found():
    named(
        cause(Stage.CRASH, point(LOST, completed=(2, 4, 5), **SAVED)),
        NOT_FOUND,
        "SIGTERM save not found",
        "the SIGTERM handler saved step 5 and every rank exited within the grace in 0.30 s (its "
        "writes: torch.save(checkpoints/preempt/model.pt), open(checkpoints/preempt/step)), yet "
        "the resumed run resumed from step 4: lost the completed checkpoint of step 5: its "
        "resume does not find the checkpoint the handler writes",
        "save on SIGTERM exactly as the regular saves are",
    )


@look_alike(NOT_FOUND, wins=CATCH_ALL)
def test_a_lost_split_checkpoint_is_not_blamed_on_the_handler():
    """The resume lost the split's checkpoint (step 4), not the handler's: the catch-all says
    where the crash came, and no cause."""
    facts = point("started over from step 0: lost the completed checkpoint of step 4", **SAVED)
    facts = dataclasses.replace(facts, resumed_from=0, completed=(2, 4, 5))
    d = cause(Stage.CRASH, facts)
    assert d is not None and d.rule == CATCH_ALL, d and d.rule


@look_alike(NOT_FOUND, wins=PAST_GRACE)
def test_a_handler_save_killed_at_the_grace_did_not_complete():
    facts = point(LOST, completed=(2, 4), **{**SAVED, **KILLED, "completed_save": False})
    d = cause(Stage.CRASH, facts)
    assert d is not None and d.rule == PAST_GRACE, d and d.rule
