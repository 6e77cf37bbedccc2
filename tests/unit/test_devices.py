"""Device selection for every accelerator kind, with fake torch / torch_npu modules on CPU."""

from types import ModuleType, SimpleNamespace

import pytest
from fakes import importer

from pytest_resume_equiv.launch.devices import (
    DeviceLease,
    DeviceUnavailable,
    backend_for,
    count_devices,
    select_device,
    visible_ids,
)


def test_cpu_needs_no_probe():
    def refuse(name):
        raise AssertionError("cpu must not probe accelerators")

    device = select_device("cpu", 4, refuse)
    assert (device.kind, device.backend) == ("cpu", "gloo")


def test_auto_prefers_cuda_then_npu_then_xpu():
    assert select_device("auto", 2, importer(cuda=2, npu=8, xpu=4)).kind == "cuda"
    npu = select_device("auto", 2, importer(cuda=0, npu=8, xpu=4))
    assert (npu.kind, npu.backend, npu.count) == ("npu", "hccl", 8)
    xpu = select_device("auto", 2, importer(xpu=4, xccl=True))
    assert (xpu.kind, xpu.backend) == ("xpu", "xccl")
    assert select_device("auto", 1, importer(xpu=1, xccl=False)).backend == "gloo"


def test_auto_without_accelerator_says_where_it_looked():
    with pytest.raises(DeviceUnavailable) as err:
        select_device("auto", 2, importer())
    assert str(err.value) == (
        "no accelerator found (looked for cuda, npu (torch_npu), xpu); "
        "pass --resume-equiv-device=cpu to run the ranks on CPU with gloo"
    )


def test_too_few_devices():
    with pytest.raises(DeviceUnavailable, match="^needs 2 cuda devices, found 1$"):
        select_device("auto", 2, importer(cuda=1))
    with pytest.raises(DeviceUnavailable, match="^needs 4 npu devices, found 2$"):
        select_device("npu", 4, importer(npu=2))
    with pytest.raises(DeviceUnavailable, match="^needs 2 npu device\\(s\\), found 0$"):
        select_device("npu", 2, importer(npu=None))


def test_explicit_kind_does_not_fall_back():
    with pytest.raises(DeviceUnavailable, match="xpu"):
        select_device("xpu", 1, importer(cuda=8))


def test_broken_driver_counts_as_none():
    def broken(name):
        torch = ModuleType("torch")
        torch.cuda = SimpleNamespace(
            is_available=lambda: (_ for _ in ()).throw(RuntimeError("driver"))
        )
        return torch

    assert count_devices("cuda", broken) == 0
    assert backend_for("cuda") == "nccl" and backend_for("npu") == "hccl"


def test_visible_ids_respect_existing_list():
    assert visible_ids("cuda", 2, {"CUDA_VISIBLE_DEVICES": "4,5,6"}) == ["4", "5"]
    assert visible_ids("npu", 3, {}) == ["0", "1", "2"]


def test_leases_are_disjoint_all_or_nothing_and_env_is_per_kind(tmp_path):
    first = DeviceLease("npu", ["0", "1", "2", "3"], str(tmp_path))
    second = DeviceLease("npu", ["0", "1", "2", "3"], str(tmp_path))
    assert first.try_acquire(2) and second.try_acquire(2)
    assert set(first.held).isdisjoint(second.held) and len(first.held) == len(second.held) == 2
    assert set(first.env()) == {"ASCEND_RT_VISIBLE_DEVICES"}
    third = DeviceLease("npu", ["0", "1", "2", "3"], str(tmp_path))
    assert not third.try_acquire(1) and third.held == []  # nothing held while it cannot have all
    first.release()
    assert third.try_acquire(2) and set(third.held).isdisjoint(second.held)
