"""crash_mode="preempt" without torchrun: the marker's keywords, the points, the handler's save
read from hand-made file events, the steps that count as completed, and the watchdog that
keeps the grace (real, short-lived processes: each ends within the test)."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from helpers import CRASH_ROOT as ROOT
from helpers import file_event
from test_crash_points import (
    ATOMIC,
    COMPARATOR,
    POINT,
    REFERENCE,
    launch,
    run_of,
    saving_run,
    trainer,
)

from pytest_resume_equiv.checks.after_crash import Row, judge_after_crash, read_crash_record
from pytest_resume_equiv.checks.crash_points import find_points
from pytest_resume_equiv.checks.preemption import Preempted, event_key, preempted
from pytest_resume_equiv.checks.preemption import preempt_steps as _preempt_steps
from pytest_resume_equiv.errors import ResumeEquivError, SettingError
from pytest_resume_equiv.marker import CRASH_GRACE, parse_marker
from pytest_resume_equiv.rank import crasher as crasher_module
from pytest_resume_equiv.rank import grace
from pytest_resume_equiv.rank.crasher import Crasher
from pytest_resume_equiv.rank.run_dir import crash_record_path

RUN = "/runs/u"


def event(op, path, after=4, to=None, time_ns=0):
    return {**file_event(op, path, after, to), "time_ns": time_ns}


# --- the marker ------------------------------------------------------------------------------


def marker(**kwargs):
    return parse_marker((6, [2, 4]), {"interrupt": "crash", **kwargs})


def test_preempt_is_a_crash_mode_alone_or_beside_the_others():
    assert marker(crash_mode="preempt").crash_mode == ("preempt",)
    both = marker(crash_mode=["preempt", "kill"])
    assert (both.crash_mode, both.crash_grace) == (("kill", "preempt"), CRASH_GRACE)
    assert marker(crash_mode="preempt", crash_grace=30).crash_grace == 30.0


@pytest.mark.parametrize("value", [0, -1, "soon", True, float("inf"), None])
def test_a_grace_that_is_no_positive_number_of_seconds_is_refused(value):
    with pytest.raises(SettingError) as error:
        marker(crash_mode="preempt", crash_grace=value)
    message = str(error.value)
    assert f"invalid crash_grace={value!r}: expected a positive number of seconds" in message
    assert "Slurm's KillWait, Kubernetes' terminationGracePeriodSeconds" in message


def test_a_grace_without_a_preemption_is_refused():
    with pytest.raises(SettingError, match=r"crash_grace=1\.0: applies to crash_mode=\"preempt\""):
        marker(crash_grace=1.0)
    with pytest.raises(SettingError, match='crash_grace= applies to interrupt="crash" only'):
        parse_marker((6, 3), {"crash_grace": 1.0})
    with pytest.raises(SettingError, match="'kill', 'power', 'preempt', or a list of them"):
        marker(crash_mode="sigterm")


# --- the points ------------------------------------------------------------------------------


def test_preempt_points_are_the_save_events_and_inside_the_next_step():
    points = find_points(saving_run(ATOMIC), 4, (2, 4), None, RUN, ("preempt",), grace=1.5)
    assert [(p.name, p.kind) for p in points] == [
        ("first (preempt)", "event"),
        ("middle (preempt)", "event"),
        ("pointer (preempt)", "written"),
        ("last, pointer (preempt)", "event"),
        ("step (preempt)", "step"),
    ]
    assert all(p.to_context()["preempt"] == 1.5 for p in points)
    step = points[-1]
    assert step.where(RUN) == "rank 0: SIGTERM inside step 5, before its optimizer step"
    assert step.completes
    assert (
        points[0].where(RUN) == "rank 0: SIGTERM after torch.save(checkpoints/tmp-step_4/model.pt)"
    )


def test_a_kill_has_no_step_point_and_a_sigterm_no_torn_or_returned_one():
    kill = find_points(saving_run(ATOMIC), 4, (2, 4), ["step", "last"], RUN, ("kill", "preempt"))
    assert [p.name for p in kill] == ["last", "last (preempt)", "step (preempt)"]
    with pytest.raises(ResumeEquivError, match="no point of crash_mode=\\['kill'\\]"):
        find_points(saving_run(ATOMIC), 4, (2, 4), ["step"], RUN, ("kill",))
    with pytest.raises(ResumeEquivError, match='has no "returned" or "torn" point'):
        find_points(saving_run(ATOMIC), 4, (2, 4), ["returned"], RUN, ("preempt",))


# --- what the SIGTERM did ----------------------------------------------------------------------

RECORD = {"rank": 0, "time_ns": 100, "preempt": {"grace": 2.0, "sigterm": "handler"}}


def rest_of(events):
    return [event_key(e, RUN) for e in events]


def test_the_rest_of_the_split_save_is_not_the_handlers_save():
    """SIGTERM at the save's first event: the trainer finishes that save, then saves nothing."""
    log = [
        event("torch.save", f"{ROOT}/tmp-step_4/model.pt", time_ns=50),
        event("torch.save", f"{ROOT}/tmp-step_4/optim.pt", time_ns=150),
        event("os.replace", f"{ROOT}/tmp-step_4", to=f"{ROOT}/step_4", time_ns=160),
    ]
    found = preempted(
        {**RECORD, "preempt": {**RECORD["preempt"], "after_step": 4}},
        {"grace": 2.0, "killed": [], "exited_s": 0.31},
        {0: log},
        rest_of(log[1:]),
        0,
        RUN,
    )
    assert (found.saved, found.finished_save, found.completed_save) == ([], True, False)
    assert (
        found.words()
        == "every rank exited within the grace (0.31 s), the handler saved nothing more"
    )


