"""Launch cost of an `@equivalent` test: the launches it makes, and its wall time against the
same comparison written by hand.

  a. launches: `examples/equivalent/train.py`, steps=4, baseline 1 rank, with 1, 2 and 3
     variants (dp2, accum4, dp2_accum2), in one pytest process and under `-n 2`
     (pytest-xdist): expected 1 + the number of variants (the baseline launched once and
     shared by the items, across workers). Counted three ways, which must agree:
       - ranks: the trainer runs through a wrapper whose rank 0 appends a line per launch
         (its world size and arguments) to a file: nothing of the plugin's is read;
       - report: distinct run directories of the launches in the JSON report
         (`--resume-equiv-report`) that were not reused from another test;
       - dirs: run directories holding signatures in the keep directory
         (`--resume-equiv-keep=all`);
     and the baseline's own launches (ranks: lines with 1 rank and no arguments) must be 1.
  b. wall time: the plugin's test (baseline 1 rank, variants dp2 and accum4, steps=4, the
     trainer as it is) against the same comparison by hand: a pytest test that torchruns
     the trainer once per configuration (a module-scoped fixture for the baseline, one test
     per variant), reads the per-step losses each rank wrote, and compares the global
     batch's loss of every step (relative 1e-5). The trainer writes nothing, so the
     by-hand launches run it through a wrapper that writes each rank's step losses (what a
     `--losses` flag in the trainer would). Each is its own pytest process, interleaved,
     `--repeat` times; the table shows medians and ratios to by hand.

    python benchmarks/bench_equivalent.py [--repeat 3] [--skip-launches] [--skip-timing]

Every run of a counts again (a race that launched the baseline twice would show in one
round); a count that is not 1 + variants is printed as a plugin bug and the script exits 1
after its tables.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import textwrap

from common import ROOT, children_cpu, machine, median_of, table, timed_run

TRAIN = os.path.join(ROOT, "examples", "equivalent", "train.py")
STEPS = 4

VARIANTS = {
    "dp2": dict(nproc=2),
    "accum4": dict(nproc=1, args=["--accum", "4"]),
    "dp2_accum2": dict(nproc=2, args=["--accum", "2"]),
}

# a: the trainer as it is, run by a wrapper whose rank 0 says that a launch happened
COUNTED_TRAIN = """
import json, os, runpy, sys

TRAIN, COUNTS = {train!r}, {counts!r}
if os.environ.get("RANK", "0") == "0":
    line = {{"pid": os.getpid(), "world": int(os.environ.get("WORLD_SIZE", "1")),
             "args": sys.argv[1:]}}
    with open(COUNTS, "a") as f:
        f.write(json.dumps(line) + "\\n")
sys.argv = [TRAIN, *sys.argv[1:]]
runpy.run_path(TRAIN, run_name="__main__")
"""

PLUGIN_TEST = """
from pytest_resume_equiv import equivalent


@equivalent(steps={steps}, baseline=dict(nproc=1), variants={variants!r})
def test_plugin(resume_equiv):
    resume_equiv.run([{train!r}, "--steps", "{{steps}}"])
"""

# a: the plugin's test, noting which pytest-xdist worker ran each item
COUNTED_TEST = """
import os

from pytest_resume_equiv import equivalent


@equivalent(steps={steps}, baseline=dict(nproc=1), variants={variants!r})
def test_plugin(resume_equiv):
    with open({workers!r}, "a") as f:
        f.write(os.environ.get("PYTEST_XDIST_WORKER", "main") + "\\n")
    resume_equiv.run([{train!r}, "--steps", "{{steps}}"])
"""

# b, by hand: each rank writes the loss of every optimizer step (the values given to
# backward() in the step, summed over its micro-batches)
LOSS_TRAIN = """
import json, os, runpy, sys

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

TRAIN = {train!r}
out = sys.argv[1]
sys.argv = [TRAIN, *sys.argv[2:]]
losses, pending = [], []
backward = torch.Tensor.backward


def recording_backward(self, *args, **kwargs):
    pending.append(self.detach().item())
    return backward(self, *args, **kwargs)


def stepped(optimizer, args, kwargs):
    losses.append(sum(pending))
    pending.clear()


torch.Tensor.backward = recording_backward
register_optimizer_step_post_hook(stepped)
runpy.run_path(TRAIN, run_name="__main__")
os.makedirs(out, exist_ok=True)
with open(os.path.join(out, f"rank-{{os.environ['RANK']}}.json"), "w") as f:
    json.dump(losses, f)
"""

HANDWRITTEN_TEST = """
import json, os, subprocess, sys

import pytest

TRAIN = {train!r}
BASELINE = (1, [])
VARIANTS = {{"dp2": (2, []), "accum4": (1, ["--accum", "4"])}}


