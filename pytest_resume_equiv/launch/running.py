"""Start torchrun launches, each in its own process group, and collect how every rank ended.

Every rank runs `pytest_resume_equiv.rank.bootstrap`, which writes its logs, pid and status
into the run directory. torchrun puts each worker in a session of its own, so killing the
agent's group is not enough: the pid files let us kill every rank's group too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shlex
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Optional, Protocol

from ..errors import ResumeEquivError
from ..rank.launch_context import CONTEXT_ENV
from ..rank.run_dir import agent_log_path, gate_path, log_path, read_pids, request_stacks
from ..rank.timings import mark
from .agents import BOOTSTRAP
from .forked import FORK_SERVER, Forked, agents_for, kill_process
from .rank_exits import RankOutcome, rank_outcomes
from .spec import LaunchSpec, Target, default_env
from .stacks import py_spy_dump
from .waiting import ExitFds, Wake, wait, wait_exits

__all__ = ["LaunchResult", "LaunchSpec", "RunningLaunch", "Target", "launch"]

STACK_DUMP_WAIT = 2.0
"""Seconds a hung launch gets to dump its ranks' Python stacks before it is killed."""


@dataclass
class LaunchResult:
    spec: LaunchSpec
    returncodes: list[Optional[int]]
    timed_out: bool
    duration: float
    ranks: list[RankOutcome]
    command: str
    """A shell line that reruns this launch by hand."""
    startup: float = 0.0
    """Seconds from start to the gate (start-up overlapped with an earlier launch)."""
    reused: str = ""
    """Set when this result is another test's launch, reused: that test's node id."""
    killed_after_step: int = 0
    """interrupt="kill": the plugin SIGKILLed this launch once every rank had recorded this
    step (0: it was not killed on purpose)."""
    crashed: str = ""
    """interrupt="crash": where its ranks were killed inside the save, on purpose."""
    judged: str = ""
    """interrupt="crash": a failure its check judged to be what the trainer should do (a
    clean refusal of a torn checkpoint), in a word for the launch's line."""
    problem: str = ""
    """The launcher's own account of a failure (a run directory the nodes do not share)."""
    note: str = ""
    """How the launch started when that was not the usual way (a plain start that the fork
    server could not serve, and why): shown with -v."""

    @property
    def ok(self) -> bool:
        """Every rank finished its work. A rank that then died in interpreter shutdown counts
        (see `shutdown_deaths`); torchrun's own exit status then says failure, so only that
        case may have a nonzero agent status."""
        if self.timed_out or not all(r.ok or r.status == "shutdown" for r in self.ranks):
            return False
        return all(code == 0 for code in self.returncodes) or bool(self.shutdown_deaths)

    @property
    def status(self) -> str:
        """ "ok", "killed as planned" (interrupt="kill"), "timed out" or "failed"."""
        if self.killed_after_step or self.crashed:
            return "killed as planned"
        if self.timed_out:
            return "timed out"
        return "ok" if self.ok else "failed"

    @property
    def shutdown_deaths(self) -> list[RankOutcome]:
        return [r for r in self.ranks if r.status == "shutdown"]

    @property
    def agent_logs(self) -> list[str]:
        return [agent_log_path(self.spec.run_dir, i) for i in range(len(self.returncodes))]

    def rank_log(self, rank: int, stream: str = "stderr") -> str:
        return log_path(self.spec.run_dir, rank, stream)

    def tail(self, path: str, lines: int = 15) -> str:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""


def launch_env(spec: LaunchSpec) -> dict[str, str]:
    """The variables a launch adds to the inherited environment (shown in the rerun line)."""
    extra = {CONTEXT_ENV: spec.context.to_json(), **default_env()}
    if spec.target.pythonpath:
        current = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        paths = [*spec.target.pythonpath, *current]
        extra["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    extra.update(spec.env)
    return extra


def _rerun_line(spec: LaunchSpec, extra: dict[str, str], argv: Sequence[str]) -> str:
    cwd = spec.cwd or os.getcwd()
    assigns = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(extra.items()))
    return f"cd {shlex.quote(cwd)} && env {assigns} {shlex.join(argv)}"


