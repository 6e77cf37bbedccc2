"""Building the launch plan: placeholders, shared baselines, targets, and user errors."""

import os

import pytest
from plan_helpers import plan_for

from pytest_resume_equiv.errors import ResumeEquivError
from pytest_resume_equiv.launch.targets import fill, target_from_argv, target_from_callable
from pytest_resume_equiv.plan import RunRequest, launch_key


def train(ctx):
    """A module-level function, as function mode needs."""


def teeth_check(plan):
    return next(c for c in plan.checks if c.kind == "teeth")


def build(
    tmp_path, command, checkpoint="{run_dir}/checkpoints/step_{split}", resume_args=(), **marker
):
    request = RunRequest(command, checkpoint, resume_args, seed=7)
    return plan_for(tmp_path, command, request=request, **marker)[1]


def test_command_mode_placeholders(tmp_path):
    plan = build(
        tmp_path,
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
    (base,) = plan.by_role("uninterrupted")
    (resumed,) = plan.by_role("resumed")
    base_dir, res_dir = str(tmp_path / "uninterrupted"), str(tmp_path / "resumed-split3")
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
    assert resumed.spec.context.phase == "resumed" and resumed.spec.context.split == 3
    assert base.spec.context.checkpoint == f"{base_dir}/ckpt/3"


def test_splits_share_a_baseline_unless_the_command_uses_split(tmp_path):
    shared = build(tmp_path, ["t.py", "--save-at={splits}"], split=[2, 4])
    assert [b.spec.name for b in shared.by_role("uninterrupted")] == ["uninterrupted"]
    assert [r.spec.name for r in shared.by_role("resumed")] == ["resumed-split2", "resumed-split4"]
    assert shared.by_role("uninterrupted")[0].spec.target.args == ("--save-at=2,4",)
    assert [r.checkpoint for r in shared.by_role("resumed")] == [
        os.path.join(str(tmp_path), "uninterrupted", "checkpoints", f"step_{s}") for s in (2, 4)
    ]

    separate = build(tmp_path, ["t.py", "--save-every={split}"], split=[2, 4])
    assert [b.spec.name for b in separate.by_role("uninterrupted")] == [
        "uninterrupted-split2",
        "uninterrupted-split4",
    ]
    assert separate.by_role("resumed")[1].reference is separate.by_role("uninterrupted")[1]


def test_function_mode(tmp_path):
    plan = build(tmp_path, train, nproc=1)
    target = plan.by_role("uninterrupted")[0].spec.target
    assert target.kind == "call" and target.name == f"{__name__}:train"
    assert os.path.exists(os.path.join(target.pythonpath[0], *__name__.split(".")) + ".py")
    with pytest.raises(ResumeEquivError, match="resume_args= applies to command mode only"):
        build(tmp_path, train, resume_args=["--x"])


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
        build(tmp_path, command)
    assert message in str(err.value)


def test_bad_checkpoint_and_resume_args(tmp_path):
    with pytest.raises(ResumeEquivError, match="checkpoint= must be a path template string"):
        build(tmp_path, ["t.py"], checkpoint=3)
    with pytest.raises(
        ResumeEquivError, match="unknown placeholder {ckpt} in resume_args argument"
    ):
        build(tmp_path, ["t.py"], resume_args=["--from={ckpt}"])
    with pytest.raises(ResumeEquivError, match="resume_args must be a list"):
        build(tmp_path, ["t.py"], resume_args="--from={checkpoint}")


def test_fill_lists_valid_placeholders():
    assert fill("{{a}} {steps}", {"steps": 2}, "x") == "{a} 2"
    with pytest.raises(ResumeEquivError, match=r"valid placeholders: \{steps\}, \{split\}"):
        fill("{nope}", {}, "command")


def test_argv_targets():
    script = target_from_argv(["train.py", "--a"])
    assert (script.kind, script.name, script.args) == ("script", "train.py", ("--a",))
    module = target_from_argv(["-m", "pkg.train", "--a"])
    assert (module.kind, module.name, module.args) == ("module", "pkg.train", ("--a",))


def test_literal_braces_stay_literal_in_every_template(tmp_path):
    """`{{split}}` is a literal `{split}` in a command, a resume argument and a checkpoint
    path alike, in the plan and in the rank's `checkpoint_for`."""
    plan = build(
        tmp_path,
        ["t.py", "--tag={{split}}-{split}"],
        checkpoint="{run_dir}/ckpt/{{split}}/{split}",
        resume_args=["--from={checkpoint}", "--literal={{checkpoint}}"],
    )
    (base,) = plan.by_role("uninterrupted")
    (resumed,) = plan.by_role("resumed")
    base_dir = str(tmp_path / "uninterrupted")
    assert base.spec.target.args == ("--tag={split}-3",)
    assert resumed.checkpoint == f"{base_dir}/ckpt/{{split}}/3"
    assert resumed.spec.target.args[1:] == (
        f"--from={base_dir}/ckpt/{{split}}/3",
        "--literal={checkpoint}",
    )
    ctx = resumed.spec.context
    assert ctx.checkpoint_template == "{run_dir}/ckpt/{{split}}/{split}"
    from pytest_resume_equiv.rank.context import RunContext

    rank_ctx = RunContext(**{**vars(base.spec.context)})
    assert rank_ctx.checkpoint_for(5) == f"{base_dir}/ckpt/{{split}}/5"


def test_the_uninterrupted_identity_ignores_the_timeout_and_the_test_directory(tmp_path):
    """Two tests that differ only in their timeout (or their own run directory) share one
    uninterrupted launch; one that differs in what the launch does gets its own."""

    def key(root, **marker):
        plan = plan_for(
            root, ["t.py", "--steps={steps}"], shared_root=str(tmp_path / "s"), **marker
        )[1]
        (launch,) = plan.by_role("uninterrupted")
        assert launch.shared and launch.spec.run_dir.startswith(str(tmp_path / "s"))
        return os.path.basename(launch.spec.run_dir)

    base = key(tmp_path / "a", timeout=30)
    assert key(tmp_path / "b", timeout=90) == base
    assert key(tmp_path / "c") == base
    assert key(tmp_path / "d", steps=7) != base
    assert key(tmp_path / "e", nproc=1) != base
    settings, plan = plan_for(tmp_path / "f", ["t.py"], shared_root=str(tmp_path / "s"))
    spec = plan.by_role("uninterrupted")[0].spec
    assert launch_key(spec, str(tmp_path / "f")) == launch_key(spec, str(tmp_path / "f"))


def test_plan_roles_controls_and_teeth(tmp_path):
    plan = build(tmp_path, train, split=[2, 5])
    # those that load no checkpoint first; the control only runs when a check asks
    assert [p.role for p in plan.launches] == [
        "uninterrupted",
        "control",
        "resumed",
        "resumed",
        "teeth",
        "repeat",
        "repeat",
    ]
    # a control and the resumed-process repeats run only when a check asks for them
    assert [p.name for p in plan.launches if p.on_demand] == [
        "uninterrupted-control",
        "resumed-split2-repeat",
        "resumed-split5-repeat",
    ]
    (teeth,) = plan.by_role("teeth")
    assert teeth.name == "teeth-split2" and teeth.spec.context.phase == "teeth"
    (control,) = plan.by_role("control")
    assert control.reference is plan.by_role("uninterrupted")[0]
    assert control.spec.context.phase == "uninterrupted"
    assert teeth_check(build(tmp_path, train, split=5)).off.startswith("needs steps >= split + 2")
    off = build(tmp_path, train, rng_mutation=False)
    assert off.by_role("teeth") == [] and teeth_check(off).off == (
        "rng_mutation=False from marker @resume_equivalent(rng_mutation=...)"
    )


def test_interrupt_modes_plan_a_first_launch_per_split(tmp_path):
    stop = build(tmp_path, train, interrupt="stop", split=[2, 4])
    assert [p.name for p in stop.by_role("interrupted")] == [
        "interrupted-split2",
        "interrupted-split4",
    ]
    assert [p.spec.context.steps for p in stop.by_role("interrupted")] == [2, 4]
    assert stop.by_role("resumed")[1].source is stop.by_role("interrupted")[1]
    assert stop.by_role("resumed")[1].reference is stop.by_role("uninterrupted")[0]
    assert "/interrupted-split4/" in stop.by_role("resumed")[1].checkpoint
    kill = build(tmp_path, train, interrupt="kill")
    assert (
        kill.by_role("interrupted")[0].kill_after == 4
        and kill.by_role("interrupted")[0].spec.context.steps == 6
    )


def test_a_chain_resumes_each_link_from_the_checkpoint_the_link_before_saved(tmp_path):
    plan = build(tmp_path, train, steps=8, split=[2, 4, 6], chain=True)
    links = plan.by_role("resumed")
    assert [p.link for p in links] == [1, 2, 3]
    assert links[0].source is plan.by_role("uninterrupted")[0]
    assert links[1].source is links[0] and links[2].source is links[1]
    assert [p.spec.context.save_at for p in links] == [(4,), (6,), ()]
    assert links[1].checkpoint == os.path.join(links[0].spec.run_dir, "checkpoints", "step_4")
    # each link saves into its own run directory
    assert links[0].spec.context.template_values["run_dir"] == links[0].spec.run_dir
    assert plan.by_role("uninterrupted")[0].spec.context.save_at == (2, 4, 6)
    # the direct resumes, run only when a later link diverges, load the uninterrupted run's
    names = [p.name for p in plan.by_role("direct")]
    assert names == ["resumed-split4-direct", "resumed-split6-direct"]
    direct = plan.named("resumed-split6-direct")
    assert direct.source is plan.by_role("uninterrupted")[0] and direct.role == "direct"
    assert direct.spec.context.phase == "resumed"  # ctx.resuming in the trainer
    assert direct not in plan.started and direct in plan.launches


def test_without_a_chain_every_resume_loads_the_uninterrupted_checkpoint(tmp_path):
    plan = build(tmp_path, train, steps=8, split=[2, 4])
    assert all(
        p.source is plan.by_role("uninterrupted")[0] and p.link == 0
        for p in plan.by_role("resumed")
    )
    assert all(p.spec.context.save_at == () for p in plan.by_role("resumed"))
    assert plan.by_role("direct") == []


def test_a_chain_needs_one_uninterrupted_launch(tmp_path):
    with pytest.raises(ResumeEquivError, match="chain=True needs one uninterrupted launch"):
        build(tmp_path, ["t.py", "--save={split}"], steps=8, split=[2, 4], chain=True)


def test_a_topology_change_plans_the_uninterrupted_run_on_the_resumed_topology(tmp_path):
    plan = build(tmp_path, train, nproc=2, resume_nproc=1)
    (full,), (other,), (resumed,) = (
        plan.by_role("uninterrupted"),
        plan.by_role("topology"),
        plan.by_role("resumed"),
    )
    assert (full.spec.nproc, other.spec.nproc, resumed.spec.nproc) == (2, 1, 1)
    assert other.name == "uninterrupted-nproc1" and other.role == "topology"
    assert other.spec.context.save_at == ()  # nothing loads its checkpoints
    assert resumed.after == (other,) and other in resumed.needs
    (teeth,) = plan.by_role("teeth")
    assert teeth.after == (other,) and teeth.spec.nproc == 1
    assert resumed.spec.context.template_values["world_size"] == 2  # the saving launch's
    assert other.spec.context.template_values["world_size"] == 1
    assert build(tmp_path, train, nproc=2).by_role("topology") == []


def test_resume_on_more_nodes(tmp_path):
    plan = build(tmp_path, train, nproc=1, nnodes=2, resume_nnodes=1, resume_nproc=2)
    (other,) = plan.by_role("topology")
    assert (other.spec.nproc, other.spec.nnodes) == (2, 1)
    assert (plan.by_role("resumed")[0].spec.nproc, plan.by_role("resumed")[0].spec.nnodes) == (2, 1)


def test_cwd_takes_placeholders_like_the_command(tmp_path):
    """A trainer that saves relative to its working directory runs in its own run directory
    (`cwd="{run_dir}"`), each launch in its own."""
    request = RunRequest(["train.py"], "{run_dir}/snapshot_{split}.pt", seed=7, cwd="{run_dir}")
    plan = plan_for(tmp_path, ["train.py"], request=request)[1]
    (base,) = plan.by_role("uninterrupted")
    (resumed,) = plan.by_role("resumed")
    assert base.spec.cwd == str(tmp_path / "uninterrupted")
    assert resumed.spec.cwd == str(tmp_path / "resumed-split3")


def test_a_working_directory_that_does_not_exist_is_a_clear_error(tmp_path):
    from pytest_resume_equiv.launch.running import RunningLaunch

    request = RunRequest(["train.py"], seed=7, cwd=str(tmp_path / "missing"))
    (base,) = plan_for(tmp_path, ["train.py"], request=request)[1].by_role("uninterrupted")
    with pytest.raises(ResumeEquivError, match=r"cwd='.*missing' is not a directory"):
        RunningLaunch(base.spec)
