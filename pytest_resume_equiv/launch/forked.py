"""Local launches forked from a per-session server that has imported torch already.

One `ForkServer` per pytest process (each pytest-xdist worker has its own), started with
the session when the options say it will fork launches (else on the first forked launch;
plugin.py) and stopped at the end of the session; it also leaves by itself when
pytest dies (its stdin closes; PR_SET_PDEATHSIG). `Forked` is the agents of a launch that
it forks: one rank per started process, each given the variables torchrun gives a worker,
rank 0 holding the rendezvous store as in a one-rank launch. `ForkedRank` is the
`subprocess.Popen` face of a forked rank that `RunningLaunch` needs.

`fork_refusal` says why a launch must start plainly instead: its environment changes what
the server read at start (an import-time switch of torch, the dynamic loader, Python). A
server that cannot start (a preload module that poisons fork, starts a thread or fails to
import) makes every launch start plainly too, with the reason as the launch's note.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import select
import signal
import subprocess
import sys
import threading
import time
from typing import Any, ClassVar, Optional

from ..errors import ResumeEquivError
from ..rank.run_dir import store_port_path
from ..rank.timings import mark
from .agents import (
    Agents,
    OneRank,
    Standalone,
    _parent_death_signal,
    launcher_agents,
    rank_env,
)
from .spec import LaunchSpec, default_env
from .waiting import wait_exits

FORK_SERVER = "pytest_resume_equiv.rank.forkserver"
IMPORT_TIME_PREFIXES = (
    "PYTORCH_",
    "TORCH_",
    "LD_",
    "PYTHON",
    "OMP_",
    "MKL_",
    "KMP_",
    "GOMP_",
    "OPENBLAS_",
    "MALLOC_",
    "TORCHDYNAMO_",
    "TORCHINDUCTOR_",
    "INDUCTOR_",
    "AOT_",
    "AOTINDUCTOR_",
    "SYMPY_",
)
"""Variables read when torch (or the interpreter, or its C libraries) loads, `torch._dynamo`
included (its config and inductor's, and sympy, read theirs at import; the server imports
it): a launch that sets one to another value than the server started with cannot be forked
from it."""
AFTER_IMPORT = frozenset(
    {
        "PYTHONPATH",
        "PYTHONUNBUFFERED",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING",
        "PYTORCH_NVML_BASED_CUDA_CHECK",
    }
)
"""...except these, which the forked child applies itself or which are read later:
PYTORCH_NVML_BASED_CUDA_CHECK at each `torch.cuda.is_available()` (lightning sets it at its
import, which replaced a session's server when a test module imported lightning)."""
STOP_GRACE = 10.0
"""Seconds the other ranks of a failed forked launch get after SIGTERM."""
START_WAIT = 120.0
"""Seconds the server gets to import torch and the preload modules."""


def changed_at_import(
    server_env: dict[str, str], env: dict[str, str], set_by_imports: Optional[dict] = None
) -> list[str]:
    """The variables read when torch is imported that `env` gives another value than a server
    started with `server_env` had. `set_by_imports`: what the server's own imports wrote into
    its environment (`torch._dynamo` sets TORCHINDUCTOR_CACHE_DIR to the folder it computed):
    a launch given that value, as pytest's process is once it imported the same module,
    starts as the server did, and so does one given the server's starting value."""
    own = set_by_imports or {}
    return sorted(
        k
        for k in set(server_env) | set(env)
        if k.startswith(IMPORT_TIME_PREFIXES)
        and k not in AFTER_IMPORT
        and server_env.get(k) != env.get(k)
        and not (k in own and env.get(k) == own[k])
    )


def fork_refusal(
    server_env: dict[str, str], env: dict[str, str], set_by_imports: Optional[dict] = None
) -> str:
    """Why a launch with environment `env` cannot be forked from a server started with
    `server_env` ("" when it can)."""
    return _refusal_words(changed_at_import(server_env, env, set_by_imports))


def _refusal_words(changed: list[str]) -> str:
    if not changed:
        return ""
    return f"its environment changes {', '.join(changed)}, read when torch is imported"


class ForkServer:
    """The session's server process and the pipe to it (one request at a time)."""

    running: ClassVar[dict[tuple[str, ...], ForkServer]] = {}
    """The live servers of this pytest process, by preload list."""
    refused: ClassVar[dict[tuple[str, ...], str]] = {}
    """Why the server for a preload list could not start: asked once per session."""

    def __init__(self, preload: tuple[str, ...], env: dict[str, str], wait: bool = True) -> None:
        self.preload = preload
        self.env = dict(env)
        self.set_by_imports: dict[str, str] = {}
        """What its imports wrote into its environment, said in its first line."""
        self.lock = threading.Lock()
        self.ready = False
        """Its first line has been read: it imported everything and serves."""
        self.owed = 0
        """Answers to requests sent whose reading was interrupted (Ctrl-C, SIGTERM): read
        and dropped before the next request, so each answer goes to its own request."""
        self._unread = b""
        mark("server.start", "fork-server")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", FORK_SERVER, *preload],
            env=self.env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=die_with_pytest,
        )
        if wait:
            self.wait_ready()

    def wait_ready(self) -> None:
        """Wait for the server's first line (once): it has imported torch and the preload
        modules, or it says why it cannot serve (then it is stopped, and this raises)."""
        if self.ready:
            return
        try:
            first = self._read(START_WAIT)
        except (ResumeEquivError, ValueError) as exc:
            self.stop()
            raise ResumeEquivError(f"the fork server did not start: {exc}") from None
        if "error" in first:
            self.stop()
            raise ResumeEquivError(f"--resume-equiv-preload: {first['error']}")
        self.set_by_imports = dict(first.get("environ_set") or {})
        self.ready = True
        mark("server.ready", "fork-server")

    def refusal(self, env: dict[str, str]) -> str:
        """Why a launch with environment `env` cannot be forked from this server ("" when it
        can). Only its first line says what its own imports wrote, so a server still
        importing is waited for when each variable `env` differs in is one it started
        without (what an import writes: cheaper than a second server); a variable it
        started with, at another value, is decided at once. A server that fails meanwhile
        is refused for the session, its own error the reason."""
        changed = changed_at_import(self.env, env, self.set_by_imports)
        if not changed or self.ready or self.proc.poll() is not None:
            return _refusal_words(changed)
        if any(k in self.env for k in changed):
            return _refusal_words(changed)
        try:
            self.wait_ready()
        except ResumeEquivError as exc:
            ForkServer.running.pop(self.preload, None)
            refusal = ForkServer.refused[self.preload] = str(exc)
            return refusal
        return fork_refusal(self.env, env, self.set_by_imports)

    @classmethod
    def get(cls, preload: tuple[str, ...]) -> ForkServer:
        """This process's server for `preload`, started on first use (or by `prestart`)."""
        server = cls.running.get(preload)
        if server is None or (server.ready and server.proc.poll() is not None):
            server = cls.running[preload] = ForkServer(preload, server_env(), wait=False)
        try:
            server.wait_ready()
        except ResumeEquivError:
            cls.running.pop(preload, None)
            raise
        return server

    @classmethod
    def prestart(cls, preload: tuple[str, ...]) -> None:
        """Start the server for `preload` without waiting for it: its imports (torch,
        `torch._dynamo`: seconds of CPU) overlap what pytest does before the first launch.
        `get` waits for it; a server that cannot start is found there, as without this. One
        already started is kept, unless the environment has since changed a variable read
        when torch is imported: then a launch could not be forked from it, and it is
        replaced (`refusal` may wait for its first line to know)."""
        if preload in cls.refused:
            return
        running = cls.running.get(preload)
        if running is not None:
            if not running.refusal(server_env()) or preload in cls.refused:
                return
            cls.stop_one(preload)  # started before a test module set an import-time variable
        with contextlib.suppress(OSError):
            cls.running[preload] = ForkServer(preload, server_env(), wait=False)

    @classmethod
    def stop_one(cls, preload: tuple[str, ...]) -> None:
        """Stop the server for `preload`, if one runs (no launch will use it)."""
        server = cls.running.pop(preload, None)
        if server is not None:
            server.stop()

    @classmethod
    def stop_all(cls) -> None:
        for server in list(cls.running.values()):
            server.stop()
        cls.running.clear()
        cls.refused.clear()

    def _read(self, timeout: float) -> dict[str, Any]:
        """The server's next line, waiting `timeout` seconds at most: never a blocking read,
        so an interrupt or a server that stopped answering cannot hold pytest."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while b"\n" not in self._unread:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ResumeEquivError(
                    f"the fork server did not answer in {timeout:.0f}s; run with "
                    "--resume-equiv-fork-server=off to start every rank plainly"
                )
            ready, _, _ = select.select([self.proc.stdout], [], [], min(left, 1.0))
            chunk = os.read(self.proc.stdout.fileno(), 65536) if ready else None
            if chunk == b"":  # what it wrote before it left was read first
                raise ResumeEquivError(
                    f"the fork server did not answer (exit status {self.proc.wait()}); "
                    "run with --resume-equiv-fork-server=off to start every rank plainly"
                )
            self._unread += chunk or b""
        line, self._unread = self._unread.split(b"\n", 1)
        return json.loads(line)

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None
        with self.lock:
            self._settle()
            try:
                self.proc.stdin.write(json.dumps(request).encode() + b"\n")
                self.proc.stdin.flush()
            except OSError as exc:
                raise ResumeEquivError(f"the fork server has gone: {exc}") from exc
            self.owed += 1
            answer = self._read(30.0)
            self.owed -= 1
        if "error" in answer:
            raise ResumeEquivError(f"the fork server: {answer['error']}")
        return answer

    def _settle(self) -> None:
        """Drop the answers of requests whose reading an interrupt cut short. An interrupt
        between reading a line and counting it leaves one owed that never comes: the short
        wait ends that."""
        while self.owed > 0:
            try:
                self._read(0.5)
            except ResumeEquivError:
                if self.proc.poll() is not None:
                    raise
                self.owed = 0
                return
            self.owed -= 1

    def stop(self) -> None:
        """Close its stdin: it kills what it forked that still runs, and leaves. One still
        importing has forked nothing and reads no stdin yet: it is killed at once."""
        with contextlib.suppress(OSError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        if not self.ready or not wait_exits([self.proc], 10.0):
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def kill_process(pid: int) -> None:
    """SIGKILL a started process and its process group: a rank leads a group of its own once
    it has called setsid(), which one forked a moment ago may not have done yet."""
    for kill in (os.killpg, os.kill):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            kill(pid, signal.SIGKILL)


def die_with_pytest() -> None:
    """Started processes get SIGKILL when pytest dies (Linux: PR_SET_PDEATHSIG)."""
    if sys.platform.startswith("linux"):
        _parent_death_signal(9)


class ForkedRank:
    """A rank the server forked, as `RunningLaunch` uses a started process."""

    def __init__(self, server: ForkServer, pid: int) -> None:
        self.server = server
        self.pid = pid
        self.returncode: Optional[int] = None

    def poll(self) -> Optional[int]:
        if self.returncode is None:
            try:
                codes = self.server.ask({"op": "poll", "pids": [self.pid]})["codes"]
            except ResumeEquivError:
                return -9  # the server is gone, and with it every rank it forked
            self.returncode = codes.get(str(self.pid))
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        if not wait_exits([self], math.inf if timeout is None else timeout):
            raise subprocess.TimeoutExpired(f"forked rank {self.pid}", timeout or 0)
        assert self.returncode is not None
        return self.returncode


class Forked(Agents):
    """The ranks of a one-node launch forked from the session's server: no agent, no
    `import torch` in any process started for the launch."""

    host_store = True
    forked = True

    def __init__(self, server: ForkServer) -> None:
        self.server = server
        self.stopping: Optional[float] = None

    def supervise(self, procs: list) -> None:
        """torchrun's rule: once a rank has failed, the others get SIGTERM, and SIGKILL if
        they are still there after STOP_GRACE seconds."""
        codes = [p.poll() for p in procs]
        if self.stopping is None and any(c not in (None, 0) for c in codes):
            self.stopping = time.monotonic()
            self._signal(procs, codes, signal.SIGTERM)
        elif self.stopping is not None and time.monotonic() > self.stopping + STOP_GRACE:
            self._signal(procs, codes, signal.SIGKILL)

    def next_look(self) -> float:
        """The end of the failed launch's grace period, while it lasts."""
        if self.stopping is None or time.monotonic() > self.stopping + STOP_GRACE:
            return math.inf
        return self.stopping + STOP_GRACE + 0.001

    @staticmethod
    def _signal(procs: list, codes: list, sig: int) -> None:
        for proc, code in zip(procs, codes):
            if code is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, sig)

    def argvs(self, spec: LaunchSpec) -> list[list[str]]:
        """What starts this launch without the server (the rerun line shows the first)."""
        return (OneRank() if spec.nproc == 1 else Standalone()).argvs(spec)

    def env(self, spec: LaunchSpec) -> dict[str, str]:
        return rank_env(spec, 0) if spec.nproc == 1 else {}

    def start(self, spec: LaunchSpec, env: dict[str, str], logs: list[str]) -> list[ForkedRank]:
        with contextlib.suppress(FileNotFoundError):
            os.remove(store_port_path(spec.run_dir))
        ranks: list[ForkedRank] = []
        try:
            for rank, log in enumerate(logs):
                answer = self.server.ask(
                    {
                        "op": "fork",
                        "argv": spec.target.argv(),
                        "env": {**env, **rank_env(spec, rank)},
                        "cwd": os.path.abspath(spec.cwd or os.getcwd()),
                        "log": log,
                    }
                )
                ranks.append(ForkedRank(self.server, int(answer["pid"])))
        except BaseException:  # Ctrl-C between two forks: the ranks forked so far go too
            for forked in ranks:
                kill_process(forked.pid)
            raise
        return ranks

    def exitcodes(self, returncodes: list[Optional[int]]) -> dict[int, int]:
        return {r: code for r, code in enumerate(returncodes) if code is not None}


def server_env() -> dict[str, str]:
    """The environment a fork server starts with: pytest's, with what every launch adds."""
    return {**os.environ, **default_env()}


def agents_for(spec: LaunchSpec, env: dict[str, str]) -> Agents:
    """The agents that start `spec`, whose processes get `env`: forked from the session's
    server where the launch allows it, else the launcher's own, with a note saying why."""
    plain = launcher_agents(spec)
    if not (spec.fork_server and spec.launcher.can_fork and spec.nnodes == 1):
        return plain
    running = ForkServer.running.get(spec.preload)
    refusal = running.refusal(env) if running is not None else fork_refusal(server_env(), env)
    refusal = refusal or ForkServer.refused.get(spec.preload, "")
    if not refusal:
        try:
            return Forked(ForkServer.get(spec.preload))
        except (ResumeEquivError, OSError) as exc:
            # a server that cannot start (a preload module that poisons fork or starts a
            # thread, an import that fails) must not fail every launch: they start plainly
            refusal = ForkServer.refused[spec.preload] = str(exc)
    plain.note = f"started without the fork server: {refusal}"
    return plain
