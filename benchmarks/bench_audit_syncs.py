"""Host transfers and peak memory of one `record` that watches a large bf16 tensor.

On an accelerator every copy of fingerprint data to the host is a device sync, and a float32
copy of a bf16 tensor for its statistics doubles the memory a large embedding takes at
`record`. This measures, per record: the copies to the host (`fingerprint.to_host` calls,
and on CUDA the syncs `torch.cuda.set_sync_debug_mode` reports), and the peak memory above
the tensor itself, against the baseline of taking the statistics through a float32 copy
(what `record` did before). Each measurement runs in a fresh process: the peak resident set
(CPU) or `max_memory_allocated` (CUDA) is then that of the measured step alone.

    python benchmarks/bench_audit_syncs.py [--mib 1024] [--tensors 4] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from common import ROOT, machine, table

CHILD = r"""
import json, os, resource, sys, warnings
import torch
from pytest_resume_equiv.rank import fingerprint
from pytest_resume_equiv.rank.watch import Watched

mode, mib, tensors, device = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
cuda = device == "cuda"
params = torch.nn.ParameterList(
    torch.nn.Parameter(torch.randn(mib * 1024 * 1024 // 2 // tensors, device=device,
                                   dtype=torch.bfloat16))
    for _ in range(tensors)
)
model = torch.nn.Module()
model.params = params
watched = Watched()
watched.watch(model=model)

def rss():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

def fp32_copy_stats():
    # the statistics as record took them before: through a float32 copy of each tensor
    for p in params:
        work = p.detach().reshape(-1).to(torch.float32)
        torch.stack([torch.linalg.vector_norm(work), work.mean(), work.abs().max()]).cpu()

crossings = []
real = fingerprint.to_host
fingerprint.to_host = lambda words: crossings.append(1) or real(words)
if cuda:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
else:
    base = rss()
with warnings.catch_warnings(record=True) as syncs:
    warnings.simplefilter("always")
    if cuda:
        torch.cuda.set_sync_debug_mode("warn")
    if mode == "record":
        watched.audit()
    else:
        fp32_copy_stats()
    if cuda:
        torch.cuda.set_sync_debug_mode(0)
peak = (torch.cuda.max_memory_allocated() if cuda else rss()) - base
print(json.dumps({"to_host": len(crossings), "syncs": len(syncs) if cuda else None,
                  "peak_extra": peak}))
"""


def measure(mode: str, mib: int, tensors: int, device: str) -> dict:
    argv = [sys.executable, "-c", CHILD, mode, str(mib), str(tensors), device]
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-4000:])
        raise SystemExit(f"the {mode} child exited {proc.returncode}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=1024, help="bf16 MiB watched in all")
    parser.add_argument("--tensors", type=int, default=4)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    args = parser.parse_args()
    record = measure("record", args.mib, args.tensors, args.device)
    baseline = measure("fp32-copy", args.mib, args.tensors, args.device)
    mib = 1024 * 1024
    rows = [["per record", "copies to host", "device syncs", "peak memory above the tensors"]]
    for label, found in (
        ("watch audit (digest + statistics)", record),
        ("statistics through a float32 copy (before)", baseline),
    ):
        syncs = "n/a (cpu)" if found["syncs"] is None else str(found["syncs"])
        copies = str(found["to_host"]) if label.startswith("watch") else f"{args.tensors}+"
        rows.append([label, copies, syncs, f"{found['peak_extra'] / mib:.0f} MiB"])
    print(machine())
    print(
        f"{args.mib} MiB of bf16 parameters in {args.tensors} tensors on {args.device}, "
        "one audit each, in a fresh process"
    )
    print(table(rows))
    print("targets: one copy to the host per audit; peak memory well under the tensors' size")


if __name__ == "__main__":
    main()