def test_the_handlers_save_at_the_step_boundary_holds_the_step_it_followed():
    log = [
        event("torch.save", f"{ROOT}/tmp-step_5/model.pt", after=5, time_ns=200),
        event("os.replace", f"{ROOT}/tmp-step_5", after=5, to=f"{ROOT}/step_5", time_ns=210),
    ]
    said = {**RECORD["preempt"], "after_step": 4, "inside_step": True}
    found = preempted(
        {**RECORD, "preempt": said}, {"killed": [], "exited_s": 0.2}, {0: log}, [], 0, RUN
    )
    assert (found.saved_step, found.mid_step, found.completed_save) == (5, False, True)
    assert found.saved == [
        "torch.save(checkpoints/tmp-step_5/model.pt)",
        "os.replace(checkpoints/tmp-step_5 -> checkpoints/step_5)",
    ]
    assert found.words().endswith("the handler saved step 5")
    assert _preempt_steps(found, [2, 4], 4) == ([2, 4, 5], (5,))


def test_a_save_inside_the_step_holds_the_step_before():
    log = [event("torch.save", f"{ROOT}/tmp-step_5/model.pt", after=4, time_ns=200)]
    said = {**RECORD["preempt"], "after_step": 4, "inside_step": True}
    found = preempted(
        {**RECORD, "preempt": said}, {"killed": [], "exited_s": 0.1}, {0: log}, [], 0, RUN
    )
    assert (found.saved_step, found.mid_step, found.completed_save) == (4, True, False)
    assert "the handler saved inside step 5 (after its backward, before its optimizer step" in (
        found.words()
    )
    assert _preempt_steps(found, [2, 4], 4) == ([2, 4], (4, 5))


def test_a_rank_still_running_at_the_end_of_the_grace_is_named_with_its_last_event(tmp_path):
    log = [event("torch.save", f"{ROOT}/model.pt", after=5, time_ns=200)]
    found = preempted(RECORD, {"grace": 2.0, "killed": [0]}, {0: log}, [], 0, str(tmp_path))
    assert found.killed == [0] and not found.completed_save
    assert found.last == {0: "torch.save(/runs/u/checkpoints/model.pt)"}
    assert found.words().startswith("still running after the 2 s grace: killed (rank 0 last after")
    assert found.words().endswith("its save of step 5 had begun (1 write after the SIGTERM)")
    bare = Preempted(2.0, "default", 4, False)
    assert bare.words() == "no SIGTERM handler: the ranks died of it, as of a kill"


def test_a_resume_from_the_step_a_handler_saved_inside_is_judged_not_refused(tmp_path):
    """The checkpoint the handler labelled step 5 is judged from step 5 on, not dismissed as
    a step where no checkpoint was saved."""
    run = run_of("resumed", range(6, 7), point=POINT, split=5)

    def judged(saved=()):
        row = Row("step", "x", status="pending")
        return judge_after_crash(
            row, launch(tmp_path), REFERENCE, run, [2, 4], COMPARATOR, "pass", saved=saved
        )

    row = judged(saved=(4, 5))
    assert row.resumed_from == 5 and "where no checkpoint was saved" not in row.why, row.why
    assert judged().why == "resumed from step 5, where no checkpoint was saved"


