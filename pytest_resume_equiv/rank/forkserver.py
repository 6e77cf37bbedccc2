"""The fork server: a process that has imported torch once and forks the ranks of local
launches, so a rank starts in milliseconds instead of paying `import torch` again.

`python -m pytest_resume_equiv.rank.forkserver PRELOAD...` imports torch,
`torch.distributed`, `torch.optim` and the plugin's rank code (plus the user's `PRELOAD`
modules), checks that nothing started a thread, touched a device or poisoned fork (a probe
child reads `_is_in_bad_fork()`), and then serves JSON
lines on its stdin/stdout:

- `{"op": "fork", "argv": [...], "env": {...}, "cwd": DIR, "log": PATH}`: fork a rank; the
  child makes itself a session and process group of its own, takes exactly `env` as its
  environment, `cwd` as its directory, `log` as its stdout/stderr, rebuilds `sys.path` as a
  `python -m` start in `cwd` with that environment would have it, and runs the bootstrap.
  Answer: `{"pid": N}`.
- `{"op": "poll", "pids": [...]}`: `{"codes": {pid: returncode or null}}` (negative: the
  signal that ended it, as `subprocess.Popen` says).

It leaves when its stdin closes (pytest ended) or pytest dies (PR_SET_PDEATHSIG, set when it
was started), killing the process group of every rank it forked that still runs. It never
imports pytest, draws no random number and starts no thread: a forked child is a fresh
process for everything the training does (`bootstrap.main` makes all per-rank state).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import json
import os
import signal
import sys
import threading
import traceback
from typing import Any, Optional

BASE_MODULES = (
    "torch",
    "torch.distributed",
    "torch.optim",
    "torch._dynamo",
    "pytest_resume_equiv.rank.bootstrap",
)
"""`torch._dynamo` is what the first `torch.optim` optimizer step imports (~2 s of CPU per
rank): imported here once, a forked launch does not pay it. With it imported, a forked rank
reaches its teardown so fast that it met a torch deadlock (`keep_process_groups`) in 3 of 15
launches; forked ranks are kept out of it (docs/performance.md)."""


def thread_count() -> int:
    """Threads of this process as the kernel sees them (C++ threads too)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


def touched_devices() -> list[str]:
    """The accelerator runtimes an import initialised (a forked child cannot use them)."""
    found = []
    torch = sys.modules.get("torch")
    for name in ("cuda", "xpu", "npu", "mps"):
        backend = getattr(torch, name, None)
        check = getattr(backend, "is_initialized", None)
        with contextlib.suppress(Exception):
            if check is not None and check():
                found.append(name)
    return found


def poisoned_fork() -> list[str]:
    """The accelerator runtimes a forked child of this process could not initialise.

    `is_initialized()` is not enough: `torch.cuda.is_available()` (a common import-time call)
    runs `cudaGetDeviceCount`, which registers a fork handler (torch/csrc/cuda/Module.cpp,
    `poison_fork`) without setting `is_initialized()`, and every forked rank then fails with
    "Cannot re-initialize CUDA in forked subprocess". Only a forked child sees that
    condition, as `_is_in_bad_fork()` (torch.cuda, torch.xpu, and torch_npu's torch.npu): a
    probe child reads it and exits."""
    torch = sys.modules.get("torch")
    if torch is None:
        return []
    for _ in range(PROBES):  # a probe that ended without an answer tells nothing: again
        answer = _probe(torch)
        if answer:
            break
    try:
        return [str(name) for name in json.loads(answer)]
    except ValueError:  # no answer (the probe died) is no "not poisoned"
        return ["an accelerator (the fork probe did not answer)"]


PROBES = 2
"""Probe children forked before a server that got no answer from any refuses to serve."""


