"""The determinism preflight of one rank: the settings that decide whether a GPU or NPU
computes the same step the same way twice, read where the training set them (at the first
`record`, after the trainer's own setup), never changed, and never importing a module the
trainer did not import (a device stack or Inductor would initialise).

No read may raise into the trainer: torch >= 2.9 raises on a legacy TF32 read
(`torch.backends.cuda.matmul.allow_tf32`, `torch.get_float32_matmul_precision()`) once a
program has set the newer `fp32_precision` API to a value the legacy one cannot express
(`aten/src/ATen/Context.cpp`, "mix of the legacy and new APIs"); transformers' `enable_tf32`
sets that API on torch >= 2.9. So the new API is read first, and every read that fails is
recorded as None with its error under `unreadable`.

The plugin (`diagnose/preflight.py`) reads them into findings when a test finds noise.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Callable, Optional

ENV = (
    "CUBLAS_WORKSPACE_CONFIG",
    "NCCL_ALGO",
    "NCCL_PROTO",
    "NCCL_NVLS_ENABLE",
    "NVIDIA_TF32_OVERRIDE",
    "FLASH_ATTENTION_DETERMINISTIC",
    "TRITON_CACHE_AUTOTUNING",
    "TRITON_CACHE_DIR",
    "HCCL_DETERMINISTIC",
)

FP32_PRECISION = (
    # knob, (backend, op) of torch._C._get_fp32_precision_getter, as torch/backends/ names them
    ("fp32_precision", "fp32_precision"),
    ("fp32_precision.matmul", "cuda.matmul.fp32_precision"),
    ("fp32_precision.cudnn", "cudnn.fp32_precision"),
    ("fp32_precision.cudnn.conv", "cudnn.conv.fp32_precision"),
    ("fp32_precision.cudnn.rnn", "cudnn.rnn.fp32_precision"),
)
"""The `fp32_precision` API of torch >= 2.9 ("ieee", "tf32", or "none": inherit the parent's)."""

LEGACY = (
    ("cudnn.deterministic", "cudnn.deterministic"),
    ("cudnn.benchmark", "cudnn.benchmark"),
    ("cudnn.allow_tf32", "cudnn.allow_tf32"),
    ("matmul.allow_tf32", "cuda.matmul.allow_tf32"),
    (
        "matmul.fp16_reduced_precision_reduction",
        "cuda.matmul.allow_fp16_reduced_precision_reduction",
    ),
    (
        "matmul.bf16_reduced_precision_reduction",
        "cuda.matmul.allow_bf16_reduced_precision_reduction",
    ),
    ("sdpa.flash", "cuda.flash_sdp_enabled"),
    ("sdpa.mem_efficient", "cuda.mem_efficient_sdp_enabled"),
    ("sdpa.math", "cuda.math_sdp_enabled"),
    ("sdpa.cudnn", "cuda.cudnn_sdp_enabled"),
)
"""Knob -> its path under `torch.backends` (a function there is called)."""

INDUCTOR = ("deterministic", "max_autotune", "max_autotune_gemm", "coordinate_descent_tuning")


class _Reader:
    """Reads knobs; a read that raises is None, its error kept (the trainer never sees it)."""

    def __init__(self) -> None:
        self.unreadable: dict[str, str] = {}

    def read(self, knob: str, fn: Callable[[], Any]) -> Any:
        try:
            value = fn()
        except Exception as exc:  # noqa: BLE001 - a preflight read must never raise
            self.unreadable[knob] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            return None
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        return str(value)


def _path(obj: Any, path: str) -> Callable[[], Any]:
    def read() -> Any:
        found = obj
        for part in path.split("."):
            found = getattr(found, part, None)
            if found is None:
                return None
        return found() if callable(found) else found

    return read


def capture() -> dict[str, Any]:
    """Every knob as a JSON value (None where the stack that has it is not loaded). Never
    raises: the trainer's first `record` calls it."""
    try:
        return _capture()
    except Exception as exc:  # noqa: BLE001 - one bad stack must not end the training
        return {"unreadable": {"preflight": f"{type(exc).__name__}: {exc}"[:300]}}


def _capture() -> dict[str, Any]:
    found: dict[str, Any] = {f"env.{name}": os.environ.get(name) for name in ENV}
    torch = sys.modules.get("torch")
    if torch is None:
        return found
    reader = _Reader()
    read = reader.read
    found["torch_version"] = read("torch_version", lambda: str(torch.__version__))
    found["cuda_version"] = read("cuda_version", _path(torch, "version.cuda"))
    found["deterministic_algorithms"] = read(
        "deterministic_algorithms", _path(torch, "are_deterministic_algorithms_enabled")
    )
    found["deterministic_warn_only"] = read(
        "deterministic_warn_only", _path(torch, "is_deterministic_algorithms_warn_only_enabled")
    )
    backends = getattr(torch, "backends", None)
    for knob, path in FP32_PRECISION:  # the new API first: reading it never raises
        found[knob] = read(knob, _path(backends, path))
    found["float32_matmul_precision"] = read(
        "float32_matmul_precision", _path(torch, "get_float32_matmul_precision")
    )
    for knob, path in LEGACY:
        found[knob] = read(knob, _path(backends, path))
    inductor = sys.modules.get("torch._inductor.config")
    for name in INDUCTOR:
        knob = f"inductor.{name}"
        found[knob] = read(knob, _path(inductor, name)) if inductor else None
    found["npu.deterministic_level"] = read("npu.deterministic_level", _npu_level(torch))
    if reader.unreadable:
        found["unreadable"] = reader.unreadable
    return found


def _npu_level(torch: Any) -> Callable[[], Optional[int]]:
    """torch_npu's deterministic level (0: off; 1: deterministic; 2, 3: stricter), read from
    `torch_npu._C._npu_get_deterministic_level` as `torch_npu.npu._get_deterministic_level`
    reads it, without that function's side effect (it sets the level to match
    `torch.use_deterministic_algorithms`). torch_npu has no `npu.is_deterministic`."""

    def read() -> Optional[int]:
        torch_npu = sys.modules.get("torch_npu")
        raw = getattr(getattr(torch_npu, "_C", None), "_npu_get_deterministic_level", None)
        if callable(raw):
            level = int(raw())
            if level == 0 and torch.are_deterministic_algorithms_enabled():
                return 1  # what _get_deterministic_level reports (and sets)
            return level
        npu = getattr(torch, "npu", None)
        level_of = getattr(npu, "_get_deterministic_level", None)
        return int(level_of()) if callable(level_of) else None

    return read
