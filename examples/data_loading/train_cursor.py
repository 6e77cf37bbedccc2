"""A trainer whose place in the data is a count of global samples, so it resumes on any
number of ranks.

Read it top to bottom: the data, the model, the resume, the loop, the checkpoint. Every step
consumes a global batch of 4 samples from the epoch's shuffled order; rank r of W takes every
W-th of them. The loss is summed over the global batch and all-reduced, and so are the
gradients, so the run is the same computation on 1, 2 or 4 ranks up to the order of the
additions.

    torchrun --nproc-per-node=2 train_cursor.py --max-steps=8 --save-at=5 --output-dir=out
    torchrun --nproc-per-node=1 train_cursor.py --max-steps=8 --output-dir=out2 \
        --resume-from=out/checkpoints/step_5

`--bug=per-process-skip` saves how many samples this process consumed and, on resume, skips
that many per process: right on the same number of ranks, wrong on any other.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist

SAMPLES, GLOBAL_BATCH = 24, 4


def sample(i: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(4, generator=torch.Generator().manual_seed(i))
    return x, x.sum(0, keepdim=True)


def global_batch(cursor: int) -> list[int]:
    """The sample ids at global positions cursor .. cursor + GLOBAL_BATCH - 1."""
    ids = []
    for position in range(cursor, cursor + GLOBAL_BATCH):
        epoch, index = divmod(position, SAMPLES)
        order = torch.randperm(SAMPLES, generator=torch.Generator().manual_seed(100 + epoch))
        ids.append(int(order[index]))
    return ids


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--max-steps", type=int, required=True)
    parser.add_argument("--save-at", default="", help="comma-separated steps to checkpoint after")
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--resume-from", default=None)
    parser.add_argument("--bug", choices=("none", "per-process-skip"), default="none")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    save_at = {int(s) for s in args.save_at.split(",") if s}
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    step, cursor = 1, 0
    if args.resume_from:
        # Written below by rank 0, whatever the number of ranks: weights_only loading is safe.
        state = torch.load(os.path.join(args.resume_from, "state.pt"), weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step = state["step"] + 1
        cursor = state["cursor"]
        if args.bug == "per-process-skip":
            cursor = state["samples_this_process"] * world

    while step <= args.max_steps:
        ids = global_batch(cursor)[rank::world]
        cursor += GLOBAL_BATCH
        x, y = (torch.stack(t) for t in zip(*(sample(i) for i in ids)))
        loss = (model(x) - y).pow(2).sum()
        optimizer.zero_grad()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)  # the global batch's gradient, on every rank
        optimizer.step()
        total = loss.detach().clone()
        dist.all_reduce(total)  # the global batch's loss: the same value on every rank

        if step in save_at and rank == 0:
            ckpt = os.path.join(args.output_dir, "checkpoints", f"step_{step}")
            os.makedirs(ckpt, exist_ok=True)
            state = {
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "step": step,
                "cursor": cursor,
                "samples_this_process": cursor // world,
            }
            torch.save(state, os.path.join(ckpt, "state.pt"))
        if step in save_at:
            dist.barrier()  # the checkpoint is complete before any rank goes on
        step += 1
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