def _probe(torch: Any) -> bytes:
    """What one forked probe child says of the runtimes it could not initialise (JSON), or
    b"" when it ended without saying."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the probe: read, write, leave without running any exit handler
        try:
            os.close(read)
            bad = []
            for name in ("cuda", "xpu", "npu"):
                check = getattr(getattr(torch, name, None), "_is_in_bad_fork", None)
                with contextlib.suppress(Exception):
                    if check is not None and check():
                        bad.append(name)
            os.write(write, json.dumps(bad).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        answer = f.read()
    os.waitpid(pid, 0)
    return answer


def preload(modules: list[str]) -> dict[str, Any]:
    """Import the base modules, then the user's one at a time, refusing what leaves a thread
    running or a device initialised. The base modules are checked together (a fork probe
    costs ~15 ms of the server's start; torch's own modules cannot be blamed apart from
    each other anyway). The answer is the server's first line."""
    started_with = dict(os.environ)
    for group in [BASE_MODULES, *((name,) for name in modules)]:
        if group is BASE_MODULES:  # torch's and ours: nothing the user could move
            named = importing = f"importing {', '.join(group)}"
            advice = "run with --resume-equiv-fork-server=off to start every rank plainly"
        else:
            named, importing = f"preload module {group[0]!r}", f"importing {group[0]!r}"
            advice = "import it in the training code instead"
        before = thread_count()
        try:
            for name in group:
                importlib.import_module(name)
        except BaseException as exc:  # noqa: BLE001 - reported to pytest, which decides
            return {"error": f"importing {name} failed: {type(exc).__name__}: {exc}"}
        if thread_count() > before:
            return {
                "error": f"{named} starts threads at import ({thread_count() - before} new); "
                f"a process with threads cannot be forked safely: {advice}"
            }
        devices = touched_devices()
        if devices:
            return {
                "error": f"{named} initialises {', '.join(devices)} at import; a forked "
                f"child cannot use an initialised device: {advice}"
            }
        poisoned = poisoned_fork()
        if poisoned:
            return {
                "error": f"{importing} poisons fork for {', '.join(poisoned)} "
                "(something asked the driver, e.g. torch.cuda.is_available()); a forked rank "
                f"could not use the device: {advice}"
            }
    # torch._dynamo's import sets TORCHINDUCTOR_CACHE_DIR to the folder it computed: pytest
    # compares a launch's environment with these too (launch/forked.py, fork_refusal)
    set_by_imports = {k: v for k, v in os.environ.items() if started_with.get(k) != v}
    return {
        "ready": True,
        "pid": os.getpid(),
        "modules": [*BASE_MODULES, *modules],
        "environ_set": set_by_imports,
    }


