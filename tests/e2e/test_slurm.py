"""The Slurm launcher against a real two-node Slurm cluster on localhost (slurm_cluster.py),
and its pieces without one.

Where Slurm is not installed the cluster tests skip with the reason, except on CI
(`CI` set), where .ci/install installs it and a skip would hide a broken launcher.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from helpers import CPU, interrupt_once_started, processes_mentioning
from slurm_cluster import LocalSlurmCluster, slurm_available

from pytest_resume_equiv.errors import ResumeEquivError
from pytest_resume_equiv.launch.agents import SlurmSteps, job_name, launcher_agents
from pytest_resume_equiv.launch.devices import Device
from pytest_resume_equiv.launch.rank_exits import rank_outcomes
from pytest_resume_equiv.launch.resources import parallelism
from pytest_resume_equiv.launch.running import LaunchSpec, Target
from pytest_resume_equiv.launch.spec import launcher_named
from pytest_resume_equiv.option_values import parse_slurm_args
from pytest_resume_equiv.rank.launch_context import LaunchContext
from pytest_resume_equiv.rank.run_dir import (
    SLURM_PROBLEM,
    launch_token_path,
    read_pids,
    request_stacks,
    stacks_requested,
)
from pytest_resume_equiv.settings import OPTIONS

SLURM = (*CPU, "--resume-equiv-launcher=slurm")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    missing = slurm_available()
    if missing:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the Slurm tests: {missing}")
        pytest.skip(missing)
    with LocalSlurmCluster(str(tmp_path_factory.mktemp("slurm")), nodes=2, cpus_per_node=4) as c:
        yield c


def squeue(cluster) -> str:
    done = subprocess.run(
        ["squeue", "--noheader"], env=cluster.client_env(), capture_output=True, text=True
    )
    return done.stdout.strip()


@pytest.mark.long(60)
def test_two_nodes_through_slurm(trainers, cluster, monkeypatch):
    """Each launch an srun job of its own: a caught bug names its node and rank, a hang is
    killed with every rank's stack, a rank killed by a signal fails its launch; nothing is
    left in the queue or running. (A correct trainer passes in the next test.)"""
    for name, value in cluster.client_env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    trainers.makepyfile(
        test_nodes="""
        from pytest_resume_equiv import resume_equivalent
        from trainers import hangs_in_collective, rank1_killed, train_forgets_cpu_rng

        @resume_equivalent(steps=5, split=3, nproc=1, nnodes=2, rng_mutation=False)
        def test_bug(resume_equiv):
            resume_equiv.run(train_forgets_cpu_rng)

        def test_hang(torchrun):
            torchrun(hangs_in_collective, nproc=1, nnodes=2, timeout=15)

        def test_killed(torchrun):
            torchrun(rank1_killed, nproc=1, nnodes=2)
        """
    )
    result = trainers.runpytest_subprocess(*SLURM, "-rA")
    result.assert_outcomes(failed=3)
    # which node a rank lands on is the rendezvous' choice; the report names it
    result.stdout.fnmatch_lines(
        [
            "*split 3: first divergence at step 4, rank 0 (node n[12]), key 'loss'*",
            "*likely cause (never restored): ranks 0-1: the CPU RNG*",
            "*the torchrun launch (launch-1) timed out after 15s and was killed*",
            "*rank 0: still running at the timeout (killed); stuck in *trainers.py:* in "
            "hangs_in_collective",
            "*rank 1: still running at the timeout (killed); stuck in *distributed_c10d.py:*",
            "*the torchrun launch (launch-1) failed*",
            "*rank 1: killed by SIGKILL*",
        ]
    )
    assert (
        "srun --nodes=2 --ntasks=2 --ntasks-per-node=1 --kill-on-bad-exit=1" in result.stdout.str()
    )
    assert squeue(cluster) == ""
    assert processes_mentioning(str(trainers.path)) == []


@pytest.mark.long(30)
def test_launches_are_steps_of_the_allocation_pytest_runs_in(trainers, cluster, monkeypatch):
    """Inside an allocation every launch is a step of it, one rank per node, and a correct
    trainer passes on two nodes."""
    env = cluster.client_env()
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    alloc = subprocess.run(
        ["salloc", "--nodes=2", "--no-shell", "--job-name=outer"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    job = alloc.stderr.split("Granted job allocation")[-1].split()[0]
    try:
        monkeypatch.setenv("SLURM_JOB_ID", job)
        seen = trainers.path / "jobs-seen"
        seen.mkdir()
        monkeypatch.setenv("JOBS_SEEN", str(seen))
        trainers.makepyfile(
            test_in_job="""
            import os
            from pytest_resume_equiv import resume_equivalent
            from trainers import train

            def train_in_job(ctx):
                path = os.path.join(os.environ["JOBS_SEEN"], f"{ctx.phase}-{ctx.rank}")
                with open(path, "w") as f:
                    f.write(os.environ["SLURM_JOB_ID"] + " " + os.environ["SLURMD_NODENAME"])
                train(ctx)

            @resume_equivalent(steps=5, split=3, nproc=1, nnodes=2, rng_mutation=False)
            def test_passes(resume_equiv):
                resume_equiv.run(train_in_job)
            """
        )
        result = trainers.runpytest_subprocess(*SLURM, "-rA")
        result.assert_outcomes(passed=1)
        result.stdout.fnmatch_lines(
            [
                "resume-equiv: *launcher=slurm (command line *): steps of job *",
                "*resumed-split3: 2 ranks, *s, ok*",
                "*split 3: equal on all 2 ranks over 2 steps*",
            ]
        )
        # every rank of every launch ran as a step of the allocation, one rank per node
        ranks = {p.name: p.read_text().split() for p in seen.iterdir()}
        assert sorted(ranks) == ["resumed-0", "resumed-1", "uninterrupted-0", "uninterrupted-1"]
        assert {job_id for job_id, _ in ranks.values()} == {job}
        for phase in ("uninterrupted", "resumed"):
            assert {ranks[f"{phase}-{r}"][1] for r in (0, 1)} == {"n1", "n2"}
    finally:
        subprocess.run(["scancel", job], env=env, timeout=30)
    assert processes_mentioning(str(trainers.path)) == []


def wait_for_empty_queue(cluster, seconds: float = 45.0) -> str:
    deadline = time.monotonic() + seconds
    while squeue(cluster) and time.monotonic() < deadline:
        time.sleep(0.5)
    return squeue(cluster)


@pytest.mark.long(20)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_stopping_pytest_cancels_every_slurm_launch(trainers, cluster, tmp_path, sig):
    """SIGTERM: the plugin cancels every launch. SIGKILL: nothing of the plugin runs, but
    each srun gets SIGTERM from the kernel (parent-death signal) and ends its job."""
    trainers.makepyfile(
        test_long="""
        from pytest_resume_equiv import resume_equivalent
        from trainers import sleeps_after_start

        @resume_equivalent(steps=4, split=2, nproc=1, nnodes=2)
        def test_long(resume_equiv):
            resume_equiv.run(sleeps_after_start)
        """
    )
    started = tmp_path / "started.txt"
    env = {**cluster.client_env(), "STARTED_FILE": str(started), "PYTHONPATH": str(trainers.path)}
    env.pop("SLURM_JOB_ID", None)
    code, output = interrupt_once_started(
        trainers.path, [*SLURM, "test_long.py"], env, started, 2, sig
    )
    if sig == signal.SIGTERM:
        assert code == 2, output  # pytest: interrupted
        assert "resume-equiv: interrupted; every launch was killed" in output
        assert squeue(cluster) == ""
    else:
        assert code == -signal.SIGKILL
        assert wait_for_empty_queue(cluster) == ""
    time.sleep(1.5)  # ranks notice within a second if anything was missed
    assert processes_mentioning(str(trainers.path)) == []


def _spec(tmp_path, nnodes=2, launcher="slurm", args=()) -> LaunchSpec:
    context = LaunchContext("uninterrupted", str(tmp_path), "cpu", "gloo")
    target = Target("script", "train.py", ("--x=1",))
    return LaunchSpec(
        "u",
        target,
        str(tmp_path),
        2,
        nnodes,
        60.0,
        context,
        {},
        None,
        launcher_named(launcher, args),
    )


@pytest.fixture
def fake_srun(tmp_path, monkeypatch):
    """An `srun` on PATH (the argv is only built, never run)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text("#!/bin/sh\nexit 1\n")
    (bin_dir / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    return str(bin_dir / "srun")


def test_slurm_argv_outside_and_inside_an_allocation(tmp_path, monkeypatch, fake_srun):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    spec = _spec(tmp_path, args=("--partition=gpu", "--gpus-per-node=8"))
    (tmp_path / "rendezvous.json").write_text('{"endpoint": "old:1", "step": "1.0"}')
    (argv,) = SlurmSteps(spec.launcher.args).argvs(spec)
    # explicit task counts: srun would otherwise take those of the step pytest runs in
    assert argv[:8] == [
        fake_srun,
        "--nodes=2",
        "--ntasks=2",
        "--ntasks-per-node=1",
        "--kill-on-bad-exit=1",
        f"--job-name={job_name(spec)}",
        "--label",
        "--partition=gpu",
    ]
    assert "--overlap" not in argv
    agent = argv.index("pytest_resume_equiv.rank.slurm_agent")
    token = open(launch_token_path(str(tmp_path))).read()
    assert argv[agent + 1 : agent + 3] == [str(tmp_path), token]
    assert argv[-5:] == [
        "-m",
        "pytest_resume_equiv.rank.bootstrap",
        "--script",
        "train.py",
        "--x=1",
    ]
    # a rerun never reads an old endpoint; the stacks request file is there, empty
    assert not (tmp_path / "rendezvous.json").exists()
    assert (tmp_path / "dump-stacks").read_text() == "" and not stacks_requested(str(tmp_path))
    request_stacks(str(tmp_path))
    assert stacks_requested(str(tmp_path))
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    (inside,) = SlurmSteps().argvs(spec)
    assert "--overlap" in inside


def test_slurm_without_srun_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ResumeEquivError, match="srun is not on PATH"):
        SlurmSteps().argvs(_spec(tmp_path))


