"""The determinism preflight: what a rank records (on the real CPU torch, with fake device
stacks where the knob needs one) and the findings a report shows when it finds noise."""

import sys
import types

import pytest
import torch

import pytest_resume_equiv as req
from pytest_resume_equiv.compare.jsonable import from_json, to_json
from pytest_resume_equiv.diagnose.preflight import PRECISION, PreflightFacts, findings
from pytest_resume_equiv.rank.preflight import capture
from pytest_resume_equiv.rank.torch_compat import has_fp32_precision_api

NEW_API = has_fp32_precision_api()
needs_the_new_api = pytest.mark.skipif(not NEW_API, reason="the fp32_precision API is torch 2.9+")


@pytest.fixture
def new_tf32_api():
    """What transformers' `enable_tf32` does on torch >= 2.9: the `fp32_precision` API set;
    put back afterwards (the legacy reads raise while the two disagree)."""
    before = torch.backends.cuda.matmul.fp32_precision
    torch.backends.cuda.matmul.fp32_precision = "tf32"
    yield
    torch.backends.cuda.matmul.fp32_precision = before


@needs_the_new_api
def test_the_new_fp32_precision_api_is_read_and_no_read_raises(new_tf32_api):
    with pytest.raises(RuntimeError, match="mix of the legacy and new APIs"):
        torch.get_float32_matmul_precision()  # what torch 2.13 does to a legacy read
    found = capture()
    assert found["fp32_precision.matmul"] == "tf32"
    assert found["matmul.allow_tf32"] is None and found["float32_matmul_precision"] is None
    assert "mix of the legacy and new APIs" in found["unreadable"]["matmul.allow_tf32"]
    tf32 = [f.knob for f in findings({"uninterrupted": found}, "cuda") if f.role == PRECISION]
    assert "fp32_precision.matmul" in tf32 and "matmul.allow_tf32" not in tf32


@needs_the_new_api
def test_the_first_record_survives_the_new_fp32_precision_api(in_rank, new_tf32_api):
    in_rank()
    req.record(1, loss=1.0)  # the preflight runs here: it must not raise into the trainer


def test_a_rank_records_the_knobs_without_importing_a_device_stack(monkeypatch):
    monkeypatch.setenv("NCCL_ALGO", "Tree")
    monkeypatch.setenv("NVIDIA_TF32_OVERRIDE", "0")
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    monkeypatch.delitem(sys.modules, "torch._inductor.config", raising=False)
    found = capture()
    assert found["env.NCCL_ALGO"] == "Tree" and found["env.CUBLAS_WORKSPACE_CONFIG"] is None
    assert found["env.NVIDIA_TF32_OVERRIDE"] == "0"
    assert found["deterministic_algorithms"] is False and found["cudnn.benchmark"] is False
    assert found["torch_version"] == torch.__version__
    assert found["sdpa.flash"] is True and found["sdpa.mem_efficient"] is True
    # torch's default; an older torch has no such API: not read, and nothing raised
    assert found["fp32_precision.cudnn.conv"] == ("tf32" if NEW_API else None)
    assert found["inductor.max_autotune"] is None  # Inductor not imported: not read
    assert "torch._inductor.config" not in sys.modules  # and not imported by the capture
    config = types.SimpleNamespace(max_autotune=True, deterministic=False)
    monkeypatch.setitem(sys.modules, "torch._inductor.config", config)
    again = capture()
    assert again["inductor.max_autotune"] is True and again["inductor.deterministic"] is False


def test_the_npu_level_is_read_as_torch_npu_keeps_it(monkeypatch):
    """torch_npu has no `npu.is_deterministic`; its level is
    `torch_npu._C._npu_get_deterministic_level()` (torch_npu/npu/utils.py,
    `_get_deterministic_level`, which also sets it: the preflight reads without that)."""
    torch_npu = types.SimpleNamespace(
        _C=types.SimpleNamespace(_npu_get_deterministic_level=lambda: 0)
    )
    monkeypatch.setitem(sys.modules, "torch_npu", torch_npu)
    monkeypatch.setenv("HCCL_DETERMINISTIC", "strict")
    found = capture()
    assert found["npu.deterministic_level"] == 0 and found["env.HCCL_DETERMINISTIC"] == "strict"
    assert [f.knob for f in findings({"uninterrupted": found}, "npu")] == [
        "deterministic_algorithms",
        "npu.deterministic_level",
    ]  # HCCL_DETERMINISTIC=strict is deterministic


