"""crash_mode="preempt": the grace between the SIGTERM and the SIGKILL, kept by a watchdog
process of its own, so it holds whatever the ranks do (the rank that sent the SIGTERM may
exit first, or hang in its handler).

The rank that reaches the point starts the watchdog (`start`), then SIGTERMs every rank of its
host. The watchdog runs this file as a script (the standard library only: no torch, no
package import), in a session of its own, so the SIGKILL of a rank's process group never
reaches it. It polls the ranks; once none runs it writes what it saw and leaves; at the
deadline it writes which ranks still ran, asks each for its Python stacks (SIGUSR1: the
bootstrap's faulthandler writes them into the rank's stderr log), and SIGKILLs each rank and
its process group. It lives at most the grace and a fraction of a second more.

What it writes (`status/preempted.json`, JSON): `grace`, `killed` (the ranks killed at the
deadline, [] when every one had exited), `exited_s` (seconds from the SIGTERM until the last
rank was gone, when every one had exited).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

POLL = 0.01
"""Seconds between two looks at the ranks."""
STACKS_WAIT = 0.2
"""Seconds the ranks get to dump their stacks before the SIGKILL."""


def outcome_path(run_dir: str) -> str:
    """Where the watchdog says how the grace ended."""
    return os.path.join(run_dir, "status", "preempted.json")


def start(run_dir: str, pids: dict[int, int], grace: float, sent: float) -> None:
    """Start the watchdog for the ranks `pids` (rank -> pid) of this host, for `grace` seconds
    from `sent` (`time.monotonic()`, the same clock in every process of the host)."""
    argv = [sys.executable, "-I", "-S", os.path.abspath(__file__), run_dir, json.dumps(pids)]
    argv += [repr(grace), repr(sent)]
    subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        close_fds=True,
        start_new_session=True,
    )


def running(pid: int) -> bool:
    """Whether `pid` runs (a zombie has ended: its parent has yet to reap it)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[-1].split()[0]
        return state not in (b"Z", b"X")
    except FileNotFoundError:
        return False
    except OSError:  # no /proc
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True


def _write(run_dir: str, outcome: dict) -> None:
    path = outcome_path(run_dir)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(outcome, f)
    os.replace(path + ".tmp", path)


def _signal(pid: int, sig: int, group: bool) -> None:
    for send in (os.killpg, os.kill) if group else (os.kill,):
        try:
            send(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def watch(run_dir: str, pids: dict[int, int], grace: float, sent: float) -> dict:
    """Wait for the ranks until `sent + grace`; SIGKILL those still running then."""
    deadline = sent + grace
    while True:
        alive = sorted(rank for rank, pid in pids.items() if running(pid))
        now = time.monotonic()
        if not alive:
            outcome = {"grace": grace, "killed": [], "exited_s": round(now - sent, 3)}
            _write(run_dir, outcome)
            return outcome
        if now >= deadline:
            break
        time.sleep(min(POLL, max(0.0, deadline - now)))
    outcome = {"grace": grace, "killed": alive}
    _write(run_dir, outcome)  # before the kill: whoever sees the ranks gone finds it
    for rank in alive:
        _signal(pids[rank], signal.SIGUSR1, group=False)
    time.sleep(STACKS_WAIT)
    for rank in alive:
        _signal(pids[rank], signal.SIGKILL, group=True)
    return outcome


def main(argv: list[str]) -> None:
    run_dir, pids, grace, sent = argv
    ranks = {int(rank): int(pid) for rank, pid in json.loads(pids).items()}
    watch(run_dir, ranks, float(grace), float(sent))


if __name__ == "__main__":
    main(sys.argv[1:])
