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
from typing import Any, Callable, Optional

from ..compare import facts
from ..signature import Signature

NOISE, PRECISION, CHOICE = "noise", "precision", "choice"
"""What a knob is: `noise` allows the same step to compute differently from run to run;
`precision` (TF32, reduced-precision reductions) computes with fewer bits, the same way in
every run, so it is no noise source and is listed apart; `choice` (which SDPA kernels may
run) matters only when the launches differ in it."""


@dataclass(frozen=True)
class Knob:
    kinds: tuple[str, ...]
    """The device kinds it matters on."""
    deterministic: Callable[[Any], Optional[bool]]
    """Whether a recorded value is deterministic (None: cannot tell, e.g. not read)."""
    fix: str
    role: str = NOISE


def _is(wanted: bool) -> Callable[[Any], Optional[bool]]:
    return lambda value: None if value is None else bool(value) == wanted


def _env(*accepted: str) -> Callable[[Any], Optional[bool]]:
    """An environment variable that is deterministic only set to one of `accepted`."""
    return lambda value: str(value).lower() in accepted


def _is_set(value: Any) -> Optional[bool]:
    return value is not None


def _no_tf32(value: Any) -> Optional[bool]:
    return None if value is None else str(value).lower() not in ("tf32", "bf16")


def _level(value: Any) -> Optional[bool]:
    return None if value is None else int(value) >= 1


def _choice(value: Any) -> Optional[bool]:
    return None


CUDA, ALL = ("cuda",), ("cuda", "npu", "xpu")
KNOBS: dict[str, Knob] = {
    "deterministic_algorithms": Knob(ALL, _is(True), "torch.use_deterministic_algorithms(True)"),
    "cudnn.deterministic": Knob(CUDA, _is(True), "torch.backends.cudnn.deterministic = True"),
    "cudnn.benchmark": Knob(
        CUDA,
        _is(False),
        "torch.backends.cudnn.benchmark = False (it picks kernels by timing, per process)",
    ),
    "env.CUBLAS_WORKSPACE_CONFIG": Knob(
        CUDA,
        _is_set,
        "CUBLAS_WORKSPACE_CONFIG=:4096:8 (before torch 2.10, cuBLAS is deterministic only "
        "with a fixed workspace)",
    ),
    "env.NCCL_ALGO": Knob(
        CUDA, _is_set, "NCCL_ALGO=Ring (and NCCL_PROTO=Simple): no algorithm chosen per run"
    ),
    "env.NCCL_PROTO": Knob(CUDA, _is_set, "NCCL_PROTO=Simple"),
    "env.NCCL_NVLS_ENABLE": Knob(
        CUDA, _env("0"), "NCCL_NVLS_ENABLE=0 (NVLS reduces in switch hardware)"
    ),
    "env.FLASH_ATTENTION_DETERMINISTIC": Knob(
        CUDA,
        _env("1"),
        "FLASH_ATTENTION_DETERMINISTIC=1 (FlashAttention's backward uses atomics otherwise)",
    ),
    "env.TRITON_CACHE_AUTOTUNING": Knob(
        ("cuda", "xpu"),
        _env("1"),
        "TRITON_CACHE_AUTOTUNING=1 with a shared TRITON_CACHE_DIR: every process reuses one "
        "autotuning result",
    ),
    "inductor.deterministic": Knob(
        ("cuda", "xpu"),
        _is(True),
        "torch._inductor.config.deterministic = True (no autotuning, no atomic reductions in "
        "generated kernels)",
    ),
    "inductor.max_autotune": Knob(
        ("cuda", "xpu"),
        _is(False),
        "torch._inductor.config.max_autotune = False (autotuning picks kernels by timing)",
    ),
    "inductor.max_autotune_gemm": Knob(
        ("cuda", "xpu"), _is(False), "torch._inductor.config.max_autotune_gemm = False"
    ),
    "inductor.coordinate_descent_tuning": Knob(
        ("cuda", "xpu"), _is(False), "torch._inductor.config.coordinate_descent_tuning = False"
    ),
    "env.HCCL_DETERMINISTIC": Knob(
        ("npu",), _env("true", "strict"), "HCCL_DETERMINISTIC=true (or strict)"
    ),
    "npu.deterministic_level": Knob(
        ("npu",),
        _level,
        "torch.use_deterministic_algorithms(True) (torch_npu's deterministic level >= 1)",
    ),
    # reduced precision: the same in every run, listed apart
    "fp32_precision": Knob(CUDA, _no_tf32, 'torch.backends.fp32_precision = "ieee"', PRECISION),
    "fp32_precision.matmul": Knob(
        CUDA, _no_tf32, 'torch.backends.cuda.matmul.fp32_precision = "ieee"', PRECISION
    ),
    "fp32_precision.cudnn": Knob(
        CUDA, _no_tf32, 'torch.backends.cudnn.fp32_precision = "ieee"', PRECISION
    ),
    "fp32_precision.cudnn.conv": Knob(
        CUDA, _no_tf32, 'torch.backends.cudnn.conv.fp32_precision = "ieee"', PRECISION
    ),
    "fp32_precision.cudnn.rnn": Knob(
        CUDA, _no_tf32, 'torch.backends.cudnn.rnn.fp32_precision = "ieee"', PRECISION
    ),
    "float32_matmul_precision": Knob(
        CUDA,
        lambda value: None if value is None else value == "highest",
        'torch.set_float32_matmul_precision("highest")',
        PRECISION,
    ),
    "cudnn.allow_tf32": Knob(
        CUDA, _is(False), "torch.backends.cudnn.allow_tf32 = False", PRECISION
    ),
    "matmul.allow_tf32": Knob(
        CUDA, _is(False), "torch.backends.cuda.matmul.allow_tf32 = False", PRECISION
    ),
    "matmul.fp16_reduced_precision_reduction": Knob(
        CUDA,
        _is(False),
        "torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False",
        PRECISION,
    ),
    "matmul.bf16_reduced_precision_reduction": Knob(
        CUDA,
        _is(False),
        "torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False",
        PRECISION,
    ),
    "env.NVIDIA_TF32_OVERRIDE": Knob(
        CUDA,
        lambda value: value is None or str(value) == "0",
        "NVIDIA_TF32_OVERRIDE=0, or unset (the driver's override of every TF32 setting)",
        PRECISION,
    ),
    # which SDPA kernels may run: only a difference between the launches matters
    "sdpa.flash": Knob(CUDA, _choice, "torch.backends.cuda.enable_flash_sdp(...)", CHOICE),
    "sdpa.mem_efficient": Knob(
        CUDA, _choice, "torch.backends.cuda.enable_mem_efficient_sdp(...)", CHOICE
    ),
    "sdpa.math": Knob(CUDA, _choice, "torch.backends.cuda.enable_math_sdp(...)", CHOICE),
    "sdpa.cudnn": Knob(CUDA, _choice, "torch.backends.cuda.enable_cudnn_sdp(...)", CHOICE),
}
"""Every knob the rank records (rank/preflight.py), with what makes it deterministic and how
to set it."""

