"""interrupt="crash" without torchrun: where the points are, what each outcome of the resumed
run is judged, the marker's keywords, the table's JSON, and the rank's side of the kill."""

import dataclasses
import json
import threading

import pytest
from helpers import CRASH_ROOT as ROOT
from helpers import file_event as event

from pytest_resume_equiv.checks import after_crash
from pytest_resume_equiv.checks.after_crash import Row, judge_after_crash
from pytest_resume_equiv.checks.base import Verdict
from pytest_resume_equiv.checks.crash_points import find_points, on_disk
from pytest_resume_equiv.checks.crash_table import CrashTable
from pytest_resume_equiv.compare.comparators import comparator_for
from pytest_resume_equiv.compare.jsonable import from_json, to_json
from pytest_resume_equiv.compare.tolerance import ComparisonRules
from pytest_resume_equiv.errors import ResumeEquivError, SettingError
from pytest_resume_equiv.launch.rank_exits import RankOutcome
from pytest_resume_equiv.launch.running import LaunchResult
from pytest_resume_equiv.marker import parse_marker
from pytest_resume_equiv.rank import crasher as crash
from pytest_resume_equiv.rank.crasher import Crasher, in_window
from pytest_resume_equiv.rank.encode import encode
from pytest_resume_equiv.rank.run_dir import RankStatus, write_status
from pytest_resume_equiv.signature import Signature

ATOMIC = [
    event("torch.save", f"{ROOT}/step_2/model.pt", after=2),  # the save before: not this one
    event("torch.save", f"{ROOT}/tmp-step_4/model.pt"),
    event("torch.save", f"{ROOT}/tmp-step_4/optim.pt"),
    event("open", f"{ROOT}/tmp-step_4/meta.json"),
    event("os.replace", f"{ROOT}/tmp-step_4", to=f"{ROOT}/step_4"),
    event("open", f"{ROOT}/latest.tmp"),
    event("os.replace", f"{ROOT}/latest.tmp", to=f"{ROOT}/latest"),
    event("open", "/runs/u/log.txt", after=5),  # after the next step: not the save's
]


def saving_run(files, steps=range(1, 7), world_size=1):
    header = {"rank": 0, "world_size": world_size, "phase": "uninterrupted", "splits": [2, 4]}
    return {0: Signature("rank-0.jsonl", header, [(s, {}) for s in steps], True, files=files)}


def names(points):
    return [(p.name, p.kind, p.index) for p in points]


def test_the_window_is_the_save_between_the_step_before_and_the_step_after():
    assert [in_window(e, 4, (2, 4)) for e in ATOMIC] == [False] + [True] * 6 + [False]
    # the step before saved too: its events are that save's
    assert not in_window(event("open", "x", after=3), 4, (3, 4))
    assert in_window(event("open", "x", after=None), 1, (1,))


def test_the_default_points_are_first_middle_last_returned_and_pointer_writes():
    points = find_points(saving_run(ATOMIC), 4, (2, 4), None, "/runs/u")
    assert names(points) == [
        ("first", "event", 0),
        ("middle", "event", 3),
        ("pointer", "written", 4),
        ("last, pointer", "event", 5),
        ("returned", "returned", 5),
    ]
    where = {p.name: p.where("/runs/u") for p in points}
    assert where["middle"] == (
        "rank 0: after os.replace(checkpoints/tmp-step_4 -> checkpoints/step_4)"
    )
    assert where["returned"] == "rank 0: after the save returned"
    assert where["pointer"] == "rank 0: after writing checkpoints/latest.tmp"
    assert [p.completes for p in points] == [False, False, False, False, True]
    assert points[0].to_context() == {
        "rank": 0,
        "index": 0,
        "thread": "main",
        "kind": "event",
        "split": 4,
        "foreign": [],
    }


def test_crash_points_limits_or_widens_the_set():
    run = saving_run(ATOMIC)
    assert names(find_points(run, 4, (2, 4), ("last",), "/runs/u")) == [("last", "event", 5)]
    every = find_points(run, 4, (2, 4), "all", "/runs/u")
    assert [p.name for p in every] == [  # inside each file's write too: a new one, not in place
        "event 0",
        "torn",
        "event 1",
        "torn",
        "event 2",
        "torn",
        "event 3",
        "event 4",
        "torn",
        "event 5",
        "returned",
    ]
    assert {p.overwrites for p in every} == {None}
    assert names(find_points(run, 4, (2, 4), (2,), "/runs/u")) == [("event 2", "event", 2)]
    with pytest.raises(ResumeEquivError, match="event 9 does not exist; the save at step 4 has 6"):
        find_points(run, 4, (2, 4), (9,), "/runs/u")


