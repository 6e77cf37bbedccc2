"""Fake accelerator modules that behave like the real ones in what the plugin depends on, so
a change that would break on real hardware fails here. Each fake names the source it follows.
"""

from __future__ import annotations

import os
import types
from types import ModuleType, SimpleNamespace
from typing import Any, Callable, Optional, Union

from pytest_resume_equiv.launch.nvml import Gpu

GIB = 1024**3


def fake_torch(
    cuda: int = 0, xpu: int = 0, xccl: bool = False, cuda_version: Optional[str] = "12.8"
) -> ModuleType:
    """A `torch` module with the parts the device code reads (torch/version.py's fields)."""
    torch = ModuleType("torch")
    torch.cuda = FakeDeviceModule("cuda", cuda)
    torch.xpu = FakeDeviceModule("xpu", xpu)
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
            torch.npu = FakeDeviceModule("npu", npu)  # torch_npu registers it on import
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


DEFAULT_SEED = 67280421310721
"""c10::detail::default_rng_seed_val: a device generator's seed before anything seeds it."""


class FakeDeviceModule(types.ModuleType):
    """`torch.cuda` (torch 2.13: torch/cuda/__init__.py, torch/cuda/random.py,
    torch/csrc/cuda/Module.cpp) with `count` devices and no driver; torch_npu's `torch.npu`
    (torch_npu/npu/utils.py, npu/random.py, csrc/npu/Module.cpp) and `torch.xpu`
    (torch/xpu/__init__.py, random.py, csrc/xpu/Module.cpp) have the same shape:

    - asking the driver for the count (`torch._C._cuda_getDeviceCount`, `_npu_getDeviceCount`,
      `_xpu_getDeviceCount`) calls `poison_fork()`: a pthread_atfork handler makes every later
      forked child "in bad fork";
    - `is_available()`: CUDA asks the driver (so it poisons fork) unless
      PYTORCH_NVML_BASED_CUDA_CHECK=1; npu and xpu are `device_count() > 0`;
    - `device_count()`: CUDA counts through NVML first (`_device_count_nvml`, no poisoning)
      while not initialised and NVML answers; npu and xpu ask the driver;
    - `is_initialized()` is `initialized and not _is_in_bad_fork()`: it stays False after
      `is_available()`, although fork is poisoned;
    - the first call that needs the driver (`_lazy_init`: `current_device`, `set_device`,
      `get_rng_state`, `get_rng_state_all`, `synchronize`, `get_device_name`,
      `mem_get_info`) raises "Cannot re-initialize CUDA in forked subprocess" in a child of
      a poisoned process, and fills `default_generators` (`torch._C._cuda_init`);
    - seeding and `set_rng_state` before initialisation are queued (`_lazy_call`) and run at
      it, on the device current then (0, unless `set_device` came first).

    The device generators are CPU `torch._C.Generator`s (made without `torch.Generator`, so
    a rank's generator registry does not see them). `calls` lists what touched the driver.
    """

    def __init__(
        self, kind: str, count: int, real: Optional[ModuleType] = None, nvml: bool = True
    ) -> None:
        super().__init__(f"torch.{kind}")
        self.real = real
        """The CPU build's module: what the fake does not model (classes torch's other
        modules read at import, `_CudaDeviceProperties`...) is read from it."""
        self.kind = kind
        self.count = count
        self.nvml = nvml and kind == "cuda"
        """Whether NVML answers (`_device_count_nvml() >= 0`; CUDA only)."""
        self.initialized = False
        self.fork_poisoned = False
        self.in_bad_fork = False
        self.current = 0
        self.default_generators: tuple[Any, ...] = ()
        self._queued_calls: list[Callable[[], None]] = []
        self.calls: list[str] = []
        self.random = self  # torch.cuda.random.set_rng_state is torch.cuda.set_rng_state
        self.name = "NVIDIA H100" if kind == "cuda" else f"fake {kind}"
        """The device model `get_device_name` reports."""
        self.free: tuple[int, ...] = (80 * GIB,)
        """Free bytes per device (the last repeats for the others)."""
        self.total = 80 * GIB

    def __getattr__(self, name: str) -> Any:
        real = self.__dict__.get("real")
        if real is None:
            raise AttributeError(name)
        return getattr(real, name)

    # initialisation
    def _driver_count(self) -> int:
        """torch._C._cuda_getDeviceCount (and npu's, xpu's): poisons fork once."""
        if not self.fork_poisoned:
            self.fork_poisoned = True
            os.register_at_fork(after_in_child=self._forked_child)
        return self.count

    def _forked_child(self) -> None:
        self.in_bad_fork = True  # Module.cpp: forked_child() sets in_bad_fork

    def device_count(self) -> int:
        if self.nvml and not self.initialized:
            return self.count
        return self._driver_count()

    def is_available(self) -> bool:
        if self.kind == "cuda" and os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK") != "1":
            return self._driver_count() > 0
        return self.device_count() > 0

    def is_initialized(self) -> bool:
        return self.initialized and not self.in_bad_fork

    def _is_in_bad_fork(self) -> bool:
        return self.in_bad_fork

    def _lazy_init(self) -> None:
        if self.initialized:
            return
        if self.in_bad_fork:
            raise RuntimeError(
                f"Cannot re-initialize {self.kind.upper()} in forked subprocess. To use "
                f"{self.kind.upper()} with multiprocessing, you must use the 'spawn' start "
                "method"
            )
        if self._driver_count() == 0:
            raise RuntimeError(f"Found no {self.kind} devices")
        self.calls.append("init")
        self.initialized = True
        import torch

        self.default_generators = tuple(
            torch._C.Generator().manual_seed(DEFAULT_SEED) for _ in range(self.count)
        )
        queued, self._queued_calls = self._queued_calls, []
        for call in queued:
            call()

    def _lazy_call(self, call: Callable[[], None]) -> None:
        if self.is_initialized():
            call()
        else:
            self._queued_calls.append(call)

    def current_device(self) -> int:
        self._lazy_init()
        return self.current

    def set_device(self, device: Union[int, str, Any]) -> None:
        index = _index(device)
        if index is not None and index >= 0:
            self._lazy_init()
            if index >= self.count:
                raise RuntimeError("CUDA error: invalid device ordinal")
            self.current = index

    def synchronize(self, device: Any = None) -> None:
        self._lazy_init()

    # random streams (torch/cuda/random.py)
    def get_rng_state(self, device: Any = "cuda") -> Any:
        self._lazy_init()
        index = _index(device)
        return self.default_generators[self.current if index is None else index].get_state()

    def get_rng_state_all(self) -> list[Any]:
        return [self.get_rng_state(i) for i in range(self.device_count())]

    def set_rng_state(self, new_state: Any, device: Any = "cuda") -> None:
        state = new_state.clone()
        index = _index(device)

        def cb() -> None:
            at = self.current_device() if index is None else index
            self.default_generators[at].set_state(state)

        self._lazy_call(cb)

    def set_rng_state_all(self, new_states: Any) -> None:
        for i, state in enumerate(new_states):
            self.set_rng_state(state, i)

    def manual_seed(self, seed: int) -> None:
        seed = int(seed)
        self._lazy_call(lambda: self.default_generators[self.current_device()].manual_seed(seed))

    def manual_seed_all(self, seed: int) -> None:
        seed = int(seed)

        def cb() -> None:
            for i in range(self.device_count()):
                self.default_generators[i].manual_seed(seed)

        self._lazy_call(cb)

    def seed(self) -> None:
        self._lazy_call(lambda: self.default_generators[self.current_device()].seed())

    def seed_all(self) -> None:
        def cb() -> None:
            for i in range(self.device_count()):
                self.default_generators[i].seed()

        self._lazy_call(cb)

    def initial_seed(self) -> int:
        self._lazy_init()
        return self.default_generators[self.current].initial_seed()

    # what the doctor reads
    def _checked(self, device: Optional[int]) -> int:
        """torch.cuda._utils._get_device_index, then the driver's "invalid device ordinal"."""
        self._lazy_init()
        index = self.current if device is None else int(device)
        if not 0 <= index < self.count:
            raise RuntimeError(f"{self.kind.upper()} error: invalid device ordinal")
        return index

    def get_device_name(self, device: Optional[int] = None) -> str:
        """torch.cuda.get_device_name: get_device_properties(device).name (initialises)."""
        return f"{self.name} #{self._checked(device)}"

    def mem_get_info(self, device: Optional[int] = None) -> tuple[int, int]:
        """torch/cuda/memory.py mem_get_info: cudart().cudaMemGetInfo(device) -> (free,
        total) bytes (initialises); torch_npu/npu/memory.py and torch/xpu/memory.py alike."""
        index = self._checked(device)
        return (self.free[min(index, len(self.free) - 1)], self.total)


