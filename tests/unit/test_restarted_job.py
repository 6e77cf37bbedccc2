"""interrupt="crash": the resumed launch runs as a restarted job (issue 43). It resumes from
and saves into its own run directory, where what the crash left is laid out first, whatever
form the test is written in; a save of its own that cannot write over what the crash left is
its failure, in words. No torchrun."""

import os

from plan_helpers import CPU, settings_for

from pytest_resume_equiv.checks.after_crash import Row, could_not_save, judge_after_crash
from pytest_resume_equiv.checks.crash_points import lay_out
from pytest_resume_equiv.compare.comparators import comparator_for
from pytest_resume_equiv.compare.tolerance import ComparisonRules
from pytest_resume_equiv.launch.rank_exits import RankOutcome
from pytest_resume_equiv.launch.running import LaunchResult
from pytest_resume_equiv.plan import Planner, RunRequest
from pytest_resume_equiv.rank.encode import encode
from pytest_resume_equiv.rank.run_dir import RankStatus, write_status
from pytest_resume_equiv.signature import Signature

COMMAND = ["train.py", "--resume-from={checkpoint}", "--output-dir={run_dir}"]


def planner(tmp_path):
    settings = settings_for(steps=6, split=[2, 4], interrupt="crash")
    request = RunRequest(COMMAND, checkpoint="{run_dir}/checkpoints", seed=7)
    return Planner(settings, request, CPU, str(tmp_path))


def test_the_resumed_launch_resumes_from_and_saves_into_its_own_run_directory(tmp_path):
    """--resume-from={checkpoint} and --output-dir={run_dir} name one place, as for a job
    restarted on its folder; the launch before it is still its source (it runs first)."""
    plan = planner(tmp_path)
    full = plan.saving("uninterrupted", "uninterrupted", (2, 4), str(tmp_path / "full"), 6)
    crash = plan.saving("crash-1", "crash", (2, 4), str(tmp_path / "crash-1"), 6)
    resumed = plan.resuming("resumed-crash-1", "resumed", 4, full, crash, own_root=True)
    own = str(tmp_path / "resumed-crash-1")
    assert resumed.checkpoint == f"{own}/checkpoints" and resumed.source is crash
    assert resumed.spec.context.checkpoint == f"{own}/checkpoints"
    assert resumed.spec.context.template_values["run_dir"] == own  # ctx.checkpoint_for
    assert list(resumed.spec.target.args[-2:]) == [
        f"--resume-from={own}/checkpoints",
        f"--output-dir={own}",
    ]
    other = plan.resuming("resumed-2", "resumed", 4, full, crash)  # the other checks' resume
    assert other.checkpoint == str(tmp_path / "crash-1" / "checkpoints")


def test_what_the_crash_left_is_laid_out_as_it_was(tmp_path):
    crash, into = tmp_path / "crash-1", tmp_path / "resumed-crash-1"
    (crash / "checkpoints" / "step_2").mkdir(parents=True)
    (crash / "checkpoints" / "step_2" / "model.pt").write_bytes(b"m" * 10)
    (crash / "checkpoints" / "tmp-step_4").mkdir()  # empty: created, nothing written yet
    (crash / "checkpoints" / "latest").symlink_to("step_2")
    (crash / "checkpoints" / "absolute").symlink_to(crash / "checkpoints" / "step_2")
    (crash / "checkpoints" / "broken").symlink_to("step_4")
    for own in ("signatures", "status", "logs"):
        (crash / own).mkdir()
        (crash / own / "rank-0.json").write_text("{}")
    (crash / "gate-open").write_text("")
    (into / "logs").mkdir(parents=True)  # the resumed launch's own, started at its gate
    lay_out(str(crash), str(into))
    found = sorted(
        os.path.relpath(os.path.join(d, n), into) for d, ds, fs in os.walk(into) for n in ds + fs
    )
    assert found == [
        "checkpoints",
        "checkpoints/absolute",
        "checkpoints/broken",
        "checkpoints/latest",
        "checkpoints/step_2",
        "checkpoints/step_2/model.pt",
        "checkpoints/tmp-step_4",
        "logs",
    ]
    assert (into / "checkpoints" / "step_2" / "model.pt").read_bytes() == b"m" * 10
    assert os.readlink(into / "checkpoints" / "latest") == "step_2"
    assert os.readlink(into / "checkpoints" / "absolute") == str(into / "checkpoints" / "step_2")
    assert os.readlink(into / "checkpoints" / "broken") == "step_4"


# --- a save of its own that fails -----------------------------------------------------------


def trainer(ctx):
    pass


def failed_launch(tmp_path):
    from plan_helpers import plan_for

    _, plan = plan_for(tmp_path, trainer, steps=6, split=[2, 4])
    spec = plan.launches[0].spec
    return LaunchResult(spec, [1], False, 0.0, [RankOutcome(0, "none", "OSError")], "rerun")


def resumed_from(start, steps=6):
    header = {"rank": 0, "world_size": 1, "phase": "resumed", "splits": [2, 4]}
    lines = [(s, {"loss": encode(s / 2, "loss")}) for s in range(start + 1, steps + 1)]
    return {0: Signature("rank-0.jsonl", header, lines, False)}


def replace_failed(run_dir, after_step):
    error = (
        f"OSError: [Errno 39] Directory not empty: '{run_dir}/checkpoints/tmp-step_4' -> "
        f"'{run_dir}/checkpoints/step_4'"
    )
    call = {
        "op": "os.replace",
        "path": f"{run_dir}/checkpoints/tmp-step_4",
        "to": f"{run_dir}/checkpoints/step_4",
        "after_step": after_step,
        "error": error,
    }
    library = 'File "/x/pytest_resume_equiv/rank/wrapping.py", line 9, in watched\n'
    return RankStatus("error", 1, error, library, call)


def test_a_resumed_run_whose_own_save_fails_could_not_save_that_step(tmp_path):
    result = failed_launch(tmp_path)
    run_dir = result.spec.run_dir
    write_status(run_dir, 0, replace_failed(run_dir, 4))
    run = resumed_from(2, steps=4)
    said = "the restarted job could not save step 4: os.replace onto the existing " + (
        "checkpoints/step_4: Directory not empty"
    )
    assert could_not_save(run_dir, 1, run) == said
    reference = resumed_from(0)
    reference[0].header["phase"] = "uninterrupted"
    comparator = comparator_for(ComparisonRules(steps=6))
    row = judge_after_crash(Row("middle", "x"), result, reference, run, [2], comparator, "pass")
    assert (row.status, row.why) == ("failed", said)


def test_a_failed_write_before_it_trained_or_a_failed_read_is_no_save_of_its_own(tmp_path):
    result = failed_launch(tmp_path)
    run_dir = result.spec.run_dir
    write_status(run_dir, 0, replace_failed(run_dir, 2))  # cleaning up before its first step
    assert could_not_save(run_dir, 1, resumed_from(2, steps=4)) == ""
    read = {"op": "open", "mode": "r", "path": f"{run_dir}/checkpoints/latest", "after_step": 4}
    write_status(run_dir, 0, RankStatus("error", 1, "FileNotFoundError: x", "", read))
    assert could_not_save(run_dir, 1, resumed_from(2, steps=4)) == ""
