"""The environment key of a golden: what makes an uninterrupted run's numbers legitimately
differ between machines (device kind and count, world size, torch version, the accelerator
runtime's version, the signature format), as a short directory name and in words.

Goldens are kept per key: a run on CUDA 12.4 is not compared with one recorded on CPU, and a
torch upgrade asks for new goldens instead of failing every test.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import asdict, dataclass
from typing import Any, Callable, Optional

from ..rank.layout import SIGNATURE_VERSION

RUNTIMES = ("cuda", "rocm", "cann", "xpu")


@dataclass(frozen=True)
class Environment:
    device: str
    """Device kind: cpu, cuda, npu, xpu."""
    devices: int
    """Devices the test's ranks use (0 on cpu)."""
    world_size: int
    torch: str
    runtime: str = ""
    """The accelerator runtime, e.g. "cuda 12.4", "rocm 6.2", "cann 8.0"; "" on cpu."""
    signature_version: int = SIGNATURE_VERSION

    @property
    def key(self) -> str:
        """The directory name: `cpu-ws2-torch2.13.0-sig2`, `cuda2-ws2-torch2.5.1-cuda12.4-sig2`."""
        device = self.device + (str(self.devices) if self.devices else "")
        parts = [device, f"ws{self.world_size}", f"torch{self.torch}"]
        if self.runtime:
            parts.append(self.runtime.replace(" ", ""))
        parts.append(f"sig{self.signature_version}")
        return _safe("-".join(parts))

    def words(self) -> str:
        """The key in words, written into the store beside it."""
        devices = f"{self.devices} {self.device} devices" if self.devices else self.device
        return (
            f"{devices}, world size {self.world_size}, torch {self.torch}, "
            f"{self.runtime or 'no accelerator runtime'}, signature format {self.signature_version}"
        )

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "key": self.key, "words": self.words()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Environment:
        return cls(
            device=str(data["device"]),
            devices=int(data["devices"]),
            world_size=int(data["world_size"]),
            torch=str(data["torch"]),
            runtime=str(data.get("runtime", "")),
            signature_version=int(data.get("signature_version", SIGNATURE_VERSION)),
        )


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._+-]", "_", text)


def runtime_of(kind: str, import_module: Callable[[str], Any] = importlib.import_module) -> str:
    """The version of the runtime behind device `kind`, in words ("" on cpu or when unknown)."""
    if kind == "cpu":
        return ""
    try:
        torch = import_module("torch")
        version = getattr(torch, "version", None)
        if kind == "cuda" and getattr(version, "hip", None):
            return f"rocm {version.hip}"
        if kind == "cuda" and getattr(version, "cuda", None):
            return f"cuda {version.cuda}"
        if kind == "npu":
            npu = import_module("torch_npu")
            cann = getattr(getattr(npu, "version", None), "cann", None)
            return f"cann {cann}" if cann else f"torch_npu {getattr(npu, '__version__', '?')}"
        if kind == "xpu" and getattr(version, "xpu", None):
            return f"xpu {version.xpu}"
    except Exception:  # a broken driver stack: the key says "unknown", the run goes on
        pass
    return f"{kind} unknown"


def current(
    kind: str,
    world_size: int,
    devices: int,
    import_module: Callable[[str], Any] = importlib.import_module,
) -> Environment:
    """This machine's environment for a test on `devices` devices of `kind`."""
    torch: Optional[Any]
    try:
        torch = import_module("torch")
    except ImportError:
        torch = None
    version = str(getattr(torch, "__version__", "unknown")).split("+")[0]
    return Environment(
        kind, 0 if kind == "cpu" else devices, world_size, version, runtime_of(kind, import_module)
    )
