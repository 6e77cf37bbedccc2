"""Fake accelerator modules for tests on a CPU-only machine, behaving like the real ones in
every respect the plugin depends on. Each says which source it follows; when one of them
changes, the fake must follow, or a regression on real hardware passes here.
"""

from __future__ import annotations

import types
from typing import Any, Callable, Optional, Union

import torch

DEFAULT_SEED = 67280421310721
"""c10::detail::default_rng_seed_val: a device generator's seed before anything seeds it."""


class FakeDeviceModule(types.ModuleType):
    """`torch.cuda` (torch 2.13: torch/cuda/__init__.py, torch/cuda/random.py) with `count`
    devices and no driver; torch_npu's `torch.npu` (torch_npu/npu/utils.py, npu/random.py)
    and `torch.xpu` (torch/xpu/__init__.py, random.py) have the same shape:

    - `device_count()` needs no initialisation; `is_initialized()` is False until the first
      call that needs the driver (`_lazy_init`: `current_device`, `set_device`,
      `get_rng_state`, `get_rng_state_all`, `synchronize`);
    - seeding and `set_rng_state` before initialisation are queued (`_lazy_call`) and run at
      it, on the device current then (0, unless `set_device` came first);
    - `default_generators` is empty until initialisation fills it (`torch._C._cuda_init`);
    - `_is_in_bad_fork()` is True in a child forked after initialisation (`in_bad_fork`).

    The device generators are CPU `torch._C.Generator`s (made without `torch.Generator`, so
    a rank's generator registry does not see them). `calls` lists what touched the driver.
    """

    def __init__(self, kind: str, count: int) -> None:
        super().__init__(f"torch.{kind}")
        self.kind = kind
        self.count = count
        self.initialized = False
        self.in_bad_fork = False
        self.current = 0
        self.default_generators: tuple[Any, ...] = ()
        self._queued_calls: list[Callable[[], None]] = []
        self.calls: list[str] = []
        self.random = self  # torch.cuda.random.set_rng_state is torch.cuda.set_rng_state

    # initialisation
    def device_count(self) -> int:
        return self.count

    def is_available(self) -> bool:
        return self.count > 0

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
        if self.count == 0:
            raise RuntimeError(f"Found no {self.kind} devices")
        self.calls.append("init")
        self.initialized = True
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

    def set_device(self, device: Union[int, str, torch.device]) -> None:
        index = _index(device)
        if index is not None and index >= 0:
            self._lazy_init()
            if index >= self.count:
                raise RuntimeError("CUDA error: invalid device ordinal")
            self.current = index

    def synchronize(self, device: Any = None) -> None:
        self._lazy_init()

    # random streams (torch/cuda/random.py)
    def get_rng_state(self, device: Any = "cuda") -> torch.Tensor:
        self._lazy_init()
        index = _index(device)
        return self.default_generators[self.current if index is None else index].get_state()

    def get_rng_state_all(self) -> list[torch.Tensor]:
        return [self.get_rng_state(i) for i in range(self.device_count())]

    def set_rng_state(self, new_state: torch.Tensor, device: Any = "cuda") -> None:
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


def _index(device: Any) -> Optional[int]:
    """The index a device argument names (None: the current device), as
    torch.cuda._utils._get_device_index reads it."""
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
