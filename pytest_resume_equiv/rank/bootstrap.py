"""Entry point of every rank the plugin launches: `python -m pytest_resume_equiv.rank.bootstrap`.

It gives each rank its own log files, a pid file (so the plugin can kill ranks that torchrun
puts in their own sessions), a stack dump on SIGUSR1 (for hangs), a status file saying how
the user's code ended, and then runs the user's script, module or function unchanged.
"""

from __future__ import annotations

import atexit
import dataclasses
import faulthandler
import importlib
import os
import runpy
import signal
import socket
import sys
import threading
import time
import traceback
import weakref
from typing import Any, Callable

from .context import RankState, RunContext, reset
from .launch_context import CONTEXT_ENV
from .run_dir import (
    RankStatus,
    log_path,
    read_pids,
    stacks_requested,
    status_path,
    store_port_path,
    write_pid,
    write_status,
)
from .timings import ProcessGroupTimer, enabled, mark
from .wrapping import failure_of


def _die_with_parent() -> None:
    # torchrun starts workers in new sessions; if the agent is SIGKILLed they would outlive
    # it. PR_SET_PDEATHSIG makes the kernel kill this rank when its parent goes away.
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:
        os._exit(1)


def _redirect_output(run_dir: str, rank: int) -> Any:
    os.makedirs(os.path.dirname(log_path(run_dir, rank, "stdout")), mode=0o700, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    for fd, stream in ((1, "stdout"), (2, "stderr")):
        target = os.open(
            log_path(run_dir, rank, stream), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600
        )
        os.dup2(target, fd)
        os.close(target)
    sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
    sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)
    return sys.stderr


def _wait_for_gate(ctx: RunContext) -> None:
    """A prestarted rank waits here, torch imported, until the launch it depends on (the one
    that writes its checkpoint) has exited."""
    while ctx.gate and not os.path.exists(ctx.gate):
        time.sleep(0.005)


def _watch_owner(ctx: RunContext) -> None:
    """If the pytest process that started this launch is gone (SIGKILLed, say), nobody will
    read this rank's results or kill it: leave, so torchrun's agent ends the others too. A
    rank on another host than pytest cannot see it (pytest's death ends srun, which ends the
    step); a rank of a Slurm launch dumps its stacks when the plugin asks through the run
    directory (a timeout)."""
    remote = ctx.owner_host not in (None, socket.gethostname())
    owner = None if remote else ctx.owner_pid
    if not owner and not ctx.stacks_by_file:
        return

    def watch() -> None:
        dumped = False
        while True:
            time.sleep(0.5)
            if ctx.stacks_by_file and not dumped and stacks_requested(ctx.run_dir):
                # SIGUSR1 to the main thread: faulthandler's handler dumps from there, so the
                # main thread's stack comes first, as when the plugin signals a local rank
                signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGUSR1)
                dumped = True
            if not owner:
                continue
            try:
                os.kill(int(owner), 0)
            except ProcessLookupError:
                os._exit(3)
            except PermissionError:
                pass

    threading.Thread(target=watch, name="resume-equiv-owner", daemon=True).start()


def _host_store(ctx: RunContext) -> Any:
    """What torchrun's agent does for its workers: hold a TCPStore on a port the kernel
    picked and still held (no other launch can take it), and tell `init_process_group`
    (env://) to join it as a client. Rank 0 holds it for the launch (the caller keeps it for
    the rank's whole life) and writes its port where the other ranks of a launch forked
    without an agent wait for it."""
    if not ctx.host_store:
        return None
    try:
        import datetime

        import torch.distributed as dist
    except ImportError:  # a trainer without torch needs no store
        return None
    if not dist.is_available():
        return None
    store = None
    if ctx.rank == 0:
        store = dist.TCPStore(
            "127.0.0.1",
            0,
            None,
            True,
            timeout=datetime.timedelta(minutes=30),
            wait_for_workers=False,
        )
        port = str(store.port)
        if ctx.world_size > 1:
            path = store_port_path(ctx.run_dir)
            with open(f"{path}.tmp", "w", encoding="utf-8") as f:
                f.write(port)
            os.replace(f"{path}.tmp", path)
    else:
        port = _wait_for_store_port(ctx)
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=port, TORCHELASTIC_USE_AGENT_STORE="True"
    )
    return store


def _wait_for_store_port(ctx: RunContext) -> str:
    """Rank 0's store port (the launch's timeout ends a wait for a rank 0 that died)."""
    path = store_port_path(ctx.run_dir)
    while True:
        try:
            with open(path, encoding="utf-8") as f:
                port = f.read().strip()
            if port:
                return port
        except FileNotFoundError:
            pass
        time.sleep(0.005)


def _resolve_callable(spec: str) -> Callable[..., Any]:
    module_name, _, qualname = spec.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _run_target(argv: list[str], ctx: RunContext) -> None:
    kind, target, args = argv[0], argv[1], argv[2:]
    if kind == "--call":
        fn = _resolve_callable(target)
        sys.argv = [target, *args]
        fn(ctx)
    elif kind == "--module":
        sys.argv = [target, *args]
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    elif kind == "--script":
        sys.argv = [target, *args]
        sys.path.insert(0, os.path.dirname(os.path.abspath(target)))
        runpy.run_path(target, run_name="__main__")
    else:
        raise SystemExit(f"pytest_resume_equiv.rank.bootstrap: unknown target kind {kind!r}")


