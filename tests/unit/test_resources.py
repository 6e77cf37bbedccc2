"""Device leases and the parallelism policy, with fake launches: no devices needed."""

import threading

import pytest
from plan_helpers import settings_for

from pytest_resume_equiv.checks import build_plan
from pytest_resume_equiv.errors import ResumeEquivError
from pytest_resume_equiv.launch import resources
from pytest_resume_equiv.launch.devices import Device
from pytest_resume_equiv.launch.resources import Launcher, LeaseWait, parallelism
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
    assert parallelism(Device("npu", "hccl", 8), nproc=2, world_size=4) == (4, 0)
    assert parallelism(Device("npu", "hccl", 1), nproc=2, world_size=2) == (1, 0)


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
    start = Launcher(CUDA2, 30.0, "test_x", lock_dir=str(tmp_path / "leases"))
    first = start(plan.by_role("resumed")[0], False)
    second = start(plan.by_role("resumed")[1], False)
    assert start(plan.by_role("resumed")[2], False) is None  # both devices taken: ask again later
    assert sorted(started) == ["0", "1"]
    first.kill()  # its devices go back
    third = start(plan.by_role("resumed")[2], False)
    assert third is not None and started[-1] == started[0]
    second.kill()
    third.kill()
