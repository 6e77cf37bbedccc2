"""Per-launch cost: a plain start (torchrun, or the one-rank start without an agent) against
ranks forked from the fork server, for 1 and 2 ranks, in one run.

Every launch runs `examples/minimal/train.py` for 2 steps (it builds a model, an AdamW
optimizer and a loader: the first optimizer step imports torch._dynamo). The launches are
made through the plugin's own `launch()`, interleaved, `--repeat` times; the fork server is
started (and its start timed) before the first forked launch, as a session does once.

    python benchmarks/bench_fork.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

from common import ROOT, machine, median_of, table

sys.path.insert(0, ROOT)

from pytest_resume_equiv.launch.forked import ForkServer  # noqa: E402
from pytest_resume_equiv.launch.running import LaunchSpec, Target, launch  # noqa: E402
from pytest_resume_equiv.rank.launch_context import LaunchContext  # noqa: E402

TRAIN = os.path.join(ROOT, "examples", "minimal", "train.py")


def one_launch(work: str, tag: str, nproc: int, fork: bool) -> float:
    run_dir = tempfile.mkdtemp(prefix=f"{tag}-", dir=work)
    spec = LaunchSpec(
        tag,
        Target("script", TRAIN, ("--max-steps=2", f"--output-dir={run_dir}/out")),
        run_dir,
        nproc,
        1,
        300.0,
        LaunchContext("launch", run_dir, "cpu", "gloo", seed=0, steps=2),
        fork_server=fork,
    )
    start = time.perf_counter()
    result = launch(spec)
    elapsed = time.perf_counter() - start
    if not result.ok:
        raise SystemExit(f"{tag} failed: {result.tail(result.rank_log(0))}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    os.environ["PYTHONPATH"] = os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])
    work = tempfile.mkdtemp(prefix="bench-fork-")
    start = time.perf_counter()
    ForkServer.get(())
    server_start = time.perf_counter() - start
    samples: dict[tuple[int, bool], list[float]] = {}
    try:
        for n in range(args.repeat):
            for nproc in (1, 2):
                for fork in (False, True):
                    tag = f"{nproc}-{'forked' if fork else 'plain'}"
                    samples.setdefault((nproc, fork), []).append(one_launch(work, tag, nproc, fork))
                    print(f"run {n + 1}/{args.repeat}: {tag}: {samples[nproc, fork][-1]:.2f}s")
    finally:
        ForkServer.stop_all()
    rows = [["ranks", "plain s", "forked s", "forked / plain"]]
    for nproc in (1, 2):
        plain, forked = median_of(samples[nproc, False]), median_of(samples[nproc, True])
        rows.append([str(nproc), f"{plain:.2f}", f"{forked:.2f}", f"{forked / plain:.2f}"])
    print()
    print(machine())
    print(f"seconds per launch, median of {args.repeat}; the server's start: {server_start:.1f}s")
    print(table(rows))


if __name__ == "__main__":
    main()
