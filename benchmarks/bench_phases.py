"""Where the time of a 15-case session goes, phase by phase, against the in-process floor.

The session: one trainer in 15 cases (benchmarks/phase_cases.py: 5 controls, 10 resume bugs),
function mode, 1 rank, 8 steps, split at 3, one pytest process, the fork server on. The
floor: the same 15 cases in one process by a plain loop that trains, saves to memory, loads
and compares (what an in-process tool does), timed as a whole process too (its interpreter
and torch import included, as the session's are).

Every launch and rank marks its phases in a timings file (`RESUME_EQUIV_TIMINGS`,
pytest_resume_equiv/rank/timings.py); the table gives each phase's median per launch and its
sum over the session, and the session's wall time apart: pytest and the plugin before the
first launch, the launches, and what is left between them.

    python benchmarks/bench_phases.py [--repeat 3] [--device cuda]

With `--device cuda` (a lent accelerator) the cases train on the GPU and the session runs with
`--resume-equiv-device=cuda`: the phase "user code to its first optimizer step" then holds
each rank's CUDA context creation and first kernels, the GPU floor of a launch.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections import defaultdict

from common import ROOT, machine, table

HERE = os.path.dirname(os.path.abspath(__file__))
SESSION = """
import pytest
from pytest_resume_equiv import resume_equivalent
import phase_cases

BUGS = {bugs!r}

@pytest.mark.parametrize("name", sorted(phase_cases.CASES))
@resume_equivalent(steps=phase_cases.STEPS, split=phase_cases.SPLIT, nproc=1)
def test_case(resume_equiv, name):
    train = getattr(phase_cases, "train_" + name)
    if name in BUGS:
        with pytest.raises(pytest.fail.Exception):
            resume_equiv.run(train)
    else:
        resume_equiv.run(train)