def test_a_run_that_finished_before_the_sigterm_took_effect_has_nothing_left_to_resume(
    tmp_path,
):
    """The preempted launch recorded through step 6 and its handler's save holds step 6: a
    restarted job that records nothing is right. Without that evidence it is a failure, and a
    restarted job that trains again from an older checkpoint lost the one of step 6."""

    def judge(run, finished, completed=(2, 4, 6)):
        row = Row("step", "x", status="pending")
        return judge_after_crash(
            row,
            launch(tmp_path),
            REFERENCE,
            run,
            list(completed),
            COMPARATOR,
            "pass",
            (6,),
            finished,
        )

    row = judge(None, 6)
    assert (row.status, row.resumed_from) == ("exact", 6)
    assert row.why == (
        "exact (the run had finished before the SIGTERM took effect: its save holds step 6, "
        "nothing left to resume)"
    )
    assert judge({}, 6).status == "exact"
    assert judge(None, None).why == "recorded no step after the crash"
    assert judge(None, 6, completed=(2, 4)).why == "recorded no step after the crash"
    again = judge(run_of("resumed", range(5, 7), point=POINT), 6)
    assert again.why == "resumed from step 4: lost the completed checkpoint of step 6"


def test_only_a_launch_that_recorded_the_last_step_on_every_rank_had_finished(tmp_path):
    """`recorded_through`: the last step every rank of the preempted launch recorded."""
    from plan_helpers import plan_for, write_run

    from pytest_resume_equiv.checks.crash_points import CrashPoint
    from pytest_resume_equiv.checks.preemption import preempt_point
    from pytest_resume_equiv.launch.running import LaunchResult, RankOutcome
    from pytest_resume_equiv.rank.run_dir import signature_path

    _, plan = plan_for(tmp_path, trainer, steps=6, split=[2, 4], nproc=2)
    spec = plan.launches[0].spec
    ranks = [RankOutcome(r, "ok", "") for r in (0, 1)]
    result = LaunchResult(spec, [0, 0], False, 0.0, ranks, "")
    point = CrashPoint("step", 0, 0, "main", "step", 4, (), {}, True, preempt=1.0)

    def through():
        found = preempt_point(point, RECORD, result, {}, str(tmp_path), (2, 4))
        return found.recorded_through

    write_run(spec.run_dir, range(1, 7), world_size=2)
    assert through() == 6
    write_run(spec.run_dir, range(1, 6), world_size=1)  # rank 0 stopped at step 5
    assert through() == 5
    os.remove(signature_path(spec.run_dir, 1))  # rank 1 left no signature
    assert through() is None


# --- the rank's side and the watchdog --------------------------------------------------------


def test_the_step_point_fires_once_before_the_first_optimizer_step_after_the_split(
    tmp_path, monkeypatch
):
    fired = []
    point = {"rank": 0, "index": 0, "kind": "step", "split": 4, "preempt": 1.0}
    crasher = Crasher(point, 0, (2, 4), str(tmp_path))
    monkeypatch.setattr(crasher, "kill", lambda where, event, **kw: fired.append((where, kw)))
    crasher.on_record(3)
    crasher.before_optimizer_step()
    assert fired == []
    crasher.on_record(4)
    crasher.on_event(event("torch.save", str(tmp_path / "model.pt")))  # the save: no point
    assert fired == []
    crasher.before_optimizer_step()
    kw = {"inside": True, "step": 5, "closure": False}
    assert fired == [("inside step 5, before its optimizer step", kw)]


def steps_with_a_closure(crasher, steps, record_in_closure=True, closure=True, now=None):
    """A real torch loop whose optimizer steps call the crasher's hooks, as in a rank. The
    closure's forward records the step before, as automatic recording does at a step's first
    forward (inside `opt.step(closure)`); or each step is recorded at its end. `now["step"]`:
    the step the loop is in."""
    import torch
    from torch.optim import optimizer as hooks

    model = torch.nn.Linear(2, 1)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    handles = []

    class Global:  # torch's global step hooks, removed when the loop is done
        def __getattr__(self, name):
            return lambda hook: handles.append(getattr(hooks, name)(hook))

    crasher.hook_steps(Global())
    try:
        for step in steps:
            (now if now is not None else {})["step"] = step

            def forward_backward(step=step):
                if record_in_closure and step > 1:
                    crasher.on_record(step - 1)
                opt.zero_grad()
                loss = model(torch.ones(3, 2)).pow(2).mean()
                loss.backward()
                return loss

            if closure:
                opt.step(forward_backward)
            else:
                forward_backward()
                opt.step()
            if not record_in_closure:
                crasher.on_record(step)
    finally:
        for handle in handles:
            handle.remove()


CLOSURE_WHERE = (
    "inside step 5, at the start of its optimizer step (before the closure it was given runs "
    "the step's forward and backward)"
)


