"""Forked two-rank launches of examples/minimal, counted: how many hang (or fail).

Each launch runs `examples/minimal/train.py --max-steps=2` with 2 ranks forked from the
plugin's fork server, through the plugin's own `launch()`, with a short timeout: a launch
that does not end within it is a hang (a rank stuck in teardown, say); its ranks' stacks
(the plugin dumps them on a timeout) are printed. Exit status 1 when any launch hung or
failed. `--preload MODULE` adds a module for the server to import before it forks (as
`--resume-equiv-preload` does), to test a candidate such as torch._dynamo.

    python benchmarks/check_fork_hangs.py [--launches 50] [--timeout 60] [--preload MOD]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

from common import ROOT, machine

sys.path.insert(0, ROOT)

from pytest_resume_equiv.launch.forked import ForkServer  # noqa: E402
from pytest_resume_equiv.launch.running import LaunchSpec, Target, launch  # noqa: E402
from pytest_resume_equiv.rank.launch_context import LaunchContext  # noqa: E402

TRAIN = os.path.join(ROOT, "examples", "minimal", "train.py")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launches", type=int, default=50)
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--preload", action="append", default=[])
    args = parser.parse_args()
    os.environ["PYTHONPATH"] = os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])
    work = tempfile.mkdtemp(prefix="fork-hangs-")
    preload = tuple(args.preload)
    ForkServer.get(preload)
    hung, failed, times = [], [], []
    try:
        for n in range(args.launches):
            run_dir = tempfile.mkdtemp(prefix=f"{n:03d}-", dir=work)
            spec = LaunchSpec(
                f"launch-{n}",
                Target("script", TRAIN, ("--max-steps=2", f"--output-dir={run_dir}/out")),
                run_dir,
                2,
                1,
                args.timeout,
                LaunchContext("launch", run_dir, "cpu", "gloo", seed=0, steps=2),
                fork_server=True,
                preload=preload,
            )
            start = time.perf_counter()
            result = launch(spec)
            times.append(time.perf_counter() - start)
            if result.timed_out:
                hung.append(n)
            elif not result.ok:
                failed.append(n)
            if not result.ok:
                for rank in range(2):
                    print(f"--- launch {n} ({result.status}), rank {rank}:")
                    print(result.tail(result.rank_log(rank), 60))
            print(f"launch {n + 1}/{args.launches}: {result.status}, {times[-1]:.2f}s", flush=True)
    finally:
        ForkServer.stop_all()
    print()
    print(machine())
    print(f"load average: {os.getloadavg()}; preload: {list(preload) or 'none'}")
    times.sort()
    print(
        f"{args.launches} forked 2-rank launches: {len(hung)} hung {hung}, {len(failed)} failed "
        f"{failed}; seconds per launch: median {times[len(times) // 2]:.2f}, "
        f"max {times[-1]:.2f}"
    )
    sys.exit(1 if hung or failed else 0)


if __name__ == "__main__":
    main()
