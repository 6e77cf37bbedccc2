"""A throwaway Slurm cluster on localhost, for testing a Slurm launcher without a real cluster.

``LocalSlurmCluster(root)`` writes a munge key and a ``slurm.conf`` into ``root``, starts one
``munged``, one ``slurmctld`` and one ``slurmd`` per node (all on 127.0.0.1, each on its own
free port), and waits until ``sinfo`` shows every node idle. Client commands (``srun``,
``sbatch``, ``scancel``, ...) reach it through ``SLURM_CONF``: merge ``cluster.env`` into
their environment, or use ``cluster.client_env()``. Nothing touches ``/etc`` or ``/run``, so
several clusters can run at once in different roots.

Pure stdlib and no pytest import, so the same file serves a fixture and a shell session::

    python tests/slurm_cluster.py /tmp/slurm    # prints `export SLURM_CONF=...`, Ctrl-C stops

Written against Slurm 22.05 and MUNGE 0.5 (Debian 12: ``apt-get install -y slurm-wlm munge``).
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Optional

INSTALL_HINT = "apt-get install -y slurm-wlm munge"
REQUIRED_PROGRAMS = ("slurmctld", "slurmd", "srun", "sinfo", "munged")
SBIN_DIRS = ("/usr/sbin", "/usr/local/sbin", "/sbin")
"""Daemons live in sbin, which a non-login PATH (CI runners, containers) often lacks."""

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
KILL_WAIT_S = 5
"""Seconds slurmd waits between SIGTERM and SIGKILL of a cancelled step (Slurm's default is
30, which would make every cancellation test wait half a minute)."""

MARKER_VAR = "LOCAL_SLURM_CLUSTER_ID"
"""Set only in the daemons' environment; slurmstepd inherits it, so ``stop()`` can find step
daemons that left slurmd's process group without killing anything of another cluster."""


def find_program(name: str) -> Optional[str]:
    """Path of ``name`` on PATH or in the sbin directories, else None."""
    return shutil.which(name) or shutil.which(name, path=os.pathsep.join(SBIN_DIRS))


def slurm_available() -> Optional[str]:
    """None when the Slurm and MUNGE programs are installed, else a one-line reason to skip."""
    missing = [name for name in REQUIRED_PROGRAMS if find_program(name) is None]
    if not missing:
        return None
    return f"Slurm not installed (missing {', '.join(missing)}); install with: {INSTALL_HINT}"


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports that were free a moment ago.

    All sockets stay bound until every port is picked, so the kernel cannot hand out the same
    port twice; another process may still take one before the daemons bind it (rare).
    """
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def tail(path: Path, lines: int = 20) -> str:
    """Last ``lines`` lines of a log file, or a note that it does not exist."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"--- {path.name}: (missing)"
    return f"--- {path.name}:\n" + "\n".join(text.splitlines()[-lines:])


def read_environ(pid: int) -> dict[str, str]:
    """The environment a process was started with (empty when it is gone or unreadable)."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {key.decode(errors="replace"): value.decode(errors="replace") for key, value in pairs}


def pids_with_env(name: str, value: str) -> list[int]:
    """Pids of processes (other than this one) started with ``name=value`` in their environment."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            if read_environ(int(entry.name)).get(name) == value:
                found.append(int(entry.name))
    return found


def pid_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


