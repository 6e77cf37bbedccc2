"""The look-alike causes of issue 41, on a trainer shaped like the public scripts
(tests/zoo/lookalikezoo.py): each bug is told apart from the cause it looks like, and a correct
resume whose fresh process sums in another order is not blamed on state the audit missed.

1. The CPU RNG put back to the epoch's start to draw the shuffle again, the state of the save
   never put back (`epoch_rng_only`): not "restored, then advanced by 2 draws" (the draws are
   the iterator's, made from the epoch's start state as the uninterrupted run made them), but
   restored to the state of an earlier point (the start of step 5, the epoch's first), with
   the state at the save never restored.
2. The shuffle drawn again, the consumed batches not skipped (`no_skip`): the samples of step
   5 consumed again lead, with words about the skip, over the stream the sampler's seed was
   drawn from.
3. A partial accumulation window lost at the save (`--save-check=completed`) and a micro-step
   counter restored in optimizer steps (`counter_in_steps`): two sentences, the first saying
   the accumulated gradients of 1 micro-batch were lost, the second naming the counter; with
   and without random draws inside a step (`--no-noise`: today both get the counter's).
4. A correct resume whose resumed process evaluates the head in two chunks (`resumed_chunks`:
   rounding level only, deterministic): a resumed-process cause or an abstention, never
   "computed differently after an exact resume"; its look-alike, a loss normalizer kept out of
   the checkpoint (`normalizer`), stays "computed differently" (or unaudited state).

One pytest session; the cases of one launch command share its uninterrupted launch."""

import re
import shutil
from pathlib import Path

import pytest
from helpers import CPU, gate_contradictions, section_of

ZOO = Path(__file__).parent.parent / "zoo" / "lookalikezoo.py"
TESTS = """
from pytest_resume_equiv import resume_equivalent

def go(resume_equiv, bug, *args):
    resume_equiv.run(
        ["lookalikezoo.py", *args],
        checkpoint="{run_dir}/out/step_{split}",
        resume_args=[f"--bug={bug}"],
    )

@resume_equivalent(steps=8, split=5, nproc=1)
def test_exact(resume_equiv):
    go(resume_equiv, "none")

@resume_equivalent(steps=8, split=5, nproc=1, rng_mutation=False)
def test_epoch_rng_only(resume_equiv):
    go(resume_equiv, "epoch_rng_only")

@resume_equivalent(steps=8, split=5, nproc=1, rng_mutation=False)
def test_no_skip(resume_equiv):
    go(resume_equiv, "no_skip")

@resume_equivalent(steps=8, split=5, nproc=1, rng_mutation=False)
def test_resumed_chunks(resume_equiv):
    go(resume_equiv, "resumed_chunks")

@resume_equivalent(steps=8, split=5, nproc=1, rng_mutation=False)
def test_normalizer(resume_equiv):
    go(resume_equiv, "normalizer")

@resume_equivalent(steps=6, split=3, nproc=1)
def test_accum_exact(resume_equiv):
    go(resume_equiv, "none", "--accum=2")

@resume_equivalent(steps=6, split=3, nproc=1, rng_mutation=False)
def test_counter_in_steps(resume_equiv):
    go(resume_equiv, "counter_in_steps", "--accum=2")

@resume_equivalent(steps=6, split=3, nproc=1, rng_mutation=False)
def test_lost_window(resume_equiv):
    go(resume_equiv, "none", "--accum=2", "--save-check=completed")

@resume_equivalent(steps=6, split=3, nproc=1, rng_mutation=False)
def test_counter_in_steps_no_noise(resume_equiv):
    go(resume_equiv, "counter_in_steps", "--accum=2", "--no-noise")

@resume_equivalent(steps=6, split=3, nproc=1, rng_mutation=False)
def test_lost_window_no_noise(resume_equiv):
    go(resume_equiv, "none", "--accum=2", "--no-noise", "--save-check=completed")
"""