def test_settings_that_differ_between_launches_come_first_with_their_fix():
    base = {"cudnn.benchmark": False, "matmul.allow_tf32": True, "deterministic_algorithms": False}
    resumed = {**base, "cudnn.benchmark": True}
    found = findings({"uninterrupted": base, "resumed-split3": resumed}, "cuda")
    assert found[0].knob == "cudnn.benchmark"
    assert found[0].text.startswith(
        "cudnn.benchmark differs between the launches (False in uninterrupted, True in "
        "resumed-split3): set it the same in every launch"
    )
    knobs = [f.knob for f in found]
    assert "matmul.allow_tf32" in knobs and "deterministic_algorithms" in knobs
    assert "env.CUBLAS_WORKSPACE_CONFIG" not in knobs  # torch needs it only when deterministic


def test_the_cublas_workspace_is_advised_only_before_torch_2_10():
    """pytorch#161749 (torch 2.10) gives cuBLAS a fixed workspace under deterministic mode."""
    old = {"deterministic_algorithms": True, "cuda_version": "12.4", "torch_version": "2.9.1"}
    new = {**old, "torch_version": "2.13.0+cu128"}
    assert "env.CUBLAS_WORKSPACE_CONFIG" in [f.knob for f in findings({"u": old}, "cuda")]
    assert "env.CUBLAS_WORKSPACE_CONFIG" not in [f.knob for f in findings({"u": new}, "cuda")]
    assert findings({"uninterrupted": old}, "cpu") == []  # nothing of it matters on CPU


def test_reduced_precision_is_listed_apart_and_never_pushes_noise_out():
    """TF32 and reduced-precision reductions compute the same way in every run: no noise
    source. They come after the noise sources, in their own list."""
    tf32 = {
        "fp32_precision": "none",
        "fp32_precision.matmul": "tf32",
        "fp32_precision.cudnn": "tf32",
        "fp32_precision.cudnn.conv": "tf32",
        "fp32_precision.cudnn.rnn": "tf32",
        "matmul.fp16_reduced_precision_reduction": True,
        "matmul.bf16_reduced_precision_reduction": True,
        "env.NVIDIA_TF32_OVERRIDE": "1",
        "deterministic_algorithms": False,
        "cudnn.deterministic": False,
        "cudnn.benchmark": True,
        "inductor.deterministic": False,
        "inductor.max_autotune": True,
        "sdpa.flash": True,
    }
    found = findings({"uninterrupted": tf32, "resumed": {**tf32, "sdpa.flash": False}}, "cuda")
    roles = [f.role for f in found]
    assert roles == sorted(roles, key=lambda role: role == PRECISION)  # noise first
    noise = [f.knob for f in found if f.role != PRECISION]
    assert noise[0] == "sdpa.flash" and "inductor.deterministic" in noise
    assert "env.NCCL_ALGO" in noise and len(noise) > 8
    facts = PreflightFacts(
        [f.text for f in found if f.role != PRECISION],
        [f.text for f in found if f.role == PRECISION],
    )
    lines = facts.lines("resumed")
    assert len([line for line in lines if line.startswith("  - ")]) == 8 + min(
        8, len(facts.precision)
    )
    assert any("reduced precision (the same in every run" in line for line in lines)
    assert from_json(PreflightFacts, to_json(facts)) == facts


def test_npu_knobs_on_npu():
    found = findings({"uninterrupted": {"env.HCCL_DETERMINISTIC": None}}, "npu")
    assert [f.knob for f in found] == ["env.HCCL_DETERMINISTIC"]
    assert "HCCL_DETERMINISTIC=true" in found[0].text
    assert findings({"u": {"env.HCCL_DETERMINISTIC": "STRICT"}}, "npu") == []