def test_srun_errors_are_the_launch_problem():
    text = "srun: error: Unable to allocate resources: Invalid account\n0: other output\n"
    assert (
        SlurmSteps().problem(text) == "srun: error: Unable to allocate resources: Invalid account"
    )
    assert SlurmSteps().problem("0: plain output") == ""
    stopped = (
        "srun: error: n2: task 1: Exited with exit code 1\nsrun: error: Terminating StepId=4.0"
    )
    assert SlurmSteps().problem(stopped) == ""  # consequences of a stop, not its cause


def test_accelerator_launches_in_one_allocation_run_one_at_a_time():
    assert parallelism(
        Device("cuda", "nccl", 8), nproc=2, world_size=4, launcher=launcher_named("slurm")
    ) == (
        1,
        0,
    )
    assert parallelism(Device("cuda", "nccl", 8), nproc=2, world_size=4) == (2, 0)


def test_local_launcher_simulates_nodes_with_one_agent_each(tmp_path):
    one, two = (_spec(tmp_path, nnodes=n, launcher="local") for n in (1, 2))
    assert len(launcher_agents(one).argvs(_spec(tmp_path))) == 1
    argvs = launcher_agents(two).argvs(_spec(tmp_path))
    assert len(argvs) == 2 and argvs[0] == argvs[1]
    assert "--standalone" not in argvs[0] and "--local-addr=127.0.0.1" in argvs[0]


