"""A plain torchrun trainer whose batching is a flag: the global batch of 8 samples per
optimizer step, split over the ranks and `--accum` micro-batches, DDP averaging the gradient
over the ranks. No plugin line.

    torchrun --nproc-per-node=2 train.py --steps 4 --accum 2

`--bug=no-accum-scale` forgets to divide each micro-batch's loss by the accumulation steps:
the stepped gradient is `--accum` times the baseline's (BUGS.md class 34).
"""

import argparse
import gc

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

GLOBAL_BATCH = 8


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--accum", type=int, default=1)
    parser.add_argument("--bug", choices=("none", "no-accum-scale"), default="none")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    torch.manual_seed(0)
    x = torch.randn(64, 4)
    data = TensorDataset(x, x.sum(dim=1, keepdim=True))
    sampler = DistributedSampler(data, shuffle=True, seed=0, drop_last=True)
    micro = GLOBAL_BATCH // (world * args.accum)
    # the global batch of a step is the same samples on any number of ranks and micro-batches
    loader = DataLoader(data, batch_size=micro, sampler=sampler, drop_last=True)
    model = DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    batches = iter(loader)
    for _ in range(args.steps):
        for _ in range(args.accum):
            inputs, target = next(batches)
            loss = torch.nn.functional.mse_loss(model(inputs), target)
            if args.bug != "no-accum-scale":
                loss = loss / args.accum
            loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    # DDP's reducer must not be the last holder of the process group when it is destroyed
    # (gloo can deadlock at exit then)
    del model, optimizer
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