@pytest.mark.parametrize(
    "record_in_closure", [True, False], ids=["recorded-at-next-forward", "recorded-at-end"]
)
def test_the_step_point_lands_in_step_split_plus_1_when_the_step_runs_a_closure(
    tmp_path, monkeypatch, record_in_closure
):
    """`opt.step(closure)` runs the forward and backward inside the optimizer step (LBFGS,
    Lightning): the point fires at the start of step 5's, where step 4 may not be recorded
    yet (automatic recording writes it at step 5's forward, inside the closure). Before, it
    fired at step 6's, saying step 5."""
    fired, now = [], {}
    point = {"rank": 0, "index": 0, "kind": "step", "split": 4, "preempt": 1.0}
    crasher = Crasher(point, 0, (2, 4), str(tmp_path))

    def kill(where, event, **kw):
        fired.append((now["step"], where, kw, crasher.last_step))
        crasher.fired = True

    monkeypatch.setattr(crasher, "kill", kill)
    steps_with_a_closure(crasher, range(1, 7), record_in_closure, now=now)
    last = 3 if record_in_closure else 4  # step 4's line comes at step 5's forward
    assert fired == [(5, CLOSURE_WHERE, {"inside": True, "step": 5, "closure": True}, last)]


def test_without_a_closure_the_step_point_comes_after_the_backward(tmp_path, monkeypatch):
    fired = []
    point = {"rank": 0, "index": 0, "kind": "step", "split": 4, "preempt": 1.0}
    crasher = Crasher(point, 0, (2, 4), str(tmp_path))

    def kill(where, event, **kw):
        fired.append((where, kw))
        crasher.fired = True

    monkeypatch.setattr(crasher, "kill", kill)
    steps_with_a_closure(crasher, range(1, 7), record_in_closure=True, closure=False)
    where = "inside step 5, before its optimizer step"
    assert fired == [(where, {"inside": True, "step": 5, "closure": False})]


def test_the_sigterm_record_says_the_step_it_came_in(tmp_path, monkeypatch):
    """The record's `after_step` is the step before the one the SIGTERM came in (step 4's
    line not yet written), and it says the step ran a closure."""
    monkeypatch.setattr(crasher_module, "read_pids", lambda run_dir: {})
    monkeypatch.setattr(crasher_module.grace, "start", lambda *a: None)
    monkeypatch.setattr(crasher_module, "_terminate", lambda pid: None)
    point = {"rank": 0, "index": 0, "kind": "step", "split": 4, "preempt": 1.0}
    crasher = Crasher(point, 0, (2, 4), str(tmp_path))
    steps_with_a_closure(crasher, range(1, 7))
    record = read_crash_record(crash_record_path(str(tmp_path)))
    assert record["where"] == f"SIGTERM {CLOSURE_WHERE}"
    said = record["preempt"]
    assert (said["after_step"], said["inside_step"], said["closure"]) == (4, True, True)
    found = preempted(record, {"killed": [], "exited_s": 0.1}, {}, [], 0, RUN)
    assert found.closure and not found.mid_step


def sleeper(ignore_sigterm=False):
    """A stand-in rank: it dumps its stacks on SIGUSR1, as the bootstrap's ranks do."""
    code = "import faulthandler, signal, time\nfaulthandler.register(signal.SIGUSR1)\n"
    if ignore_sigterm:
        code += "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    code += "print('ready', flush=True)\ntime.sleep(60)\n"
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,  # where a rank's faulthandler writes its stacks
        start_new_session=True,
    )
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    return proc


def test_the_watchdog_kills_what_outlives_the_grace(tmp_path):
    (tmp_path / "status").mkdir()
    stubborn = sleeper(ignore_sigterm=True)
    os.kill(stubborn.pid, signal.SIGTERM)
    outcome = grace.watch(str(tmp_path), {0: stubborn.pid}, 0.2, time.monotonic())
    assert stubborn.wait(timeout=10) == -signal.SIGKILL
    assert outcome == {"grace": 0.2, "killed": [0]}
    assert json.loads((tmp_path / "status" / "preempted.json").read_text()) == outcome


def test_the_watchdog_leaves_once_every_rank_has_exited(tmp_path):
    (tmp_path / "status").mkdir()
    polite = sleeper()
    grace.start(str(tmp_path), {0: polite.pid}, 30.0, time.monotonic())
    polite.terminate()
    assert polite.wait(timeout=10) == -signal.SIGTERM
    path = tmp_path / "status" / "preempted.json"
    for _ in range(500):  # the watchdog writes once it sees the rank gone
        if path.exists():
            break
        time.sleep(0.02)
    outcome = json.loads(path.read_text())
    assert outcome["killed"] == [] and outcome["exited_s"] >= 0
    mine = [p for p in os.listdir("/proc") if p.isdigit() and _runs_watchdog(p, tmp_path)]
    for _ in range(250):
        mine = [p for p in mine if _runs_watchdog(p, tmp_path)]
        if not mine:
            break
        time.sleep(0.02)
    assert mine == []


def _runs_watchdog(pid, tmp_path):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[-1].split()[0]
    except OSError:
        return False
    return str(tmp_path).encode() in cmdline and b"grace.py" in cmdline and state != b"Z"
