"""The pipe to the fork server under interrupts: an answer always goes to its own request, and
no read waits longer than its bound (issue 39: a Ctrl-C must never leave pytest waiting).

A stand-in server (plain Python, no torch) answers each request line with the request's `id`.
"""

import subprocess
import sys

import pytest

from pytest_resume_equiv.errors import ResumeEquivError
from pytest_resume_equiv.launch import forked
from pytest_resume_equiv.launch.forked import ForkServer

ECHO = (
    "import json, sys, time\n"
    "print(json.dumps({'ready': True}), flush=True)\n"
    "for line in sys.stdin:\n"
    "    request = json.loads(line)\n"
    "    time.sleep(request.get('delay', 0))\n"
    "    if not request.get('mute'):\n"
    "        print(json.dumps({'id': request['id']}), flush=True)\n"
)


@pytest.fixture
def server(monkeypatch):
    """A ForkServer whose process is the echo stand-in."""

    real = subprocess.Popen

    def popen(argv, **kwargs):
        return real([sys.executable, "-c", ECHO], **kwargs)

    monkeypatch.setattr(forked.subprocess, "Popen", popen)
    started = ForkServer((), {}, wait=True)
    yield started
    started.stop()


def test_an_ask_cut_short_by_ctrl_c_leaves_no_answer_for_the_next_request(server, monkeypatch):
    real_select = forked.select.select
    calls = []

    def interrupted(*args):
        calls.append(args)
        if len(calls) == 1:  # the signal lands while the answer is awaited
            raise KeyboardInterrupt
        return real_select(*args)

    monkeypatch.setattr(forked.select, "select", interrupted)
    with pytest.raises(KeyboardInterrupt):
        server.ask({"id": 1, "delay": 0.2})
    assert server.owed == 1
    # the cleanup that follows asks again: it gets its own answer, not the one left behind
    assert server.ask({"id": 2}) == {"id": 2}
    assert server.ask({"id": 3}) == {"id": 3} and server.owed == 0


def test_an_answer_read_but_not_counted_does_not_hold_the_next_request(server):
    """The interrupt can land between reading a line and counting it: the owed answer never
    comes, and the next request waits half a second for it, not forever."""
    server.owed = 1  # as if the line of the last request was read and then interrupted
    assert server.ask({"id": 4}) == {"id": 4} and server.owed == 0


def test_a_server_that_stops_answering_is_a_bounded_wait_with_a_clear_error(server):
    server.proc.stdin.write(b'{"id": 5, "mute": true}\n')
    server.proc.stdin.flush()
    with pytest.raises(ResumeEquivError, match=r"did not answer in 1s; run with "):
        server._read(1.0)


def test_a_server_that_left_is_said_so_at_once(server):
    server.proc.stdin.close()
    server.proc.wait(timeout=10)
    with pytest.raises(ResumeEquivError, match=r"did not answer \(exit status 0\)"):
        server._read(30.0)


def test_a_fork_probe_that_ends_without_an_answer_is_asked_again_and_never_read_as_safe(
    tmp_path, monkeypatch
):
    """A probe child that dies before it answers said nothing: the server is not taken to be
    safe to fork from (it was: an empty answer read as "nothing poisoned"). One failed
    probe is asked again."""
    import json

    import torch  # noqa: F401 - the probe looks at torch's runtimes

    from pytest_resume_equiv.rank import forkserver

    real = json.dumps
    flag = tmp_path / "failed-once"
    # what a probe that answers says here: [] on a CPU build of torch; on a CUDA build, a
    # test before this one that asked torch.cuda anything has poisoned forks for CUDA
    answered = forkserver.poisoned_fork()

    def once(obj):  # runs in the probe child: the first child dies before writing
        if not flag.exists():
            flag.write_text("x")
            raise RuntimeError("probe died")
        return real(obj)

    monkeypatch.setattr(json, "dumps", once)
    assert forkserver.poisoned_fork() == answered  # the second probe answered
    assert flag.exists()

    def never(obj):
        raise RuntimeError("probe died")

    monkeypatch.setattr(json, "dumps", never)
    assert forkserver.poisoned_fork() == ["an accelerator (the fork probe did not answer)"]