def _is_our_rank(pid: int) -> bool:
    """Guard against pid reuse: only signal processes that still run our bootstrap."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
        return BOOTSTRAP.encode() in cmdline or FORK_SERVER.encode() in cmdline
    except FileNotFoundError:
        return False
    except OSError:
        return True  # no /proc: trust the pid file


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def dump_stacks(run_dir: str, by_file: bool = False) -> None:
    """Take every live rank's Python stack: py-spy from outside when installed (it sees a rank
    stuck in C code too), and faulthandler into the rank's stderr log, by SIGUSR1 or, for a
    Slurm launch whose ranks may be on other hosts, by the request file they watch."""
    if by_file:
        request_stacks(run_dir)
    for rank, pid in read_pids(run_dir).items():
        if _is_our_rank(pid):
            py_spy_dump(pid, log_path(run_dir, rank, "pyspy"))
            if not by_file:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGUSR1)


KILL_WAIT = 10.0
"""Seconds, for all of a launch's agents together, that a kill waits for them to exit."""


def kill_all(procs: Sequence[subprocess.Popen], run_dir: str) -> None:
    """Kill the agents' process groups and every rank's own group; wait for the agents, for
    KILL_WAIT seconds in all (what a kill leaves, the fork server or the parent-death signal
    ends with pytest)."""
    ranks = [pid for pid in read_pids(run_dir).values() if _is_our_rank(pid)]
    # stopped first, then killed: a rank that saw its peer's socket close before its own
    # SIGKILL came would report that error instead of where it was stuck at the timeout
    try:
        for pgid in ranks:
            _signal_group(pgid, signal.SIGSTOP)
    finally:  # an interrupt between the two leaves no rank stopped forever
        for pgid in ranks:
            _signal_group(pgid, signal.SIGKILL)
    for proc in procs:
        kill_process(proc.pid)
    wait_exits(procs, KILL_WAIT)


class Handle(Protocol):
    """A started launch as the scheduler sees it (RunningLaunch, a leased or shared launch, a fake)."""

    @property
    def gate_open(self) -> bool: ...

    def open_gate(self) -> None: ...

    def poll(self) -> Optional[LaunchResult]: ...

    def kill(self) -> None: ...

    # optional: `wake() -> Wake`, what ends a wait for its next change (else it is polled)


