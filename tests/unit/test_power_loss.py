"""crash_mode="power" (issue 43): the file-event log says what an fsync made durable and keeps
the file a rename replaces, and checks/power_loss.py rolls back, in a real folder, every
write a power loss at the end of the events undoes. Savers run here in-process under the
file-event log (no torchrun), killed after their k-th call."""

import contextlib
import os
import shutil

import pytest

from pytest_resume_equiv.checks.crash_points import find_points
from pytest_resume_equiv.checks.power_loss import (
    merged,
    roll_back,
    rolled_back_words,
    unsynced,
)
from pytest_resume_equiv.errors import SettingError
from pytest_resume_equiv.marker import parse_marker
from pytest_resume_equiv.rank.files import FileLog
from pytest_resume_equiv.signature import Signature


@contextlib.contextmanager
def file_log(run_dir):
    """The rank's file-event log on `run_dir`, as a power-loss crash launch has it."""
    log, events = FileLog(), []
    log.listeners.append(events.append)
    log.watch(str(run_dir))
    log.keep_into = str(run_dir / "status" / "replaced")
    log.install()
    try:
        yield log, events
    finally:
        log.uninstall()


def fsync_path(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write(path, text, sync):
    with open(path, "w") as f:
        f.write(text)
        if sync:
            f.flush()
            os.fsync(f.fileno())


def one_file(root, step, sync):
    """A temporary beside ckpt, os.replace'd onto it; `sync`: the file and the folder
    fsynced (the correct saver), else neither (renames without fsync)."""
    tmp, final = root / "ckpt.tmp", root / "ckpt"
    calls = [lambda: write(tmp, f"state of step {step}", sync), lambda: os.replace(tmp, final)]
    return calls + ([lambda: fsync_path(root)] if sync else [])


def run_saves(tmp_path, saver, kill_after, **kw):
    """The save at step 2 whole, then the first `kill_after` calls of the save at step 4;
    the power is lost there: what is left."""
    run_dir = tmp_path / "run"
    root = run_dir / "checkpoints"
    root.mkdir(parents=True)
    with file_log(run_dir) as (log, events):
        for step, calls in ((2, saver(root, 2, **kw)), (4, saver(root, 4, **kw)[:kill_after])):
            log.after_step = step
            for call in calls:
                call()
    return root, roll_back(unsynced(events), str(run_dir))


@pytest.mark.parametrize("kill_after", [0, 1, 2, 3])
def test_a_saver_that_fsyncs_the_file_and_the_folder_survives_every_point(tmp_path, kill_after):
    root, records = run_saves(tmp_path, one_file, kill_after, sync=True)
    assert (root / "ckpt").read_text() == f"state of step {4 if kill_after == 3 else 2}"
    assert not (root / "ckpt.tmp").exists()
    if kill_after == 2:  # renamed, the folder not yet fsynced: the step-2 file is back
        assert rolled_back_words(records) == (
            "checkpoints/ckpt.tmp removed (created at step 4; checkpoints not fsynced after), "
            "os.replace(checkpoints/ckpt.tmp -> checkpoints/ckpt) undone, the file it "
            "replaced back (at step 4; checkpoints not fsynced after)"
        )
    if kill_after == 3:
        assert records == [] and rolled_back_words(records).startswith("nothing")


@pytest.mark.parametrize("kill_after", [0, 1, 2])
def test_renames_without_fsync_leave_nothing_after_a_power_loss(tmp_path, kill_after):
    root, records = run_saves(tmp_path, one_file, kill_after, sync=False)
    assert os.listdir(root) == []
    first = records[0]
    assert first["kind"] == "create" and first["path"] == "checkpoints/ckpt.tmp"
    renamed = [r for r in records if r["kind"] == "rename"]
    assert renamed[0]["after_step"] == 2 and renamed[0]["now"] == "is gone"
    assert renamed[0]["dirs"] == ["checkpoints"]


def pointed_then_pruned(root, step):
    """Step folders written durably (files, folder and root fsynced), then `latest` renamed
    into place without an fsync of the root, then older folders deleted."""
    tmp, final = root / f"tmp-step_{step}", root / f"step_{step}"

    def folder():
        tmp.mkdir()
        write(tmp / "model", f"weights {step}", sync=True)
        fsync_path(tmp)

    def prune():
        for name in os.listdir(root):
            if name.startswith("step_") and name != final.name:
                shutil.rmtree(root / name)

    return [
        folder,
        lambda: os.replace(tmp, final),
        lambda: fsync_path(root),
        lambda: write(root / "latest.tmp", final.name, sync=True),
        lambda: os.replace(root / "latest.tmp", root / "latest"),
        prune,
    ]


def test_a_pointer_renamed_without_an_fsync_of_its_folder_names_the_previous_step_again(
    tmp_path,
):
    root, records = run_saves(tmp_path, pointed_then_pruned, 6)
    assert (root / "latest").read_text() == "step_2"  # the rename undone
    assert sorted(os.listdir(root)) == ["latest", "step_4"]  # step_2 deleted, for good
    assert (root / "step_4" / "model").read_text() == "weights 4"
    pointer = next(r for r in records if r["kind"] == "rename")
    assert pointer == {
        "kind": "rename",
        "op": "os.replace",
        "path": "checkpoints/latest.tmp",
        "to": "checkpoints/latest",
        "after_step": 4,
        "dirs": ["checkpoints"],
        "restored": True,
        "now": "reads 'step_2'",
    }


def test_a_file_is_cut_to_what_its_last_fsync_covered_and_a_name_needs_its_folder_fsynced(
    tmp_path,
):
    run_dir = tmp_path / "run"
    (run_dir / "ckpt" / "tmp").mkdir(parents=True)
    with file_log(run_dir) as (log, events):
        log.after_step = 3
        with open(run_dir / "ckpt" / "log.txt", "w") as f:
            f.write("0123456789")
            f.flush()
            os.fsync(f.fileno())
            f.write("abcdef")
        fsync_path(run_dir / "ckpt")
        write(run_dir / "ckpt" / "tmp" / "model", "weights", sync=True)
        os.replace(run_dir / "ckpt" / "tmp", run_dir / "ckpt" / "step_3")
        fsync_path(run_dir / "ckpt")  # the rename is durable; tmp/ never fsynced: model is not
    fsyncs = [e for e in events if e["op"] == "os.fsync"]
    assert [e.get("size", e.get("folder")) for e in fsyncs] == [10, True, 7, True]
    records = roll_back(unsynced(events), str(run_dir))
    assert (run_dir / "ckpt" / "log.txt").read_text() == "0123456789"
    assert os.listdir(run_dir / "ckpt" / "step_3") == []
    assert [record_kind(r) for r in records] == [
        ("create", "ckpt/tmp/model"),
        ("cut", "ckpt/log.txt"),
    ]
    assert rolled_back_words(records).endswith(
        "ckpt/log.txt cut to 10 B of 16 B (written at step 3; fsynced at that size)"
    )


def record_kind(record):
    return record["kind"], record["path"]


def test_the_events_of_several_ranks_are_read_in_the_order_they_happened():
    rank0 = [
        {"op": "open", "path": "/r/a", "time_ns": 1},
        {"op": "open", "path": "/r/c", "time_ns": 5},
    ]
    rank1 = [{"op": "open", "path": "/r/b", "time_ns": 3}]
    assert [e["path"] for e in merged([rank0, rank1])] == ["/r/a", "/r/b", "/r/c"]


def test_crash_mode_takes_kill_power_or_both_and_each_point_runs_once_per_mode():
    spec = parse_marker((), {"steps": 6, "split": [2, 4], "interrupt": "crash"})
    assert spec.crash_mode == ("kill",)
    both = parse_marker(
        (), {"steps": 6, "split": 4, "interrupt": "crash", "crash_mode": ["power", "kill"]}
    )
    assert both.crash_mode == ("kill", "power")
    for bad in ("flood", [], ["power", "power"]):
        with pytest.raises(SettingError, match="crash_mode"):
            parse_marker((), {"steps": 6, "split": 4, "interrupt": "crash", "crash_mode": bad})
    with pytest.raises(SettingError, match='crash_mode= applies to interrupt="crash" only'):
        parse_marker((), {"steps": 6, "split": 4, "crash_mode": "power"})
    root = "/runs/u/checkpoints"
    files = [
        {"op": "open", "path": f"{root}/ckpt.tmp", "after_step": 4},
        {"op": "os.replace", "path": f"{root}/ckpt.tmp", "to": f"{root}/ckpt", "after_step": 4},
    ]
    header = {"rank": 0, "world_size": 1, "phase": "uninterrupted", "splits": [4]}
    run = {0: Signature("rank-0.jsonl", header, [(s, {}) for s in range(1, 7)], True, files=files)}
    points = find_points(run, 4, (4,), ["first"], "/runs/u", ("kill", "power"))
    assert [(p.name, p.power) for p in points] == [("first", False), ("first (power)", True)]
    assert points[1].to_context()["power"] is True and "power" not in points[0].to_context()
