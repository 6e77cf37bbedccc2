"""The phase timings a benchmark asks for (rank/timings.py): nothing at all unless asked, one
line per mark when asked, and `init_process_group` timed only then; and a rank's exit skips
torch's operator-library teardown and nothing else (rank/bootstrap.py)."""

import weakref

import torch.distributed as dist
import torch.library

from pytest_resume_equiv.rank import bootstrap, timings


def test_a_mark_writes_nothing_unless_a_benchmark_asks(tmp_path, monkeypatch):
    monkeypatch.delenv(timings.ENV, raising=False)
    timings.mark("rank.start", str(tmp_path / "run"))
    assert list(tmp_path.iterdir()) == []
    timer = timings.ProcessGroupTimer("run")
    timer.install()
    assert not timer.patches.replaced  # no patch outside a benchmark


def test_marks_are_lines_of_time_pid_launch_and_phase(tmp_path, monkeypatch):
    path = tmp_path / "timings.txt"
    monkeypatch.setenv(timings.ENV, str(path))
    timings.mark("host.started", "/runs/session/test_a/resumed-split3")
    timings.mark("host.exited", "/runs/session/test_a/resumed-split3")
    timings.mark("host.started", "/runs/session/test_b/resumed-split3")
    lines = [line.split() for line in path.read_text().splitlines()]
    a, b = timings.launch_name("/runs/session/test_a/resumed-split3"), lines[2][2]
    assert a.startswith("resumed-split3@") and b.startswith("resumed-split3@") and a != b
    assert [(launch, phase) for _, _, launch, phase in lines] == [
        (a, "host.started"),
        (a, "host.exited"),
        (b, "host.started"),
    ]
    assert float(lines[0][0]) <= float(lines[1][0])
    assert timings.launch_name("fork-server") == "fork-server"


def test_init_process_group_is_timed_only_when_asked_and_put_back(tmp_path, monkeypatch):
    path = tmp_path / "timings.txt"
    monkeypatch.setenv(timings.ENV, str(path))
    original = dist.init_process_group
    timer = timings.ProcessGroupTimer("launch")
    timer.install()
    try:
        assert dist.init_process_group is not original
        try:
            dist.init_process_group(backend="no-such-backend", rank=0, world_size=1)
        except Exception:
            pass  # the call failed: its start and end are marked all the same
    finally:
        timer.uninstall()
    assert dist.init_process_group is original
    assert [line.split()[3] for line in path.read_text().splitlines()] == ["pg.start", "pg.done"]


def test_a_ranks_exit_skips_the_operator_library_teardown_only():
    class Owner:
        pass

    owner, ran = Owner(), []
    kept = weakref.finalize(owner, ran.append, "mine")  # an exit handler of the user's
    before = [
        f
        for f, info in weakref.finalize._registry.items()
        if info.func is torch.library._del_library
    ]
    assert before, "torch registers one finalizer per operator library it defines"
    bootstrap._skip_operator_teardown()
    after = [
        f
        for f, info in weakref.finalize._registry.items()
        if info.func is torch.library._del_library
    ]
    assert after == [] and kept.alive
    kept.detach()
