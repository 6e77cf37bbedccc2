"""crash_mode="preempt" end to end (trainers in tests/zoo/preemptzoo.py): every rank gets
SIGTERM at the point, what still runs after crash_grace= is SIGKILLed, and the restarted job
must resume from the newest checkpoint that completed, the SIGTERM handler's own included.
A closure-based step (`opt.step(closure)`, as Lightning steps) and a run that finishes before
its SIGTERM takes effect pass. One rank, few points and a small grace keep it to twenty short
launches."""

import re
import shutil
from pathlib import Path

import pytest
from helpers import CPU, processes_mentioning, section_of

ZOO = Path(__file__).parent.parent / "zoo"

TESTS = """
from pytest_resume_equiv import resume_equivalent
import preemptzoo

ROOT = "{run_dir}/checkpoints"
PREEMPT = dict(steps=6, split=[2, 4], nproc=1, interrupt="crash", crash_mode="preempt")


@resume_equivalent(**PREEMPT, crash_points=["last", "step"], crash_grace=1.0)
def test_stops_at_step_boundary(resume_equiv):
    resume_equiv.run(preemptzoo.train_stops_at_step_boundary, checkpoint=ROOT)


@resume_equivalent(**PREEMPT, crash_points=["step"], crash_grace=1.0)
def test_without_handler(resume_equiv):
    resume_equiv.run(preemptzoo.train_without_handler, checkpoint=ROOT)


@resume_equivalent(**PREEMPT, crash_points=["step"], crash_grace=1.0)
def test_saves_in_handler(resume_equiv):
    resume_equiv.run(preemptzoo.train_saves_in_handler, checkpoint=ROOT)


@resume_equivalent(**PREEMPT, crash_points=["step"], crash_grace=1.0)
def test_steps_with_a_closure(resume_equiv):
    resume_equiv.run(preemptzoo.train_steps_with_a_closure, checkpoint=ROOT)


@resume_equivalent(**PREEMPT, crash_points=["step"], crash_grace=1.0)
def test_checks_flag_each_epoch(resume_equiv):
    resume_equiv.run(preemptzoo.train_checks_flag_each_epoch, checkpoint=ROOT)


@resume_equivalent(**PREEMPT, crash_points=["step"], crash_grace=0.5)
def test_saves_slowly_in_place(resume_equiv):
    resume_equiv.run(preemptzoo.train_saves_slowly_in_place, checkpoint=ROOT)
"""

WITHIN = r"then: every rank exited within the grace \(\d+\.\d\d s\)"


@pytest.mark.long(35)
def test_a_sigterm_save_must_finish_within_the_grace(pytester):
    for name in ("crashzoo.py", "preemptzoo.py"):
        shutil.copy(ZOO / name, pytester.path / name)
    pytester.makepyfile(test_preempted=TESTS)
    result = pytester.runpytest_subprocess(*CPU, "-rA", "-p", "no:randomly")
    text = result.stdout.str()
    result.assert_outcomes(passed=4, failed=2)

    correct = section_of(text, "test_stops_at_step_boundary")
    assert "crash at split 4 passed (2 exact)" in correct, correct
    last = "last (preempt)  rank 0: SIGTERM after os.replace(checkpoints/latest.tmp -> "
    assert last + "checkpoints/latest)" in correct, correct
    assert re.search(WITHIN + ", the handler saved nothing more", correct), correct
    assert "step (preempt)  rank 0: SIGTERM inside step 5, before its optimizer step" in correct
    assert re.search(WITHIN + ", the handler saved step 5\n", correct), correct
    assert "-> EXACT: exact (resumed from step 5)" in correct, correct

    bare = section_of(text, "test_without_handler")
    assert "crash at split 4 passed (1 exact)" in bare, bare
    assert "then: no SIGTERM handler: the ranks died of it, as of a kill" in bare, bare
    assert "-> EXACT: exact (resumed from step 4)" in bare, bare

    closure = section_of(text, "test_steps_with_a_closure")
    assert (
        "step (preempt)  rank 0: SIGTERM inside step 5, at the start of its optimizer step "
        "(before the closure it was given runs the step's forward and backward)"
    ) in closure, closure
    assert re.search(WITHIN + ", the handler saved step 5\n", closure), closure
    assert "-> EXACT: exact (resumed from step 5)" in closure, closure

    epoch = section_of(text, "test_checks_flag_each_epoch")
    assert re.search(WITHIN + ", the handler saved step 6\n", epoch), epoch
    assert (
        "-> EXACT: exact (the run had finished before the SIGTERM took effect: its save holds "
        "step 6, nothing left to resume)"
    ) in epoch, epoch

    inside = section_of(text, "test_saves_in_handler")
    assert re.search(
        WITHIN + r", the handler saved inside step 5 \(after its backward, before its "
        r"optimizer step: the state of step 4\)",
        inside,
    ), inside
    assert "-> FAILED: resumed from step 5, then diverged (step 6, rank 0, 'loss')" in inside
    assert (
        "likely cause (saved inside a step): the SIGTERM handler saved at once, inside step 5 "
        "(after its backward, before its optimizer step): its writes "
        "(torch.save(checkpoints/tmp-step_5/model.pt), +"
    ) in inside, inside
    assert "it holds the state of step 4, so step 5's update is lost" in inside, inside
    assert inside.count("Fix: in the SIGTERM handler only set a flag") == 1, inside

    slow = section_of(text, "test_saves_slowly_in_place")
    assert (
        "then: still running after the 0.5 s grace: killed (rank 0 last after "
        "torch.save(checkpoints/model.pt), stuck in "
    ) in slow, slow
    assert "preemptzoo.py:" in slow and " in save_in_place); its save of step 5 had begun" in slow
    assert "-> FAILED: resumed from a torn or mixed checkpoint of step 4" in slow, slow
    assert (
        "likely cause (save on SIGTERM past the grace): rank 0: the save on SIGTERM (of step 5) "
        "did not finish within the 0.5 s grace: it was killed inside it after "
        "torch.save(checkpoints/model.pt)"
    ) in slow, slow
    assert slow.count("Fix: make the save on SIGTERM fit the grace") == 1, slow
    assert processes_mentioning(str(pytester.path)) == []  # no rank, no watchdog left