LOST = (
    ("gradient accumulation",),
    ("accumulated gradients", "lost", ("1 micro-batch", "one micro-batch")),
    ("micro-step counter was not restored",),
)
COUNTER = (("gradient accumulation",), ("micro-step counter",), ("accumulated gradients",))
CAUSES = {
    # name: (classes, one of which is the likely cause's; phrases its line holds, a tuple
    # for alternatives; phrases it must not hold)
    "epoch_rng_only": (
        ("restored to an earlier state",),
        (
            "the CPU RNG",
            "not the one at the save",
            "the state at the save is never restored",
            ("step 5", "after step 4"),
        ),
        ("advanced by", "generator of its own"),
    ),
    "no_skip": (("data order",), ("step 5", "skip"), ("prefetched",)),
    "lost_window": LOST,
    "lost_window_no_noise": LOST,
    "counter_in_steps": COUNTER,
    "counter_in_steps_no_noise": COUNTER,
    "normalizer": (
        ("computed differently after an exact resume", "unaudited state"),
        (),
        ("rounding", "resumed-process"),
    ),
}
LIKELY = re.compile(r"likely cause \(([^)]*)\): (.*)")


def likely_causes(section: str) -> list[tuple[str, str]]:
    """(class, cause) of each likely-cause line of a test's failure section."""
    found = (LIKELY.search(line) for line in section.splitlines())
    return [(m.group(1), m.group(2)) for m in found if m]


def _alternatives(phrase) -> tuple:
    return phrase if isinstance(phrase, tuple) else (phrase,)


@pytest.mark.long(60)
def test_each_look_alike_gets_its_own_cause(pytester):
    shutil.copy(ZOO, pytester.path / ZOO.name)
    pytester.makepyfile(test_lookalikes=TESTS)
    report = pytester.path / "report.json"
    result = pytester.runpytest_subprocess(
        *CPU, "-rA", "-W", "always", f"--resume-equiv-report={report}"
    )
    text = result.stdout.str()
    assert "INTERNALERROR" not in text
    for exact in ("test_exact", "test_accum_exact"):
        assert f"PASSED test_lookalikes.py::{exact}" in text, section_of(text, exact)
    problems = []
    lines = {}
    for name, (classes, expected, wrong) in CAUSES.items():
        section = section_of(text, f"test_{name}")
        if f"FAILED test_lookalikes.py::test_{name}" not in text:
            problems.append(f"{name}: not caught:\n{section[:2000]}")
            continue
        causes = likely_causes(section)
        if len(causes) != 1:
            problems.append(f"{name}: {len(causes)} likely causes:\n{section[:3000]}")
            continue
        kind, cause = lines[name] = causes[0]
        missing = [p for p in expected if not any(a in cause for a in _alternatives(p))]
        claimed = [phrase for phrase in wrong if phrase in cause]
        if kind not in classes or missing or claimed or cause.count("Fix:") != 1:
            problems.append(
                f"{name}: class {kind!r} (expected one of {classes}), lacks {missing}, "
                f"claims {claimed}:\n{section[:3000]}"
            )
    # a lost window and a counter out of phase are two bugs: two sentences
    for suffix in ("", "_no_noise"):
        lost, counter = lines.get(f"lost_window{suffix}"), lines.get(f"counter_in_steps{suffix}")
        if lost and counter and lost[1] == counter[1]:
            problems.append(f"lost_window{suffix} and counter_in_steps{suffix}: one sentence")
    # a correct trainer whose resumed process sums in another order: a resumed-process cause
    # or an abstention that says so, never state the audit missed
    chunks = section_of(text, "test_resumed_chunks")
    skipped = re.search(r"SKIPPED .*test_lookalikes.py.*abstained.*", text)
    fresh = "likely cause (resumed-process compute)" in chunks
    if "computed differently" in chunks or not (fresh or skipped and "rounding" in skipped[0]):
        problems.append(f"resumed_chunks: neither fresh-process nor abstained:\n{chunks[:3000]}")
    assert not problems, "\n\n".join(problems)
    # where the resume point held, no cause blames an audited object's save or restore
    assert not gate_contradictions(report), gate_contradictions(report)
