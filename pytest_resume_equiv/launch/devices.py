"""Accelerator kinds, their process-group backends, visible-device variables and leases
(how long to wait for a lease is resources.py's business).

Probing goes through an injectable `import_module`, so the NPU (torch_npu) and XPU paths are
tested on CPU with fake modules.
"""

from __future__ import annotations

import importlib
import os
import tempfile
from contextlib import ExitStack
from dataclasses import dataclass
from types import ModuleType
from typing import Callable, Optional

ACCELERATORS = ("cuda", "npu", "xpu")
BACKENDS = {"cpu": "gloo", "cuda": "nccl", "npu": "hccl", "xpu": "xccl"}
VISIBLE_DEVICES_ENV = {
    "cuda": "CUDA_VISIBLE_DEVICES",
    "npu": "ASCEND_RT_VISIBLE_DEVICES",
    "xpu": "ZE_AFFINITY_MASK",
}
_PROBE_NAMES = {"cuda": "cuda", "npu": "npu (torch_npu)", "xpu": "xpu"}

Importer = Callable[[str], ModuleType]


class DeviceUnavailable(Exception):
    """The requested device is absent or too few; the message is the skip/fail reason."""


@dataclass(frozen=True)
class Device:
    kind: str
    backend: str
    count: int
    """Devices visible to this process (0 for cpu)."""


def count_devices(kind: str, import_module: Importer = importlib.import_module) -> int:
    """How many devices of `kind` this process sees (0 when the kind's stack is missing)."""
    try:
        torch = import_module("torch")
        if kind == "npu":
            import_module("torch_npu")  # registers torch.npu
        module = getattr(torch, kind, None)
        if module is None or not module.is_available():
            return 0
        return int(module.device_count())
    except Exception:  # a missing or broken driver stack is "no device", with no traceback
        return 0


def backend_for(kind: str, import_module: Importer = importlib.import_module) -> str:
    if kind == "xpu":
        try:
            dist = import_module("torch.distributed")
            if getattr(dist, "is_xccl_available", lambda: False)():
                return "xccl"
        except ImportError:
            pass
        return "gloo"
    return BACKENDS[kind]


def select_device(
    requested: str, ranks_per_node: int, import_module: Importer = importlib.import_module
) -> Device:
    """Pick the device for a launch of `ranks_per_node` ranks, or raise DeviceUnavailable."""
    if requested == "cpu":
        return Device("cpu", "gloo", 0)
    kinds = ACCELERATORS if requested == "auto" else (requested,)
    found: list[tuple[str, int]] = []
    for kind in kinds:
        count = count_devices(kind, import_module)
        if count:
            found.append((kind, count))
            break
    if not found:
        if requested == "auto":
            looked = ", ".join(_PROBE_NAMES[k] for k in ACCELERATORS)
            raise DeviceUnavailable(
                f"no accelerator found (looked for {looked}); "
                "pass --resume-equiv-device=cpu to run the ranks on CPU with gloo"
            )
        raise DeviceUnavailable(f"needs {ranks_per_node} {requested} device(s), found 0")
    kind, count = found[0]
    if count < ranks_per_node:
        raise DeviceUnavailable(f"needs {ranks_per_node} {kind} devices, found {count}")
    return Device(kind, backend_for(kind, import_module), count)


def visible_ids(kind: str, count: int, environ: Optional[dict[str, str]] = None) -> list[str]:
    """Physical ids this process may hand out (respects an existing visible-devices list)."""
    environ = dict(os.environ) if environ is None else environ
    current = environ.get(VISIBLE_DEVICES_ENV[kind], "").strip()
    if current:
        return [x.strip() for x in current.split(",") if x.strip()][:count]
    return [str(i) for i in range(count)]


class DeviceLease:
    """Exclusive use of some devices across processes (pytest-xdist workers), by file locks."""

    def __init__(self, kind: str, ids: list[str], lock_dir: Optional[str] = None) -> None:
        self.kind = kind
        self.ids = ids
        self.lock_dir = lock_dir or os.path.join(
            tempfile.gettempdir(), f"pytest-resume-equiv-{os.getuid()}", "leases"
        )
        self._stack = ExitStack()
        self.held: list[str] = []

    def try_acquire(self, n: int) -> bool:
        """Take `n` free devices now, all or nothing: holding some while waiting for more
        would deadlock two workers that each hold half of what the other needs."""
        from filelock import FileLock, Timeout

        os.makedirs(self.lock_dir, mode=0o700, exist_ok=True)
        for device_id in self.ids:
            lock = FileLock(os.path.join(self.lock_dir, f"{self.kind}-{device_id}.lock"))
            try:
                lock.acquire(timeout=0)
            except Timeout:
                continue
            self._stack.callback(lock.release)
            self.held.append(device_id)
            if len(self.held) == n:
                return True
        self.release()
        return False

    def env(self) -> dict[str, str]:
        return {VISIBLE_DEVICES_ENV[self.kind]: ",".join(self.held)}

    def release(self) -> None:
        self._stack.close()
        self.held = []