def test_a_save_with_no_file_event_is_a_clear_error():
    with pytest.raises(ResumeEquivError, match="logged no file event in its save at step 4"):
        find_points(saving_run(ATOMIC[:1]), 4, (2, 4), None, "/runs/u")


def test_a_save_that_goes_on_in_a_thread_has_not_completed_when_it_returns():
    files = [
        event("open", f"{ROOT}/step_4/meta.json"),
        event("open", f"{ROOT}/step_4/model.bin", thread="writer"),
    ]
    (returned,) = find_points(saving_run(files), 4, (2, 4), ("returned",), "/runs/u")
    assert (returned.index, returned.completes) == (0, False)


def test_what_a_crash_left_on_disk_is_listed_by_folder_with_sizes(tmp_path):
    (tmp_path / "checkpoints" / "step_2").mkdir(parents=True)
    (tmp_path / "checkpoints" / "step_2" / "model.pt").write_bytes(b"x" * 2048)
    (tmp_path / "checkpoints" / "latest").write_text("step_2")
    (tmp_path / "signatures").mkdir()
    (tmp_path / "signatures" / "rank-0.jsonl").write_text("{}")
    assert (
        on_disk(str(tmp_path)) == "checkpoints/{latest 6 B}, checkpoints/step_2/{model.pt 2.0 KiB}"
    )
    assert on_disk(str(tmp_path / "signatures" / "none")) == "nothing"


# --- what the resumed run did --------------------------------------------------------------

POINT = {"rng": {"cpu": "s"}, "watch": {"model.params": "w"}, "at": "first forward of Linear"}


def run_of(phase, steps, loss=lambda s: s / 2, point=None, split=4):
    header = {"rank": 0, "world_size": 1, "phase": phase, "splits": [2, 4]}
    recorded = [(s, {"loss": encode(loss(s), "loss")}) for s in steps]
    points = [] if point is None else [{**point, "split": split}]
    return {0: Signature("rank-0.jsonl", header, recorded, True, resume_points=points)}


REFERENCE = {
    0: Signature(
        "rank-0.jsonl",
        {"rank": 0, "world_size": 1, "phase": "uninterrupted", "splits": [2, 4]},
        [(s, {"loss": encode(s / 2, "loss")}) for s in range(1, 7)],
        True,
        resume_points=[{**POINT, "split": 2}, {**POINT, "split": 4}],
    )
}
COMPARATOR = comparator_for(ComparisonRules(steps=6))


def trainer(ctx):
    pass


def launch(tmp_path, ok=True, timed_out=False, detail=""):
    from plan_helpers import plan_for

    _, plan = plan_for(tmp_path, trainer, steps=6, split=[2, 4])
    spec = plan.launches[0].spec
    ranks = [RankOutcome(0, "ok" if ok else "none", detail)]
    return LaunchResult(spec, [0 if ok else 1], timed_out, 0.0, ranks, "rerun")


def judged(tmp_path, run, completed=(2,), refusal="pass", **result):
    row = Row("first", "rank 0: after torch.save(x)", status="pending")
    return judge_after_crash(
        row, launch(tmp_path, **result), REFERENCE, run, list(completed), COMPARATOR, refusal
    )


def test_a_resume_from_the_completed_checkpoint_that_matches_is_exact(tmp_path):
    row = judged(tmp_path, run_of("resumed", range(3, 7), point=POINT))
    assert (row.status, row.why, row.resumed_from) == ("exact", "exact (resumed from step 2)", 2)


def test_a_resume_from_a_mixed_checkpoint_is_caught_at_the_resume_point(tmp_path):
    mixed = {**POINT, "watch": {"model.params": "w-from-step-4"}}
    row = judged(tmp_path, run_of("resumed", range(3, 7), point=mixed))
    assert row.status == "failed"
    assert row.why.startswith("resumed from a torn or mixed checkpoint of step 2: the state")
    assert "watch:model.params" in row.why


