"""interrupt="crash", killed inside a write (issue 43): which writes get a torn point, the
rank cutting the file to half its size before the kill, what a failed rank says in its
status (the call its exception came out of, the files it read), and the facts a failed
point's cause is read from. No torchrun."""

import json
import os
import threading

import pytest
import torch
from helpers import CRASH_ROOT as ROOT
from helpers import file_event as event

from pytest_resume_equiv.checks.after_crash import Row, after_crash, judge_after_crash
from pytest_resume_equiv.checks.crash_points import find_points, overwritten
from pytest_resume_equiv.errors import ResumeEquivError
from pytest_resume_equiv.launch.rank_exits import RankOutcome
from pytest_resume_equiv.launch.running import LaunchResult
from pytest_resume_equiv.rank import crasher as crash
from pytest_resume_equiv.rank.context import current
from pytest_resume_equiv.rank.crasher import Crasher
from pytest_resume_equiv.rank.run_dir import RankStatus, read_status, write_status
from pytest_resume_equiv.rank.wrapping import failure_of
from pytest_resume_equiv.signature import Signature


def saving_run(files):
    header = {"rank": 0, "world_size": 1, "phase": "uninterrupted", "splits": [2, 4]}
    return {0: Signature("rank-0.jsonl", header, [(s, {}) for s in range(1, 7)], True, files=files)}


# One file saved over at every save, beside a pointer written by rename
IN_PLACE = [
    event("torch.save", f"{ROOT}/ckpt.pt", after=2),
    event("open", f"{ROOT}/latest.tmp", after=2),
    event("os.replace", f"{ROOT}/latest.tmp", after=2, to=f"{ROOT}/latest"),
    event("torch.save", f"{ROOT}/ckpt.pt"),
    event("open", f"{ROOT}/latest.tmp"),
    event("os.replace", f"{ROOT}/latest.tmp", to=f"{ROOT}/latest"),
]


def test_a_write_over_a_file_an_earlier_save_left_is_torn_by_default():
    """ckpt.pt was there (step 2 wrote it); latest.tmp was renamed away, so it is new."""
    points = find_points(saving_run(IN_PLACE), 4, (2, 4), None, "/runs/u")
    torn = [p for p in points if p.kind == "torn"]
    assert [(p.name, p.index, p.overwrites) for p in torn] == [("torn", 0, 2)]
    assert torn[0].where("/runs/u") == "rank 0: inside torch.save(checkpoints/ckpt.pt), cut to half"
    assert [p.name for p in points][:2] == ["first", "torn"]  # at its event, after it
    every = find_points(saving_run(IN_PLACE), 4, (2, 4), "all", "/runs/u")
    assert [(p.name, p.index, p.overwrites) for p in every if p.kind == "torn"] == [
        ("torn", 0, 2),
        ("torn", 1, None),
    ]


def test_asking_for_torn_points_of_a_save_that_writes_nothing_in_place_is_an_error():
    atomic = [e for e in IN_PLACE if "ckpt.pt" not in e["path"]]
    with pytest.raises(ResumeEquivError, match=r"crash_points=\('torn',\): no such point"):
        find_points(saving_run(atomic), 4, (2, 4), ("torn",), "/runs/u")


def test_a_file_is_there_until_renamed_away_or_deleted_and_a_renamed_folder_brings_its_files():
    log = [
        event("torch.save", f"{ROOT}/tmp-step_2/model.pt", after=2),
        event("os.replace", f"{ROOT}/tmp-step_2", after=2, to=f"{ROOT}/step_2"),
        event("open", f"{ROOT}/marker", after=2),
        event("os.unlink", f"{ROOT}/marker", after=3),
        event("torch.save", f"{ROOT}/step_2/model.pt"),  # over the renamed folder's file
        event("torch.save", f"{ROOT}/tmp-step_2/model.pt"),  # its folder was renamed away
        event("open", f"{ROOT}/marker"),  # deleted since
        event("open", f"{ROOT}/step_2/model.pt"),  # written twice in the save: the first only
    ]
    assert overwritten(log, log[4:]) == {0: 2, 1: None, 2: None}
    gone = [*log[:2], event("shutil.rmtree", f"{ROOT}/step_2", after=3), log[4]]
    assert overwritten(gone, gone[3:]) == {0: None}


# --- the rank's side ------------------------------------------------------------------------


@pytest.fixture
def kills(monkeypatch):
    killed = []
    monkeypatch.setattr(crash, "_kill", killed.append)
    monkeypatch.setattr(crash, "read_pids", lambda run_dir: {0: 111, 1: 222})
    return killed


def torn_point(index=0):
    return {"rank": 0, "index": index, "kind": "torn", "split": 4}


def record(tmp_path):
    return json.loads((tmp_path / "status" / "crashed.json").read_text())


