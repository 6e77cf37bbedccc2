"""A rank's device and process group (`ctx.device`, `ctx.init_process_group`), with fake
device modules and a fake `init_process_group` that parse arguments as torch does."""

import pytest
import torch
import torch.distributed as dist
from fakes import FakeDeviceModule, RecordingInitProcessGroup

from pytest_resume_equiv.rank.accelerate import checkpointed_objects
from pytest_resume_equiv.rank.context import RunContext


@pytest.fixture
def init(monkeypatch):
    recorder = RecordingInitProcessGroup()
    monkeypatch.setattr(dist, "init_process_group", recorder)
    return recorder


def context(kind, backend, local_rank=0):
    return RunContext(
        "uninterrupted", "/tmp/run", device_kind=kind, backend=backend, local_rank=local_rank
    )


@pytest.mark.parametrize("kind, backend", [("cuda", "nccl"), ("xpu", "xccl")])
def test_the_process_group_has_a_cpu_backend_and_the_device(init, monkeypatch, kind, backend):
    """A device-only backend fails DCP's async_save ("A CPU backend must be enabled") and
    every CPU collective: `cpu:gloo,<kind>:<backend>`, with this rank's device as
    `device_id`."""
    fake = FakeDeviceModule(kind, 2)
    monkeypatch.setattr(torch, kind, fake, raising=False)
    context(kind, backend, local_rank=1).init_process_group()
    assert init.kwargs == {
        "backend": f"cpu:gloo,{kind}:{backend}",
        "device_id": torch.device(kind, 1),
    }
    assert init.dcp_async_save_allowed() and fake.current == 1


def test_the_callers_arguments_win(init, monkeypatch):
    monkeypatch.setattr(torch, "cuda", FakeDeviceModule("cuda", 2))
    ctx = context("cuda", "nccl")
    ctx.init_process_group(backend="nccl", timeout=5)  # a TypeError before
    assert init.kwargs["backend"] == "nccl" and init.kwargs["timeout"] == 5
    assert not init.dcp_async_save_allowed()  # the caller's choice, as given
    context("cpu", "gloo").init_process_group()
    assert init.kwargs == {"backend": "gloo"}


def test_one_gpu_per_task_is_ordinal_zero(init, monkeypatch):
    """Slurm with --gpus-per-task=1: each task sees one device, whatever its local rank;
    set_device(local_rank) would name an ordinal that does not exist."""
    fake = FakeDeviceModule("cuda", 1)
    monkeypatch.setattr(torch, "cuda", fake)
    ctx = context("cuda", "nccl", local_rank=3)
    assert ctx.device == torch.device("cuda", 0)
    ctx.init_process_group()
    assert fake.current == 0 and init.kwargs["device_id"] == torch.device("cuda", 0)
    monkeypatch.setattr(torch, "cuda", FakeDeviceModule("cuda", 4))
    assert ctx.device == torch.device("cuda", 3)  # every device visible: the local rank


def test_an_accelerators_grad_scaler_is_watched():
    """accelerate's save_state writes the GradScaler of fp16 training (scaler.pt)."""
    Accelerator = type("Accelerator", (), {"__module__": "accelerate.accelerator"})
    accelerator = Accelerator()
    accelerator._models, accelerator._optimizers, accelerator._schedulers = [], [], []
    accelerator._dataloaders, accelerator._custom_objects = [], []
    accelerator.scaler = torch.amp.GradScaler("cpu")
    assert checkpointed_objects(accelerator) == {"scaler": accelerator.scaler}
    accelerator.scaler = None
    assert checkpointed_objects(accelerator) == {}
