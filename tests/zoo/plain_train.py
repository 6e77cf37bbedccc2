"""A plain torchrun trainer with its own save and resume, and no plugin line: what zero
edits test as it is (tests/e2e/test_zero_edits.py).

    torchrun --nproc-per-node=2 plain_train.py --max-steps=6 --save-at=3 --out=o
    torchrun --nproc-per-node=2 plain_train.py --max-steps=6 --out=o2 --resume-from=o/step_3

`--bug=...` switches on one resume bug: the optimizer state or the LR scheduler not restored,
the data order restarted at the resume, one batch skipped or consumed again at the resume, the
epoch the checkpoint was made in run again (the checkpoint stores the epoch it finished, as
pytorch/examples' DDP tutorial does), or the checkpoint of a later step loaded. `--augment`
scales each sample by a draw from Python's `random` after the data is fetched: the checkpoint
does not save that stream, so a resume of it is wrong by itself (the inputs' content differs).
"""

import argparse
import os
import random

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

BUGS = (
    "none",
    "no-optimizer-state",
    "no-scheduler",
    "data-restart",
    "skip-batch",
    "repeat-batch",
    "replay-epoch",
    "wrong-checkpoint",
)
EPOCH = 3
"""Steps per epoch (the split of the tests is at the end of the first)."""


def batch(step: int, rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's share of the global batch of one step: a function of the step, so it
    resumes by itself, and the same samples over all ranks on any number of them."""
    gen = torch.Generator().manual_seed(1000 * step)
    x = torch.randn(16, 4, generator=gen)[rank::world]
    return x, x.sum(dim=1, keepdim=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-steps", type=int, required=True)
    parser.add_argument("--save-at", default="")
    parser.add_argument("--out", required=True)
    parser.add_argument("--resume-from", default=None)
    parser.add_argument("--bug", choices=BUGS, default="none")
    parser.add_argument("--augment", action="store_true")
    args = parser.parse_args()
    save_at = {int(s) for s in args.save_at.split(",") if s}
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(16, 1)
    )
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    torch.manual_seed(100 + rank)
    start = 1
    if args.resume_from:
        path = args.resume_from
        if args.bug == "wrong-checkpoint":  # a "latest" link that points past the split
            path = os.path.join(os.path.dirname(path), "step_5")
        state = torch.load(os.path.join(path, f"rank-{rank}.pt"), weights_only=True)
        model.load_state_dict(state["model"])
        if args.bug != "no-optimizer-state":
            optimizer.load_state_dict(state["optimizer"])
        if args.bug != "no-scheduler":
            scheduler.load_state_dict(state["scheduler"])
        torch.set_rng_state(state["rng"])
        start = state["step"] + 1
        if args.bug == "wrong-checkpoint":
            start = int(os.path.basename(args.resume_from).split("_")[1]) + 1
        if args.bug == "replay-epoch":  # resumes at the start of the epoch it finished
            start = (state["step"] - 1) // EPOCH * EPOCH + 1
    first = start
    for step in range(start, args.max_steps + 1):
        data = step
        if args.bug == "data-restart":  # the data order starts over at the resume
            data = step - first + 1
        elif args.bug == "skip-batch":  # one batch too many skipped at the resume
            data = step + 1
        elif args.bug == "repeat-batch":  # the data cursor restored one batch behind
            data = step - 1
        x, y = batch(data, rank, world)
        if args.augment:  # a random scale per sample, drawn after the data was fetched
            x = x * torch.tensor([[random.uniform(0.5, 1.5)] for _ in range(len(x))])
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        if step in save_at or (args.bug == "wrong-checkpoint" and step == 5):
            folder = os.path.join(args.out, f"step_{step}")
            os.makedirs(folder, exist_ok=True)
            state = {
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(),
                "rng": torch.get_rng_state(),
                "step": step,
            }
            torch.save(state, os.path.join(folder, f"rank-{rank}.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
