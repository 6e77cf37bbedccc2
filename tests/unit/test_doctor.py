"""The doctor's rows: every branch (cuda, npu, xpu against fake device modules) and every way
a row fails, each a clear row with a fix and never a traceback."""

import json
import os
import shutil
import subprocess
import sys
from types import ModuleType

import pytest
from fakes import GIB, importer
from helpers import hangs_after_destroy

import pytest_resume_equiv as req
from pytest_resume_equiv.__main__ import main
from pytest_resume_equiv.doctor import cli, determinism, environment, launches, leftovers, resume
from pytest_resume_equiv.doctor.ranks import FIRST_STEP_KEYS
from pytest_resume_equiv.doctor.rows import FAIL, OK, WARN, Row, table, to_json
from pytest_resume_equiv.launch.devices import (
    Device,
    DeviceLease,
    HostProbe,
    TorchBuild,
    count_here,
)
from pytest_resume_equiv.launch.targets import target_from_callable
from pytest_resume_equiv.rank.context import current
from pytest_resume_equiv.signature import Signature


def by_child(import_module):
    """The plugin's device count, its child asking the fake torch (as test_devices.py does)."""
    return HostProbe(
        build=lambda: TorchBuild(cuda=True, xpu=True, npu=True),
        gpus=lambda: None,
        child=lambda kind: count_here(kind, import_module),
    )


def pick(requested, nproc, import_module):
    return environment.pick(requested, nproc, by_child(import_module), import_module)


def statuses(rows):
    return {row.check: row.status for row in rows}


# environment ----------------------------------------------------------------------------


def test_versions_fail_when_torch_does_not_import():
    def no_torch(name):
        raise ImportError("No module named 'torch'")

    (row,) = environment.versions(no_torch)
    assert row.status == FAIL and "torch does not import" in row.seen
    assert row.fix.startswith("install torch")


def test_pick_every_kind_and_why():
    assert environment.pick("cpu", 2, HostProbe(build=pytest.fail)).device.kind == "cpu"
    cuda = pick("auto", 2, importer(cuda=2, npu=8))
    assert (cuda.device.kind, cuda.device.backend, cuda.fallback) == ("cuda", "nccl", False)
    assert "first accelerator found" in cuda.rows[0].seen
    npu = pick("npu", 4, importer(npu=8))
    assert (npu.device.backend, npu.rows[0].status) == ("hccl", OK)
    xpu = pick("xpu", 2, importer(xpu=2, xccl=False))
    assert statuses(xpu.rows) == {"device": OK, "xpu backend": WARN}


def test_pick_fails_without_the_device_and_falls_back_to_cpu():
    missing = pick("auto", 2, importer())
    assert missing.fallback and missing.device.kind == "cpu"
    (row,) = missing.rows
    assert row.status == FAIL and "no accelerator found" in row.seen
    assert "--resume-equiv-device=cpu" in row.fix
    cuda = pick("cuda", 2, importer(cuda=0)).rows[0]
    assert cuda.status == FAIL and "needs 2 cuda device(s), found 0" in cuda.seen


def test_pick_fails_with_too_few_devices():
    (row,) = pick("npu", 4, importer(npu=2)).rows
    assert row.status == FAIL and row.seen.startswith("needs 4 npu devices, found 2")
    assert "--nproc" in row.fix


def test_devices_name_each_one_and_its_free_memory():
    fake = importer(cuda=2)
    (row,) = environment.devices(
        Device("cuda", "nccl", 2), lambda kind: environment.device_facts(kind, fake)
    )
    assert row.status == OK
    assert row.seen == (
        "2 cuda devices: cuda:0 NVIDIA H100 #0 (80.0 of 80.0 GiB free); "
        "cuda:1 NVIDIA H100 #1 (80.0 of 80.0 GiB free)"
    )


def test_devices_that_do_not_answer_are_a_warning():
    (row,) = environment.devices(Device("xpu", "xccl", 2), lambda kind: [])
    assert row.status == WARN and "got no answer" in row.seen