def test_a_file_a_saver_wrote_is_cut_to_half_its_size_then_every_rank_killed(kills, tmp_path):
    path = tmp_path / "ckpt.pt"
    path.write_bytes(b"x" * 3000)
    Crasher(torn_point(), 0, (2, 4), str(tmp_path)).on_event(event("torch.save", str(path)))
    assert path.stat().st_size == 1500 and len(kills) == 3
    assert record(tmp_path)["where"] == (
        "inside torch.save(ckpt.pt): cut to 1.5 KiB of 2.9 KiB, then killed"
    )
    assert record(tmp_path)["torn"] == {"path": str(path), "size": 1500, "of": 3000}


def test_a_file_opened_for_writing_is_cut_once_its_thread_goes_on_to_another_file(kills, tmp_path):
    path = tmp_path / "meta.json"
    crasher = Crasher(torn_point(), 0, (2, 4), str(tmp_path))
    crasher.on_event(event("open", str(path)))
    path.write_text('{"step": 4}')
    crasher.before_call({"op": "torch.save", "path": ""})  # into a stream with no name
    crasher.before_call({"op": "torch.save", "path": str(path)})  # into the open file
    assert kills == []
    crasher.before_call({"op": "os.fsync", "path": str(path)})  # its fsync: it was written
    assert path.read_text() == '{"ste' and len(kills) == 3
    kills.clear()
    again = Crasher(torn_point(), 0, (2, 4), str(tmp_path))
    again.on_event(event("open", str(path)))
    path.write_text('{"step": 4}')
    again.before_call({"op": "os.replace", "path": str(path)})  # renamed: it was written
    assert path.read_text() == '{"ste' and len(kills) == 3
    assert record(tmp_path)["where"].startswith("inside open(meta.json): cut to 5 B of 11 B")


def test_a_file_a_writer_thread_opened_is_cut_at_its_next_file_call_or_once_it_ended(
    kills, tmp_path, monkeypatch
):
    monkeypatch.setattr(crash, "HOLD_LIMIT", 5.0)
    path = tmp_path / "__0_0.distcp"
    crasher = Crasher({**torn_point(), "thread": "background"}, 0, (2, 4), str(tmp_path))

    def write():
        crasher.on_event(event("open", str(path), thread="writer"))
        path.write_bytes(b"y" * 100)

    writer = threading.Thread(target=write, name="writer")
    writer.start()
    writer.join()
    crasher.before_call({"op": "open", "path": str(tmp_path / "other")})  # the main thread's
    for _ in range(200):
        if kills:
            break
        threading.Event().wait(0.01)
    assert path.stat().st_size == 50 and len(kills) == 3  # once the writer ended


# --- what a failed rank says ----------------------------------------------------------------


@pytest.fixture
def rank_dir(in_rank):
    run_dir = in_rank(phase="resumed", split=2, steps=4)
    os.makedirs(run_dir, exist_ok=True)
    current().install()
    yield run_dir
    current().uninstall()


def raised(call, *args):
    with pytest.raises(Exception) as caught:
        call(*args)
    return failure_of(caught.value)


def test_an_exception_out_of_a_watched_call_says_which_call_and_the_files_read_are_kept(
    rank_dir,
):
    folder = os.path.join(rank_dir, "checkpoints")
    os.makedirs(os.path.join(folder, "step_4"))
    open(os.path.join(folder, "step_4", "model.pt"), "w").close()
    os.makedirs(os.path.join(folder, "tmp-step_4"))
    torch.save({"w": torch.ones(3)}, os.path.join(folder, "ckpt.pt"))
    with open(os.path.join(folder, "ckpt.pt"), "r+b") as f:
        f.truncate(100)
    real = os.path.realpath(folder)
    loaded = raised(torch.load, os.path.join(folder, "ckpt.pt"))
    assert loaded["op"] == "torch.load" and loaded["path"] == os.path.join(real, "ckpt.pt")
    assert loaded["error"].startswith("RuntimeError: PytorchStreamReader failed")
    replaced = raised(
        os.replace, os.path.join(folder, "tmp-step_4"), os.path.join(folder, "step_4")
    )
    assert {k: replaced[k] for k in ("op", "path", "to")} == {
        "op": "os.replace",
        "path": os.path.join(real, "tmp-step_4"),
        "to": os.path.join(real, "step_4"),
    }
    assert "Directory not empty" in replaced["error"]
    missing = raised(open, os.path.join(folder, "latest"))
    assert (missing["op"], missing["mode"]) == ("open", "r")
    assert raised(open, "/nonexistent/elsewhere") is None  # outside the run's folders
    assert current().files.reads == [os.path.join(real, "ckpt.pt")]  # torch.load opens it


def test_the_status_file_carries_the_failed_call_and_the_reads(tmp_path):
    call = {"op": "torch.load", "path": "/r/ckpt.pt", "error": "RuntimeError: torn"}
    write_status(str(tmp_path), 1, RankStatus("error", 1, "RuntimeError: torn", "", call, ["/r/a"]))
    assert read_status(str(tmp_path), 1) == RankStatus(
        "error", 1, "RuntimeError: torn", "", call, ["/r/a"]
    )