LEGACY_PRECISION = ("float32_matmul_precision", "cudnn.allow_tf32", "matmul.allow_tf32")
"""The legacy TF32 flags: not listed when the `fp32_precision` API (torch >= 2.9) was read,
which says the same."""


@dataclass(frozen=True)
class Finding:
    knob: str
    text: str
    role: str = NOISE


def _words(value: Any) -> str:
    return "unset" if value is None else repr(value)


def _version(text: Any) -> tuple[int, ...]:
    parts = []
    for part in str(text or "").split("+")[0].split(".")[:2]:
        if not part.isdigit():
            return ()
        parts.append(int(part))
    return tuple(parts)


def _needs_workspace(preflight: Mapping[str, Any]) -> bool:
    """cuBLAS is deterministic only with a fixed workspace from CUDA 10.2 on, and torch
    before 2.10 then requires CUBLAS_WORKSPACE_CONFIG once deterministic algorithms are on;
    from torch 2.10 (pytorch#161749) torch gives cuBLAS a fixed workspace itself."""
    cuda = _version(preflight.get("cuda_version"))
    torch = _version(preflight.get("torch_version"))
    if not cuda or (torch and torch >= (2, 10)):
        return False
    return bool(preflight.get("deterministic_algorithms")) and cuda >= (10, 2)


def findings(
    preflights: Mapping[str, Optional[Mapping[str, Any]]], device_kind: str
) -> list[Finding]:
    """`preflights`: launch name -> what its rank 0 recorded (None: nothing recorded). The
    knobs that differ between launches first, then those that allow noise in all of them,
    then the reduced-precision ones (role PRECISION: deterministic, listed apart)."""
    known = {name: p for name, p in preflights.items() if p}
    if not known:
        return []
    found: list[Finding] = []
    for knob, spec in KNOBS.items():
        values = {name: p.get(knob) for name, p in known.items()}
        if len({repr(v) for v in values.values()}) > 1:
            where = ", ".join(f"{_words(v)} in {name}" for name, v in values.items())
            found.append(
                Finding(
                    knob,
                    f"{knob} differs between the launches ({where}): set it "
                    f"the same in every launch; to be deterministic: {spec.fix}",
                )
            )
    first = next(iter(known.values()))
    new_api = first.get("fp32_precision.matmul") is not None
    for role in (NOISE, PRECISION):
        for knob, spec in KNOBS.items():
            if spec.role != role or device_kind not in spec.kinds:
                continue
            if any(f.knob == knob for f in found):
                continue
            if knob == "env.CUBLAS_WORKSPACE_CONFIG" and not _needs_workspace(first):
                continue
            if new_api and knob in LEGACY_PRECISION:
                continue
            value = first.get(knob)
            if spec.deterministic(value) is False:
                found.append(Finding(knob, f"{knob} is {_words(value)}: {spec.fix}", role))
    return found


@facts.fact("preflight")
@dataclass
class PreflightFacts:
    """The preflight findings of the launches a verdict compared, when it found noise."""

    findings: list[str] = field(default_factory=list)
    precision: list[str] = field(default_factory=list)
    """Reduced precision (TF32, ...): the same in every run, so listed after the noise
    sources, never in their place."""

    def lines(self, label: str) -> list[str]:
        out = []
        if self.findings:
            head = f"{label}: determinism preflight (what makes the same step compute differently):"
            out += [head, *[f"  - {text}" for text in self.findings[:8]]]
        if self.precision:
            head = (
                f"{label}: reduced precision (the same in every run: changes the numbers, "
                "not whether a run repeats):"
            )
            out += [head, *[f"  - {text}" for text in self.precision[:8]]]
        return out

    def summary(self, label: str) -> list[str]:
        return []


def preflight_of(runs: Mapping[str, dict[int, Signature]]) -> PreflightFacts:
    """The findings of these launches (name -> signatures), read from rank 0 of each."""
    recorded = {name: run[0].preflight if 0 in run else None for name, run in runs.items()}
    first = next((run[0] for run in runs.values() if 0 in run), None)
    kind = str(first.header.get("device", "cpu")) if first is not None else "cpu"
    found = findings(recorded, kind)
    return PreflightFacts(
        [f.text for f in found if f.role != PRECISION],
        [f.text for f in found if f.role == PRECISION],
    )
