"""How far apart tests/zoo/batchzoo.py trains under other batchings and parallelisms, by hand:
the numbers `@equivalent` must separate (controls: round-off; bugs 34-43: a real difference).

Each configuration is launched once under torchrun (CPU, gloo), its wall time measured; each
pair (baseline, variant) is compared per optimizer step on the global batch:

- samples: the multiset of sample ids over the ranks, exactly;
- lr: the learning rate each step used, exactly;
- loss: the global batch's loss (its mean per sample or token, computed aside from what the
  trainer backwards), |a - b| / |b|;
- lossbw: the loss the trainer backwarded, summed over micro-batches and averaged over ranks
  (what a bug scales or weights otherwise), |a - b| / |b|;
- gnorm: the whole gradient's norm before clipping, |a - b| / |b|; g1x: its ratio at step 1;
- grad: the gradient the optimizer stepped with (after clipping), ||a - b|| / ||b||; grad@:
  the first step where it passes 1e-5;
- params: the parameters after the step, ||a - b|| / ||b|| and, as `upd`, ||a - b|| over the
  baseline's update since the initial parameters ||b - b0||;
- buffers (BatchNorm running statistics) of rank 0, ||a - b|| / ||b||.

The table shows each quantity's largest relative difference over the steps and, for params,
the value after the last step; `first` is the first step where any of them passes 1e-5 (or
the samples or the lr differ), with what differed there.

    python benchmarks/equivalent_zoo_check.py [--steps 6] [--keep DIR] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter

import torch
from common import ROOT, machine, table

ZOO = os.path.join(ROOT, "tests", "zoo", "batchzoo.py")
THRESHOLD = 1e-5
TIMEOUT = 300

DENSE = {
    "b1": (1, []),
    "acc4": (1, ["--accum", "4"]),
    "dp2": (2, []),
    "dp2_acc2": (2, ["--accum", "2"]),
    "fsdp2": (2, ["--fsdp"]),
    "fsdp2_acc2": (2, ["--fsdp", "--accum", "2"]),
}


def configs() -> dict[str, tuple[int, list[str]]]:
    out: dict[str, tuple[int, list[str]]] = {}
    for name, (n, a) in DENSE.items():
        out[name] = (n, a)
        out[f"seq_{name}"] = (n, ["--seq", *a])
    for name in ("b1", "dp2", "acc2"):
        n, a = {"b1": (1, []), "dp2": (2, []), "acc2": (1, ["--accum", "2"])}[name]
        out[f"bn_{name}"] = (n, ["--bn", *a])
    for name in ("b1", "acc4", "dp2"):
        n, a = DENSE[name]
        out[f"drop_{name}"] = (n, ["--dropout", "0.1", *a])
    bugs = {
        "34_acc4": (1, ["--accum", "4", "--bug", "no-accum-scale"]),
        "34_dp2": (2, ["--bug", "no-accum-scale"]),
        "35_acc4": (1, ["--accum", "4", "--bug", "zero-grad-in-window"]),
        "35_dp2": (2, ["--bug", "zero-grad-in-window"]),
        "36_acc4": (1, ["--accum", "4", "--bug", "sched-per-micro"]),
        "37_acc4": (1, ["--accum", "4", "--bug", "clip-per-micro"]),
        "37_dp2": (2, ["--bug", "clip-per-micro"]),
        "38_seq_acc4": (1, ["--seq", "--accum", "4", "--bug", "token-mean-per-micro"]),
        "38_seq_dp2": (2, ["--seq", "--bug", "token-mean-per-micro"]),
        "38_seq_b1": (1, ["--seq", "--bug", "token-mean-per-micro"]),
        "39_dp2": (2, ["--bug", "world-scale"]),
        "39_fsdp2": (2, ["--fsdp", "--bug", "world-scale"]),
        "40_dp2": (2, ["--bug", "same-data"]),
        "41_bn_dp2": (2, ["--bn", "--bug", "no-sync-bn"]),
        "43_fsdp2": (2, ["--fsdp", "--bug", "local-shard-clip"]),
        "43_fsdp2_acc2": (2, ["--fsdp", "--accum", "2", "--bug", "local-shard-clip"]),
        "43_fsdp2_noclip": (2, ["--fsdp", "--clip", "5", "--bug", "local-shard-clip"]),
        "b1_rerun": (1, ["--global-batch", "16"]),
        "b1_clip0": (1, ["--clip", "0"]),
        "dp2_clip0": (2, ["--clip", "0"]),
        "fsdp2_clip0": (2, ["--fsdp", "--clip", "0"]),
        "34_acc4_clip0": (1, ["--accum", "4", "--clip", "0", "--bug", "no-accum-scale"]),
        "39_dp2_clip0": (2, ["--clip", "0", "--bug", "world-scale"]),
    }
    out.update(bugs)
    return out


PAIRS = [
    # (kind, baseline, variant)
    ("same", "b1", "b1_rerun"),
    ("control", "b1", "acc4"),
    ("control", "b1", "dp2"),
    ("control", "b1", "dp2_acc2"),
    ("control", "b1", "fsdp2"),
    ("control", "dp2", "fsdp2"),
    ("control", "b1", "fsdp2_acc2"),
    ("control", "dp2_acc2", "fsdp2_acc2"),
    ("control", "dp2_clip0", "fsdp2_clip0"),
    ("control", "seq_b1", "seq_acc4"),
    ("control", "seq_b1", "seq_dp2"),
    ("control", "seq_b1", "seq_dp2_acc2"),
    ("control", "seq_b1", "seq_fsdp2"),
    ("control", "seq_dp2", "seq_fsdp2"),
    ("control", "seq_b1", "seq_fsdp2_acc2"),
    ("control", "seq_dp2_acc2", "seq_fsdp2_acc2"),
    ("control", "bn_b1", "bn_dp2"),
    ("bn+accum", "bn_b1", "bn_acc2"),
    ("42 dropout", "drop_b1", "drop_acc4"),
    ("42 dropout", "drop_b1", "drop_dp2"),
    ("34", "b1", "34_acc4"),
    ("34 (K=1)", "b1", "34_dp2"),
    ("34 (no clip)", "b1_clip0", "34_acc4_clip0"),
    ("35", "b1", "35_acc4"),
    ("35 (K=1)", "b1", "35_dp2"),
    ("36", "b1", "36_acc4"),
    ("37", "b1", "37_acc4"),
    ("37 (K=1)", "b1", "37_dp2"),
    ("38", "seq_b1", "38_seq_acc4"),
    ("38", "seq_b1", "38_seq_dp2"),
    ("38 (1x1)", "seq_b1", "38_seq_b1"),
    ("39", "b1", "39_dp2"),
    ("39", "b1", "39_fsdp2"),
    ("39 (no clip)", "b1_clip0", "39_dp2_clip0"),
    ("40", "b1", "40_dp2"),
    ("41", "bn_b1", "41_bn_dp2"),
    ("43", "b1", "43_fsdp2"),
    ("43", "dp2", "43_fsdp2"),
    ("43", "dp2_acc2", "43_fsdp2_acc2"),
    ("43 (no bite)", "b1_clip0", "43_fsdp2_noclip"),
]


def launch(name: str, spec: tuple[int, list[str]], steps: int, root: str) -> float:
    """Wall seconds of one torchrun launch, torchrun to exit; a failure or a launch past
    TIMEOUT stops the check (its numbers would mean nothing)."""
    nproc, args = spec
    out = os.path.join(root, name)
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    argv += [f"--nproc-per-node={nproc}", ZOO, "--steps", str(steps), "--out", out, *args]
    start = time.perf_counter()
    try:
        proc = subprocess.run(argv, cwd=root, capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        raise SystemExit(f"{name}: no exit in {TIMEOUT} s: {argv!r}") from None
    if proc.returncode:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        raise SystemExit(f"{name}: exited {proc.returncode}: {argv!r}")
    return time.perf_counter() - start


def read_run(folder: str) -> dict:
    ranks = {}
    for f in sorted(os.listdir(folder)):
        if f.startswith("rank") and f.endswith(".jsonl"):
            with open(os.path.join(folder, f)) as fh:
                ranks[int(f[4:-6])] = [json.loads(line) for line in fh]
    steps = len(ranks[0])
    tensors = [
        torch.load(os.path.join(folder, f"step{s}.pt"), weights_only=True) for s in range(steps + 1)
    ]
    return {"ranks": ranks, "steps": steps, "tensors": tensors}


def flat(d: dict) -> torch.Tensor:
    if not d:
        return torch.zeros(1, dtype=torch.float64)
    return torch.cat([d[k].detach().double().reshape(-1) for k in sorted(d)])


def rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-30)


def vrel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / max(float(b.norm()), 1e-30))


def compare(base: dict, var: dict) -> dict:
    worst = {k: 0.0 for k in ("loss", "lossbw", "gnorm", "grad", "params", "buffers")}
    ratio = 1.0
    grad_first = None
    first = None
    samples_ok = lr_ok = True
    last = {}
    for s in range(1, min(base["steps"], var["steps"]) + 1):
        b0, v0 = base["ranks"][0][s - 1], var["ranks"][0][s - 1]
        bs = Counter(i for r in base["ranks"].values() for i in r[s - 1]["samples"])
        vs = Counter(i for r in var["ranks"].values() for i in r[s - 1]["samples"])
        tb, tv = base["tensors"][s], var["tensors"][s]
        if s == 1:
            ratio = v0["grad_norm"] / b0["grad_norm"]
        now = {
            "loss": rel(v0["loss"], b0["loss"]),
            "lossbw": rel(v0["loss_backward"], b0["loss_backward"]),
            "gnorm": rel(v0["grad_norm"], b0["grad_norm"]),
            "grad": vrel(flat(tv["grads"]), flat(tb["grads"])),
            "params": vrel(flat(tv["params"]), flat(tb["params"])),
            "buffers": vrel(flat(tv["buffers"]), flat(tb["buffers"])),
        }
        for k, x in now.items():
            worst[k] = max(worst[k], x)
        what = [k for k, x in now.items() if x > THRESHOLD]
        if now["grad"] > THRESHOLD and grad_first is None:
            grad_first = s
        if bs != vs:
            samples_ok = False
            what.insert(0, "samples")
        if v0["lr"] != b0["lr"]:
            lr_ok = False
            what.insert(0, f"lr {v0['lr']:.4g} vs {b0['lr']:.4g}")
        if what and first is None:
            first = (s, what)
        last = now
        p0 = flat(base["tensors"][0]["params"])
        update = float((flat(tb["params"]) - p0).norm())
        last["upd"] = float((flat(tv["params"]) - flat(tb["params"])).norm()) / update
    return {
        "worst": worst,
        "last": last,
        "first": first,
        "ratio": ratio,
        "grad_first": grad_first,
        "samples_ok": samples_ok,
        "lr_ok": lr_ok,
    }


def e(x: float) -> str:
    return "0" if x == 0 else f"{x:.1e}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--keep", default=None, help="keep the run folders here (reused)")
    parser.add_argument("--only", nargs="*", default=None, help="only these pairs' variants")
    args = parser.parse_args()
    root = args.keep or tempfile.mkdtemp(prefix="batchzoo-")
    os.makedirs(root, exist_ok=True)
    pairs = [p for p in PAIRS if args.only is None or p[2] in args.only]
    needed = {n for _, b, v in pairs for n in (b, v)}
    every = configs()
    times: dict[str, float] = {}
    for name in every:
        if name not in needed:
            continue
        if os.path.exists(os.path.join(root, name, "rank0.jsonl")) and args.keep:
            continue
        times[name] = launch(name, every[name], args.steps, root)
        print(f"launched {name}: {times[name]:.1f} s", file=sys.stderr, flush=True)
    runs = {name: read_run(os.path.join(root, name)) for name in needed}

    print(machine())
    print(f"\n{args.steps} optimizer steps, global batch 16; relative differences (see the doc)\n")
    rows = [["kind", "baseline", "variant", "samples", "lr", "loss", "lossbw", "gnorm", "g1x",
             "grad", "grad@", "params", "upd", "buffers", "first (step: what)"]]  # fmt: skip
    for kind, b, v in pairs:
        c = compare(runs[b], runs[v])
        w, last = c["worst"], c["last"]
        first = "-" if c["first"] is None else f"{c['first'][0]}: {', '.join(c['first'][1])}"
        rows.append([kind, b, v, "=" if c["samples_ok"] else "DIFF", "=" if c["lr_ok"] else "DIFF",
                     e(w["loss"]), e(w["lossbw"]), e(w["gnorm"]), f"{c['ratio']:.3f}", e(w["grad"]),
                     str(c["grad_first"] or "-"), e(last["params"]), e(last["upd"]), e(w["buffers"]), first])  # fmt: skip
    print(table(rows))

    print("\nclipping (max norm 0.7, 0.45 with --seq, unless --clip): steps whose norm passed it")
    for name in sorted(needed):
        recs = runs[name]["ranks"][0]
        bites = [r["step"] for r in recs if r["clipped"]]
        norms = " ".join(f"{r['grad_norm']:.3f}" for r in recs)
        print(f"  {name:18s} clipped at {bites or 'none'}; norms {norms}")

    if times:
        print("\nlaunch wall time (s), torchrun to exit:")
        for name, t in times.items():
            print(f"  {name:18s} nproc={every[name][0]}  {t:5.1f}")
        one = [t for n, t in times.items() if every[n][0] == 1]
        two = [t for n, t in times.items() if every[n][0] == 2]
        if one and two:
            print(f"  mean: nproc=1 {sum(one) / len(one):.1f} s, nproc=2 {sum(two) / len(two):.1f} s,"
                  f" total {sum(times.values()):.0f} s")  # fmt: skip


if __name__ == "__main__":
    main()