class LocalSlurmCluster:
    """``nodes`` Slurm nodes (``n1``, ``n2``, ...) on 127.0.0.1, configured and run from ``root``.

    Use as a context manager, or call ``start()`` and ``stop()``; ``stop()`` is idempotent
    and leaves no daemon, step daemon or task of this cluster running.
    """

    def __init__(self, root: str, nodes: int = 2, cpus_per_node: int = 1) -> None:
        self.root = Path(root).resolve()
        self.nodes = nodes
        self.cpus_per_node = cpus_per_node
        self.node_names = [f"n{i}" for i in range(1, nodes + 1)]
        self.conf_path = self.root / "slurm.conf"
        self.munge_socket = self.root / "munge.socket"
        self.marker = secrets.token_hex(8)
        self._daemons: dict[str, subprocess.Popen[bytes]] = {}

    @property
    def env(self) -> dict[str, str]:
        """What a client command needs on top of its environment (the munge socket is in the
        config, so the config path is all)."""
        return {"SLURM_CONF": str(self.conf_path)}

    def client_env(self) -> dict[str, str]:
        """This process's environment pointed at the cluster, without SLURM_* variables left
        over from an enclosing job (an inherited SLURM_JOB_ID would make srun try to run a
        step in a job this cluster has never heard of)."""
        env = {key: value for key, value in os.environ.items() if not key.startswith("SLURM_")}
        env.update(self.env)
        return env

    # --- configuration -------------------------------------------------------------------

    def write_files(self) -> None:
        """Create ``root`` (0700: munged refuses a key or socket in a directory others can
        write), the munge key, empty state, spool and log directories, and ``slurm.conf``.

        State and logs of an earlier cluster in the same root are removed: slurmctld refuses
        state saved under another ClusterName, and old log lines would mislead.
        """
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.root.chmod(0o700)
        for sub in ("state", "spool", "log"):
            shutil.rmtree(self.root / sub, ignore_errors=True)
        for sub in ("state", "log", *(f"spool/{name}" for name in self.node_names)):
            (self.root / sub).mkdir(mode=0o700, parents=True)
        key = self.root / "munge.key"
        if not key.exists():
            key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o400)
        os.chown(key, os.getuid(), os.getgid())
        (self.root / "plugstack.conf").write_text("")
        self.conf_path.write_text(self.slurm_conf())

    def slurm_conf(self) -> str:
        """The ``slurm.conf`` text: every path under ``root``, every port freshly picked."""
        user = pwd.getpwuid(os.getuid()).pw_name
        ctld_port, *node_ports = free_ports(1 + self.nodes)
        r = self.root
        lines = [
            f"ClusterName=local{self.marker[:6]}",
            "SlurmctldHost=localhost",
            f"SlurmctldPort={ctld_port}",
            # as root, tasks may run as any user; as anyone else, only as that user
            f"SlurmUser={user}",
            f"SlurmdUser={user}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            "ProctrackType=proctrack/linuxproc",  # no cgroups: works in containers
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "MpiDefault=none",
            "ReturnToService=2",
            f"KillWait={KILL_WAIT_S}",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "MailProg=/bin/true",
            # trust CPUs= even beyond the hardware, instead of draining the node
            "SlurmdParameters=config_overrides",
            # the system plugstack.conf may load SPANK plugins the test does not want
            f"PlugStackConfig={r}/plugstack.conf",
            f"StateSaveLocation={r}/state",
            f"SlurmdSpoolDir={r}/spool/%n",
            f"SlurmctldPidFile={r}/slurmctld.pid",
            f"SlurmdPidFile={r}/slurmd-%n.pid",
            f"SlurmctldLogFile={r}/log/slurmctld.log",
            f"SlurmdLogFile={r}/log/slurmd-%n.log",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
        ]
        for name, port in zip(self.node_names, node_ports):
            lines.append(
                f"NodeName={name} NodeAddr=127.0.0.1 Port={port} CPUs={self.cpus_per_node}"
                " RealMemory=1000 State=UNKNOWN"
            )
        nodes = ",".join(self.node_names)
        lines.append(f"PartitionName=local Nodes={nodes} Default=YES MaxTime=INFINITE State=UP")
        return "\n".join(lines) + "\n"

    # --- daemons -------------------------------------------------------------------------

    def daemon_env(self) -> dict[str, str]:
        """The client environment plus the marker that ``stop()`` sweeps for."""
        return {**self.client_env(), MARKER_VAR: self.marker}

    def spawn(self, name: str, argv: list[str]) -> None:
        """Run one daemon in the foreground of its own session (so its process group can be
        signalled as a whole), its stdout and stderr in ``log/<name>.out``."""
        with open(self.root / "log" / f"{name}.out", "wb") as out:
            self._daemons[name] = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.daemon_env(),
                cwd=self.root,
                start_new_session=True,
            )

    def start_munged(self) -> None:
        """munged, on a socket of its own. ``--force``: munged refuses a socket whose directory
        is not searchable by everyone, and ``root`` is 0700 (only this user's clients need it)."""
        r = self.root
        self.spawn(
            "munged",
            [
                str(find_program("munged")),
                "--foreground",
                "--force",
                f"--key-file={r}/munge.key",
                f"--socket={self.munge_socket}",
                f"--pid-file={r}/munged.pid",
                f"--log-file={r}/log/munged.log",
                f"--seed-file={r}/munged.seed",
            ],
        )
        self.wait_for(lambda: self.munge_socket.exists(), "munged socket")

    def start_slurm(self) -> None:
        """slurmctld, then one slurmd per node (they register with slurmctld when it is up)."""
        conf = str(self.conf_path)
        self.spawn("slurmctld", [str(find_program("slurmctld")), "-D", "-f", conf])
        slurmd = str(find_program("slurmd"))
        for name in self.node_names:
            self.spawn(f"slurmd-{name}", [slurmd, "-D", "-f", conf, "-N", name])

    def node_states(self) -> dict[str, str]:
        """``{node: state}`` as sinfo reports it (empty while slurmctld does not answer)."""
        result = subprocess.run(
            [str(find_program("sinfo")), "-h", "-N", "-o", "%N %T"],
            env=self.client_env(),
            capture_output=True,
            text=True,
            timeout=10,
        )
        if result.returncode != 0:
            return {}
        return dict(line.split()[:2] for line in result.stdout.splitlines() if line.strip())

    def all_idle(self) -> bool:
        """True once every node is idle, failing early when a daemon has died."""
        for name, proc in self._daemons.items():
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with status {proc.returncode}")
        states = self.node_states()
        return all(states.get(name) == "idle" for name in self.node_names)

    def wait_for(
        self, ready: Callable[[], bool], what: str, timeout: float = START_TIMEOUT_S
    ) -> None:
        """Poll ``ready()`` until it is true; RuntimeError after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while not ready():
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")
            time.sleep(0.2)

    def logs(self) -> str:
        """Tails of every daemon's stderr, for an error message. In the foreground the daemons
        copy their log lines there, and it also holds the errors from before a log was open."""
        files = sorted((self.root / "log").glob("*.out"))
        return "\n".join([*(tail(path) for path in files), f"(full logs in {self.root}/log)"])

    def start(self) -> LocalSlurmCluster:
        """Write the files, start the daemons and wait until every node is idle.

        On failure everything started so far is stopped and RuntimeError carries the logs.
        """
        if self._daemons:
            raise RuntimeError("cluster already started")
        try:
            self.write_files()
            self.start_munged()
            self.start_slurm()
            self.wait_for(self.all_idle, f"nodes {','.join(self.node_names)} to be idle")
        except Exception as exc:
            logs = self.logs()
            self.stop()
            raise RuntimeError(f"local Slurm cluster did not start: {exc}\n{logs}") from exc
        return self

    def cancel_jobs(self) -> None:
        """Cancel every job and give slurmd a moment to end the steps cleanly, so tasks are
        killed by their step daemon rather than orphaned by a killed one."""
        scancel = find_program("scancel")
        slurmctld = self._daemons.get("slurmctld")
        if scancel is None or slurmctld is None or slurmctld.poll() is not None:
            return
        env = self.client_env()
        user = pwd.getpwuid(os.getuid()).pw_name
        subprocess.run([scancel, "-u", user], env=env, capture_output=True, timeout=10)
        squeue = str(find_program("squeue"))

        def queue_empty() -> bool:
            out = subprocess.run([squeue, "-h"], env=env, capture_output=True, timeout=10)
            return out.returncode != 0 or not out.stdout.strip()

        try:
            self.wait_for(queue_empty, "jobs to end", timeout=KILL_WAIT_S + 5)
        except RuntimeError:
            pass  # the sweep in stop() kills whatever is left

    def stop(self) -> None:
        """Cancel jobs, SIGTERM every daemon's process group, SIGKILL what outlives
        ``STOP_TIMEOUT_S``, then kill any step daemon that escaped. Safe to call twice."""
        if not self._daemons:
            return
        try:
            self.cancel_jobs()
        except (OSError, subprocess.SubprocessError):
            pass
        # slurmds, then slurmctld, then munged: each talks to the next while it shuts down
        order = sorted(self._daemons, key=lambda n: (n == "munged", n == "slurmctld"))
        for name in order:
            stop_process_group(self._daemons.pop(name))
        self.sweep()

    def sweep(self) -> None:
        """SIGKILL leftover processes of this cluster: step daemons (which carry the marker)
        and tasks of its jobs (started with this SLURM_CONF and a SLURM_JOB_ID)."""
        conf = str(self.conf_path)
        pids = set(pids_with_env(MARKER_VAR, self.marker))
        pids.update(
            pid for pid in pids_with_env("SLURM_CONF", conf) if "SLURM_JOB_ID" in read_environ(pid)
        )
        pids -= ancestors()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while any(pid_alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.05)

    def __enter__(self) -> LocalSlurmCluster:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def stop_process_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the group ``proc`` leads, SIGKILL it after ``STOP_TIMEOUT_S``, reap ``proc``,
    then SIGKILL whatever else is still in the group."""
    signal_group(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        signal_group(proc.pid, signal.SIGKILL)
        proc.wait()
    signal_group(proc.pid, signal.SIGKILL)


def signal_group(pid: int, sig: signal.Signals) -> None:
    """Send ``sig`` to the process group led by ``pid``; a group already gone is fine."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def ancestors() -> set[int]:
    """This process and its ancestors: never swept, even if started inside a job."""
    pids = set()
    pid = os.getpid()
    while pid > 1:
        pids.add(pid)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    return pids


def interrupt(signum: int, frame: object) -> None:
    """SIGTERM handler: raise KeyboardInterrupt, so SIGTERM and SIGINT stop the cluster alike."""
    raise KeyboardInterrupt


def main(argv: list[str]) -> int:
    """``slurm_cluster.py ROOT [NODES [CPUS_PER_NODE]]``: run a cluster until SIGTERM/SIGINT."""
    if not 2 <= len(argv) <= 4:
        print(main.__doc__, file=sys.stderr)
        return 2
    reason = slurm_available()
    if reason:
        print(reason, file=sys.stderr)
        return 1
    nodes = int(argv[2]) if len(argv) > 2 else 2
    cpus = int(argv[3]) if len(argv) > 3 else 1
    cluster = LocalSlurmCluster(argv[1], nodes=nodes, cpus_per_node=cpus)
    signal.signal(signal.SIGTERM, interrupt)
    started = time.monotonic()
    try:
        cluster.start()
        print(f"# started {nodes} nodes in {time.monotonic() - started:.1f} s", flush=True)
        print(f"export SLURM_CONF={cluster.conf_path}", flush=True)
        while True:
            signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        started = time.monotonic()
        cluster.stop()
        print(f"# stopped in {time.monotonic() - started:.1f} s", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