def test_devices_warn_about_a_nearly_full_one():
    fake = importer(npu=2)
    fake("torch_npu")
    npu = fake.torch.npu
    npu.name, npu.free, npu.total = "Ascend910B", (60 * GIB, GIB // 4), 64 * GIB

    def registered(name):  # torch_npu imported once: its torch.npu stays the one set up here
        return ModuleType("torch_npu") if name == "torch_npu" else fake(name)

    (row,) = environment.devices(
        Device("npu", "hccl", 2), lambda kind: environment.device_facts(kind, registered)
    )
    assert row.status == WARN and "0.2 of 64.0 GiB free" in row.seen
    assert row.fix.startswith("npu:1 nearly full")


def test_leases_show_the_visible_device_sets(tmp_path):
    (row,) = environment.leases(Device("cuda", "nccl", 4), 2, {}, str(tmp_path))
    assert row.status == OK
    assert "CUDA_VISIBLE_DEVICES=0,1 | CUDA_VISIBLE_DEVICES=2,3" in row.seen
    (npu,) = environment.leases(
        Device("npu", "hccl", 2), 2, {"ASCEND_RT_VISIBLE_DEVICES": "4,5"}, str(tmp_path)
    )
    assert "ASCEND_RT_VISIBLE_DEVICES=4,5;" in npu.seen and "only those" in npu.seen
    (xpu,) = environment.leases(Device("xpu", "xccl", 3), 2, {}, str(tmp_path))
    assert (
        xpu.status == WARN and "ZE_AFFINITY_MASK=0,1;" in xpu.seen and "2 never leased" in xpu.seen
    )


def test_leases_warn_when_another_pytest_holds_the_devices(tmp_path):
    other = DeviceLease("cuda", ["0", "1"], str(tmp_path))
    assert other.try_acquire(2)
    try:
        (row,) = environment.leases(Device("cuda", "nccl", 2), 2, {}, str(tmp_path))
    finally:
        other.release()
    assert row.status == WARN and "another pytest holds their locks" in row.seen


def test_leases_fail_when_the_locks_cannot_be_taken(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    (row,) = environment.leases(Device("cuda", "nccl", 2), 2, {}, str(blocker / "leases"))
    assert row.status == FAIL and "cannot be taken" in row.seen and "writable" in row.fix


def test_backends_tried_per_kind():
    assert environment.backends_to_try(Device("cpu", "gloo", 0)) == ["gloo"]
    assert environment.backends_to_try(Device("cuda", "nccl", 2), importer(cuda=2)) == [
        "nccl",
        "gloo",
    ]
    assert environment.backends_to_try(Device("npu", "hccl", 2), importer(npu=2)) == [
        "hccl",
        "gloo",
    ]
    assert environment.backends_to_try(Device("xpu", "gloo", 2), importer(xpu=2)) == ["gloo"]


# launches: backends, teardown, fork server ----------------------------------------------


@pytest.mark.long(8)
def test_a_backend_that_does_not_initialise_is_a_failed_row(tmp_path):
    runner = launches.Launches(str(tmp_path), Device("cpu", "gloo", 0), 2, 60)
    # nccl on CPU tensors: "no NCCL built in" on a CPU build, no backend for cpu on a GPU one
    (row,) = launches.backend_rows(runner, ["nccl"])
    assert row.status == FAIL and row.check == "nccl"
    assert "failed before rank(s) 0, 1 had all-reduced: rank 0: error" in row.seen
    assert "NCCL_DEBUG=INFO" in row.fix
    launches.stop_fork_server()


@pytest.mark.long(8)
def test_a_rank_that_hangs_after_destroy_is_a_failed_teardown_row(tmp_path):
    runner = launches.Launches(str(tmp_path), Device("cpu", "gloo", 0), 2, 8)
    probe = target_from_callable(hangs_after_destroy)
    (backend,) = launches.backend_rows(runner, ["gloo"], probe)
    assert backend.status == OK, backend  # it came up and reduced: only its exit hangs
    (row,) = launches.teardown_rows(runner)
    assert row.status == FAIL, row
    assert row.seen.startswith("did not exit within the launch timeout (8s): backend-gloo rank 0")
    assert "after destroy_process_group" in row.seen and "hangs_after_destroy" in row.seen
    assert launches.fork_server_row(runner).status == OK
    launches.stop_fork_server()


def test_fork_server_rows():
    runner = launches.Launches("/nonexistent", Device("cpu", "gloo", 0), 2, 3)
    runner.done.append(launches.Ran("backend-gloo", None, error="the fork server did not answer"))
    row = launches.fork_server_row(runner)
    assert row.status == FAIL and "--resume-equiv-fork-server=off" in row.fix
    assert (
        launches.teardown_rows(launches.Launches("/x", Device("cpu", "gloo", 0), 2, 3))[0].status
        == FAIL
    )


def test_leftover_processes_are_a_failed_row():
    marker = leftovers.mark()
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE,
    )
    try:
        # running, not still in its exec: until then its /proc environ may read as empty
        # (seen on Python 3.13)
        assert child.stdout.readline() == b"up\n"
        row = cli.leftover_row(marker)
    finally:
        child.kill()
        child.wait()
        child.stdout.close()
    assert row.status == FAIL and f"pid {child.pid}" in row.seen
    assert cli.leftover_row(marker).status == OK


# resume test ----------------------------------------------------------------------------


def test_no_report_is_a_failed_row(tmp_path):
    (row,) = resume.rows_from_report(str(tmp_path / "none.json"), 4, "E   boom\n1 error")
    assert (
        row.status == FAIL
        and row.seen == "pytest ended with status 4 and no report: E   boom / 1 error"
    )


def test_a_failed_verdict_and_teeth_are_failed_rows(tmp_path):
    test = {
        "verdict": "failed",
        "ranks": 2,
        "device": "cuda",
        "steps": 4,
        "splits": [2],
        "runs": [
            {
                "launches": [{"name": "uninterrupted", "seconds": 1.0, "status": "ok"}],
                "failure": "split 2: first divergence at step 3, rank 1, key 'loss'",
                "teeth": {"status": "failed", "why": "mutating every RNG stream changed nothing"},
                "verdicts": [],
            }
        ],
    }
    path = tmp_path / "report.json"
    path.write_text(json.dumps({"tests": [test]}))
    rows = resume.rows_from_report(str(path), 1, "")
    assert statuses(rows) == {"verdict": FAIL, "teeth check": FAIL, "streams": FAIL}
    assert "first divergence at step 3, rank 1" in rows[0].seen


def _signature(path, points, restores=()):
    return Signature(
        str(path), {"rank": 0}, [], True, restores=list(restores), resume_points=points
    )


def test_a_stream_not_restored_is_a_failed_row():
    base = {0: _signature("u", [{"split": 2, "rng": {"cpu": "a", "cuda:0": "b"}, "watch": {}}])}
    resumed = {
        0: _signature(
            "r",
            [{"split": 2, "rng": {"cpu": "a", "cuda:0": "c"}, "watch": {}}],
            [{"what": "rng:cpu", "call": "torch.set_rng_state"}],
        )
    }
    states = resume._states(base, resumed, 2)
    assert states == {"rng:cpu": {0: (True, "torch.set_rng_state")}, "rng:cuda:0": {0: (False, "")}}


# determinism ----------------------------------------------------------------------------


@pytest.fixture
def write_run(in_rank, tmp_path):
    def write(name, loss=0.5, cold=1.0, warm=1.0, preflight=None):
        run_dir = tmp_path / name
        in_rank(phase="launch", run_dir=run_dir, steps=2)
        for step in (1, 2):
            extra = dict(zip(FIRST_STEP_KEYS, (cold, warm))) if step == 1 else {}
            req.record(step, loss=loss * step, **extra)
        current().close()
        return str(run_dir)

    return write


def _run(path):
    from pytest_resume_equiv.signature import read_run

    return read_run(path)


def test_two_runs_apart_is_a_warning_with_how_far(write_run):
    first, second = _run(write_run("a")), _run(write_run("b", loss=0.5000001))
    ran = launches.Ran("repeat-2", None)
    row = determinism._repeat_row(first, second, ran)
    assert row.status == WARN and "loss relative 2e-07" in row.seen
    assert determinism._repeat_row(first, first, ran).status == OK


def test_a_first_step_that_differs_in_a_fresh_process_is_a_warning(write_run):
    row = determinism._first_step_row(_run(write_run("a", cold=1.0, warm=1.0000001)))
    assert row.status == WARN and "rank 0: relative 1e-07" in row.seen
    assert "cudnn.benchmark = False" in row.fix


def test_preflight_settings_are_warnings_with_their_fix(write_run):
    first = _run(write_run("a"))
    first[0].preflight = {"cudnn.benchmark": True, "deterministic_algorithms": False}
    rows = determinism._preflight_rows(first, first, "cuda")
    by_check = {row.check: row for row in rows}
    assert by_check["preflight cudnn.benchmark"].seen == "cudnn.benchmark is True"
    assert by_check["preflight cudnn.benchmark"].fix.startswith(
        "torch.backends.cudnn.benchmark = False"
    )
    assert all(row.status == WARN for row in rows)
    assert determinism._preflight_rows(first, first, "cpu")[0].status == OK


def test_a_trainer_that_cannot_run_is_a_failed_row():
    rows = determinism.rows(
        [launches.Ran("repeat-1", None, error="no devices"), launches.Ran("repeat-2", None)], "cuda"
    )
    assert statuses(rows) == {"two runs": FAIL}
    assert "repeat-1 could not start: no devices" in rows[0].seen


# the command ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["doctor", "--nproc", "0"],
        ["doctor", "--device", "tpu"],
        ["doctor", "--timeout", "soon"],
        ["doctor", "--json", "/nonexistent/dir/doctor.json"],
        ["doctor", "--bogus"],
    ],
)
def test_bad_arguments_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as exit:
        main(argv)
    assert exit.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_a_failed_row_exits_1_and_the_json_says_why(monkeypatch, tmp_path, capsys):
    rows = [
        Row("environment", "device", FAIL, "needs 2 cuda devices, found 1", "--nproc 1"),
        Row("teardown", "left running", OK, "nothing"),
    ]
    monkeypatch.setattr(cli, "examine", lambda *args: (rows, {"device": "cpu"}))
    path = tmp_path / "doctor.json"
    assert main(["doctor", "--device", "cuda", "--json", str(path)]) == 1
    out = capsys.readouterr().out
    assert "  fail device" in out and "fix: --nproc 1" in out
    assert "resume tests are blocked on this machine: 1 ok, 0 warn, 1 fail" in out
    data = json.loads(path.read_text())
    assert data["blocked"] is True and data["rows"][0]["status"] == FAIL
    assert os.path.isdir(data["kept"])
    shutil.rmtree(data["kept"])


