"""The determinism preflight: the settings that make GPUs and NPUs compute the same step
differently, as every rank of every launch recorded them (`rank/preflight.py`), read into
findings for a report that found noise.

Settings that differ between the launches come first (a resumed process that turns on
`cudnn.benchmark`, another `NCCL_ALGO`): each is a reason on its own for the same state to
compute differently. Then the settings that allow nondeterminism in every launch, for the
device kind that ran. Each finding has its fix in one line.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Optional

from ..compare import facts
from ..signature import Signature

KNOBS: dict[str, tuple[tuple[str, ...], Any, str]] = {
    # name: (device kinds it matters on, the deterministic value (None: set), the fix)
    "deterministic_algorithms": (
        ("cuda", "npu", "xpu"),
        True,
        "torch.use_deterministic_algorithms(True)",
    ),
    "cudnn.deterministic": (("cuda",), True, "torch.backends.cudnn.deterministic = True"),
    "cudnn.benchmark": (
        ("cuda",),
        False,
        "torch.backends.cudnn.benchmark = False (it picks kernels by timing, per process)",
    ),
    "cudnn.allow_tf32": (("cuda",), False, "torch.backends.cudnn.allow_tf32 = False"),
    "matmul.allow_tf32": (("cuda",), False, "torch.backends.cuda.matmul.allow_tf32 = False"),
    "matmul.fp16_reduced_precision_reduction": (
        ("cuda",),
        False,
        "torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False",
    ),
    "matmul.bf16_reduced_precision_reduction": (
        ("cuda",),
        False,
        "torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False",
    ),
    "env.CUBLAS_WORKSPACE_CONFIG": (
        ("cuda",),
        None,
        "CUBLAS_WORKSPACE_CONFIG=:4096:8 (cuBLAS is deterministic only with a fixed workspace)",
    ),
    "env.NCCL_ALGO": (
        ("cuda",),
        None,
        "NCCL_ALGO=Ring (and NCCL_PROTO=Simple): no algorithm chosen per run",
    ),
    "env.NCCL_PROTO": (("cuda",), None, "NCCL_PROTO=Simple"),
    "env.NCCL_NVLS_ENABLE": (
        ("cuda",),
        "0",
        "NCCL_NVLS_ENABLE=0 (NVLS reduces in switch hardware)",
    ),
    "env.FLASH_ATTENTION_DETERMINISTIC": (
        ("cuda",),
        "1",
        "FLASH_ATTENTION_DETERMINISTIC=1 (FlashAttention's backward uses atomics otherwise)",
    ),
    "env.TRITON_CACHE_AUTOTUNING": (
        ("cuda", "xpu"),
        "1",
        "TRITON_CACHE_AUTOTUNING=1 with a shared TRITON_CACHE_DIR: every process reuses one "
        "autotuning result",
    ),
    "inductor.max_autotune": (
        ("cuda", "xpu"),
        False,
        "torch._inductor.config.max_autotune = False (autotuning picks kernels by timing)",
    ),
    "inductor.coordinate_descent_tuning": (
        ("cuda", "xpu"),
        False,
        "torch._inductor.config.coordinate_descent_tuning = False",
    ),
    "env.HCCL_DETERMINISTIC": (("npu",), "true", "HCCL_DETERMINISTIC=true"),
    "npu.deterministic": (
        ("npu",),
        True,
        "torch.use_deterministic_algorithms(True) (torch_npu's deterministic mode)",
    ),
}
"""Every knob the rank records, with what makes it deterministic and how to set it."""


@dataclass(frozen=True)
class Finding:
    knob: str
    text: str


def _words(value: Any) -> str:
    return "unset" if value is None else repr(value)


def _needs_workspace(preflight: Mapping[str, Any]) -> bool:
    """cuBLAS is deterministic only with a fixed workspace from CUDA 10.2 on, and torch then
    requires CUBLAS_WORKSPACE_CONFIG once deterministic algorithms are on."""
    version = str(preflight.get("cuda_version") or "")
    try:
        major, minor = (int(x) for x in version.split(".")[:2])
    except ValueError:
        return False
    return bool(preflight.get("deterministic_algorithms")) and (major, minor) >= (10, 2)


def _allows_noise(knob: str, value: Any) -> bool:
    kinds, wanted, _ = KNOBS[knob]
    if wanted is None:
        return value is None
    if isinstance(wanted, str):
        return str(value).lower() != wanted
    return value is not None and bool(value) != wanted


def findings(
    preflights: Mapping[str, Optional[Mapping[str, Any]]], device_kind: str
) -> list[Finding]:
    """`preflights`: launch name -> what its rank 0 recorded (None: nothing recorded). The
    knobs that differ between launches first, then those that allow noise in all of them."""
    known = {name: p for name, p in preflights.items() if p}
    if not known:
        return []
    found: list[Finding] = []
    for knob, (_, _, fix) in KNOBS.items():
        values = {name: p.get(knob) for name, p in known.items()}
        if len({repr(v) for v in values.values()}) > 1:
            where = ", ".join(f"{_words(v)} in {name}" for name, v in values.items())
            found.append(
                Finding(
                    knob,
                    f"{knob} differs between the launches ({where}): set it "
                    f"the same in every launch; to be deterministic: {fix}",
                )
            )
    for knob, (kinds, _, fix) in KNOBS.items():
        if device_kind not in kinds or any(f.knob == knob for f in found):
            continue
        first = next(iter(known.values()))
        value = first.get(knob)
        if knob == "env.CUBLAS_WORKSPACE_CONFIG" and not _needs_workspace(first):
            continue
        if _allows_noise(knob, value):
            found.append(Finding(knob, f"{knob} is {_words(value)}: {fix}"))
    return found


@facts.fact("preflight")
@dataclass
class PreflightFacts:
    """The preflight findings of the launches a verdict compared, when it found noise."""

    findings: list[str] = field(default_factory=list)

    def lines(self, label: str) -> list[str]:
        if not self.findings:
            return []
        head = f"{label}: determinism preflight (what makes the same step compute differently):"
        return [head, *[f"  - {text}" for text in self.findings[:8]]]

    def summary(self, label: str) -> list[str]:
        return []


def preflight_of(runs: Mapping[str, dict[int, Signature]]) -> PreflightFacts:
    """The findings of these launches (name -> signatures), read from rank 0 of each."""
    recorded = {name: run[0].preflight if 0 in run else None for name, run in runs.items()}
    first = next((run[0] for run in runs.values() if 0 in run), None)
    kind = str(first.header.get("device", "cpu")) if first is not None else "cpu"
    return PreflightFacts([f.text for f in findings(recorded, kind)])