class RunningLaunch:
    """A started launch. A gated one has its agents and ranks up with torch imported, each
    rank waiting for the gate file before it runs the user's code: the start-up cost of a
    resumed launch overlaps the launch whose checkpoint it will load."""

    def __init__(self, spec: LaunchSpec, gated: bool = False) -> None:
        self.spec = spec
        os.makedirs(os.path.join(spec.run_dir, "logs"), mode=0o700, exist_ok=True)
        if spec.cwd is not None and not os.path.isdir(spec.cwd):
            raise ResumeEquivError(
                f"the {spec.name} launch's working directory cwd={spec.cwd!r} is not a directory "
                "(placeholders such as {run_dir} are filled; create any other folder first)"
            )
        self.gate = gate_path(spec.run_dir) if gated else None
        base = {**os.environ, **launch_env(spec)}
        self.agents = agents_for(spec, base)
        context = dataclasses.replace(
            spec.context,
            gate=self.gate,
            owner_pid=os.getpid(),
            owner_host=socket.gethostname(),
            stacks_by_file=self.agents.stacks_by_file,
            host_store=self.agents.host_store,
        )
        self.extra = {**self.agents.env(spec), **launch_env(spec)}
        env = {**os.environ, **self.extra, CONTEXT_ENV: context.to_json()}
        self.procs: list = []
        self._logs = []
        self.started = time.monotonic()
        self.gate_opened: Optional[float] = None if gated else self.started
        self.result: Optional[LaunchResult] = None
        self.argvs: list[list[str]] = []
        self.exits = ExitFds()
        try:
            self.argvs = self.agents.argvs(spec)
            if isinstance(self.agents, Forked):
                logs = [agent_log_path(spec.run_dir, i) for i in range(spec.nproc)]
                self.procs = self.agents.start(spec, env, logs)
            else:
                self._start_plain(env)
            self.exits.watch(self.procs)
        except BaseException:
            self.kill()
            raise
        mark("host.started", spec.run_dir)

    def _start_plain(self, env: dict[str, str]) -> None:
        for node, argv in enumerate(self.argvs):
            log = open(agent_log_path(self.spec.run_dir, node), "wb")
            self._logs.append(log)
            self.procs.append(
                subprocess.Popen(
                    argv,
                    cwd=self.spec.cwd,
                    env={**env, **self.agents.node_env(self.spec, node)},
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    preexec_fn=self.agents.preexec,
                )
            )

    @property
    def gate_open(self) -> bool:
        """Whether the ranks may run (or are running) the user's code."""
        return self.gate_opened is not None

    def open_gate(self) -> None:
        """Let the ranks run the user's code; the launch's timeout counts from here."""
        if self.gate is not None and self.gate_opened is None:
            with open(self.gate, "w"):
                pass
            self.gate_opened = time.monotonic()

    def poll(self) -> Optional[LaunchResult]:
        """The result once every agent has exited (or the timeout passed), else None."""
        if self.result is not None:
            return self.result
        self.agents.supervise(self.procs)
        if all(p.poll() is not None for p in self.procs):
            return self._finish(timed_out=False)
        if self.gate_opened is not None and time.monotonic() > self.gate_opened + self.spec.timeout:
            dump_stacks(self.spec.run_dir, by_file=self.agents.stacks_by_file)
            time.sleep(STACK_DUMP_WAIT)
            return self._finish(timed_out=True)
        return None

    def wake(self) -> Wake:
        """What ends the wait for this launch's next change (call after `poll`): an exit of
        a process still running, its timeout, the next step of its agents' supervision."""
        if self.result is not None:
            return Wake(at=0.0)
        wake = self.exits.wake(self.procs, [p.returncode is None for p in self.procs])
        if self.gate_opened is not None:
            wake.by(self.gate_opened + self.spec.timeout)
        return wake.by(self.agents.next_look())

    def wait(self) -> LaunchResult:
        self.open_gate()
        while True:
            result = self.poll()
            if result is not None:
                return result
            wait(self.wake())

    def kill(self) -> None:
        """Stop the launch now (cancelled, interrupted or failed elsewhere)."""
        if self.result is None:
            self._finish(timed_out=False)

    def _finish(self, timed_out: bool) -> LaunchResult:
        mark("host.exited", self.spec.run_dir)
        try:
            stopped_early = any(p.poll() is None for p in self.procs)
            if stopped_early:
                self.agents.cancel(self.spec)  # what the scheduler still runs
            kill_all(self.procs, self.spec.run_dir)
            if not stopped_early and any(p.returncode != 0 for p in self.procs):
                # srun returns on a failed rank while the job still completes on the
                # other nodes: wait until the scheduler has cleaned it up
                self.agents.cancel(self.spec)
        finally:
            self.exits.close()
            for log in self._logs:
                log.close()
        end = time.monotonic()
        agent_text = ""
        for path in (agent_log_path(self.spec.run_dir, i) for i in range(len(self.procs))):
            try:
                with open(path, encoding="utf-8", errors="replace") as f:
                    agent_text += f.read()
            except OSError:
                pass
        self.result = LaunchResult(
            spec=self.spec,
            returncodes=[p.returncode for p in self.procs],
            timed_out=timed_out,
            duration=end - (self.gate_opened if self.gate_opened is not None else end),
            ranks=rank_outcomes(
                self.spec.run_dir,
                self.spec.world_size,
                agent_text,
                timed_out,
                self.agents.exitcodes([p.returncode for p in self.procs]),
            ),
            command=_rerun_line(self.spec, self.extra, self.argvs[0] if self.argvs else []),
            startup=(self.gate_opened or end) - self.started,
            problem=self.agents.problem(agent_text),
            note=self.agents.note,
        )
        return self.result


def launch(spec: LaunchSpec) -> LaunchResult:
    """Run one torchrun launch to the end (or its timeout); never leaves a process behind."""
    with terminate_as_interrupt():
        running = RunningLaunch(spec)
        try:
            return running.wait()
        finally:
            running.kill()


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """While launches run, SIGTERM to pytest raises KeyboardInterrupt like Ctrl-C does, so the
    code that kills every started launch runs instead of the process vanishing and leaving
    torchrun agents (each in a session of its own) behind."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"pytest received {signal.Signals(signum).name}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
