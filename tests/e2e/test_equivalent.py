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
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from helpers import CPU, section_of

from pytest_resume_equiv.__main__ import main

ZOO = Path(__file__).parent.parent / "zoo" / "batchzoo.py"
EXAMPLE = Path(__file__).parent.parent.parent / "examples" / "equivalent" / "train.py"
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
        "compiled": dict(args=["--compile", "aot_eager"]),
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
    *(f"test_batching[{n}]" for n in ("acc4", "dp2", "dp2_acc2", "fsdp2", "compiled")),
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
    "test_batching[b39]": ("loss scaled by world size", "their ratio of ranks (2 against 1)"),
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
    # the baseline of test_batching ran once for its twelve items
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


REPORTED = """
from pytest_resume_equiv import equivalent

@equivalent(
    steps=4,
    baseline=dict(nproc=1),
    variants={
        "dp2_accum2": dict(nproc=2, args=["--accum", "2"]),
        "unscaled": dict(nproc=1, args=["--accum", "2", "--bug", "no-accum-scale"]),
    },
)
def test_batching(resume_equiv):
    resume_equiv.run(["train.py", "--steps", "{steps}"])
"""


def test_an_equivalent_items_reports_and_offline_compare_agree_with_its_verdict(pytester, capsys):
    """The five outputs of a resume test, for a passing and a failing variant: the -v line,
    the JSON report's entry (roles baseline and variant, the differences), the JUnit
    properties, the plot of both trajectories, and the offline compare of the two run
    directories the failing item kept (the baseline is shared), which says what it said."""
    shutil.copy(EXAMPLE, pytester.path / "train.py")
    pytester.makepyfile(test_reported=REPORTED)
    args = ("-v", "--resume-equiv-report=report.json", "--junitxml=junit.xml")
    result = pytester.runpytest_subprocess(*CPU, *args)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*resume-equiv: test_reported.py::test_batching[[]dp2_accum2[]] passed: launches "
            "baseline, variant-dp2_accum2; variant dp2_accum2 equal to the baseline over 4 steps",
            "*resume-equiv: test_reported.py::test_batching[[]unscaled[]] failed: launches "
            "baseline (reused: *), variant-unscaled; variant unscaled differs from the baseline "
            "from step 1 (loss)",
            "test_reported.py::test_batching[[]dp2_accum2[]] * 1 vs 2 * 2 * passed",
        ]
    )
    text = result.stdout.str()
    lines = section_of(text, "test_batching[unscaled]").splitlines()
    block = lines[2 : lines.index("run directories (kept: --resume-equiv-keep=failed):")]
    assert block[0].startswith("variant unscaled: unscaled (1 rank, args --accum 2 --bug")
    assert block[1].startswith("  step 1: loss: baseline ")
    # the JSON report
    tests = {
        t["test"].split("[")[-1][:-1]: t
        for t in json.loads((pytester.path / "report.json").read_text())["tests"]
    }
    bad, good = tests["unscaled"]["runs"][0], tests["dp2_accum2"]["runs"][0]
    assert {launch["role"] for launch in bad["launches"]} == {"baseline", "variant"}
    (verdict,) = bad["verdicts"]
    assert (verdict["check"], verdict["status"], verdict["equal"]) == (
        "equivalent",
        "failed",
        False,
    )
    first = verdict["first_divergence"]
    assert (first["step"], first["key"], first["relative"]) == (1, "loss", pytest.approx(0.5))
    assert first["variant"] == pytest.approx(2 * first["baseline"])
    assert (good["verdicts"][0]["status"], good["verdicts"][0]["equal"]) == ("passed", True)
    assert (tests["dp2_accum2"]["ranks"], tests["dp2_accum2"]["variant_ranks"]) == (1, 2)
    # the plot, named in the failure text and the JSON report
    (plot,) = bad["plots"]
    assert f"plot: {plot}" in text and Path(plot).name == "plot-variant-unscaled.png"
    assert Path(plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and not good["plots"]
    # the JUnit properties
    cases = {
        c.get("name"): c for c in ET.parse(pytester.path / "junit.xml").getroot().iter("testcase")
    }
    props = {
        p.get("name"): p.get("value") for p in cases["test_batching[unscaled]"].iter("property")
    }
    assert props["resume_equiv_verdict"] == "failed"
    assert props["resume_equiv_first_divergence"] == f"variant unscaled: {block[1].strip()}"
    assert props["resume_equiv_proved"].endswith("differs from the baseline from step 1 (loss)")
    assert props["resume_equiv_likely_cause"].startswith(
        "variant unscaled: loss not scaled by accumulation: step 1: the gradient of the variant"
    )
    # the offline compare of the kept run directories: the test's verdict and lines
    runs = verdict["runs"]
    capsys.readouterr()  # what the pytester run printed
    for flags in ([], ["--configurations"]):
        assert main(["compare", *flags, runs["baseline"], runs["variant"]]) == 1
        assert capsys.readouterr().out.splitlines() == block
