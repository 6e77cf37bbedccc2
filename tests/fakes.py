"""Fake accelerator modules that behave like the real ones in what the plugin depends on, so
a change that would break on real hardware fails here. Each fake names the source it follows.
"""

from __future__ import annotations

import os
from types import ModuleType, SimpleNamespace
from typing import Optional

from pytest_resume_equiv.launch.nvml import Gpu


class FakeCuda:
    """`torch.cuda` of a CUDA build, after torch/cuda/__init__.py (torch 2.13) and
    torch/csrc/cuda/Module.cpp:

    - `is_available()` asks `torch._C._cuda_getDeviceCount()`, which initialises the driver
      and calls `poison_fork()`: a pthread_atfork handler makes every later forked child
      "in bad fork" (unless PYTORCH_NVML_BASED_CUDA_CHECK=1, then it counts through NVML);
    - `device_count()` counts through NVML first (`_device_count_nvml`; no poisoning) and
      falls back to `_cuda_getDeviceCount` when NVML cannot answer;
    - `is_initialized()` is `_initialized and not _is_in_bad_fork()`: it stays False after
      `is_available()`, although fork is poisoned;
    - `_lazy_init()` (any `current_device()`, tensor on the device, ...) raises "Cannot
      re-initialize CUDA in forked subprocess" in a child of a poisoned process.
    """

    def __init__(self, count: int, nvml: bool = True) -> None:
        self.count = count
        self.nvml = nvml
        """Whether NVML answers (`_device_count_nvml() >= 0`)."""
        self._initialized = False
        self.fork_poisoned = False
        self._in_bad_fork = False

    def _cuda_getDeviceCount(self) -> int:  # noqa: N802 - torch._C's name
        if not self.fork_poisoned:
            self.fork_poisoned = True
            os.register_at_fork(after_in_child=self._forked_child)
        return self.count

    def _forked_child(self) -> None:
        self._in_bad_fork = True  # Module.cpp: forked_child() sets in_bad_fork

    def _is_in_bad_fork(self) -> bool:
        return self._in_bad_fork

    def is_available(self) -> bool:
        if os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK") == "1":
            return self.device_count() > 0
        return self._cuda_getDeviceCount() > 0

    def device_count(self) -> int:
        if self._initialized or not self.nvml:
            return self._cuda_getDeviceCount()
        return self.count

    def is_initialized(self) -> bool:
        return self._initialized and not self._is_in_bad_fork()

    def _lazy_init(self) -> None:
        if self.is_initialized():
            return
        if self._is_in_bad_fork():
            raise RuntimeError(
                "Cannot re-initialize CUDA in forked subprocess. To use CUDA with "
                "multiprocessing, you must use the 'spawn' start method"
            )
        self._cuda_getDeviceCount()
        self._initialized = True

    def current_device(self) -> int:
        self._lazy_init()
        return 0


class FakeNpu(FakeCuda):
    """`torch.npu` as torch_npu registers it, after torch_npu/npu/utils.py and
    torch_npu/csrc/npu/Module.cpp: `device_count()` is `_npu_getDeviceCount()`, which poisons
    fork as CUDA's does, and `is_available()` is `device_count() > 0`; no NVML path."""

    def __init__(self, count: int) -> None:
        super().__init__(count, nvml=False)

    def is_available(self) -> bool:
        return self.device_count() > 0


def fake_torch(
    cuda: int = 0, xpu: int = 0, xccl: bool = False, cuda_version: Optional[str] = "12.8"
) -> ModuleType:
    """A `torch` module with the parts the device code reads (torch/version.py's fields)."""
    torch = ModuleType("torch")
    torch.cuda = FakeCuda(cuda)
    torch.xpu = FakeCuda(xpu)  # torch/xpu/__init__.py: the same lazy-init and fork rules
    torch.version = SimpleNamespace(cuda=cuda_version, hip=None, xpu="2025.1" if xpu else None)
    torch.distributed = SimpleNamespace(is_xccl_available=lambda: xccl)
    return torch


def importer(cuda=0, npu=None, xpu=0, xccl=False):
    """An import_module for a fake torch; npu=None means torch_npu is not installed."""
    torch = fake_torch(cuda, xpu, xccl)

    def import_module(name):
        if name == "torch":
            return torch
        if name == "torch.distributed":
            return torch.distributed
        if name == "torch_npu":
            if npu is None:
                raise ImportError("No module named 'torch_npu'")
            torch.npu = FakeNpu(npu)  # torch_npu registers torch.npu on import
            return ModuleType("torch_npu")
        raise ImportError(name)

    import_module.torch = torch
    return import_module


def gpus(n: int, name: str = "NVIDIA H100") -> list[Gpu]:
    """What nvml.gpus() answers on a host with `n` GPUs of one model."""
    return [Gpu(i, f"GPU-{i:08x}-aaaa-bbbb-cccc-{i:012x}", name) for i in range(n)]


def nccl_init(node_visible: list[str], nproc: int) -> list[str]:
    """The physical device each rank of a launch takes, as NCCL checks it: rank `local_rank`
    of a node takes the `local_rank`-th of that node's visible devices, and a communicator
    with two ranks on one device fails (nccl src/init.cc: "Duplicate GPU detected : rank %d
    and rank %d both on CUDA device %lx")."""
    taken: list[str] = []
    for node, visible in enumerate(node_visible):
        ids = [x for x in visible.split(",") if x]
        for local_rank in range(nproc):
            if local_rank >= len(ids):
                raise RuntimeError(f"node {node} rank {local_rank}: invalid device ordinal")
            device = ids[local_rank]
            if device in taken:
                raise RuntimeError(
                    f"Duplicate GPU detected : rank {taken.index(device)} and rank "
                    f"{len(taken)} both on CUDA device {device}"
                )
            taken.append(device)
    return taken
