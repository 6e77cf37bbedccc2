"""Device selection for every accelerator kind, with fake torch / torch_npu modules and a fake
NVML on CPU (tests/fakes.py): counted without initialising a driver in the pytest process."""

import os
import sys

import pytest
from fakes import gpus, importer

from pytest_resume_equiv.launch import devices
from pytest_resume_equiv.launch.devices import (
    Device,
    DeviceLease,
    DeviceUnavailable,
    HostProbe,
    TorchBuild,
    backend_for,
    count_here,
    lock_names,
    resolve_gpus,
    select_device,
    torch_build,
    visible_ids,
)

EVERY_KIND = TorchBuild(cuda=True, xpu=True, npu=True)


def by_child(import_module, build=EVERY_KIND):
    """A probe whose child runs torch's own count against the fake modules (no NVML)."""
    return HostProbe(
        build=lambda: build,
        gpus=lambda: None,
        child=lambda kind: count_here(kind, import_module),
    )


def test_cpu_needs_no_probe():
    def refuse():
        raise AssertionError("cpu must not probe accelerators")

    device = select_device("cpu", 4, HostProbe(build=refuse))
    assert (device.kind, device.backend) == ("cpu", "gloo")


def test_auto_prefers_cuda_then_npu_then_xpu():
    found = select_device("auto", 2, by_child(importer(cuda=2, npu=8, xpu=4)))
    assert found.kind == "cuda"
    npu = select_device("auto", 2, by_child(importer(cuda=0, npu=8, xpu=4)))
    assert (npu.kind, npu.backend, npu.count) == ("npu", "hccl", 8)
    fake = importer(xpu=4, xccl=True)
    xpu = select_device("auto", 2, by_child(fake), import_module=fake)
    assert (xpu.kind, xpu.backend) == ("xpu", "xccl")
    fake = importer(xpu=1, xccl=False)
    assert select_device("auto", 1, by_child(fake), import_module=fake).backend == "gloo"


def test_auto_without_accelerator_says_where_it_looked():
    with pytest.raises(DeviceUnavailable) as err:
        select_device("auto", 2, by_child(importer()))
    assert str(err.value) == (
        "no accelerator found (looked for cuda, npu (torch_npu), xpu); "
        "pass --resume-equiv-device=cpu to run the ranks on CPU with gloo"
    )


def test_too_few_devices_says_what_needs_them():
    with pytest.raises(DeviceUnavailable, match="^needs 2 cuda devices, found 1$"):
        select_device("auto", 2, by_child(importer(cuda=1)))
    with pytest.raises(DeviceUnavailable, match="^needs 4 npu devices, found 2$"):
        select_device("npu", 4, by_child(importer(npu=2)))
    with pytest.raises(DeviceUnavailable, match="^needs 2 npu device\\(s\\), found 0$"):
        select_device("npu", 2, by_child(importer(npu=None)))
    with pytest.raises(DeviceUnavailable, match=r"^needs 4 npu devices \(its resumed"):
        select_device("npu", 4, by_child(importer(npu=2)), why="its resumed launches: ...")


def test_explicit_kind_does_not_fall_back():
    with pytest.raises(DeviceUnavailable, match="xpu"):
        select_device("xpu", 1, by_child(importer(cuda=8)))


def test_broken_driver_counts_as_none():
    def broken(name):
        raise RuntimeError("driver")

    assert count_here("cuda", broken) == 0
    assert backend_for("cuda") == "nccl" and backend_for("npu") == "hccl"


