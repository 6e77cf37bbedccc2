"""A minimal data-parallel trainer that resumes exactly: read it top to bottom.

Run by hand:  torchrun --nproc-per-node=2 train.py --max-steps=6 --save-at=3 --output-dir=out
then resume:  torchrun --nproc-per-node=2 train.py --max-steps=6 --output-dir=out2 \
                  --resume-from=out/checkpoints/step_3

`--bug=...` switches on a classic resume bug, to show that the test catches it.

Nothing here knows about the plugin: no import, no call. Under a resume test every rank
records each optimizer step by itself (the loss of each `backward()`, the inputs' sample ids,
the model, optimizer and scheduler, every random stream), so this file is tested as it is.
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

BUGS = ("none", "no-cpu-rng", "restart-from-zero")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--max-steps", type=int, required=True)
    parser.add_argument("--save-at", default="", help="comma-separated steps to checkpoint after")
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--resume-from", default=None)
    parser.add_argument("--bug", choices=BUGS, default="none")
    parser.add_argument(
        "--metrics-dir",
        default=None,
        help="write each rank's per-step loss and lr as JSON here (comparing runs by hand)",
    )
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    save_at = {int(s) for s in args.save_at.split(",") if s}
    dist.init_process_group("gloo")
    rank = dist.get_rank()

    # Same initial weights on every rank; then a per-rank stream for data and dropout.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.5), nn.Linear(32, 1))
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 4))
    torch.manual_seed(1000 + rank)

    metrics: dict[int, list[float]] = {}
    start = 1
    if args.resume_from:
        # Our own per-rank file, written just below by this trainer: weights_only is safe.
        state = torch.load(os.path.join(args.resume_from, f"rank-{rank}.pt"), weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        if args.bug != "no-cpu-rng":
            torch.set_rng_state(state["cpu_rng"])
        start = 1 if args.bug == "restart-from-zero" else state["step"] + 1

    for step in range(start, args.max_steps + 1):
        x = torch.randn(16, 8)
        y = x.sum(dim=1, keepdim=True)
        loss = nn.functional.mse_loss(ddp(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        metrics[step] = [loss.item(), scheduler.get_last_lr()[0]]

        if step in save_at:
            ckpt = os.path.join(args.output_dir, "checkpoints", f"step_{step}")
            os.makedirs(ckpt, exist_ok=True)
            torch.save(
                {
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict(),
                    "cpu_rng": torch.get_rng_state(),
                    "step": step,
                },
                os.path.join(ckpt, f"rank-{rank}.pt"),
            )
    if args.metrics_dir:
        os.makedirs(args.metrics_dir, exist_ok=True)
        with open(os.path.join(args.metrics_dir, f"rank-{rank}.json"), "w") as f:
            json.dump(metrics, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