def test_a_mixed_checkpoint_is_judged_beside_the_step_counters_it_loaded(tmp_path):
    """Recorded automatically, a resumed run logs the step counters its load restored: a
    finding about them is not the resume point's (it crashed the judge, reading one as the
    other). No snapshot at the resume point here: where the gate held, the state it judged
    equal wins over the counters (compare/loaded_step.py)."""
    reference = {
        0: dataclasses.replace(REFERENCE[0], counters={2: {"optimizer": 2}, 4: {"optimizer": 4}})
    }
    run = run_of("resumed", range(5, 7))
    run[0].loaded = {"split": 4, "counters": {"optimizer": 2}}
    row = judge_after_crash(
        Row("first", "rank 0: after torch.save(x)", status="pending"),
        launch(tmp_path),
        reference,
        run,
        [2, 4],
        COMPARATOR,
        "pass",
    )
    assert row.status == "failed", row.why
    assert row.why.startswith("resumed from step 4, then diverged"), row.why


def test_a_resume_earlier_than_the_completed_checkpoint_lost_it(tmp_path):
    row = judged(tmp_path, run_of("resumed", range(3, 7), point=POINT), completed=(2, 4))
    assert row.why == "resumed from step 2: lost the completed checkpoint of step 4"
    over = judged(tmp_path, run_of("resumed", range(1, 7), point=POINT))
    assert over.why == "started over from step 0: lost the completed checkpoint of step 2"


def test_starting_over_with_nothing_completed_is_a_refusal(tmp_path):
    row = judged(tmp_path, run_of("resumed", range(1, 7), point=POINT), completed=())
    assert (row.status, row.why) == ("refused", "started over from step 0")
    strict = judged(tmp_path, run_of("resumed", range(1, 7)), completed=(), refusal="fail")
    assert (strict.status, strict.why) == (
        "failed",
        'started over from step 0, and crash_refusal="fail"',
    )
    other = judged(tmp_path, run_of("resumed", range(1, 7), loss=lambda s: s), completed=())
    assert other.why == "started over from step 0, and differs from the uninterrupted run"


def test_a_deliberate_exit_is_a_refusal_and_a_library_error_a_crash(tmp_path):
    result = launch(tmp_path, ok=False)
    run_dir = result.spec.run_dir
    write_status(run_dir, 0, RankStatus("exit", 3, "checkpoint step_4 is incomplete"))
    row = judged(tmp_path, None, completed=(), ok=False)
    assert (row.status, row.why) == ("refused", "refused (rank 0: checkpoint step_4 is incomplete)")
    lost = judged(tmp_path, None, completed=(2,), ok=False)
    assert lost.why == (
        "refused (rank 0: checkpoint step_4 is incomplete): lost the completed checkpoint of step 2"
    )
    library = 'File "/venv/lib/python3.11/site-packages/torch/serialization.py", line 9, in load'
    write_status(run_dir, 0, RankStatus("error", 1, "EOFError: torn", f"{library}\n"))
    row = judged(tmp_path, None, completed=(), ok=False, detail="EOFError: torn")
    assert (row.status, row.why) == (
        "failed",
        "crashed on the torn checkpoint (rank 0: EOFError: torn)",
    )
    own = 'File "/work/train.py", line 40, in find_latest'
    write_status(run_dir, 0, RankStatus("error", 1, "RuntimeError: step_4 is torn", f"{own}\n"))
    assert judged(tmp_path, None, completed=(), ok=False).status == "refused"


