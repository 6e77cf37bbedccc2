"""`@equivalent` on a trainer whose batching is set by flags (tests/zoo/batchzoo.py, no
plugin line): the configurations that train the same model pass (accumulation 4, 2 ranks, 2
ranks with accumulation 2, each with variable-length sequences too, FSDP2 against DDP with and
without accumulation), with dropout made an identity; each batching bug of ../shared/BUGS.md
(34-41, 43) fails with its class named and its one fix; dropout kept abstains. One pytest
session; every item shares its test's one baseline launch; a bad variant fails only its own
item."""

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
        "b43": dict(nproc=2, args=["--fsdp", "--bug", "local-shard-clip"]),
    },
    nproc=1,
)
def test_batching(resume_equiv):
    resume_equiv.run(
        ["batchzoo.py", "--steps", "{steps}", "--global-batch", "8", "--clip", "0.5",
         "--dropout", "0.2", "--out", "{run_dir}/out"]
    )

@equivalent(
    steps=4,
    baseline=dict(nproc=1),
    variants={
        "acc4": dict(args=["--accum", "4"]),
        "dp2": dict(nproc=2),
        "dp2_acc2": dict(nproc=2, args=["--accum", "2"]),
        "b38": dict(args=["--accum", "2", "--bug", "token-mean-per-micro"]),
    },
    nproc=1,
)
def test_variable_lengths(resume_equiv):
    resume_equiv.run(["batchzoo.py", "--steps", "{steps}", "--global-batch", "8", "--seq"])

@equivalent(
    steps=4,
    variants={"fsdp2": dict(args=["--fsdp"]), "fsdp2_acc2": dict(args=["--fsdp", "--accum", "2"])},
    nproc=2,
)
def test_ddp_against(resume_equiv):
    resume_equiv.run(["batchzoo.py", "--steps", "{steps}", "--global-batch", "8"])

@equivalent(steps=3, baseline=dict(nproc=2), variants={"b41": dict(args=["--bug", "no-sync-bn"])})
def test_batch_norm(resume_equiv):
    resume_equiv.run(["batchzoo.py", "--steps", "{steps}", "--global-batch", "8", "--bn"])

@equivalent(steps=4, variants={"dp2": dict(nproc=2)}, nproc=1, dropout="on")
def test_dropout_kept(resume_equiv):
    resume_equiv.run(["batchzoo.py", "--steps", "{steps}", "--global-batch", "8", "--dropout", "0.2"])

@equivalent(steps=3, variants={"same": dict(nproc=1)}, nproc=1)
def test_a_variant_equal_to_the_baseline(resume_equiv):
    resume_equiv.run(["batchzoo.py", "--steps", "{steps}", "--global-batch", "8"])
"""
CONTROLS = (
    *(f"test_batching[{n}]" for n in ("acc4", "dp2", "dp2_acc2", "fsdp2")),
    *(f"test_variable_lengths[{n}]" for n in ("acc4", "dp2", "dp2_acc2")),
    "test_ddp_against[fsdp2]",
    "test_ddp_against[fsdp2_acc2]",
)
BUGS = {
    # item: the class its likely cause names, and words of the cause
    "test_batching[b34]": ("loss not scaled by accumulation", "2 times the baseline's"),
    "test_batching[b35]": ("gradients zeroed inside the window", "between backward 1 and 2"),
    "test_batching[b36]": ("scheduler per micro-step", "runs 2 times fast"),
    "test_batching[b37]": ("clipping per micro-step", "inside the accumulation window"),
    "test_variable_lengths[b38]": ("per-micro-batch token mean", "weighted by their token"),
    "test_batching[b39]": ("loss scaled by world size", "ratio of world sizes (2)"),
    "test_batching[b40]": ("same data on every rank", "each of them 2 times"),
    "test_batch_norm[b41]": ("per-rank batch statistics", "running_mean"),
    "test_batching[b43]": ("clipping on local shards", "each rank scaled its gradient"),
}


@pytest.mark.long(90)
def test_configurations_that_train_the_same_model_pass_and_batching_bugs_fail(pytester, capsys):
    shutil.copy(ZOO, pytester.path / ZOO.name)
    pytester.makepyfile(test_configs=TESTS)
    report = pytester.path / "report.json"
    result = pytester.runpytest_subprocess(*CPU, "-rA", f"--resume-equiv-report={report}")
    text = result.stdout.str()
    assert "INTERNALERROR" not in text
    for item in CONTROLS:
        assert f"PASSED test_configs.py::{item}" in text, text[-4000:]
        name = item.split("[")[1].rstrip("]")
        assert re.search(rf"variant {name}: .*equal over \d steps", section_of(text, item)), item
    # dropout is off by default, and the report says so
    assert "dropout off: " in section_of(text, "test_batching[acc4]")
    for item, (bug_class, words) in BUGS.items():
        section = section_of(text, item)
        assert f"FAILED test_configs.py::{item}" in text, section
        assert "the variant does not train the same model as the baseline" in section
        assert f"likely cause ({bug_class}): " in section, (item, section[:3000])
        cause = section[section.index(f"likely cause ({bug_class})") :].splitlines()[0]
        assert words in cause and cause.count("Fix: ") == 1, (item, cause)
    # dropout kept: the masks differ by construction; the item abstains and blames no code
    assert re.search(r"SKIPPED .*abstained: variant dp2: .*dropout drew masks", text), text[-3000:]
    # the baseline of test_batching ran once for its eleven items
    assert section_of(text, "test_batching[b34]").count("(reused: run for") == 1
    assert "rerun the variant launch by hand" in section_of(text, "test_batching[b34]")
    # a variant that equals the baseline is its own item's error, nothing else's
    bad = section_of(text, "test_a_variant_equal_to_the_baseline[same]")
    assert "@equivalent: invalid variants['same']=" in bad and "equals the baseline" in bad
    data = json.loads(report.read_text())
    verdicts = {
        t["test"].split("::")[-1]: t["runs"][0]["verdicts"][0]
        for t in data["tests"]
        if t["runs"] and t["runs"][0]["verdicts"]
    }
    assert {n for n, v in verdicts.items() if v["status"] == "passed"} == set(CONTROLS)
    for item, (bug_class, _) in BUGS.items():
        assert verdicts[item]["likely_cause"]["class"] == bug_class, item
    b36 = verdicts["test_batching[b36]"]
    assert b36["facts"][0]["differences"][0]["what"] == "watch:lr_scheduler.last_epoch"
    # the offline compare of the two run directories says what the test said
    runs = verdicts["test_batching[b34]"]["runs"]
    assert main(["compare", "--configurations", runs["baseline"], runs["variant"]]) == 1
    out = capsys.readouterr().out
    assert "step 1: loss: baseline" in out
    assert "likely cause (loss not scaled by accumulation)" in out
