"""NVIDIA's management library (NVML) through ctypes: the GPUs of this host, by index and UUID,
without initialising CUDA.

Why not `torch.cuda`: `torch.cuda.is_available()` calls `cudaGetDeviceCount`, which
initialises the driver and registers a fork handler that poisons every later fork of the
process ("Cannot re-initialize CUDA in forked subprocess"). Asking NVML leaves the process
forkable; it is what `torch.cuda.device_count()` itself asks first
(`torch/cuda/__init__.py: _device_count_nvml`). Nothing here imports torch.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Optional

LIBRARY = "libnvidia-ml.so.1"
"""The driver's NVML (torch/cuda/__init__.py loads the same name)."""


@dataclass(frozen=True)
class Gpu:
    index: int
    """NVML's index (PCI bus order)."""
    uuid: str
    """`GPU-...`: the name CUDA_VISIBLE_DEVICES also accepts."""
    name: str


def gpus(library: str = LIBRARY) -> Optional[list[Gpu]]:
    """This host's GPUs as NVML lists them; None when NVML cannot be loaded or answer (no
    NVIDIA driver here, or a broken one): the caller must then not conclude "no GPU"."""
    try:
        nvml = ctypes.CDLL(library)
    except OSError:
        return None
    try:
        if nvml.nvmlInit_v2() != 0:
            return None
    except AttributeError:
        return None
    try:
        count = ctypes.c_uint(0)
        if nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0:
            return None
        found = []
        for index in range(count.value):
            handle = ctypes.c_void_p()
            if nvml.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle)) != 0:
                return None
            uuid = ctypes.create_string_buffer(96)
            name = ctypes.create_string_buffer(96)
            if nvml.nvmlDeviceGetUUID(handle, uuid, 96) != 0:
                return None
            if nvml.nvmlDeviceGetName(handle, name, 96) != 0:
                name.value = b""
            found.append(Gpu(index, uuid.value.decode("ascii"), name.value.decode("ascii")))
        return found
    except AttributeError:
        return None
    finally:
        nvml.nvmlShutdown()
