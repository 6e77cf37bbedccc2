"""`@equivalent` on a trainer whose batching is set by flags (tests/zoo/batchzoo.py, no
plugin line): the configurations that train the same model pass (accumulation 4, 2 ranks, 2
ranks with accumulation 2, FSDP2 against DDP), and each batching bug fails, naming the
quantity that differs first (the loss scaled, a learning rate stepped per micro-batch,
samples duplicated over the ranks, parameters beyond round-off). One pytest session; every
item shares the baseline's one launch; a bad variant fails only its own item."""

import json
import re
import shutil
from pathlib import Path

import pytest
from helpers import CPU, section_of

from pytest_resume_equiv.__main__ import main

ZOO = Path(__file__).parent.parent / "zoo" / "batchzoo.py"
TESTS = """
from pytest_resume_equiv import equivalent

@equivalent(
    steps=5,
    baseline=dict(nproc=1),
    variants={
        "acc4": dict(args=["--accum", "4"]),
        "dp2": dict(nproc=2),
        "dp2_acc2": dict(nproc=2, args=["--accum", "2"]),
        "fsdp2": dict(nproc=2, args=["--fsdp"]),
        "b34": dict(args=["--accum", "2", "--bug", "no-accum-scale"]),
        "b35": dict(args=["--accum", "2", "--bug", "zero-grad-in-window"]),
        "b36": dict(args=["--accum", "2", "--bug", "sched-per-micro"]),
        "b37": dict(args=["--accum", "2", "--bug", "clip-per-micro"]),
        "b39": dict(nproc=2, args=["--bug", "world-scale"]),
        "b40": dict(nproc=2, args=["--bug", "same-data"]),
    },
    nproc=1,
)
def test_batching(resume_equiv):
    resume_equiv.run(
        ["batchzoo.py", "--steps", "{steps}", "--global-batch", "8", "--clip", "0.5",
         "--out", "{run_dir}/out"]
    )

@equivalent(steps=3, variants={"same": dict(nproc=1)}, nproc=1)
def test_a_variant_equal_to_the_baseline(resume_equiv):
    resume_equiv.run(["batchzoo.py", "--steps", "{steps}", "--global-batch", "8"])
"""
CONTROLS = ("acc4", "dp2", "dp2_acc2", "fsdp2")
BUGS = {
    # variant: what its report names first
    "b34": "step 1: loss: baseline",
    "b35": "model.params[",
    "b36": "step 1: watch:lr_scheduler.last_epoch: baseline 1, variant 2",
    "b37": "model.params[",
    "b39": "step 1: loss: baseline",
    "b40": "step 1: samples consumed (auto:data, over every rank and micro-batch)",
}


@pytest.mark.long(60)
def test_configurations_that_train_the_same_model_pass_and_batching_bugs_fail(pytester, capsys):
    shutil.copy(ZOO, pytester.path / ZOO.name)
    pytester.makepyfile(test_configs=TESTS)
    report = pytester.path / "report.json"
    result = pytester.runpytest_subprocess(*CPU, "-rA", f"--resume-equiv-report={report}")
    text = result.stdout.str()
    assert "INTERNALERROR" not in text
    for name in CONTROLS:
        assert f"PASSED test_configs.py::test_batching[{name}]" in text, text[-4000:]
        assert re.search(rf"variant {name}: .*equal over 5 steps", text), name
    for name, first in BUGS.items():
        section = section_of(text, f"test_batching[{name}]")
        assert f"FAILED test_configs.py::test_batching[{name}]" in text, section
        assert "the variant does not train the same model as the baseline" in section
        assert first in section, (name, section[:3000])
    # the baseline ran once for the ten items, and the rerun line is the variant's
    assert text.count("baseline: 1 rank") == 10 and text.count("(reused: run for") == 9
    assert "rerun the variant launch by hand" in section_of(text, "test_batching[b34]")
    # a variant that equals the baseline is its own item's error, nothing else's
    bad = section_of(text, "test_a_variant_equal_to_the_baseline[same]")
    assert "@equivalent: invalid variants['same']=" in bad and "equals the baseline" in bad
    data = json.loads(report.read_text())
    verdicts = {
        t["test"].split("[")[-1].rstrip("]"): t["runs"][0]["verdicts"][0]
        for t in data["tests"]
        if "test_batching" in t["test"]
    }
    assert {n for n, v in verdicts.items() if v["status"] == "passed"} == set(CONTROLS)
    assert verdicts["b36"]["facts"][0]["differences"][0]["what"] == "watch:lr_scheduler.last_epoch"
    # the offline compare of the two run directories says what the test said
    runs = verdicts["b34"]["runs"]
    assert main(["compare", "--configurations", runs["baseline"], runs["variant"]]) == 1
    assert "step 1: loss: baseline" in capsys.readouterr().out