def _slurm_agent(run_dir, *args, **env) -> subprocess.CompletedProcess:
    env = {**os.environ, "RESUME_EQUIV_SLURM_WAIT": "0.5", **env}
    return subprocess.run(
        [sys.executable, "-m", "pytest_resume_equiv.rank.slurm_agent", str(run_dir), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_step_with_more_tasks_than_nodes_says_which_option_did_it(tmp_path):
    done = _slurm_agent(
        tmp_path, "t", "r", "--nnodes=2", SLURM_STEP_NUM_TASKS="4", SLURM_LOCALID="1"
    )
    assert done.returncode == 3
    assert "this job step has 4 tasks (local id 1), expected one per node on 2 nodes" in done.stderr


def test_a_node_never_reads_an_earlier_launchs_endpoint(tmp_path):
    (tmp_path / "launch-token").write_text("t")
    (tmp_path / "rendezvous.json").write_text('{"endpoint": "old-host:1", "step": "7.0"}')
    done = _slurm_agent(tmp_path, "t", "r", SLURM_NODEID="1", SLURM_JOB_ID="7", SLURM_STEP_ID="1")
    assert done.returncode == 3 and "never saw node 0's rendezvous endpoint" in done.stderr


def test_a_one_rank_launch_runs_its_rank_with_torchruns_variables_and_no_agent(tmp_path):
    spec = _spec(tmp_path, nnodes=1, launcher="local")
    spec = LaunchSpec(**{**spec.__dict__, "nproc": 1})
    agents = launcher_agents(spec)
    (argv,) = agents.argvs(spec)
    assert argv[1:] == ["-m", "pytest_resume_equiv.rank.bootstrap", "--script", "train.py", "--x=1"]
    env = agents.env(spec)
    assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"]) == (
        "0",
        "0",
        "1",
        "1",
    )
    assert env["TORCHELASTIC_RUN_ID"]  # torch.distributed.is_torchelastic_launched()
    # the rank's own exit status stands where an agent's summary would
    assert agents.exitcodes([-9]) == {0: -9} and agents.exitcodes([None]) == {}
    (outcome,) = rank_outcomes(str(tmp_path), 1, "", False, agents.exitcodes([-9]))
    assert outcome.detail == "killed by SIGKILL"


def test_a_node_that_does_not_see_the_run_directory_says_so(tmp_path):
    (tmp_path / "launch-token").write_text("another launch's token")
    done = _slurm_agent(tmp_path, "t", "r", SLURM_NODEID="1", SLURMD_NODENAME="n2")
    assert done.returncode == 3
    assert done.stderr.startswith(f"{SLURM_PROBLEM} node n2 (")
    assert f"does not see the run directory {tmp_path}" in done.stderr
    assert SlurmSteps().problem("0: " + done.stderr).startswith("node n2 (")


def test_slurm_args_are_shell_split_and_a_bad_quote_names_its_source():
    assert parse_slurm_args("--partition=gpu --comment='a b'") == (
        "--partition=gpu",
        "--comment=a b",
    )
    with pytest.raises(ValueError, match="not a shell-quoted list of srun options"):
        parse_slurm_args("--comment='open")
    assert OPTIONS["launcher"].parse("SLURM") == "slurm"
    with pytest.raises(ValueError, match="expected one of local, slurm"):
        OPTIONS["launcher"].parse("pbs")


def test_pid_files_of_other_hosts_are_not_signalled(tmp_path):
    pids = tmp_path / "pids"
    pids.mkdir()
    (pids / "rank-0.pid").write_text(f"{os.getpid()} {os.uname().nodename}")
    (pids / "rank-1.pid").write_text("4242 some-other-node")
    (pids / "rank-2.pid").write_text("4343")  # written before hosts were recorded
    assert read_pids(str(tmp_path)) == {0: os.getpid(), 2: 4343}
