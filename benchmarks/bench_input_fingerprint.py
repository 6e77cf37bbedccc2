"""The automatic input fingerprint of a large batch: what crosses to the host, and the
memory it takes where the batch lives.

`auto:data` gives every sample given to the model's forward an id, a hash of its row of
the inputs, reduced where the batch lives (rank/inputs.py `device_row_digests`). This
measures, for one batch, in a fresh process per variant: the copies to the host made while
fingerprinting (a TorchFunctionMode sees every `.cpu()`, `.item()`, `.tolist()`,
`.numpy()`, `.to("cpu")`), the bytes the step's line later copies, the peak memory above
the batch, and the time, against the baseline of the same digest reduced over the whole
batch at once (what it did before). On `--device cpu` the device code runs on CPU tensors
(the trainer's CPU path hashes rows in place instead, `--variant host`).

    python benchmarks/bench_input_fingerprint.py [--mib 1024] [--rows 64] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from common import ROOT, machine, table

CHILD = r"""
import json, resource, sys, time
import torch
from torch.overrides import TorchFunctionMode
from pytest_resume_equiv.rank import inputs

variant, mib, rows, device = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
cuda = device == "cuda"
batch = torch.randn(rows, mib * 1024 * 1024 // 4 // rows, device=device)

class HostCopies(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.count = 0
    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in ("cpu", "item", "tolist", "numpy", "__array__") or (
            name == "to" and "cpu" in map(str, [*args[1:], *(kwargs or {}).values()])):
            self.count += 1
        return func(*args, **(kwargs or {}))

def whole_batch(raw):
    # the digest as rank/inputs.py reduced it before: every column at once
    words = raw.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    idx = torch.arange(words.shape[1], device=words.device, dtype=torch.int64)
    mixed = (words + 0x9E3779B1) * ((idx * 0x632BE5AB + 0x7F4A7C15) | 1)
    mixed = mixed ^ (mixed >> 31)
    return torch.cat([mixed.sum(dim=1), (mixed * ((idx << 1) | 1)).sum(dim=1)])

def rss():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

raw = batch.reshape(-1).view(torch.uint8).reshape(rows, -1)
if cuda:
    torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
else:
    base = rss()
start = time.perf_counter()
with HostCopies() as mode:
    if variant == "banded":
        crossing = inputs.device_row_digests(raw).words
    elif variant == "whole":
        crossing = whole_batch(raw)
    else:
        crossing = None
        inputs._row_digests(batch)  # the CPU path: rows hashed in place on the host
if cuda:
    torch.cuda.synchronize()
seconds = time.perf_counter() - start
peak = (torch.cuda.max_memory_allocated() if cuda else rss()) - base
print(json.dumps({"copies": mode.count, "seconds": seconds, "peak_extra": peak,
                  "line_bytes": 0 if crossing is None else crossing.numel() * 8}))
"""


def measure(variant: str, mib: int, rows: int, device: str) -> dict:
    argv = [sys.executable, "-c", CHILD, variant, str(mib), str(rows), device]
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-4000:])
        raise SystemExit(f"the {variant} child exited {proc.returncode}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=1024, help="float32 MiB in the batch")
    parser.add_argument("--rows", type=int, default=64, help="samples in the batch")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    args = parser.parse_args()
    variants = [("banded", "device digest, a band of columns at a time")]
    variants.append(("whole", "device digest over the whole batch (before)"))
    if args.device == "cpu":
        variants.append(("host", "CPU path: rows hashed in place"))
    mib = 1024 * 1024
    rows = [["variant", "copies to host", "bytes in the line", "peak above the batch", "s/GiB"]]
    for variant, label in variants:
        found = measure(variant, args.mib, args.rows, args.device)
        rows.append(
            [
                label,
                str(found["copies"]) if variant != "host" else "0 (a numpy view)",
                str(found["line_bytes"]) if variant != "host" else "-",
                f"{found['peak_extra'] / mib:.0f} MiB",
                f"{found['seconds'] / (args.mib / 1024):.2f}",
            ]
        )
    print(machine())
    print(
        f"a {args.mib} MiB float32 batch of {args.rows} samples on {args.device}, one fingerprint"
    )
    print(table(rows))
    print("targets: no copy to the host while fingerprinting; peak well under the batch's size")


if __name__ == "__main__":
    main()
