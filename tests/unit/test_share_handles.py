"""Shared uninterrupted launches without launching: one handle runs it, another reuses its
stored result, and the stored result reads back as the same typed result."""

from plan_helpers import plan_for

from pytest_resume_equiv.launch.rank_exits import RankOutcome
from pytest_resume_equiv.launch.running import LaunchResult
from pytest_resume_equiv.launch.share import SharedLaunch, load_result, save_result


def train(ctx):
    """Stands in for a trainer: nothing here runs it."""


class Inner:
    def __init__(self, spec):
        self.spec, self.polls, self.killed = spec, 0, False

    def poll(self):
        self.polls += 1
        if self.polls < 3:
            return None
        return LaunchResult(self.spec, [0], False, 1.5, [RankOutcome(0, "ok")], "rerun")

    def kill(self):
        self.killed = True


def test_a_result_reads_back_exactly(tmp_path):
    _, plan = plan_for(tmp_path, train, nproc=1, interrupt="kill")
    spec = plan.by_role("interrupted")[0].spec
    result = LaunchResult(spec, [0], False, 2.5, [RankOutcome(0, "ok")], "cd x && go", 0.5)
    result.killed_after_step = 4
    (tmp_path / "run").mkdir()
    save_result(str(tmp_path / "run"), result, owner="t.py::test_a")
    back = load_result(str(tmp_path / "run"))
    assert back.spec == spec and back.spec.context.template_values == spec.context.template_values
    assert (back.reused, back.killed_after_step, back.ranks) == ("t.py::test_a", 4, result.ranks)


def test_one_handle_runs_the_launch_the_other_waits_and_reuses_it(tmp_path):
    _, plan = plan_for(tmp_path, train, nproc=1, shared_root=str(tmp_path / "shared"))
    (tmp_path / "shared").mkdir()
    spec = plan.by_role("uninterrupted")[0].spec
    started = []

    def start():
        started.append(Inner(spec))
        return started[-1]

    first = SharedLaunch(spec.run_dir, start, "t.py::test_a")
    second = SharedLaunch(spec.run_dir, start, "t.py::test_b")
    assert first.poll() is None  # it holds the lock and runs the launch
    assert second.poll() is None  # it waits for the lock
    while (result := first.poll()) is None:
        pass
    assert len(started) == 1 and result.reused == ""
    reused = second.poll()
    assert reused.reused == "t.py::test_a" and len(started) == 1
    assert reused.duration == result.duration