def test_an_error_holding_every_ranks_traceback_reads_as_one_line(tmp_path):
    """DCP's CheckpointException, as a trial printed it: its text holds each rank's traceback."""
    gathered = "CheckpointException: CheckpointException ranks:dict_keys([0, 1])\n" + "".join(
        f"Traceback (most recent call last): (RANK {r})\n"
        '  File "/venv/site-packages/torch/distributed/checkpoint/utils.py", line 193\n'
        "    local_data = map_fun()\n"
        f"AssertionError: metadata is None; global metadata read failed: rank {r}\n"
        for r in (0, 1)
    )
    library = 'File "/venv/lib/python3.11/site-packages/torch/distributed/checkpoint/utils.py"'
    write_status(launch(tmp_path).spec.run_dir, 0, RankStatus("error", 1, gathered, library))
    row = judged(tmp_path, None, completed=(), ok=False, detail=gathered)
    assert row.why == (
        "crashed on the torn checkpoint (rank 0: CheckpointException: CheckpointException "
        "ranks:dict_keys([0, 1]) ... AssertionError: metadata is None; global metadata read "
        "failed: rank 1)"
    )
    assert (
        after_crash.one_line("x" * 400).endswith("...")
        and len(after_crash.one_line("x" * 400)) == 300
    )


def test_a_resumed_run_that_hangs_fails_with_where_it_was_stuck(tmp_path):
    row = judged(tmp_path, None, ok=False, timed_out=True, detail="stuck in train.py:9 in load")
    assert (row.status, row.why) == (
        "failed",
        "hung on the torn checkpoint (rank 0: stuck in train.py:9 in load)",
    )


def test_the_crash_table_reads_back_from_json():
    rows = [
        Row("first", "rank 0: after open(x)", "x 1 B", 2, "exact", "exact (resumed from step 2)")
    ]
    verdict = Verdict("crash", "passed", "crash at split 4", 4, facts=[CrashTable(4, rows)])
    again = from_json(Verdict, json.loads(json.dumps(to_json(verdict))))
    (table,) = again.facts
    assert table.rows == rows and to_json(table) == to_json(CrashTable(4, rows))
    assert table.lines("crash at split 4")[1:] == [
        "  first  rank 0: after open(x)",
        "         on disk: x 1 B",
        "         -> EXACT: exact (resumed from step 2)",
    ]


@pytest.mark.parametrize(
    "marker, message",
    [
        ({"crash_points": ["first", "sometime"]}, "invalid crash_points=['first', 'sometime']"),
        ({"crash_refusal": "maybe"}, "invalid crash_refusal='maybe': supported: 'pass', 'fail'"),
        ({"interrupt": "kill", "crash_points": "all"}, 'applies to interrupt="crash" only'),
        ({"resume_nproc": 1}, 'interrupt="crash" resumes on the topology that crashed'),
    ],
)
def test_the_crash_keywords_are_validated(marker, message):
    with pytest.raises(SettingError, match=message.replace("[", r"\[").replace("(", r"\(")):
        parse_marker((), {"steps": 6, "split": 4, "interrupt": "crash", **marker})
    ok = parse_marker((), {"steps": 6, "split": 4, "interrupt": "crash", "crash_points": [3]})
    assert ok.crash_points == (3,) and ok.crash_refusal == "pass"


# --- the rank's side ------------------------------------------------------------------------


@pytest.fixture
def kills(monkeypatch, tmp_path):
    killed = []
    monkeypatch.setattr(crash, "_kill", killed.append)
    monkeypatch.setattr(crash, "read_pids", lambda run_dir: {0: 111, 1: 222})
    return killed


def test_the_rank_kills_every_rank_after_the_event_at_its_index(kills, tmp_path, monkeypatch):
    monkeypatch.setattr(crash.os, "getpid", lambda: 111)
    point = {"rank": 0, "index": 1, "kind": "event", "split": 4}
    crasher = Crasher(point, 0, (2, 4), str(tmp_path))
    crasher.on_event(event("open", str(tmp_path / "early"), after=1))  # not the save's
    crasher.on_event(event("open", str(tmp_path / "a")))
    assert kills == []
    crasher.on_event(event("os.replace", str(tmp_path / "a"), to=str(tmp_path / "b")))
    assert kills == [222, 111]  # the others, then itself
    record = json.loads((tmp_path / "status" / "crashed.json").read_text())
    assert record["where"] == "after os.replace(a -> b)" and record["rank"] == 0
    other = Crasher(point, 1, (2, 4), str(tmp_path))
    for _ in range(3):
        other.on_event(event("open", str(tmp_path / "a")))
    assert kills == [222, 111]  # only the point's rank kills


