"""Wall time of a resume test written with the plugin against the same test written by hand.

  a. examples/minimal, steps=8, split=4, 2 ranks: the plugin's test with rng_mutation=False
     (the same two launches of work as by hand), and with the teeth check on;
  b. splits [2, 4, 6]: the plugin's test against the hand-written test run once per split;
  each plugin variant with the fork server (the default) and without it
  (`--resume-equiv-fork-server=off`).

The hand-written test is what a careful engineer writes without the plugin: torchrun the
trainer uninterrupted (saving at the split), torchrun it again resumed, compare the per-rank
metrics JSON the trainer writes. Each variant runs as its own pytest process, interleaved,
`--repeat` times; the table shows medians and ratios against the hand-written test.

    python benchmarks/bench_launches.py [--repeat 3] [--only-ratios]

`--only-ratios` runs only the four variants the two ratios need (by hand and the plugin with
the fork server, for a and b): a repeat takes about a third of the time.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import textwrap

from common import ROOT, children_cpu, machine, median_of, table, timed_run

TRAIN = os.path.join(ROOT, "examples", "minimal", "train.py")

PLUGIN_TEST = """
from pytest_resume_equiv import resume_equivalent

@resume_equivalent(steps=8, split={splits}, nproc=2, rng_mutation={mutation})
def test_plugin(resume_equiv):
    resume_equiv.run(
        [{train!r}, "--max-steps={{steps}}", "--save-at={{splits}}", "--output-dir={{run_dir}}"],
        checkpoint="{{run_dir}}/checkpoints/step_{{split}}",
        resume_args=["--resume-from={{checkpoint}}"],
    )
"""

HANDWRITTEN_TEST = """
import json, os, subprocess, sys

import pytest

TRAIN = {train!r}


def torchrun(*args):
    # no check=True: torch's gloo teardown sometimes aborts a rank that finished (SIGABRT at
    # exit, about 1 torchrun in 20 here); the plugin warns and judges what the ranks wrote,
    # and so does this test: the metrics files decide (a rank that failed wrote none)
    subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
         TRAIN, "--max-steps=8", *args],
        env={{**os.environ, "OMP_NUM_THREADS": "1"}},
    )


def metrics(path, rank):
    with open(os.path.join(path, f"rank-{{rank}}.json")) as f:
        return json.load(f)


@pytest.mark.parametrize("split", {splits})
def test_handwritten(tmp_path, split):
    base, resumed = tmp_path / "base", tmp_path / "resumed"
    torchrun(f"--save-at={{split}}", f"--output-dir={{base}}", f"--metrics-dir={{base}}/m")
    torchrun(f"--output-dir={{resumed}}", f"--metrics-dir={{resumed}}/m",
             f"--resume-from={{base}}/checkpoints/step_{{split}}")
    for rank in range(2):
        want = {{k: v for k, v in metrics(f"{{base}}/m", rank).items() if int(k) > split}}
        assert metrics(f"{{resumed}}/m", rank) == want
"""


RATIOS = (
    "a: by hand (2 launches)",
    "a: plugin, rng_mutation=False",
    "b: by hand, per split (6 launches)",
    "b: plugin, split=[2, 4, 6]",
)


HAND = {"a": "a: by hand (2 launches)", "b": "b: by hand, per split (6 launches)"}


def write(directory: str, name: str, text: str) -> str:
    path = os.path.join(directory, name)
    with open(path, "w") as f:
        f.write(textwrap.dedent(text))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only-ratios", action="store_true")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="bench-launches-")
    off = ["--resume-equiv-fork-server=off"]
    variants = {
        "a: by hand (2 launches)": ("hand_a.py", HANDWRITTEN_TEST, [4], None, []),
        "a: plugin, rng_mutation=False, no fork server": (
            "plugin_a.py",
            PLUGIN_TEST,
            4,
            False,
            off,
        ),
        "a: plugin, rng_mutation=False": ("plugin_a.py", PLUGIN_TEST, 4, False, []),
        "a: plugin, teeth check on": ("plugin_a_teeth.py", PLUGIN_TEST, 4, True, []),
        "b: by hand, per split (6 launches)": ("hand_b.py", HANDWRITTEN_TEST, [2, 4, 6], None, []),
        "b: plugin, split=[2, 4, 6], no fork server": (
            "plugin_b.py",
            PLUGIN_TEST,
            [2, 4, 6],
            False,
            off,
        ),
        "b: plugin, split=[2, 4, 6]": ("plugin_b.py", PLUGIN_TEST, [2, 4, 6], False, []),
    }
    if args.only_ratios:
        variants = {k: v for k, v in variants.items() if k in RATIOS}
    for name, text, splits, mutation, _ in variants.values():
        write(work, f"test_{name}", text.format(train=TRAIN, splits=splits, mutation=mutation))
    pytest = [sys.executable, "-m", "pytest", "-q", "-p", "resume_equiv", "-p", "no:cacheprovider"]
    pytest += ["--resume-equiv-device=cpu", "--rootdir", work]
    samples: dict[str, list[float]] = {label: [] for label in variants}
    cpu: dict[str, list[float]] = {label: [] for label in variants}
    for n in range(args.repeat):
        for label, (name, _, _, _, extra) in variants.items():
            before = children_cpu()
            samples[label].append(timed_run([*pytest, *extra, f"test_{name}"], cwd=work))
            cpu[label].append(children_cpu() - before)
            print(
                f"run {n + 1}/{args.repeat}: {label}: {samples[label][-1]:.1f}s "
                f"({cpu[label][-1]:.1f} CPU s)",
                flush=True,
            )
    med = {label: median_of(s) for label, s in samples.items()}
    med_cpu = {label: median_of(s) for label, s in cpu.items()}
    base = {part: med[label] for part, label in HAND.items()}
    rows = [
        ["variant", "median s", "ratio to by hand", "min-max ratio", "CPU s", "CPU ratio", "target"]
    ]
    targets = {
        "a: plugin, rng_mutation=False": "<= 0.25",
        "b: plugin, split=[2, 4, 6]": "<= 0.15",
    }
    for label, value in med.items():
        hand = samples[HAND[label[0]]]
        ratios = [mine / theirs for mine, theirs in zip(samples[label], hand)]
        rows.append(
            [
                label,
                f"{value:.1f}",
                f"{value / base[label[0]]:.2f}",
                f"{min(ratios):.2f}-{max(ratios):.2f}",
                f"{med_cpu[label]:.1f}",
                f"{med_cpu[label] / med_cpu[HAND[label[0]]]:.2f}",
                targets.get(label, ""),
            ]
        )
    print()
    print(machine())
    print(f"load average (1, 5, 15 min) at the end: {os.getloadavg()}")
    print(
        f"pytest wall time per variant, median of {args.repeat} (whole pytest process); "
        "min-max ratio: each run against the hand-written run of the same round; CPU s: "
        "user + system of the pytest process and everything it started"
    )
    print(table(rows))


if __name__ == "__main__":
    main()
