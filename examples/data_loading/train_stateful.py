"""A trainer fed by torchdata's StatefulDataLoader with two worker processes, which resumes
mid-epoch in any epoch.

Read it top to bottom: the data, the model, the resume, the loop, the checkpoint. The loader's
state (position in the epoch, the workers' base seed, each worker's state) is saved with the
weights; the sampler's epoch is saved beside it, because the loader's state does not hold it.

    torchrun --nproc-per-node=1 train_stateful.py --max-steps=7 --save-at=6 --output-dir=out
    torchrun --nproc-per-node=1 train_stateful.py --max-steps=7 --output-dir=out2 \
        --resume-from=out/checkpoints/step_6

Nothing here knows about the plugin unless `--watch-loader` asks: under a resume test every
rank records each optimizer step by itself (the loss, the batches by content, the model and
the optimizer, every random stream). What it cannot see is the loader's own state: with
`--watch-loader` the trainer hands the loader to `req.watch` (its position, its sampler's
epoch, its workers) and records each batch's dataset indices, so a report can say which
sample and which epoch (docs/guides/recording-more.md).

`--bug=epoch-not-restored` loads the loader's state but not the epoch: the sampler shuffles
epoch 1's remaining batches with epoch 0's permutation (a classic of mid-epoch resumes).
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch.utils.data import Dataset, DistributedSampler
from torchdata.stateful_dataloader import StatefulDataLoader

SAMPLES, BATCH = 8, 2


class Samples(Dataset):
    """Sample i, with its augmentation drawn from a generator of its own: a worker's global RNG
    is re-seeded when a resumed loader starts its workers, and its state is not saved."""

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, i: int) -> dict:
        g = torch.Generator().manual_seed(i)
        x = torch.randn(4, generator=g)
        return {"ids": i, "x": x, "y": x.sum(0, keepdim=True)}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--max-steps", type=int, required=True)
    parser.add_argument("--save-at", default="", help="comma-separated steps to checkpoint after")
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--resume-from", default=None)
    parser.add_argument("--bug", choices=("none", "epoch-not-restored"), default="none")
    parser.add_argument(
        "--watch-loader", action="store_true", help="record more: the loader and sample ids"
    )
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    save_at = {int(s) for s in args.save_at.split(",") if s}
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)

    sampler = DistributedSampler(Samples(), num_replicas=world, rank=rank, shuffle=True, seed=7)
    loader = StatefulDataLoader(Samples(), batch_size=BATCH, sampler=sampler, num_workers=2)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.5), torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    if args.watch_loader:
        import pytest_resume_equiv as req  # every call is a no-op outside a test run

        req.watch(loader=loader)  # the loader's state: no optimizer holds it

    step, epoch, rng = 1, 0, None
    if args.resume_from:
        # Our own file, written below: weights_only loading is safe.
        state = torch.load(os.path.join(args.resume_from, f"rank-{rank}.pt"), weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        loader.load_state_dict(state["loader"])
        epoch = 0 if args.bug == "epoch-not-restored" else state["epoch"]
        step, rng = state["step"] + 1, state["rng"]

    while step <= args.max_steps:
        sampler.set_epoch(epoch)
        batches = iter(loader)  # draws the workers' base seed from the CPU RNG
        if rng is not None:
            # Restored after that draw: the uninterrupted run, mid-epoch here, made it long ago.
            torch.set_rng_state(rng)
            rng = None
        for batch in batches:
            loss = torch.nn.functional.mse_loss(model(batch["x"]), batch["y"])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if args.watch_loader:
                req.record(step, sample_ids=batch["ids"])  # dataset indices, beside the rest

            if step in save_at:
                ckpt = os.path.join(args.output_dir, "checkpoints", f"step_{step}")
                os.makedirs(ckpt, exist_ok=True)
                state = {
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "loader": loader.state_dict(),
                    "epoch": epoch,
                    "step": step,
                    "rng": torch.get_rng_state(),
                }
                torch.save(state, os.path.join(ckpt, f"rank-{rank}.pt"))
            step += 1
            if step > args.max_steps:
                break
        epoch += 1
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