def test_returned_kills_at_the_next_record_and_holds_background_writes(
    kills, tmp_path, monkeypatch
):
    held = []
    monkeypatch.setattr(crash, "_hold", lambda: held.append(threading.current_thread().name))
    monkeypatch.setattr(crash, "HOLD_LIMIT", 0.0)
    point = {"rank": 0, "index": 0, "kind": "returned", "split": 4}
    crasher = Crasher(point, 0, (4,), str(tmp_path))

    def background_write():
        writer = threading.Thread(
            target=crasher.on_event,
            args=(event("open", str(tmp_path / "w"), thread="w"),),
            name="w",
        )
        writer.start()
        writer.join()

    background_write()  # the training waits for it before its save: not held, let go
    assert held == [] and kills == []
    crasher.on_record(4)
    crasher.on_event(event("open", str(tmp_path / "meta.json")))  # index 0 of the main thread
    assert kills == []
    background_write()  # the training waits for the held write: killed all the same
    assert held == ["w"] and len(kills) == 3
    record = json.loads((tmp_path / "status" / "crashed.json").read_text())
    assert record["where"] == "after the save returned, while the training waited for its write"
    kills.clear()
    crasher.on_record(5)  # or it goes on to its next step
    assert kills[:2] == [111, 222] and len(kills) == 3  # then itself
    record = json.loads((tmp_path / "status" / "crashed.json").read_text())
    assert record["where"] == "after the save returned, at record(step=5)"


def test_the_returned_point_counts_only_the_main_threads_events():
    files = [
        event("open", f"{ROOT}/step_4/model.bin", thread="writer"),
        event("open", f"{ROOT}/latest.tmp"),
        event("open", f"{ROOT}/step_4/optim.bin", thread="writer"),
        event("os.replace", f"{ROOT}/latest.tmp", to=f"{ROOT}/latest"),
    ]
    (returned,) = find_points(saving_run(files), 4, (2, 4), ("returned",), "/runs/u")
    assert (returned.index, returned.event["op"], returned.completes) == (1, "os.replace", False)


def test_a_pointer_file_is_killed_at_once_written(kills, tmp_path):
    crasher = Crasher(
        {"rank": 0, "index": 0, "kind": "written", "split": 4}, 0, (4,), str(tmp_path)
    )
    crasher.on_event(event("open", str(tmp_path / "latest")))
    assert kills == []  # being written
    crasher.before_call()  # the next file call: it has been closed
    assert len(kills) == 3
    record = json.loads((tmp_path / "status" / "crashed.json").read_text())
    assert record["where"] == "after writing latest (closed, before the next file call)"


def test_a_background_write_of_the_save_counts_whichever_step_it_follows():
    """A trainer that saves before it records: the save's writer thread logs after step
    split-1; one still writing after the next step logs after split+1."""
    for after in (3, 5):
        files = [
            event("open", f"{ROOT}/step_4/meta.json"),
            event("open", f"{ROOT}/step_4/model.bin", after=after, thread="writer"),
        ]
        (returned,) = find_points(saving_run(files), 4, (2, 4), ("returned",), "/runs/u")
        assert not returned.completes, after


# DCP's async_save, as a trial logged it: the save of step 2 finishes in its writer thread
# during steps 3 and 4, before the save of step 4 begins; that one finishes during step 5
DCP = [
    event("torch.distributed.checkpoint.async_save", f"{ROOT}/step_2", after=2),
    event("open", f"{ROOT}/step_2/__0_0.distcp", after=3, thread="AsyncCheckpointExecutor_0"),
    event("os.fsync", f"{ROOT}/step_2/__0_0.distcp", after=3, thread="AsyncCheckpointExecutor_0"),
    event("os.rename", f"{ROOT}/step_2/.metadata.tmp", to=f"{ROOT}/step_2/.metadata", thread="A"),
    event("torch.distributed.checkpoint.async_save", f"{ROOT}/step_4"),
    event("open", f"{ROOT}/step_4/__0_0.distcp", thread="AsyncCheckpointExecutor_0"),
    event("open", f"{ROOT}/step_4/.metadata.tmp", after=5, thread="AsyncCheckpointExecutor_0"),
    event(
        "os.rename",
        f"{ROOT}/step_4/.metadata.tmp",
        to=f"{ROOT}/step_4/.metadata",
        after=5,
        thread="AsyncCheckpointExecutor_0",
    ),
]