def test_table_and_json_of_good_rows():
    rows = [
        Row("backends", "gloo", OK, "came up"),
        Row("determinism", "two runs", WARN, "apart", "set it"),
    ]
    text = table(rows, width=80)
    assert text.splitlines()[0] == "backends"
    assert "resume tests can run on this machine: 1 ok, 1 warn, 0 fail" in text
    assert to_json(rows, {})["blocked"] is False


@pytest.mark.long(10)
def test_the_cuda_branch_against_a_fake_torch_cuda(tmp_path):
    """With a fake torch.cuda of 2 devices the environment rows say cuda; nccl, which this
    CPU machine cannot bring up on them, is a failed row with its fix, and what depends on it
    is not run: exit 1, no traceback."""
    fake = importer(cuda=2)
    fake.torch.cuda.name = "NVIDIA H200"
    seams = cli.Seams(
        import_module=fake,
        host_probe=by_child(fake),
        device_query=lambda kind: environment.device_facts(kind, fake),
        environ={},
        lock_dir=str(tmp_path / "locks"),
        resume_test=lambda *args: pytest.fail("must not run on a backend that failed"),
    )
    rows, facts = cli.examine("auto", 2, 60, str(tmp_path / "work"), seams)
    got = statuses(rows)
    assert (facts["device"], facts["backend"], facts["devices"]) == ("cuda", "nccl", 2)
    assert got["device"] == got["devices"] == got["leases"] == OK
    assert got["nccl"] == FAIL and got["gloo"] == OK
    assert got["verdict"] == FAIL and got["two runs"] == FAIL
    assert got["left running"] == OK
    assert "NVIDIA H200 #1" in next(r.seen for r in rows if r.check == "devices")