"""
SPANS = (
    ("host: start of the launch to the rank's bootstrap (fork)", "host.started", "rank.start"),
    ("rank: plugin bootstrap (recording installed)", "rank.start", "rank.installed"),
    ("rank: gate and the rank's own setup", "rank.installed", "rank.user"),
    ("rank: user code to its first optimizer step", "rank.user", "rank.first_step"),
    ("  of which rendezvous and init_process_group", "pg.start", "pg.done"),
    ("rank: training (first step to the end)", "rank.first_step", "rank.user_done"),
    ("rank: signature closed", "rank.user_done", "rank.closed"),
    ("rank: status, exit handlers", "rank.closed", "rank.exit"),
    ("host: rank exit seen", "rank.exit", "host.exited"),
    ("host: exit seen to judging", "host.exited", "host.judging"),
    ("host: reading and comparing the signatures", "host.judging", "host.judged"),
)


ITEM_SPANS = (
    ("item: plan", "item.run", "item.planned"),
    ("item: launches, start to the last judged", "item.planned", "item.launched"),
    ("item: report (summary, failure text, plot)", "item.launched", "item.reported"),
)


def read_marks(path: str) -> dict[str, dict[str, float]]:
    """{launch: {phase: first time}} (a phase marked twice, e.g. by two ranks, keeps the
    earliest; a host mark for a launch the ranks never reached stays alone)."""
    launches: dict[str, dict[str, float]] = defaultdict(dict)
    with open(path, encoding="utf-8") as f:
        for line in f:
            stamp, _pid, launch, phase = line.split()
            launches[launch].setdefault(phase, float(stamp))
    return launches


def session(work: str, timings: str, device: str) -> tuple[float, float]:
    argv = [
        sys.executable, "-m", "pytest", "-p", "resume_equiv", f"--resume-equiv-device={device}",
        "-q", "-p", "no:cacheprovider", "test_session.py",
    ]  # fmt: skip
    env = {**os.environ, "RESUME_EQUIV_TIMINGS": timings, "PYTHONPATH": f"{ROOT}:{HERE}",
           "PHASE_CASES_DEVICE": device}  # fmt: skip
    began, start = time.time(), time.perf_counter()
    proc = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-2000:])
        raise SystemExit(f"the session exited {proc.returncode}")
    return wall, began


def floor(work: str, device: str) -> float:
    argv = [sys.executable, "-c", "import phase_cases, sys; r = phase_cases.floor(); print(r)"]
    env = {**os.environ, "PYTHONPATH": HERE, "PHASE_CASES_DEVICE": device}
    start = time.perf_counter()
    subprocess.run(argv, cwd=work, env=env, check=True, capture_output=True)
    return time.perf_counter() - start


def phases(marks: dict[str, dict[str, float]], start: float) -> dict[str, list[float]]:
    """Each span's durations over the session's launches and items; between items (pytest's
    own work: the report of one item, setup of the next), and before the first item (pytest's
    start, collection, the fork server)."""
    spans: dict[str, list[float]] = defaultdict(list)
    for phases_of in marks.values():
        for name, first, last in (*SPANS, *ITEM_SPANS):
            if first in phases_of and last in phases_of:
                spans[name].append(phases_of[last] - phases_of[first])
    items = sorted((p["item.run"], p.get("item.reported", p["item.run"])) for p in marks.values()
                   if "item.run" in p)  # fmt: skip
    if items:
        spans["session: pytest start to the first item"].append(items[0][0] - start)
        spans["session: between items (pytest)"] += [b[0] - a[1] for a, b in zip(items, items[1:])]
    server = marks.get("fork-server", {})
    if "server.start" in server and "server.ready" in server:
        spans["session: the fork server's start (overlaps)"].append(
            server["server.ready"] - server["server.start"]
        )
    return spans


def busy(marks: dict[str, dict[str, float]], within: tuple[float, float] = (-1e18, 1e18)) -> float:
    """Seconds of the session (or of the window `within`) during which at least one launch
    ran (host start to judged)."""
    intervals = sorted(
        (p["host.started"], p.get("host.judged", p.get("host.exited", p["host.started"])))
        for p in marks.values()
        if "host.started" in p
    )
    total, end = 0.0, within[0]
    for a, b in intervals:
        a, b = max(a, within[0]), min(b, within[1])
        if b > max(a, end):
            total += b - max(a, end)
            end = b
    return total


def idle_in_items(marks: dict[str, dict[str, float]]) -> float:
    """Seconds inside items (first launch planned to last judged) with no launch running."""
    windows = [(p["item.planned"], p["item.launched"]) for p in marks.values()
               if "item.planned" in p and "item.launched" in p]  # fmt: skip
    return sum((b - a) - busy(marks, (a, b)) for a, b in windows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    args = parser.parse_args()
    import phase_cases

    bugs = sorted(n for n in phase_cases.CASES if not n.startswith("correct"))
    load = os.getloadavg()
    walls, floors, spans, gaps, launches = [], [], defaultdict(list), [], []
    for _ in range(args.repeat):
        work = tempfile.mkdtemp(prefix="bench-phases-")
        try:
            with open(os.path.join(work, "test_session.py"), "w") as f:
                f.write(textwrap.dedent(SESSION.format(bugs=bugs)))
            timings = os.path.join(work, "timings.txt")
            wall, began = session(work, timings, args.device)
            walls.append(wall)
            floors.append(floor(work, args.device))
            marks = read_marks(timings)
            launches.append(sum("host.started" in p for p in marks.values()))
            for name, values in phases(marks, began).items():
                spans[name].append(values)
            gaps.append((walls[-1], busy(marks), idle_in_items(marks)))
        finally:
            shutil.rmtree(work, ignore_errors=True)
    wall, base = statistics.median(walls), statistics.median(floors)
    rows = [("phase", "median ms", "session sum s")]
    names = [n for n, _, _ in (*SPANS, *ITEM_SPANS)] + sorted(
        n for n in spans if n.startswith("session:")
    )
    for name in names:
        runs = spans.get(name, [])
        if runs:
            flat = [v for run in runs for v in run]
            rows.append((name, f"{1000 * statistics.median(flat):.0f}",
                         f"{statistics.median(sum(r) for r in runs):.2f}"))  # fmt: skip
    session_wall, launch_busy, idle = (statistics.median(g[i] for g in gaps) for i in (0, 1, 2))
    print(machine())
    print(f"load average at the start: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(f"launches per session: {statistics.median(launches):.0f}; repeats: {args.repeat}\n")
    print(table(rows))
    print(f"\nsession wall {session_wall:.1f} s: launches running {launch_busy:.1f} s, "
          f"the rest (pytest, collection, the fork server's start, between launches) "
          f"{session_wall - launch_busy:.1f} s")  # fmt: skip
    print(f"inside items with no launch running (the first item's wait for the fork server "
          f"included): {idle:.1f} s")  # fmt: skip
    print(f"in-process floor (one process, the 15 cases): {base:.1f} s")
    print(f"ratio session / floor: {wall / base:.2f} (aim: <= 2.5)")


if __name__ == "__main__":
    main()