def test_an_async_save_is_its_own_writes_not_the_tail_of_the_save_before():
    """Counted by the steps alone, the save at 4 began with step 2's writes (a crash there
    left no checkpoint, read as 'lost the completed checkpoint of step 2') and missed its own
    last ones (the .metadata that completes it, written after step 5)."""
    assert crash.save_events(DCP, 4, (2, 4), "/runs/u") == DCP[4:]
    assert (
        crash.save_events(DCP, 2, (2, 4), "/runs/u") == DCP[:4]
    )  # ends where the save at 4 begins
    points = find_points(saving_run(DCP), 4, (2, 4), None, "/runs/u")
    assert [(p.name, p.thread, p.index) for p in points] == [
        ("first", "main", 0),
        ("returned", "main", 0),
        ("middle", "background", 1),
        ("last", "background", 2),
    ]
    assert not any(p.completes for p in points)
    assert {p.foreign for p in points} == {("checkpoints/step_2",)}  # as the run dir names it


def test_a_save_wholly_in_a_thread_is_bounded_by_the_steps():
    files = [
        event("open", f"{ROOT}/step_2/model.bin", after=3, thread="w"),  # the save before
        event("open", f"{ROOT}/step_4/model.bin", thread="w"),
        event("open", f"{ROOT}/step_4/meta.json", after=5, thread="w"),  # after the next step
    ]
    # from the step before the split on: a write of the save before, logged after step 3,
    # cannot be told from one of this save begun before record(4); to the run's end
    assert crash.save_events(files, 4, (2, 4), "/runs/u") == files
    assert crash.save_events(files, 2, (2, 4), "/runs/u") == []  # it is the save at 4's, not both
    last = find_points(saving_run(files), 4, (2, 4), ("last",), "/runs/u")
    assert [(p.thread, p.index, p.foreign) for p in last] == [("background", 2, ())]


def test_a_background_point_counts_background_events_however_they_interleave(
    kills, tmp_path, monkeypatch
):
    monkeypatch.setattr(crash.os, "getpid", lambda: 111)
    point = {"rank": 0, "index": 1, "thread": "background", "kind": "event", "split": 4}
    # as find_points found it (a folder outside the run directory keeps its whole path)
    point["foreign"] = [f"{ROOT}/step_2"]
    crasher = Crasher(point, 0, (2, 4), str(tmp_path))
    log = [(e, e.get("thread")) for e in DCP]
    log.insert(6, (event("open", str(tmp_path / "metrics.json"), after=5), None))
    for e, _ in log[:6]:  # step 2's tail is not counted; step 4's first write is index 0
        crasher.on_event(e)
    assert kills == []
    crasher.on_event(log[6][0])  # a main-thread write after the save: no shift
    assert kills == []
    crasher.on_event(log[7][0])
    assert kills == [222, 111]
    record = json.loads((tmp_path / "status" / "crashed.json").read_text())
    assert record["where"].startswith("after open(") and ".metadata.tmp" in record["where"]


def test_a_thread_the_save_starts_before_its_first_main_thread_write_is_the_saves():
    """AsyncPointerFirst: the writer of step 4 runs before the main thread moves `latest`; it
    writes its own folder, not the save before's, so it is this save's and held at returned."""
    files = [
        event("torch.save", f"{ROOT}/step_2/model.pt", after=2, thread="w2"),
        event("open", f"{ROOT}/latest.tmp", after=2),
        event("os.replace", f"{ROOT}/latest.tmp", after=2, to=f"{ROOT}/latest"),
        event("torch.save", f"{ROOT}/step_2/optim.pt", after=2, thread="w2"),
        event("torch.save", f"{ROOT}/step_4/model.pt", thread="w4"),
        event("open", f"{ROOT}/latest.tmp"),
        event("os.replace", f"{ROOT}/latest.tmp", to=f"{ROOT}/latest"),
        event("torch.save", f"{ROOT}/step_4/optim.pt", thread="w4"),
    ]
    assert crash.save_events(files, 4, (2, 4), "/runs/u") == files[4:]
    (returned,) = find_points(saving_run(files), 4, (2, 4), ("returned",), "/runs/u")
    assert (returned.index, returned.foreign, returned.completes) == (
        1,
        ("checkpoints/step_2",),
        False,
    )
