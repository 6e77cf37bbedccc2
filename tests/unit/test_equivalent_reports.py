"""An `@equivalent` item's reports, as a resume test's: the judge's verdict (roles `baseline`
and `variant`, the judgement kept in the variant's run directory), the `-v` line, the JSON
report's entry, the JUnit properties, the plot of both trajectories, and the offline
`compare` of the two run directories, which says what the test said. Signatures written by
hand; no launch."""

import json
import math
import os

import pytest
from plan_helpers import CPU

from pytest_resume_equiv.__main__ import main
from pytest_resume_equiv.checks import build_plan, kind_of
from pytest_resume_equiv.compare.jsonable import from_json, to_json
from pytest_resume_equiv.judge import Judge
from pytest_resume_equiv.launch.rank_exits import RankOutcome
from pytest_resume_equiv.launch.running import LaunchResult
from pytest_resume_equiv.plan import RunRequest
from pytest_resume_equiv.rank.encode import encode_float
from pytest_resume_equiv.rank.layout import SIGNATURE_FORMAT, SIGNATURE_VERSION
from pytest_resume_equiv.rank.run_dir import signature_path
from pytest_resume_equiv.report.picture import draw
from pytest_resume_equiv.report.plot import LOSS, PARAMS, picture_of, trajectory
from pytest_resume_equiv.report.records import RunRecord, TestRecord, report_json
from pytest_resume_equiv.report.replay import read_judgement
from pytest_resume_equiv.settings import OPTIONS, Resolved, SessionSettings, resolve_test
from pytest_resume_equiv.signature import read_run

STEPS = 3
VARIANTS = {"dp2": dict(nproc=2), "unscaled": dict(args=["--accum", "2", "--bug", "x"])}
SECOND_LOSS = {"dp2": 1.0, "unscaled": 2.0}
"""The variant's loss against the baseline's: equal over the global batch, or twice it."""


def train(ctx):
    """A module-level function, as function mode needs."""


class Recorder:
    def add(self, planned):
        pass

    def cancel(self, planned):
        pass


class FakeJob:
    def __init__(self, planned):
        self.planned = planned


def tensor(norm):
    return {"norm": encode_float(norm), "absmax": encode_float(norm / 2), "hash": f"h{norm}"}


def write_configuration(run_dir, world, losses, norm=lambda step, rank: 2.0 + step):
    """A configuration's signature files: at each step every rank's losses given to backward
    (`losses(step, rank)`), its share of the global batch's 4 samples, the model's parameter
    `w` (its norm on that rank), a learning rate and a scheduler counter."""
    for rank in range(world):
        path = signature_path(str(run_dir), rank)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        head = {"format": SIGNATURE_FORMAT, "version": SIGNATURE_VERSION, "phase": "x"}
        lines = [{**head, "rank": rank, "world_size": world, "pid": 1}]
        for step in range(1, STEPS + 1):
            ids = [4 * step + i for i in range(4) if i % world == rank]
            lines.append(
                {
                    "step": step,
                    "values": {},
                    "auto": {"loss": [encode_float(x) for x in losses(step, rank)], "data": ids},
                    "watch": {
                        "model.params": {"w": tensor(norm(step, rank))},
                        "opt.lr": [encode_float(0.1)],
                        "sched.last_epoch": step,
                    },
                }
            )
        lines.append({"end": {"records": STEPS}})
        with open(path, "w") as f:
            f.write("".join(json.dumps(line) + "\n" for line in lines))


def judged(tmp_path, variant):
    """The outcome of `variant`'s item: the baseline on 1 rank, the variant as VARIANTS says,
    judged by the judge from their signature files."""
    values = {o.name: Resolved(o.default, "default") for o in OPTIONS.values()}
    kwargs = {"steps": STEPS, "baseline": dict(nproc=1), "variants": VARIANTS, "nproc": 1}
    settings = resolve_test(SessionSettings(values), (), kwargs, variant)
    plan = build_plan(settings, RunRequest(train, seed=7), CPU, str(tmp_path))
    judge = Judge(plan, settings, Recorder())
    (baseline,), (other,) = plan.by_role("baseline"), plan.by_role("variant")
    world = other.spec.world_size
    write_configuration(baseline.spec.run_dir, 1, lambda s, r: [1.0 / s])
    # each rank's half of the global batch: its mean loss, averaged over the ranks
    write_configuration(other.spec.run_dir, world, lambda s, r: [SECOND_LOSS[variant] / s])
    for planned in (baseline, other):
        ranks = [RankOutcome(r, "ok", "") for r in range(planned.spec.world_size)]
        result = LaunchResult(planned.spec, [0], False, 0.0, ranks, f"rerun {planned.name}")
        judge.on_done(FakeJob(planned), result)
    return judge.conclude(), settings


