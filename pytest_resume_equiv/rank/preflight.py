"""The determinism preflight of one rank: the settings that decide whether a GPU or NPU
computes the same step the same way twice, read where the training set them (at the first
`record`, after the trainer's own setup), never changed, and never importing a module the
trainer did not import (a device stack or Inductor would initialise).

The plugin (`preflight.py`) reads them into findings when a test finds noise.
"""

from __future__ import annotations

import os
import sys
from typing import Any

ENV = (
    "CUBLAS_WORKSPACE_CONFIG",
    "NCCL_ALGO",
    "NCCL_PROTO",
    "NCCL_NVLS_ENABLE",
    "FLASH_ATTENTION_DETERMINISTIC",
    "TRITON_CACHE_AUTOTUNING",
    "TRITON_CACHE_DIR",
    "HCCL_DETERMINISTIC",
)


def _get(obj: Any, path: str) -> Any:
    for part in path.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj() if callable(obj) else obj


def capture() -> dict[str, Any]:
    """Every knob as a JSON value (None where the stack that has it is not loaded)."""
    found: dict[str, Any] = {f"env.{name}": os.environ.get(name) for name in ENV}
    torch = sys.modules.get("torch")
    if torch is None:
        return found
    found["deterministic_algorithms"] = _get(torch, "are_deterministic_algorithms_enabled")
    found["deterministic_warn_only"] = _get(torch, "is_deterministic_algorithms_warn_only_enabled")
    found["float32_matmul_precision"] = _get(torch, "get_float32_matmul_precision")
    found["cuda_version"] = _get(torch, "version.cuda")
    backends = getattr(torch, "backends", None)
    for name, path in (
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
    ):
        value = _get(backends, path) if backends is not None else None
        found[name] = value if isinstance(value, (bool, int, str)) or value is None else str(value)
    inductor = sys.modules.get("torch._inductor.config")
    for name in ("max_autotune", "coordinate_descent_tuning", "max_autotune_gemm"):
        found[f"inductor.{name}"] = getattr(inductor, name, None) if inductor else None
    npu = getattr(torch, "npu", None)
    deterministic = getattr(npu, "is_deterministic", None) if npu is not None else None
    found["npu.deterministic"] = deterministic() if callable(deterministic) else None
    return found
