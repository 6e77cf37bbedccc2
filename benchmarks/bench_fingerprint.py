"""Tensor fingerprint throughput against reading the memory (`torch.sum`) and `hashlib.sha256`.

Every recorded or watched tensor is fingerprinted on every step, so this bounds what `record`
and `watch` cost per byte. Targets: at least half of `torch.sum`'s rate over the same tensor
(memory-read bandwidth), and at least 10x `sha256`.

    python benchmarks/bench_fingerprint.py [--mib 256] [--repeat 5]
"""

from __future__ import annotations

import argparse
import hashlib
import time
from typing import Any, Callable

import torch
from common import machine, median_of, table

from pytest_resume_equiv.rank.fingerprint import content_hash, describe


def seconds(fn: Callable[[], Any], repeat: int) -> float:
    fn()  # warm up: page in the tensor, load code
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return median_of(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    tensor = torch.randn(args.mib * 1024 * 1024 // 4)  # float32
    raw = tensor.numpy().view("uint8")
    variants = {
        "torch.sum (memory read)": lambda: float(tensor.sum()),
        "content_hash (fingerprint)": lambda: content_hash(tensor),
        "describe (fingerprint + stats)": lambda: describe(tensor),
        "hashlib.sha256": lambda: hashlib.sha256(raw).hexdigest(),
    }
    times = {label: seconds(fn, args.repeat) for label, fn in variants.items()}
    gib = args.mib / 1024
    reference = times["torch.sum (memory read)"]
    sha = times["hashlib.sha256"]
    rows = [["operation", "ms", "GiB/s", "rate vs torch.sum", "rate vs sha256"]]
    for label, value in times.items():
        rows.append(
            [
                label,
                f"{value * 1000:.1f}",
                f"{gib / value:.2f}",
                f"{reference / value:.2f}",
                f"{sha / value:.1f}x",
            ]
        )
    print(machine())
    print(
        f"{args.mib} MiB float32 tensor on CPU, median of {args.repeat}; torch threads: "
        f"{torch.get_num_threads()} (ranks run with OMP_NUM_THREADS=1)"
    )
    print(table(rows))
    print("targets: content_hash >= 0.5 of torch.sum's rate, >= 10x sha256")


if __name__ == "__main__":
    main()