def _start_recording(state: RankState, ctx: RunContext) -> None:
    """Before the user's code: audit every generator it creates, seed the global streams,
    log every restore call, watch for the resume point, and write the signature's header,
    so even a rank that never records leaves a file saying so."""
    state.install(seed=ctx.seed + ctx.rank)
    state.open()


def _run_user_code(argv: list[str], ctx: RunContext) -> RankStatus:
    """Run the target; how it ended, as the status file says it."""
    try:
        _run_target(argv, ctx)
    except SystemExit as exc:
        if exc.code in (None, 0):
            return RankStatus("ok")
        if not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
        code = exc.code if isinstance(exc.code, int) else 1
        return RankStatus("exit", code, str(exc.code))
    except BaseException as exc:
        tb = traceback.format_exc()
        print(tb, file=sys.stderr, end="")
        return RankStatus("error", 1, f"{type(exc).__name__}: {exc}", tb, failure_of(exc))
    return RankStatus("ok")


def main(argv: list[str]) -> None:
    """Run one rank: every piece of per-process state is made here (a fork server may call
    it in a child forked from a process that imported the package), starting with the rank
    state, made afresh from this process's environment."""
    _die_with_parent()
    state = reset()
    ctx = state.context
    if ctx is None:
        raise SystemExit(
            f"pytest_resume_equiv.rank.bootstrap runs only under the plugin ({CONTEXT_ENV} unset)"
        )
    rank = ctx.rank
    mark("rank.start", ctx.run_dir)
    err = _redirect_output(ctx.run_dir, rank)
    write_pid(ctx.run_dir, rank, os.getpid())
    faulthandler.enable(file=err, all_threads=True)
    faulthandler.register(signal.SIGUSR1, file=err, all_threads=True)
    _start_recording(state, ctx)
    timer = _time_phases(state, ctx)
    _watch_owner(ctx)
    _wait_for_gate(ctx)
    store = _host_store(ctx)
    mark("rank.user", ctx.run_dir)
    status = _run_user_code(argv, ctx)
    mark("rank.user_done", ctx.run_dir)
    status = dataclasses.replace(status, read=list(state.files.reads))
    state.finish()
    timer.uninstall()
    mark("rank.closed", ctx.run_dir)
    write_status(ctx.run_dir, rank, status)
    if ctx.host_store and ctx.world_size > 1 and status.status == "ok":
        _wait_for_peers(ctx)  # a failed rank leaves now: its peers may wait on it forever
    _leave(status.code, holding=store, run_dir=ctx.run_dir)


def _time_phases(state: RankState, ctx: RunContext) -> ProcessGroupTimer:
    """With `RESUME_EQUIV_TIMINGS` set (a benchmark): the rank's phases marked, its
    `init_process_group` and its first optimizer step included (rank/timings.py)."""
    mark("rank.installed", ctx.run_dir)
    timer = ProcessGroupTimer(ctx.run_dir)
    timer.install()
    auto = state.auto
    if enabled() and auto is not None and auto.first_step_seen is not None:
        first = auto.first_step_seen

        def first_step() -> None:
            mark("rank.first_step", ctx.run_dir)
            first()

        auto.first_step_seen = first_step
    return timer


def _wait_for_peers(ctx: RunContext, limit: float = 60.0) -> None:
    """In a launch without an agent every rank stays until every other rank has ended its
    work (a status file) or gone (at most `limit` seconds): rank 0 holds the store, as
    torchrun's agent keeps it, and no rank closes its connections under a peer that is
    still tearing its process group down."""
    deadline = time.monotonic() + limit
    others = [r for r in range(ctx.world_size) if r != ctx.rank]
    while time.monotonic() < deadline:
        pids = read_pids(ctx.run_dir)
        waiting = [
            r
            for r in others
            if not os.path.exists(status_path(ctx.run_dir, r)) and _alive(pids.get(r))
        ]
        if not waiting:
            return
        time.sleep(0.01)


def _alive(pid: Any) -> bool:
    if pid is None:
        return True  # not started yet
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _skip_operator_teardown() -> None:
    """torch registers a weakref finalizer per operator library it defines
    (`torch.library._del_library`, 174 at import), run at exit to deregister each one: 40-80
    ms of every rank's exit (benchmarks/bench_phases.py), for a process that `os._exit`s right
    after. Detached here; every other exit handler (the user's, the signature's) still runs."""
    library = sys.modules.get("torch.library")
    teardown = getattr(library, "_del_library", None)
    registry = getattr(weakref.finalize, "_registry", None)
    if teardown is None or not isinstance(registry, dict):
        return
    for finalizer, info in list(registry.items()):
        if getattr(info, "func", None) is teardown:
            finalizer.detach()


def _leave(code: int, holding: Any, run_dir: str = "") -> None:
    """Leave without interpreter teardown: the work is done and recorded, and gloo/NCCL
    threads aborting in C++ static destructors (SIGABRT, "terminate called without an active
    exception") would otherwise turn a finished rank into a failed launch. `holding` (the
    rendezvous store of a one-rank launch) lives until the process ends."""
    try:
        _skip_operator_teardown()
        atexit._run_exitfuncs()
        mark("rank.exit", run_dir)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


if __name__ == "__main__":
    main(sys.argv[1:])
