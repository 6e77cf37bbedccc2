"""A trainer fed by a torch DataLoader, with a switch per resume bug of *order*: state that is
restored, but at the wrong moment (`--bug=NAME`; none: correct). The report must name when
it went wrong, not only what differs.

The data: 32 samples, 2 per step, a sampler seeded by the epoch (so a resumed epoch has the
same order), and a DataLoader whose iterator draws a base seed from the CPU RNG when it is
made. A correct trainer makes its iterator first and restores the RNG after it, so that draw
comes from the stream it will overwrite; the uninterrupted run made it at the start of the
epoch, before it saved.

The trainer makes no `record` or `watch` call: the plugin records every optimizer step, its
loss, its inputs and the model and optimizer on its own. `req.context()` is how it reads its
launch arguments.
"""

import os
import sys

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Sampler

import pytest_resume_equiv as req


def _flag(name, default):
    prefix = f"--{name}="
    return next((a[len(prefix) :] for a in sys.argv[1:] if a.startswith(prefix)), default)


BUG = _flag("bug", "none")
SAMPLES, BATCH = 32, 2
DATA = [(torch.arange(4.0) / 4 + i / SAMPLES, i) for i in range(SAMPLES)]


class EpochSampler(Sampler):
    """The epoch's permutation from a generator seeded by the epoch (as DistributedSampler)."""

    def __init__(self, epoch):
        self.epoch = epoch

    def __iter__(self):
        g = torch.Generator()
        g.manual_seed(1000 + self.epoch)
        return iter(torch.randperm(SAMPLES, generator=g).tolist())

    def __len__(self):
        return SAMPLES


def augment(batch):
    """A collate function that draws augmentation noise from the CPU RNG."""
    x = torch.stack([x for x, _ in batch])
    if BUG != "latent_rng":  # that variant draws nothing after it starts
        x = x + 0.01 * torch.randn(x.shape)
    return x, [i for _, i in batch]


def batches(epoch, skip):
    """The epoch's batches from `skip` on (making the iterator draws the base seed)."""
    loader = DataLoader(DATA, batch_size=BATCH, sampler=EpochSampler(epoch), collate_fn=augment)
    iterator = iter(loader)
    for _ in range(skip):
        next(iterator)
    return iterator


def train(ctx):
    ctx.init_process_group()
    torch.manual_seed(0)
    dropout = 0.0 if BUG == "latent_rng" else 0.25
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 8), torch.nn.Dropout(dropout), torch.nn.Linear(8, 1)
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    torch.manual_seed(100 + ctx.rank)
    # --reiterate=yes: a fresh iterator right after every save, so after a load too: both
    # runs draw its base seed at the same point, and the RNG is restored before it
    reiterate = _flag("reiterate", "no") == "yes"
    step, epoch, skip, saved_rng, first = 0, 0, 0, None, None
    if ctx.resuming:
        state = torch.load(os.path.join(ctx.checkpoint, f"rank-{ctx.rank}.pt"), weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step, epoch, skip, saved_rng = state["step"], state["epoch"], state["skip"], state["rng"]
        if BUG == "rng_then_iterator" or reiterate:
            torch.set_rng_state(saved_rng)  # restored, then the iterator below draws from it
    iterator = batches(epoch, skip)
    if BUG == "restore_after_fetch":
        first = next(iterator)  # the first batch fetched (its augmentation drawn), and then...
    restored = BUG in ("rng_then_iterator", "latent_rng") or reiterate
    if saved_rng is not None and not restored:
        torch.set_rng_state(saved_rng)  # ...the RNG restored
    while step < ctx.steps:
        x, _ids = first if first is not None else next(iterator)
        first = None
        if BUG == "latent_rng" and step < 2:
            torch.rand(1)  # draws only in the first steps: after the split the stream is idle
        loss = model(x).pow(2).mean()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= ctx.world_size
        optimizer.step()
        optimizer.zero_grad()
        step += 1
        skip += 1
        if ctx.should_save(step) or (BUG == "rolling" and not ctx.resuming):
            path = ctx.checkpoint_for(step)
            os.makedirs(path, exist_ok=True)
            state = {
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "step": step,
                "epoch": epoch,
                "skip": skip,
                "rng": torch.get_rng_state(),
            }
            torch.save(state, os.path.join(path, f"rank-{ctx.rank}.pt"))
            if _flag("eval-before-save", "no") == "yes":
                model.eval()  # an evaluation pass at the checkpoint, then back to training
                model(torch.ones(1, 4))
                model.train()
            if reiterate:
                iterator = batches(epoch, skip)
    dist.destroy_process_group()


if __name__ == "__main__":
    train(req.context())