def _python_path(env: dict[str, str], cwd: str, tail: list[str]) -> list[str]:
    """sys.path of `python -m ...` started in `cwd` with `env`: the directory, PYTHONPATH,
    then the interpreter's own entries (stdlib, site-packages) as the server found them."""
    extra = [os.path.join(cwd, p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    return list(dict.fromkeys([cwd, *extra, *tail]))


def _interpreter_tail() -> list[str]:
    start = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    own = {os.path.abspath(p) for p in start if p} | {os.path.abspath(sys.path[0] or ".")}
    return [p for p in sys.path[1:] if os.path.abspath(p or ".") not in own]


class Server:
    def __init__(self, requests: Any, answers: Any) -> None:
        self.requests = requests
        self.answers = answers
        self.children: dict[int, Optional[int]] = {}
        self.tail = _interpreter_tail()

    def answer(self, message: dict[str, Any]) -> None:
        self.answers.write(json.dumps(message) + "\n")
        self.answers.flush()

    def serve(self) -> None:
        for line in self.requests:
            self.reap()
            try:
                request = json.loads(line)
                if request["op"] == "fork":
                    self.answer({"pid": self.fork(request)})
                elif request["op"] == "poll":
                    self.answer({"codes": {p: self.children.get(p) for p in request["pids"]}})
                else:
                    self.answer({"error": f"unknown request {request['op']!r}"})
            except (ValueError, KeyError, TypeError, OSError) as exc:
                self.answer({"error": f"{type(exc).__name__}: {exc}"})
        self.stop()

    def reap(self) -> None:
        for pid, code in list(self.children.items()):
            if code is not None:
                continue
            with contextlib.suppress(ChildProcessError):
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    self.children[pid] = _returncode(status)

    def stop(self) -> None:
        """pytest has gone: nothing it started may outlive it."""
        for pid, code in self.children.items():
            if code is None:
                with contextlib.suppress(OSError):
                    os.killpg(pid, signal.SIGKILL)

    def fork(self, request: dict[str, Any]) -> int:
        argv = [str(a) for a in request["argv"]]
        env = {str(k): str(v) for k, v in request["env"].items()}
        cwd, log = str(request["cwd"]), str(request["log"])
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            pid = os.fork()
            if pid == 0:
                self._child(argv, env, cwd, fd)  # never returns
        finally:
            os.close(fd)
        self.children[pid] = None
        return pid

    def _child(self, argv: list[str], env: dict[str, str], cwd: str, log_fd: int) -> None:
        code = 1
        try:
            os.setsid()
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.dup2(log_fd, 1)
            os.dup2(log_fd, 2)
            for fd in (null, log_fd, self.requests.fileno(), self.answers.fileno()):
                with contextlib.suppress(OSError):
                    os.close(fd)
            sys.stdin = open(os.devnull)  # noqa: SIM115 - the process's whole life
            sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
            sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            os.chdir(cwd)
            os.environ.clear()
            os.environ.update(env)
            _forget_environment_caches()
            sys.path[:] = _python_path(env, cwd, self.tail)
            sys.path_importer_cache.clear()
            importlib.invalidate_caches()
            sys.argv = [sys.argv[0], *argv]
            keep_process_groups()
            from . import bootstrap

            bootstrap.main(argv)  # leaves with os._exit
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
            if not isinstance(exc.code, int) and exc.code is not None:
                print(exc.code, file=sys.stderr)
        except BaseException:  # noqa: BLE001 - whatever it was, the log says it
            traceback.print_exc()
        finally:
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(code)


def _forget_environment_caches() -> None:
    """What the standard library read from the server's environment and keeps: the rank reads
    it again from its own (a launch's `env={"TMPDIR": ...}` names where `tempfile` writes)."""
    import tempfile

    tempfile.tempdir = None


KEPT_GROUPS: list[object] = []
"""The process groups a forked rank destroyed, alive until it leaves (`keep_process_groups`)."""


def keep_process_groups() -> None:
    """Make `destroy_process_group()` keep the groups it destroys alive until the rank leaves
    (with `os._exit`, which runs no destructor), so `~ProcessGroupGloo` never runs.

    Why: every collective that DDP starts inside `backward()` captures the thread's
    `at::ThreadLocalState`, which holds the Python context that
    `torch.autograd.graph._engine_run_backward` stashes in the thread (`_stash_obj_in_tls`).
    The gloo worker thread (`pt_gloo_runloop`) that runs the collective often drops the last
    reference to it, and freeing it takes the GIL (`SafePyObject`). If the trainer's main
    thread, holding the GIL, frees the last reference to the process group first (a DDP module
    going out of scope after `destroy_process_group()`), `~ProcessGroupGloo` joins that worker
    thread while it waits for the GIL: a deadlock, for good (seen with gdb: main thread in
    `std::thread::join` under `~ProcessGroupGloo`, the worker in `take_gil` under
    `~AsyncAllreduceWork`). A rank that does not import `torch._dynamo` at its first step
    gets there too late to meet it; a forked rank, with dynamo imported by the server, met it
    in 2-3 of 15 two-rank launches of examples/minimal. Destroying a group still does all it
    did (the group leaves every registry, its name can be reused); only the C++ object and its
    idle threads live until the process ends, as they do in a trainer that never destroys."""
    try:
        import torch.distributed as dist
        from torch.distributed import distributed_c10d
    except ImportError:
        return
    if not dist.is_available():
        return
    real = distributed_c10d.destroy_process_group
    if getattr(real, "keeps_groups", False):
        return

    @functools.wraps(real)
    def destroy_process_group(group: Optional[Any] = None) -> None:
        world = getattr(distributed_c10d, "_world", None)
        if group is not None:
            KEPT_GROUPS.append(group)
        elif world is not None:
            KEPT_GROUPS.extend(list(world.pg_map))
        real(group)

    destroy_process_group.keeps_groups = True  # type: ignore[attr-defined]
    distributed_c10d.destroy_process_group = destroy_process_group
    dist.destroy_process_group = destroy_process_group


def _returncode(status: int) -> int:
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def main(modules: list[str]) -> None:
    # The protocol gets fds of its own: stdout (fd 1) becomes the server's log, so nothing a
    # preloaded module prints can corrupt an answer.
    requests = os.fdopen(os.dup(0), "r", encoding="utf-8")
    answers = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    if os.getppid() == 1:
        os._exit(1)  # pytest died before PR_SET_PDEATHSIG took effect
    server = Server(requests, answers)
    first = preload(modules)
    server.answer(first)
    if "error" not in first:
        server.serve()
    # pytest waits for this exit at the end of its session; tearing down an interpreter that
    # has imported torch costs over half a second, and nothing of it is needed
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    # run as the package's module, not as __main__: a forked rank that imports this module
    # (its KEPT_GROUPS, say) then finds the server's, not a second copy
    from pytest_resume_equiv.rank import forkserver

    forkserver.main([m for m in sys.argv[1:] if m])