def _index(device: Any) -> Optional[int]:
    """The index a device argument names (None: the current device), as
    torch.cuda._utils._get_device_index reads it."""
    import torch

    if isinstance(device, int):
        return device
    if isinstance(device, str):
        device = torch.device(device)
    return getattr(device, "index", None)


class RecordingInitProcessGroup:
    """`torch.distributed.init_process_group` as far as its arguments go (torch 2.13,
    torch/distributed/distributed_c10d.py): `backend` is parsed by the real `BackendConfig`
    ("gloo", "nccl", "cpu:gloo,cuda:nccl"), `device_id` must be a `torch.device` with an
    index. `device_types` is what the group would serve: DCP's `async_save` asserts that
    it includes "cpu" (torch/distributed/checkpoint/state_dict_saver.py: "A CPU backend
    must be enabled for async save")."""

    def __init__(self) -> None:
        self.kwargs: dict[str, Any] = {}
        self.device_types: set[str] = set()

    def __call__(self, backend: Optional[str] = None, **kwargs: Any) -> None:
        import torch
        from torch.distributed.distributed_c10d import BackendConfig

        device_id = kwargs.get("device_id")
        if device_id is not None and (
            not isinstance(device_id, torch.device) or device_id.index is None
        ):
            raise ValueError(f"Invalid device_id {device_id!r}: a torch.device with an index")
        config = BackendConfig(backend if backend is not None else "undefined")
        self.device_types = set(config.get_device_backend_map())
        self.kwargs = {"backend": backend, **kwargs}

    def dcp_async_save_allowed(self) -> bool:
        return "cpu" in self.device_types