def record_of(outcome, settings, failed):
    conf = settings.marker.configurations
    return TestRecord(
        test=f"t.py::test_x[{conf.name}]",
        outcome="failed" if failed else "passed",
        verdict="failed" if failed else "passed",
        steps=STEPS,
        splits=[],
        ranks=conf.baseline.nproc,
        variant_ranks=conf.variant.nproc,
        device="cpu",
        wall_seconds=1.0,
        runs=[
            RunRecord.of(outcome, kind_of("equivalent").words(outcome.failed[0]) if failed else "")
        ],
    )


def test_the_verdict_names_baseline_and_variant_and_keeps_its_judgement(tmp_path):
    outcome, _ = judged(tmp_path, "unscaled")
    (verdict,) = outcome.verdicts
    assert (verdict.check, verdict.status, verdict.split) == ("equivalent", "failed", None)
    assert [p.role for p in outcome.plan.launches] == ["baseline", "variant"]
    assert set(verdict.runs) == {"baseline", "variant"}
    assert verdict.signatures is not None  # for the plot, in the test's process
    kept = read_judgement(verdict.runs["variant"])
    assert (kept.check, kept.label, kept.rules.steps) == ("equivalent", "variant unscaled", STEPS)
    assert kept.runs == {"baseline": verdict.runs["baseline"]}
    assert kept.names == {
        "baseline": "1 rank",
        "variant": "unscaled (1 rank, args --accum 2 --bug x)",
    }


def test_the_json_report_gives_the_verdict_roles_and_differences(tmp_path):
    failing, settings = judged(tmp_path / "a", "unscaled")
    passing, settings_ok = judged(tmp_path / "b", "dp2")
    records = [record_of(failing, settings, True), record_of(passing, settings_ok, False)]
    data = json.loads(json.dumps(report_json(records)))
    by_name = {t["test"]: t for t in data["tests"]}
    bad, good = by_name["t.py::test_x[unscaled]"], by_name["t.py::test_x[dp2]"]
    (entry,) = bad["runs"][0]["verdicts"]
    assert (entry["check"], entry["status"], entry["equal"]) == ("equivalent", "failed", False)
    assert entry["split"] is None and entry["compared_steps"] == STEPS
    assert entry["first_divergence"] == {
        "step": 1,
        "rank": None,
        "key": "loss",
        "baseline": 1.0,
        "variant": 2.0,
        "relative": 0.5,
        "bound": pytest.approx(4 * 2.0**-24),
    }
    assert entry["divergent_keys"] == {"global batch": ["loss"]}
    assert set(entry["runs"]) == {"baseline", "variant"}
    assert entry["facts"][0]["differences"][0]["what"] == "loss"
    assert {launch["role"] for launch in bad["runs"][0]["launches"]} == {"baseline", "variant"}
    assert bad["first_divergence"].startswith("variant unscaled: step 1: loss: baseline 1,")
    (ok,) = good["runs"][0]["verdicts"]
    assert (ok["status"], ok["equal"], ok["first_divergence"], ok["compared_steps"]) == (
        "passed",
        True,
        None,
        STEPS,
    )
    assert (good["ranks"], good["variant_ranks"]) == (1, 2)
    # read back (a pytest-xdist worker's records): the same lines
    again = from_json(TestRecord, to_json(records[0]))
    assert again.proved() == records[0].proved()
    assert again.junit_properties() == records[0].junit_properties()


