"""The determinism preflight: what a rank records (with fake device stacks, on CPU) and the
findings a report shows when it finds noise."""

import sys
import types

from pytest_resume_equiv.diagnose.preflight import findings
from pytest_resume_equiv.rank.preflight import capture


def test_a_rank_records_the_knobs_without_importing_a_device_stack(monkeypatch):
    import torch  # noqa: F401  (a trainer imported it: the knobs are read)

    monkeypatch.setenv("NCCL_ALGO", "Tree")
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    monkeypatch.delitem(sys.modules, "torch._inductor.config", raising=False)
    found = capture()
    assert found["env.NCCL_ALGO"] == "Tree" and found["env.CUBLAS_WORKSPACE_CONFIG"] is None
    assert found["deterministic_algorithms"] is False and found["cudnn.benchmark"] is False
    assert found["inductor.max_autotune"] is None  # Inductor not imported: not read
    assert "torch._inductor.config" not in sys.modules  # and not imported by the capture
    config = types.SimpleNamespace(max_autotune=True)
    monkeypatch.setitem(sys.modules, "torch._inductor.config", config)
    assert capture()["inductor.max_autotune"] is True


def test_a_fake_npu_stack_is_read_where_it_is_loaded(monkeypatch):
    import torch

    npu = types.SimpleNamespace(is_deterministic=lambda: True)
    monkeypatch.setattr(torch, "npu", npu, raising=False)
    monkeypatch.setenv("HCCL_DETERMINISTIC", "true")
    found = capture()
    assert found["npu.deterministic"] is True and found["env.HCCL_DETERMINISTIC"] == "true"


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


def test_the_cublas_workspace_is_named_where_torch_needs_it():
    on = {"deterministic_algorithms": True, "cuda_version": "12.4"}
    found = [f.knob for f in findings({"uninterrupted": on}, "cuda")]
    assert "env.CUBLAS_WORKSPACE_CONFIG" in found
    assert findings({"uninterrupted": on}, "cpu") == []  # nothing of it matters on CPU


def test_npu_knobs_on_npu():
    found = findings({"uninterrupted": {"env.HCCL_DETERMINISTIC": None}}, "npu")
    assert [f.knob for f in found] == ["env.HCCL_DETERMINISTIC"]
    assert "HCCL_DETERMINISTIC=true" in found[0].text
