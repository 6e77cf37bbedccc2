"""The doctor's own launches, through the plugin's launch machinery (`launch/running.py`, the
fork server, device leases): one backend probe per process-group backend, and two plain runs
of the tiny trainer for the determinism rows. Each launch has a timeout: a backend that does
not come up or a rank that does not leave after `destroy_process_group` is a failed row with
the rank's stack, never a wait without end.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import dataclass, field
from typing import Any, Optional

from ..errors import ResumeEquivError
from ..launch.devices import Device
from ..launch.forked import Forked, ForkServer
from ..launch.resources import LeaseWait, with_lease
from ..launch.running import LaunchResult, LaunchSpec, RunningLaunch, Target, terminate_as_interrupt
from ..plan import DEFAULT_SEED
from ..rank.launch_context import LaunchContext
from .ranks import BACKEND_ENV, STEPS_ENV, all_reduce, probe_path, train
from .rows import FAIL, OK, WARN, Row

PROBE = Target("call", f"{all_reduce.__module__}:{all_reduce.__name__}")
TRAINER = Target("call", f"{train.__module__}:{train.__name__}")
REPEAT_STEPS = 4

BACKEND_FIXES = {
    "nccl": "NCCL_DEBUG=INFO shows where it stops; check the driver and NCCL versions "
    "(nvidia-smi, torch.cuda.nccl.version()), and NCCL_P2P_DISABLE=1 / NCCL_SHM_DISABLE=1 "
    "inside containers without shared memory",
    "hccl": "check CANN's environment (source set_env.sh), npu-smi info, and HCCL_CONNECT_TIMEOUT; "
    "ASCEND_GLOBAL_LOG_LEVEL=1 shows where HCCL stops",
    "xccl": "check the oneCCL and Level Zero runtimes (sycl-ls); CCL_LOG_LEVEL=info shows where "
    "it stops",
    "gloo": "gloo needs a loopback interface: GLOO_SOCKET_IFNAME=lo; check that localhost "
    "resolves (getent hosts localhost)",
}


@dataclass
class Ran:
    """One doctor launch: its result (None when it could not start, `error` says why),
    whether the fork server forked its ranks, and when it ended (wall clock)."""

    name: str
    result: Optional[LaunchResult]
    forked: bool = False
    error: str = ""
    ended: float = 0.0
    probes: dict[int, dict[str, Any]] = field(default_factory=dict)
    """What each probe rank wrote (rank -> JSON): the all-reduce's sum, when it tore down."""


class Launches:
    """Starts the doctor's launches of `nproc` ranks on `device`, each in its own run
    directory under `root`, leasing its devices as a test's launch would."""

    def __init__(
        self,
        root: str,
        device: Device,
        nproc: int,
        timeout: float,
        lock_dir: Optional[str] = None,
    ) -> None:
        self.root = root
        self.device = device
        self.nproc = nproc
        self.timeout = timeout
        self.lock_dir = lock_dir
        self.done: list[Ran] = []

    def run(self, name: str, target: Target, env: dict[str, str], backend: str = "") -> Ran:
        run_dir = os.path.join(self.root, name)
        context = LaunchContext(
            "launch", run_dir, self.device.kind, backend or self.device.backend, seed=DEFAULT_SEED
        )
        spec = LaunchSpec(
            name, target, run_dir, self.nproc, 1, self.timeout, context, env, fork_server=True
        )
        lease = None
        ran = Ran(name, None)
        try:
            if self.device.kind != "cpu":
                lease = LeaseWait(self.device, self.nproc, self.timeout, name, self.lock_dir).wait()
            with terminate_as_interrupt():
                running = RunningLaunch(with_lease(spec, lease))
                try:
                    ran.result = running.wait()
                finally:
                    running.kill()
            ran.forked = isinstance(running.agents, Forked)
        except ResumeEquivError as exc:
            ran.error = str(exc)
        finally:
            ran.ended = time.time()
            if lease is not None:
                lease.release()
        ran.probes = _probes(run_dir, self.nproc)
        self.done.append(ran)
        return ran


def _probes(run_dir: str, nproc: int) -> dict[int, dict[str, Any]]:
    found = {}
    for rank in range(nproc):
        with contextlib.suppress(OSError, ValueError):
            with open(probe_path(run_dir, rank), encoding="utf-8") as f:
                found[rank] = json.load(f)
    return found


def _rank_problems(result: LaunchResult) -> str:
    bad = [r for r in result.ranks if not r.ok]
    return "; ".join(
        f"rank {r.rank}: {r.status}{f' ({r.detail})' if r.detail else ''}" for r in bad
    )


def backend_rows(launches: Launches, backends: list[str], probe: Target = PROBE) -> list[Row]:
    """Each backend in a process group of `nproc` ranks with one all-reduce."""
    rows = []
    for backend in backends:
        ran = launches.run(f"backend-{backend}", probe, {BACKEND_ENV: backend}, backend)
        rows.append(_backend_row(backend, ran, launches.nproc))
    return rows


