"""Device leases and the parallelism policy, with fake launches: no devices needed."""

import os
import threading

import pytest
from fakes import nccl_init
from plan_helpers import settings_for

from pytest_resume_equiv.checks import build_plan
from pytest_resume_equiv.errors import ResumeEquivError
from pytest_resume_equiv.launch import resources
from pytest_resume_equiv.launch.agents import LocalNodes
from pytest_resume_equiv.launch.devices import Device
from pytest_resume_equiv.launch.resources import LeaseWait, LeasingStarter, parallelism
from pytest_resume_equiv.launch.spec import launcher_named
from pytest_resume_equiv.plan import RunRequest

CUDA2 = Device("cuda", "nccl", 2)


def train(ctx):
    """Stands in for a trainer: nothing here runs it."""


def test_parallelism_cpu_gives_a_core_per_rank(monkeypatch):
    monkeypatch.setattr(resources.os, "cpu_count", lambda: 8)
    assert parallelism(Device("cpu", "gloo", 0), nproc=2, world_size=2) == (4, 1)
    assert parallelism(Device("cpu", "gloo", 0), nproc=4, world_size=16) == (1, 1)


def test_parallelism_accelerators_run_one_launch_per_device_set_and_none_ahead():
    assert parallelism(CUDA2, nproc=1, world_size=1) == (2, 0)
    assert parallelism(Device("cuda", "nccl", 3), nproc=2, world_size=2) == (1, 0)
    assert parallelism(Device("npu", "hccl", 1), nproc=2, world_size=2) == (1, 0)


def test_simulated_nodes_on_one_host_each_need_their_own_devices():
    """nnodes=2 on the local launcher runs both nodes here: a launch uses nproc * nnodes
    devices, so 8 devices hold 2 such launches, not 4."""
    assert parallelism(Device("npu", "hccl", 8), nproc=2, world_size=4) == (2, 0)
    assert launcher_named("local").devices_per_host(2, 2) == 4
    assert launcher_named("slurm").devices_per_host(2, 2) == 2  # a host per node