def trainer(ctx):
    pass


def test_a_failed_points_facts_come_from_the_crash_record_and_the_resumed_ranks_status(
    tmp_path,
):
    from plan_helpers import plan_for

    _, plan = plan_for(tmp_path, trainer, steps=6, split=[2, 4])
    spec = plan.launches[0].spec
    result = LaunchResult(spec, [1], False, 0.0, [RankOutcome(0, "none", "")], "rerun")
    crash_dir = tmp_path / "crash-1"
    (crash_dir / "checkpoints").mkdir(parents=True)
    (crash_dir / "checkpoints" / "ckpt.pt").write_bytes(b"z" * 10)
    mine = os.path.join(spec.run_dir, "checkpoints", "ckpt.pt")
    call = {"op": "torch.load", "path": mine, "error": "RuntimeError: torn", "after_step": None}
    status = RankStatus("error", 1, "RuntimeError: torn\nmore", "", call, [mine])
    write_status(spec.run_dir, 0, status)
    where = {"path": str(crash_dir / "checkpoints" / "ckpt.pt"), "size": 10, "of": 20}
    record = {"event": {"op": "torch.save"}, "torn": where}
    facts = after_crash(Row("torn", "rank 0: inside"), record, str(crash_dir), result, None, 2)
    assert facts.torn == {
        "path": "checkpoints/ckpt.pt",
        "size": 10,
        "of": 20,
        "op": "torch.save",
        "overwrites": 2,
    }
    assert facts.failed == {**call, "path": "checkpoints/ckpt.pt", "rank": 0}
    assert facts.read == ("checkpoints/ckpt.pt",) and facts.message == "RuntimeError: torn ..."
    assert facts.on_disk == ("checkpoints", "checkpoints/ckpt.pt")


def test_the_files_read_are_listed_while_another_thread_opens_more(tmp_path):
    """A background save thread opening files while the rank's status is written: reading
    the list never sees it change under it (it raised 'deque mutated during iteration')."""
    import sys
    import threading

    from pytest_resume_equiv.rank.files import FileLog

    log = FileLog()
    log.watch(str(tmp_path))
    stop = threading.Event()

    def opening() -> None:
        n = 0
        while not stop.is_set():
            log._opened_to_read.append(str(tmp_path / f"f{n % 50}"))
            n += 1

    # the threads trade the GIL every 10 us, not every 5 ms: many switches inside each read
    # (a direct iteration of the deque raised within a few reads), at a fraction of the time
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    thread = threading.Thread(target=opening)
    thread.start()
    try:
        for _ in range(300):
            assert len(log.reads) <= 50
    finally:
        stop.set()
        thread.join()
        sys.setswitchinterval(interval)


def test_a_resume_that_fails_right_after_reading_a_file_the_crash_left_empty_crashed_on_it(
    tmp_path,
):
    """A marker opened and not yet written: the trainer's own parser raises (which reads as a
    refusal) right after reading it. With a completed checkpoint there, the row names the
    empty file, not a lost checkpoint; with none, the refusal passes as before. The facts
    say where the kill came and what it left empty."""
    from plan_helpers import plan_for

    _, plan = plan_for(tmp_path, trainer, steps=6, split=[2, 4])
    spec = plan.launches[0].spec
    result = LaunchResult(spec, [1], False, 0.0, [RankOutcome(0, "none", "ValueError")], "rerun")
    marker = os.path.join(spec.run_dir, "checkpoints", "step")
    os.makedirs(os.path.dirname(marker))
    open(marker, "w").close()
    error = "ValueError: invalid literal for int() with base 10: ''"
    mine = 'File "/x/train.py", line 9, in find\n'
    write_status(spec.run_dir, 0, RankStatus("error", 1, error, mine, None, [marker]))
    reference = saving_run([])
    row = judge_after_crash(Row("last", "x"), result, reference, None, [2], None, "pass")
    assert (row.status, row.why) == (
        "failed",
        "crashed on the empty checkpoints/step (rank 0: ValueError)",
    )
    row = judge_after_crash(Row("last", "x"), result, reference, None, [], None, "pass")
    assert row.status == "refused"
    with open(marker, "w") as f:
        f.write("4")
    row = judge_after_crash(Row("last", "x"), result, reference, None, [2], None, "pass")
    assert row.why == f"refused (rank 0: {error}): lost the completed checkpoint of step 2"

    crash_dir = tmp_path / "crash-1"
    (crash_dir / "checkpoints" / "step_2").mkdir(parents=True)
    (crash_dir / "checkpoints" / "step").write_text("")
    opened = {"op": "open", "path": str(crash_dir / "checkpoints" / "step"), "after_step": 4}
    facts = after_crash(Row("last", "x"), {"event": opened}, str(crash_dir), result, None, 2)
    assert facts.killed_at == {
        "op": "open",
        "path": "checkpoints/step",
        "after_step": 4,
        "overwrites": 2,
    }
    assert facts.empty == ("checkpoints/step",)