def test_the_pytest_process_counts_gpus_without_poisoning_fork(monkeypatch):
    """torch.cuda.is_available() in pytest poisons every later fork of it (a user's test that
    forks and uses CUDA fails): the count comes from NVML and the torch build, and the fake
    torch (in sys.modules, as after a user's import) is never asked."""
    fake = importer(cuda=2)
    monkeypatch.setitem(sys.modules, "torch", fake.torch)
    monkeypatch.setattr(devices, "host_gpus", lambda: gpus(2), raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    found = select_device("auto", 2)
    assert (found.kind, found.count) == ("cuda", 2)
    assert not fake.torch.cuda.fork_poisoned
    assert not fake.torch.cuda.is_initialized()


def test_without_nvml_a_child_counts_and_the_header_does_not_ask_one():
    asked = []

    def child(kind):
        asked.append(kind)
        return 4

    probe = HostProbe(build=lambda: EVERY_KIND, gpus=lambda: None, child=child)
    assert probe.count("cuda") == 4 and asked == ["cuda"]
    quiet = HostProbe(build=lambda: EVERY_KIND, gpus=lambda: None, child=child, use_child=False)
    assert quiet.count("cuda") is None and asked == ["cuda"]
    assert HostProbe(build=lambda: TorchBuild(), child=child).count("npu") == 0
    assert asked == ["cuda"]  # a kind the build cannot use costs no child


def test_the_torch_build_is_read_without_importing_torch(monkeypatch):
    """Read from torch's version.py, the build is what the imported torch says it was built
    for, whichever wheel is installed: the CPU wheel (no cuda, rocm, xpu) or the registry's
    default CUDA build, which is a CUDA build on a machine without a GPU too (there the
    count of CUDA devices is 0, not the build)."""
    import torch as imported

    monkeypatch.delitem(sys.modules, "torch", raising=False)
    build = torch_build()
    assert "torch" not in sys.modules
    monkeypatch.setitem(sys.modules, "torch", imported)
    version = imported.version
    assert build == TorchBuild(
        cuda=bool(version.cuda or version.hip),
        rocm=bool(version.hip),
        xpu=bool(getattr(version, "xpu", None)),
        npu=build.npu,
    )
    assert torch_build() == build  # and read from the imported torch, the same


def test_visible_devices_are_read_as_cuda_reads_them():
    four = gpus(4)
    assert resolve_gpus(None, four) == four
    assert resolve_gpus(["2", "0"], four) == [four[2], four[0]]
    assert resolve_gpus(["1", "7", "2"], four) == [four[1]]  # ends at the first invalid one
    assert resolve_gpus(["1", "1"], four) == []  # a repeated device empties the list
    assert resolve_gpus([four[3].uuid[:12]], four) == [four[3]]  # a UUID prefix
    assert resolve_gpus(["MIG-1234"], four) is None  # NVML cannot tell: a child counts
    probe = HostProbe(
        build=lambda: TorchBuild(cuda=True),
        gpus=lambda: four,
        environ={"CUDA_VISIBLE_DEVICES": "3,1"},
    )
    assert probe.count("cuda") == 2


def test_visible_ids_respect_existing_list():
    assert visible_ids("cuda", 2, {"CUDA_VISIBLE_DEVICES": "4,5,6"}) == ["4", "5"]
    assert visible_ids("npu", 3, {}) == ["0", "1", "2"]


def test_on_rocm_hip_visible_devices_is_read_first_and_leased_too(tmp_path):
    """HIP_VISIBLE_DEVICES overrides CUDA_VISIBLE_DEVICES on ROCm (torch/cuda/__init__.py,
    _parse_visible_devices): a lease that set only the latter would not restrict anything."""
    environ = {"HIP_VISIBLE_DEVICES": "4,5,6", "CUDA_VISIBLE_DEVICES": "0,1,2"}
    assert visible_ids("cuda", 3, environ, rocm=True) == ["4", "5", "6"]
    rocm = Device("cuda", "nccl", 3, rocm=True)
    lease = DeviceLease("cuda", ["4", "5", "6"], str(tmp_path), variables=rocm.visible_vars)
    assert lease.try_acquire(2)
    assert lease.env() == {"HIP_VISIBLE_DEVICES": "4,5", "CUDA_VISIBLE_DEVICES": "4,5"}
    lease.release()


def test_one_gpu_named_by_index_and_by_uuid_is_one_lease(tmp_path):
    """Two pytest sessions, one with CUDA_VISIBLE_DEVICES=0,1 and one naming the same GPUs by
    UUID: the locks are taken by UUID, so they cannot both lease GPU 0."""
    four = gpus(4)
    cuda = Device("cuda", "nccl", 2)
    by_index = DeviceLease(
        "cuda", ["0", "1"], str(tmp_path), lock_names(cuda, ["0", "1"], {}, lambda: four)
    )
    named = [four[0].uuid, four[1].uuid[:14]]
    by_uuid = DeviceLease("cuda", named, str(tmp_path), lock_names(cuda, named, {}, lambda: four))
    assert by_index.try_acquire(1) and by_index.held == ["0"]
    assert by_uuid.try_acquire(1) and by_uuid.held == [named[1]]  # GPU 1: GPU 0 is taken
    assert not DeviceLease(
        "cuda", named, str(tmp_path), lock_names(cuda, named, {}, lambda: four)
    ).try_acquire(1)
    by_index.release()
    by_uuid.release()
    mixed = [*four[:1], *(g.__class__(g.index, g.uuid, "NVIDIA A100") for g in four[1:])]
    assert lock_names(cuda, ["1"], {}, lambda: mixed) == {"1": "1"}  # CUDA's order may differ
    pci = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert lock_names(cuda, ["1"], pci, lambda: mixed) == {"1": mixed[1].uuid}


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


def test_a_lease_prefers_the_devices_asked_for(tmp_path):
    lease = DeviceLease("cuda", ["0", "1", "2", "3"], str(tmp_path))
    assert lease.try_acquire(2, prefer=["3", "1"]) and lease.held == ["3", "1"]
    lease.release()


def test_the_nvml_library_missing_is_unknown_not_zero():
    from pytest_resume_equiv.launch import nvml

    assert nvml.gpus("libnvidia-ml-not-here.so.1") is None
    assert os.path.basename(nvml.LIBRARY) == "libnvidia-ml.so.1"