def test_lease_wait_polls_blocks_and_gives_up_with_one_message(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    one = Device("cuda", "nccl", 1)
    holder = LeaseWait(one, 1, 5, "first", str(tmp_path)).poll()
    assert holder is not None and holder.env() == {"CUDA_VISIBLE_DEVICES": "0"}
    waiting = LeaseWait(one, 1, 0.2, "resumed-split3", str(tmp_path))
    assert waiting.poll() is None  # taken: ask again later
    threading.Event().wait(0.3)
    with pytest.raises(ResumeEquivError, match="could not lease 1 cuda devices for resumed-split3"):
        waiting.poll()
    threading.Timer(0.3, holder.release).start()
    lease = LeaseWait(one, 1, 5, "second", str(tmp_path)).wait()  # blocks until released
    assert lease.held == ["0"]
    lease.release()


def test_each_accelerator_launch_leases_its_own_devices(tmp_path, monkeypatch):
    """Launches that run side by side (or in other xdist workers) get disjoint devices through
    their visible-devices variable; a launch waits while none are free."""
    started = []

    class FakeRunning:
        def __init__(self, spec, gated):
            self.spec, self.gate_open = spec, not gated
            started.append(spec.env["CUDA_VISIBLE_DEVICES"])

        def poll(self):
            return None

        def kill(self):
            pass

    monkeypatch.setattr(resources, "RunningLaunch", FakeRunning)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    settings = settings_for(split=[2, 3, 4], nproc=1, rng_mutation=False)
    plan = build_plan(settings, RunRequest(train), CUDA2, str(tmp_path))
    start = LeasingStarter(CUDA2, 30.0, "test_x", lock_dir=str(tmp_path / "leases"))
    first = start(plan.by_role("resumed")[0], False)
    second = start(plan.by_role("resumed")[1], False)
    assert start(plan.by_role("resumed")[2], False) is None  # both devices taken: ask again later
    assert sorted(started) == ["0", "1"]
    first.kill()  # its devices go back
    third = start(plan.by_role("resumed")[2], False)
    assert third is not None and started[-1] == started[0]
    second.kill()
    third.kill()


class FakeRunning:
    """Stands in for RunningLaunch: records each start's environment; runs until killed."""

    started: list = []

    def __init__(self, spec, gated):
        self.spec, self.gate_open = spec, not gated
        FakeRunning.started.append(spec)

    def poll(self):
        return None

    def kill(self):
        pass


def test_a_simulated_two_node_launch_leases_four_devices_and_gives_each_node_two(
    tmp_path, monkeypatch
):
    """Each simulated node must see only its own devices: with the whole list, local rank 0
    of both nodes takes the first device, and NCCL refuses ("Duplicate GPU detected")."""
    FakeRunning.started = []
    monkeypatch.setattr(resources, "RunningLaunch", FakeRunning)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    four = Device("cuda", "nccl", 4)
    settings = settings_for(split=3, nproc=2, nnodes=2, rng_mutation=False)
    plan = build_plan(settings, RunRequest(train), four, str(tmp_path))
    start = LeasingStarter(four, 30.0, "test_x", lock_dir=str(tmp_path / "leases"))
    first = start(plan.by_role("uninterrupted")[0], False)
    spec = FakeRunning.started[-1]
    assert spec.env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
    nodes = [LocalNodes().node_env(spec, node)["CUDA_VISIBLE_DEVICES"] for node in range(2)]
    assert nodes == ["0,1", "2,3"]
    assert sorted(nccl_init(nodes, 2)) == ["0", "1", "2", "3"]
    with pytest.raises(RuntimeError, match="Duplicate GPU detected"):
        nccl_init([spec.env["CUDA_VISIBLE_DEVICES"]] * 2, 2)  # what every node saw before
    first.kill()


def test_each_simulated_node_is_started_with_its_own_slice(tmp_path, monkeypatch):
    """RunningLaunch gives each agent process its node's variables."""
    from pytest_resume_equiv.launch import running
    from pytest_resume_equiv.launch.running import LaunchSpec, RunningLaunch, Target
    from pytest_resume_equiv.rank.launch_context import LaunchContext

    envs = []

    class FakePopen:
        def __init__(self, argv, env, **kwargs):
            envs.append(env)
            self.pid, self.returncode = -1, 0

        def poll(self):
            return 0

        def wait(self, timeout=None):
            return 0

    monkeypatch.setattr(running.subprocess, "Popen", FakePopen)
    monkeypatch.setattr(running, "kill_all", lambda procs, run_dir: None)  # nothing to kill
    lease_env = {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}
    spec = LaunchSpec(
        "x",
        Target("script", "t.py"),
        str(tmp_path),
        2,
        2,
        60.0,
        LaunchContext("launch", str(tmp_path), "cuda", "nccl", seed=0),
        dict(lease_env),
        lease_env=lease_env,
    )
    RunningLaunch(spec).kill()
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["4,5", "6,7"]


def test_a_lease_larger_than_the_visible_devices_fails_at_once(tmp_path, monkeypatch):
    """A resumed launch with resume_nproc=4 on 2 GPUs used to poll for the whole timeout and
    then blame other pytest workers."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    wait = LeaseWait(CUDA2, 4, 600.0, "resumed-split3", str(tmp_path))
    with pytest.raises(ResumeEquivError) as err:
        wait.poll()
    assert str(err.value) == (
        "resumed-split3 needs 4 cuda devices on this host, but this process sees 2 "
        "(CUDA_VISIBLE_DEVICES=0,1): lower nproc, nnodes or resume_nproc, or make more "
        "devices visible"
    )


def test_waiters_are_served_in_arrival_order(tmp_path, monkeypatch):
    """A 4-device launch that waits is not overtaken by 2-device launches that ask later,
    even when 2 devices are free: otherwise it could wait forever."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    four = Device("cuda", "nccl", 4)
    locks = str(tmp_path)
    running = LeaseWait(four, 2, 60, "running", locks).poll()
    assert running is not None and running.held == ["0", "1"]
    big = LeaseWait(four, 4, 60, "big", locks)
    small = LeaseWait(four, 2, 60, "small", locks)
    assert big.poll() is None  # first in line, but 2 of its 4 are taken
    assert small.poll() is None  # 2 are free, but the 4-device launch came first
    running.release()
    lease = big.poll()
    assert lease is not None and lease.held == ["0", "1", "2", "3"]
    assert small.poll() is None  # now only because the devices are taken
    lease.release()
    second = small.poll()
    assert second is not None
    second.release()


def test_a_dead_or_silent_waiter_does_not_block_the_queue(tmp_path, monkeypatch):
    from pytest_resume_equiv.launch import leases

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    locks = str(tmp_path)
    silent = LeaseWait(CUDA2, 2, 60, "silent", locks)
    assert silent.poll() is not None  # takes both devices and leaves the queue
    dead = leases.Ticket(locks, "cuda")
    os.close(dead._fd)  # its process is gone: nobody holds its ticket's lock
    dead._fd = None
    stuck = leases.Ticket(locks, "cuda")  # alive, but no longer asking
    old = os.path.getmtime(stuck.path) - 2 * leases.TICKET_FRESH
    os.utime(stuck.path, (old, old))
    latest = leases.Ticket(locks, "cuda")
    assert latest.first()
    assert not os.path.exists(dead.path) and os.path.exists(stuck.path)
    for ticket in (stuck, latest):
        ticket.leave()


def test_a_tests_next_launch_prefers_the_devices_of_its_previous_one(tmp_path, monkeypatch):
    """Another set of GPUs can change NCCL's reduction order: the resumed launch asks first
    for the GPUs its uninterrupted launch ran on."""
    FakeRunning.started = []
    monkeypatch.setattr(resources, "RunningLaunch", FakeRunning)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    four = Device("cuda", "nccl", 4)
    locks = str(tmp_path / "leases")
    settings = settings_for(split=3, nproc=2, rng_mutation=False)
    plan = build_plan(settings, RunRequest(train), four, str(tmp_path))
    other = LeaseWait(four, 1, 5, "another test", locks).poll()
    start = LeasingStarter(four, 30.0, "test_x", lock_dir=locks)
    first = start(plan.by_role("uninterrupted")[0], False)
    assert FakeRunning.started[-1].env["CUDA_VISIBLE_DEVICES"] == "1,2"
    first.kill()
    other.release()
    resumed = start(plan.by_role("resumed")[0], False)
    assert FakeRunning.started[-1].env["CUDA_VISIBLE_DEVICES"] == "1,2"  # not 0,1
    resumed.kill()