def test_the_v_line_and_junit_properties_say_what_the_item_showed(tmp_path):
    failing, settings = judged(tmp_path / "a", "unscaled")
    passing, settings_ok = judged(tmp_path / "b", "dp2")
    bad, good = record_of(failing, settings, True), record_of(passing, settings_ok, False)
    assert good.proved() == (
        "t.py::test_x[dp2] passed: launches baseline, variant-dp2; "
        f"variant dp2 equal to the baseline over {STEPS} steps"
    )
    assert bad.proved().endswith("variant unscaled differs from the baseline from step 1 (loss)")
    assert good.ranks_text == "1 vs 2" and bad.ranks_text == "1 vs 1"
    props = dict(bad.junit_properties())
    assert props["resume_equiv_verdict"] == "failed"
    assert props["resume_equiv_first_divergence"].startswith("variant unscaled: step 1: loss")
    assert props["resume_equiv_proved"] == bad.proved()
    assert dict(good.junit_properties())["resume_equiv_first_divergence"] == ""


def test_the_plot_draws_both_trajectories_of_a_variant_that_differs(tmp_path):
    pytest.importorskip("matplotlib")
    failing, _ = judged(tmp_path / "a", "unscaled")
    passing, _ = judged(tmp_path / "b", "dp2")
    (bad,), (good,) = failing.verdicts, passing.verdicts
    path = draw(picture_of(bad, str(tmp_path)))
    assert path == str(tmp_path / "plot-variant-unscaled.png") and os.path.getsize(path) > 0
    assert picture_of(good, str(tmp_path)) is None  # as for a resume: a failure's picture
    baseline, variant = (trajectory(run) for run in bad.signatures)
    assert baseline[LOSS] == {1: 1.0, 2: 0.5, 3: pytest.approx(1 / 3)}
    assert variant[LOSS][1] == 2.0 and baseline[PARAMS] == {1: 3.0, 2: 4.0, 3: 5.0}


def test_the_trajectory_reads_the_global_batch_over_ranks_and_shards(tmp_path):
    """Losses summed over micro-batches and averaged over ranks; a parameter every rank
    holds alike read once, one whose ranks hold shards combined."""
    write_configuration(tmp_path / "ddp", 2, lambda s, r: [0.5, 1.5 + r])
    write_configuration(tmp_path / "fsdp", 2, lambda s, r: [1.0], norm=lambda s, r: 3.0 + r)
    ddp, fsdp = (
        trajectory(read_run(str(tmp_path / "ddp"))),
        trajectory(read_run(str(tmp_path / "fsdp"))),
    )
    assert ddp[LOSS][1] == (2.0 + 3.0) / 2 and ddp[PARAMS][1] == 3.0
    assert fsdp[PARAMS][1] == pytest.approx(math.sqrt(3.0**2 + 4.0**2))


def test_a_rank_with_no_backward_in_a_step_is_left_out_of_the_step_loss(tmp_path):
    """The trajectory and the resume picture read a step's loss one way: a rank whose step
    gave `backward()` nothing has no loss there, not a loss of 0 that halves the mean."""
    write_configuration(tmp_path / "ddp", 2, lambda s, r: [] if r == 1 else [0.5, 1.5])
    assert trajectory(read_run(str(tmp_path / "ddp")))[LOSS][1] == 2.0


def test_the_offline_compare_of_the_kept_runs_says_what_the_test_said(tmp_path, capsys):
    for variant, status in (("unscaled", 1), ("dp2", 0)):
        outcome, _ = judged(tmp_path / variant, variant)
        (verdict,) = outcome.verdicts
        block = kind_of("equivalent").block(verdict, outcome, "kept")
        base, other = verdict.runs["baseline"], verdict.runs["variant"]
        for flags in ([], ["--configurations"]):
            assert main(["compare", *flags, base, other]) == status
            assert capsys.readouterr().out.splitlines() == block
    # without the judgement: the runs' own names, the same differences
    os.remove(os.path.join(other, "judgement.json"))
    assert main(["compare", "--configurations", base, other]) == 0
    assert capsys.readouterr().out.startswith(
        f"compare: {other} against the baseline {base}: equal"
    )
    assert main(["compare", "--configurations", "--split", "2", base, other]) == 2
    assert "--split: not taken when comparing configurations" in capsys.readouterr().err
