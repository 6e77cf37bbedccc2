"""Right causes on the loops people write (tests/zoo/loopzoo.py: an eval at the top of the
iteration that saves, a prefetched batch, per-rank state beside rank 0's checkpoint, a folder
the resumed run writes back into): every bug is named by its own cause, no wrong-mode or
rewritten-checkpoint claim appears, the exact resume passes without a rolling-path warning,
and a resume onto fewer ranks fails on what differs (the data: rank 1's saved batch
dropped) even with the teeth check off.
One pytest session; the cases share one uninterrupted launch."""

import shutil
from pathlib import Path

import pytest
from helpers import CPU, gate_contradictions, section_of

ZOO = Path(__file__).parent.parent / "zoo" / "loopzoo.py"
TESTS = """
from pytest_resume_equiv import resume_equivalent

def go(resume_equiv, bug):
    resume_equiv.run(["loopzoo.py"], checkpoint="{run_dir}/out", resume_args=[f"--bug={bug}"])

@resume_equivalent(steps=6, split=3, nproc=2)
def test_exact(resume_equiv):
    go(resume_equiv, "none")

@resume_equivalent(steps=6, split=3, nproc=2, rng_mutation=False)
def test_eval_redo(resume_equiv):
    go(resume_equiv, "eval_redo")

@resume_equivalent(steps=6, split=3, nproc=2, rng_mutation=False)
def test_prefetch(resume_equiv):
    go(resume_equiv, "prefetch")

@resume_equivalent(steps=6, split=3, nproc=2, rng_mutation=False)
def test_cpu_rng(resume_equiv):
    go(resume_equiv, "cpu_rng")

@resume_equivalent(steps=6, split=3, nproc=2, resume_nproc=1, rng_mutation=False)
def test_fewer_ranks(resume_equiv):
    go(resume_equiv, "none")
"""

CAUSES = {
    "eval_redo": (
        "likely cause (repeated before the resume)",
        "repeats code the uninterrupted run ran before it wrote the checkpoint",
        "randint at loopzoo.py:",
    ),
    "prefetch": ("likely cause (restored then advanced)", "the batch prefetched before the save"),
    "cpu_rng": ("likely cause (never restored)", "the CPU RNG"),
    "fewer_ranks": ("data not equivalent on 1 rank", "consumed other samples"),
}
WRONG = ("wrong mode", "written again", "not on disk", "train/eval flags")


@pytest.mark.long(120)
def test_the_loop_zoo_names_each_cause_and_no_wrong_one(pytester):
    shutil.copy(ZOO, pytester.path / "loopzoo.py")
    pytester.makepyfile(test_loops=TESTS)
    report = pytester.path / "report.json"
    result = pytester.runpytest_subprocess(
        *CPU, "-rA", "-W", "always", f"--resume-equiv-report={report}"
    )
    text = result.stdout.str()
    assert "INTERNALERROR" not in text
    # where the resume point held, no cause blames an audited object's save or restore
    assert not gate_contradictions(report), gate_contradictions(report)
    assert "PASSED test_loops.py::test_exact" in text, section_of(text, "test_exact")
    assert "wrote to it again" not in text  # one save at the split: no rolling-path warning
    problems = []
    for name, expected in CAUSES.items():
        section = section_of(text, f"test_{name}")
        if f"FAILED test_loops.py::test_{name}" not in text:
            problems.append(f"{name}: not caught:\n{section[:2000]}")
        missing = [phrase for phrase in expected if phrase not in section]
        wrong = [phrase for phrase in WRONG if phrase in section]
        if missing or wrong:
            problems.append(f"{name}: lacks {missing}, claims {wrong}:\n{section[:3000]}")
    assert not problems, "\n\n".join(problems)