def _backend_row(backend: str, ran: Ran, nproc: int) -> Row:
    expected = float(nproc * (nproc + 1) // 2)
    fix = BACKEND_FIXES.get(backend, "")
    result = ran.result
    if result is None:
        return Row("backends", backend, FAIL, f"the probe could not start: {ran.error}", fix)
    sums = {rank: p.get("sum") for rank, p in ran.probes.items()}
    if len(sums) == nproc and all(s == expected for s in sums.values()):
        seen = (
            f"{nproc} ranks initialised {backend} and all-reduced one tensor on "
            f"{ran.probes[0].get('device', '?')} (sum {expected:g} on every rank) in "
            f"{result.duration:.1f}s"
        )
        return Row("backends", backend, OK, seen)
    wrong = {r: s for r, s in sums.items() if s != expected}
    if wrong:
        seen = ", ".join(f"rank {r} got {s}" for r, s in sorted(wrong.items()))
        return Row(
            "backends", backend, FAIL, f"all-reduce is wrong: {seen} (expected {expected:g})", fix
        )
    missing = [r for r in range(nproc) if r not in sums]
    how = (
        f"hung for {result.spec.timeout:g}s (the launch timeout)" if result.timed_out else "failed"
    )
    return Row(
        "backends",
        backend,
        FAIL,
        f"{how} before rank(s) {', '.join(map(str, missing))} had all-reduced: "
        f"{_rank_problems(result) or result.tail(result.rank_log(missing[0])).strip()[-300:]}",
        fix,
    )


def teardown_rows(launches: Launches) -> list[Row]:
    """Every rank of every doctor launch left within its timeout after
    `destroy_process_group`; a rank that finished and then died on its way out is a warning
    (the plugin warns too, and fails with --resume-equiv-strict-shutdown)."""
    started = [ran for ran in launches.done if ran.result is not None]
    if not started:
        return [
            Row(
                "teardown",
                "exit after destroy",
                FAIL,
                "no launch started, so no rank could be seen leaving",
                "see the failed rows above",
            )
        ]
    hung, died, latencies = [], [], []
    for ran in started:
        result = ran.result
        assert result is not None
        if result.timed_out:
            for outcome in result.ranks:
                if outcome.ok:
                    continue
                probe = ran.probes.get(outcome.rank, {})
                where = "after destroy_process_group" if "destroyed" in probe else "before it"
                hung.append(
                    f"{ran.name} rank {outcome.rank} ({where}; {outcome.detail or 'no stack'})"
                )
            continue
        died += [f"{ran.name} rank {o.rank} ({o.detail})" for o in result.shutdown_deaths]
        destroyed = [p["destroyed"] for p in ran.probes.values() if "destroyed" in p]
        if destroyed and result.ok:
            latencies.append(max(0.0, ran.ended - max(destroyed)))
    if hung:
        return [
            Row(
                "teardown",
                "exit after destroy",
                FAIL,
                f"did not exit within the launch timeout ({launches.timeout:g}s): "
                + "; ".join(hung),
                "a rank stuck in a gloo/NCCL destructor hangs every test that launches it: "
                "update torch, set TORCH_NCCL_ASYNC_ERROR_HANDLING=1, and rerun with "
                "--timeout to see whether it is slow or stuck",
            )
        ]
    if died:
        return [
            Row(
                "teardown",
                "exit after destroy",
                WARN,
                "finished, then died in interpreter shutdown: " + "; ".join(died),
                "tests still judge (with a ResumeEquivWarning); "
                "--resume-equiv-strict-shutdown makes it a failure",
            )
        ]
    slowest = f" (slowest {max(latencies):.2f}s after destroy_process_group)" if latencies else ""
    seen = f"every rank of {len(started)} launch(es) exited within its timeout{slowest}"
    return [Row("teardown", "exit after destroy", OK, seen)]


def fork_server_row(launches: Launches) -> Row:
    """The fork server started and forked the launches' ranks; it leaves when asked."""
    refused = [ran for ran in launches.done if "fork server" in ran.error]
    if refused:
        return Row(
            "teardown",
            "fork server",
            FAIL,
            refused[0].error,
            "run with --resume-equiv-fork-server=off (every rank starts as torchrun would, "
            "about 2 s slower per launch)",
        )
    plain = [ran for ran in launches.done if ran.result is not None and not ran.forked]
    if plain:
        note = plain[0].result.note if plain[0].result is not None else ""
        return Row(
            "teardown",
            "fork server",
            WARN,
            f"{plain[0].name} started without the fork server{f': {note}' if note else ''}",
            "launches still run, each paying import torch per rank",
        )
    forked = [ran for ran in launches.done if ran.forked]
    server = ForkServer.running.get(())
    pid = f" (pid {server.proc.pid})" if server is not None else ""
    if not forked:
        return Row("teardown", "fork server", FAIL, "no launch was forked", "see the rows above")
    return Row(
        "teardown",
        "fork server",
        OK,
        f"started{pid} and forked the ranks of {len(forked)} launch(es)",
    )


def stop_fork_server() -> Optional[Row]:
    """Stop this process's fork servers; a row only when one would not leave."""
    servers = list(ForkServer.running.values())
    ForkServer.stop_all()
    stuck = [
        s.proc.pid for s in servers if s.proc.returncode not in (0, None) and s.proc.returncode < 0
    ]
    if stuck:
        return Row(
            "teardown",
            "fork server exit",
            WARN,
            f"the fork server (pid {stuck[0]}) did not leave when asked and was killed",
            "nothing is left running; report it with the doctor's JSON",
        )
    return None


def repeat(launches: Launches, trainer: Target = TRAINER) -> list[Ran]:
    """Two uninterrupted runs of the tiny trainer, each in fresh processes."""
    env = {STEPS_ENV: str(REPEAT_STEPS)}
    return [launches.run(f"repeat-{n}", trainer, env) for n in (1, 2)]
