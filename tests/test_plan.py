"""Building the launch plan: placeholders, shared baselines, targets, and user errors."""

import os

import pytest

from pytest_resume_equiv.orchestrate import (
    PlanInputs,
    ResumeEquivError,
    build_plan,
    fill,
    target_from_argv,
    target_from_callable,
)
from pytest_resume_equiv.settings import parse_marker


def inputs(tmp_path, **marker):
    spec = parse_marker((), {"steps": 6, "split": 3, **marker})
    return PlanInputs(spec, str(tmp_path), "cpu", "gloo", 30.0, {}, seed=7)


def train(ctx):
    """A module-level function, as function mode needs."""


def test_command_mode_placeholders(tmp_path):
    plan = build_plan(
        inputs(tmp_path),
        [
            "-m",
            "trainer",
            "--steps={steps}",
            "--out={run_dir}",
            "--n={nproc}x{world_size}",
            "--seed={seed}",
            "--json={{}}",
        ],
        checkpoint="{run_dir}/ckpt/{split}",
        resume_args=["--resume={checkpoint}"],
    )
    (base,) = plan.baselines
    (resumed,) = plan.resumed
    base_dir, res_dir = str(tmp_path / "baseline"), str(tmp_path / "resumed-split3")
    assert base.spec.target.kind == "module" and base.spec.target.name == "trainer"
    assert base.spec.target.args == (
        "--steps=6",
        f"--out={base_dir}",
        "--n=2x2",
        "--seed=7",
        "--json={}",
    )
    assert resumed.spec.target.args[-1] == f"--resume={base_dir}/ckpt/3"
    assert resumed.spec.target.args[1] == f"--out={res_dir}"
    assert resumed.checkpoint == f"{base_dir}/ckpt/3"
    assert resumed.spec.context["phase"] == "resumed" and resumed.spec.context["split"] == 3
    assert base.spec.context["checkpoint"] == f"{base_dir}/ckpt/3"


def test_splits_share_a_baseline_unless_the_command_uses_split(tmp_path):
    shared = build_plan(inputs(tmp_path, split=[2, 4]), ["t.py", "--save-at={splits}"])
    assert [b.spec.name for b in shared.baselines] == ["baseline"]
    assert [r.spec.name for r in shared.resumed] == ["resumed-split2", "resumed-split4"]
    assert shared.baselines[0].spec.target.args == ("--save-at=2,4",)
    assert [r.checkpoint for r in shared.resumed] == [
        os.path.join(str(tmp_path), "baseline", "checkpoints", f"step_{s}") for s in (2, 4)
    ]

    separate = build_plan(inputs(tmp_path, split=[2, 4]), ["t.py", "--save-every={split}"])
    assert [b.spec.name for b in separate.baselines] == ["baseline-split2", "baseline-split4"]
    assert separate.resumed[1].baseline is separate.baselines[1]


def test_function_mode(tmp_path):
    plan = build_plan(inputs(tmp_path, nproc=1), train)
    target = plan.baselines[0].spec.target
    assert target.kind == "call" and target.name == f"{__name__}:train"
    assert os.path.exists(os.path.join(target.pythonpath[0], *__name__.split(".")) + ".py")
    with pytest.raises(ResumeEquivError, match="resume_args= applies to command mode only"):
        build_plan(inputs(tmp_path), train, resume_args=["--x"])


def test_callables_must_be_importable_by_name():
    with pytest.raises(ResumeEquivError, match="must be a module-level function"):
        target_from_callable(lambda ctx: None)

    def nested(ctx):
        pass

    with pytest.raises(ResumeEquivError, match="no lambdas, nested functions"):
        target_from_callable(nested)


@pytest.mark.parametrize(
    ("command", "message"),
    [
        ("python train.py", "command must be a list of strings, got str"),
        (["train.py", 3], "must hold only strings, got 3"),
        ([], "command is empty"),
        (["-m"], "'-m' needs a module name"),
        (["--nproc-per-node=2", "t.py"], "must start with a Python script path or '-m module'"),
        (
            ["t.py", "--out={rundir}"],
            "unknown placeholder {rundir} in command argument '--out={rundir}'",
        ),
    ],
)
def test_bad_commands(tmp_path, command, message):
    with pytest.raises(ResumeEquivError) as err:
        build_plan(inputs(tmp_path), command)
    assert message in str(err.value)


def test_bad_checkpoint_and_resume_args(tmp_path):
    with pytest.raises(ResumeEquivError, match="checkpoint= must be a path template string"):
        build_plan(inputs(tmp_path), ["t.py"], checkpoint=3)
    with pytest.raises(
        ResumeEquivError, match="unknown placeholder {ckpt} in resume_args argument"
    ):
        build_plan(inputs(tmp_path), ["t.py"], resume_args=["--from={ckpt}"])
    with pytest.raises(ResumeEquivError, match="resume_args must be a list"):
        build_plan(inputs(tmp_path), ["t.py"], resume_args="--from={checkpoint}")


def test_fill_lists_valid_placeholders():
    assert fill("{{a}} {steps}", {"steps": 2}, "x") == "{a} 2"
    with pytest.raises(ResumeEquivError, match=r"valid placeholders: \{steps\}, \{split\}"):
        fill("{nope}", {}, "command")


def test_argv_targets():
    assert target_from_argv(["train.py", "--a"]).display() == "train.py --a"
    assert target_from_argv(["-m", "pkg.train", "--a"]).display() == "-m pkg.train --a"
