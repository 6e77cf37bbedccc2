"""`python -m pytest_resume_equiv doctor --device cpu`: the whole command, for real, with gloo."""

import json
import subprocess
import sys

import pytest


@pytest.mark.long(40)
def test_doctor_on_cpu_runs_every_check_and_exits_0(tmp_path):
    path = tmp_path / "doctor.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest_resume_equiv", "doctor", "--device=cpu", f"--json={path}"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    for section in ("environment", "backends", "resume test", "determinism", "teardown"):
        assert f"\n{section}\n" in f"\n{out}"
    assert "resume tests can run on this machine" in out
    report = json.loads(path.read_text())
    assert (report["format"], report["blocked"], report["device"]) == (
        "pytest-resume-equiv/doctor",
        False,
        "cpu",
    )
    rows = {row["check"]: row for row in report["rows"]}
    assert [r for r in report["rows"] if r["status"] != "ok"] == []
    assert "sum 3 on every rank" in rows["gloo"]["seen"]
    assert rows["verdict"]["seen"].startswith("passed: 2 cpu ranks")
    streams = [check for check in rows if check.startswith("stream ")]
    # every stream the tiny trainer draws from, the one it owns included, was restored
    for name in ("rng:cpu", "rng:python", "rng:generator doctor/ranks.py"):
        assert any(s.startswith(f"stream {name}") for s in streams), streams
    assert "restored by torch.set_rng_state" in rows["stream rng:cpu"]["seen"]
    assert "bitwise equal" in rows["two runs"]["seen"]
    assert rows["first step"]["status"] == "ok"
    assert "forked the ranks of 3 launch(es)" in rows["fork server"]["seen"]
    assert rows["left running"]["seen"] == "nothing the doctor started is still running"