def torchrun(out, nproc, args):
    subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone",
         f"--nproc-per-node={{nproc}}", TRAIN, str(out), "--steps", "{steps}", *args],
        check=True, env={{**os.environ, "OMP_NUM_THREADS": "1"}},
    )
    ranks = [json.loads((out / f"rank-{{r}}.json").read_text()) for r in range(nproc)]
    # the global batch's loss of each step: the ranks' step losses averaged
    return [sum(step) / nproc for step in zip(*ranks)]


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    return torchrun(tmp_path_factory.mktemp("baseline"), *BASELINE)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_handwritten(tmp_path, baseline, variant):
    losses = torchrun(tmp_path, *VARIANTS[variant])
    assert len(losses) == len(baseline) == {steps}
    for step, (mine, theirs) in enumerate(zip(losses, baseline), 1):
        assert mine == pytest.approx(theirs, rel=1e-5, abs=0), step
"""


def write(directory: str, name: str, text: str) -> str:
    path = os.path.join(directory, name)
    with open(path, "w") as f:
        f.write(textwrap.dedent(text))
    return path


def pytest_argv(work: str) -> list[str]:
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "resume_equiv", "-p", "no:cacheprovider"]
    return [*argv, "--resume-equiv-device=cpu", "--rootdir", work]


def count_launches(work: str, variants: int, xdist: bool, n: int) -> dict:
    """One pytest session of a: its wall time and its launches, counted three ways."""
    run = os.path.join(work, f"a-{variants}-{'n2' if xdist else 'n0'}-{n}")
    os.makedirs(run)
    counts = os.path.join(run, "ranks.jsonl")
    train = write(run, "counted_train.py", COUNTED_TRAIN.format(train=TRAIN, counts=counts))
    chosen = dict(list(VARIANTS.items())[:variants])
    workers = os.path.join(run, "workers.txt")
    test = COUNTED_TEST.format(steps=STEPS, variants=chosen, train=train, workers=workers)
    write(run, "test_a.py", test)
    keep, report = os.path.join(run, "keep"), os.path.join(run, "report.json")
    argv = [*pytest_argv(run), "--resume-equiv-keep=all", f"--resume-equiv-keep-dir={keep}"]
    argv += [f"--resume-equiv-report={report}", f"--basetemp={os.path.join(run, 'tmp')}"]
    argv += ["-n", "2"] if xdist else ["-p", "no:xdist"]
    before = children_cpu()
    wall = timed_run([*argv, "test_a.py"], cwd=run)
    cpu = children_cpu() - before
    with open(counts) as f:
        lines = [json.loads(line) for line in f]
    with open(report) as f:
        tests = json.load(f)["tests"]
    with open(workers) as f:
        used = set(f.read().split())
    launches = [la for t in tests for r in t["runs"] for la in r["launches"]]
    own = {la["run_dir"] for la in launches if not la["reused_from"]}
    reused = sum(1 for la in launches if la["reused_from"])
    dirs = {
        root
        for root, subdirs, _ in os.walk(keep)
        if "signatures" in subdirs and os.listdir(os.path.join(root, "signatures"))
    }
    return {
        "wall": wall,
        "cpu": cpu,
        "items": len(tests),
        "passed": sum(1 for t in tests if t["verdict"] == "passed"),
        "workers": len(used),
        "ranks": len(lines),
        "baseline": sum(
            1 for x in lines if x["world"] == 1 and x["args"] == ["--steps", str(STEPS)]
        ),
        "report": len(own),
        "reused": reused,
        "dirs": len(dirs),
        "sessions": len(os.listdir(keep)) - (".gitignore" in os.listdir(keep)),
    }


def part_a(work: str, repeat: int) -> tuple[list[list[str]], list[str]]:
    cases = [(v, x) for x in (False, True) for v in (1, 2, 3)]
    found: dict[tuple[int, bool], list[dict]] = {case: [] for case in cases}
    for n in range(repeat):
        for variants, xdist in cases:
            label = f"{variants} variant{'s' if variants > 1 else ''}{', -n 2' if xdist else ''}"
            got = count_launches(work, variants, xdist, n)
            found[(variants, xdist)].append(got)
            print(
                f"a, run {n + 1}/{repeat}: {label}: {got['wall']:.1f}s, launches: ranks "
                f"{got['ranks']}, report {got['report']}, dirs {got['dirs']}, baseline "
                f"{got['baseline']}",
                flush=True,
            )
    rows = [
        [
            "variants",
            "workers",
            "workers used",
            "items passed",
            "expected",
            "launches: ranks / report / dirs",
            "baseline launched",
            "reused",
            "wall s",
            "CPU s",
        ]
    ]
    bugs = []
    for (variants, xdist), runs in found.items():

        def each(key: str, runs: list[dict] = runs) -> str:
            values = sorted({r[key] for r in runs})
            return ",".join(str(v) for v in values)

        expected = 1 + variants
        rows.append(
            [
                str(variants),
                "2 (-n 2)" if xdist else "1",
                each("workers"),
                f"{each('passed')}/{variants}",
                str(expected),
                f"{each('ranks')} / {each('report')} / {each('dirs')}",
                each("baseline"),
                each("reused"),
                f"{median_of([r['wall'] for r in runs]):.1f}",
                f"{median_of([r['cpu'] for r in runs]):.1f}",
            ]
        )
        for n, r in enumerate(runs, 1):
            wrong = {k: r[k] for k in ("ranks", "report", "dirs") if r[k] != expected}
            if r["baseline"] != 1:
                wrong["baseline"] = r["baseline"]
            if r["passed"] != variants or r["items"] != variants:
                wrong["passed"] = f"{r['passed']} of {r['items']} items"
            if wrong:
                bugs.append(
                    f"{variants} variants, {'-n 2' if xdist else 'one process'}, round {n}: "
                    f"expected {expected} launches, 1 baseline: {wrong}"
                )
    return rows, bugs


def part_b(work: str, repeat: int) -> list[list[str]]:
    loss_train = write(work, "loss_train.py", LOSS_TRAIN.format(train=TRAIN))
    both = {k: VARIANTS[k] for k in ("dp2", "accum4")}
    write(work, "test_b_plugin.py", PLUGIN_TEST.format(steps=STEPS, variants=both, train=TRAIN))
    write(work, "test_b_hand.py", HANDWRITTEN_TEST.format(steps=STEPS, train=loss_train))
    variants = {
        "by hand (3 torchrun launches)": ["test_b_hand.py"],
        "plugin, @equivalent (3 launches, fork server)": ["test_b_plugin.py"],
        "plugin, --resume-equiv-fork-server=off": [
            "--resume-equiv-fork-server=off",
            "test_b_plugin.py",
        ],
    }
    samples: dict[str, list[float]] = {label: [] for label in variants}
    cpu: dict[str, list[float]] = {label: [] for label in variants}
    for n in range(repeat):
        for label, extra in variants.items():
            before = children_cpu()
            argv = [*pytest_argv(work), "-p", "no:xdist", f"--basetemp={work}/tmp-b", *extra]
            samples[label].append(timed_run(argv, cwd=work))
            cpu[label].append(children_cpu() - before)
            print(
                f"b, run {n + 1}/{repeat}: {label}: {samples[label][-1]:.1f}s "
                f"({cpu[label][-1]:.1f} CPU s)",
                flush=True,
            )
    hand = next(iter(variants))
    rows = [["variant", "median s", "ratio to by hand", "min-max ratio", "CPU s", "CPU ratio"]]
    for label in variants:
        ratios = [mine / theirs for mine, theirs in zip(samples[label], samples[hand])]
        med, med_cpu = median_of(samples[label]), median_of(cpu[label])
        rows.append(
            [
                label,
                f"{med:.1f}",
                f"{med / median_of(samples[hand]):.2f}",
                f"{min(ratios):.2f}-{max(ratios):.2f}",
                f"{med_cpu:.1f}",
                f"{med_cpu / median_of(cpu[hand]):.2f}",
            ]
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--skip-launches", action="store_true", help="skip a")
    parser.add_argument("--skip-timing", action="store_true", help="skip b")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="bench-equivalent-")
    load_start = os.getloadavg()
    print(f"load average (1, 5, 15 min) at the start: {load_start}", flush=True)
    rows_a, bugs = part_a(work, args.repeat) if not args.skip_launches else ([], [])
    rows_b = part_b(work, args.repeat) if not args.skip_timing else []
    print()
    print(machine())
    print(f"load average (1, 5, 15 min) at the start: {load_start}, at the end: {os.getloadavg()}")
    if rows_a:
        print()
        print(
            f"a: launches of one @equivalent test (steps={STEPS}, baseline 1 rank), "
            f"{args.repeat} sessions each (values seen, comma-separated when they differ); "
            "ranks: rank 0's line per launch; report: run directories in the JSON report not "
            "reused; dirs: run directories with signatures"
        )
        print(table(rows_a))
    if rows_b:
        print()
        print(
            f"b: baseline 1 rank, variants dp2 and accum4, steps={STEPS}; pytest wall time, "
            f"median of {args.repeat} (whole pytest process); min-max ratio: each run against "
            "the by-hand run of the same round; CPU s: user + system of the pytest process "
            "and everything it started"
        )
        print(table(rows_b))
    if bugs:
        print()
        print("plugin bug: launch counts differ from 1 + variants:")
        print("\n".join(f"  {b}" for b in bugs))
        raise SystemExit(1)


if __name__ == "__main__":
    main()
