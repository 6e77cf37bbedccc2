"""A trainer shaped like the public `*_no_trainer.py` scripts, for causes that look alike:
a shuffled DataLoader, a checkpoint folder per saved step (`step_{N}`, every 3 steps and at
the split), and a mid-epoch resume done the usual way: the restore function re-draws the
epoch's shuffle from the RNG state saved at the epoch's start, skips the batches already
consumed, then puts back the RNG state of the split. The DataLoader's `RandomSampler` makes a
fresh `torch.Generator` (seeded from the CPU RNG) whenever an iterator starts: in the
uninterrupted run that happens in `start_epoch`, in the resumed run in `restore`, on another
line. The correct trainer must pass all the same.

`causezoo.py [--own-generator] [--sharded] [--bug=NAME]` (`--bug` is a resume argument: the
resumed launch only; `--own-generator` gives the loader a generator of its own, seeded at
start; `--sharded` shards the data with a DistributedSampler, all-reduces the gradients and
records only the all-reduced loss, no sample ids, as elastic scripts often do):
- `none`: the exact resume;
- `no_epoch_shuffle`: the restore function starts the iterator without putting back the RNG
  state of the epoch's start (the CPU RNG of the split is restored after it, and matches):
  the sampler's generator, seeded from the CPU RNG, shuffles the epoch another way;
- `newest`: loads the newest checkpoint folder, not the one it was given (the step to resume
  at still comes from the given folder's name, as the public scripts take it);
- `loader_reseed`: (with --own-generator) the loader's generator is seeded again at load and
  its saved state never applied: the resumed epoch replays epoch 0's order;
- `unwatched`: a running loss normalizer that the audit does not watch is saved but not
  loaded: it starts over in the resumed process (everything watched restores exactly).

The trainer makes no `record` or `watch` call: the plugin records it on its own;
`req.context()` is how it reads its launch arguments. Only `--sharded` records its all-reduced
loss by hand: its test runs with auto=False, to show what such a record alone can tell.
"""

import os
import sys

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import pytest_resume_equiv as req

BUG = next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--bug=")), "none")
OWN_GENERATOR = "--own-generator" in sys.argv[1:]
SHARDED = "--sharded" in sys.argv[1:]
SAMPLES, BATCH, SAVE_EVERY = 8, 2, 3

ctx = req.context()
ctx.init_process_group()
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(8, 1)
)
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
ids = torch.arange(SAMPLES)
rows = torch.linspace(-1, 1, SAMPLES * 4).reshape(SAMPLES, 4)
loader_generator = torch.Generator().manual_seed(7) if OWN_GENERATOR else None
data = TensorDataset(ids, rows)
sampler = DistributedSampler(data, world, rank, shuffle=True, seed=0) if SHARDED else None
loader = DataLoader(
    data,
    batch_size=BATCH,
    shuffle=not SHARDED,
    sampler=sampler,
    generator=loader_generator,
)
PER_EPOCH = len(loader)
normalizer = {"mean": 1.0}
"""A running loss scale the script keeps outside every watched object."""


def shuffle_state():
    """The state the epoch's shuffle is drawn from: the loader's generator, or the CPU RNG."""
    return loader_generator.get_state() if OWN_GENERATOR else torch.get_rng_state()


def set_shuffle_state(state):
    if OWN_GENERATOR:
        loader_generator.set_state(state)
    else:
        torch.set_rng_state(state)


def start_epoch(run, step):
    run["epoch_start"] = shuffle_state()
    if SHARDED:
        sampler.set_epoch(step // PER_EPOCH)
    return iter(loader)


def save(step, run):
    if SHARDED and rank != 0:
        return  # the ranks hold the same state: rank 0 writes it
    # a resumed launch keeps its own saves under its own run directory (the uninterrupted
    # launch's folders are shared by every case)
    own = os.path.join(ctx.run_dir, "out", f"step_{step}")
    folder = own if ctx.resuming else ctx.checkpoint_for(step)
    os.makedirs(folder, exist_ok=True)
    state = {
        "model": model.state_dict(),
        "opt": opt.state_dict(),
        "step": step,
        "rng": torch.get_rng_state(),
        "epoch_start": run["epoch_start"],
        "normalizer": normalizer["mean"],
    }
    torch.save(state, os.path.join(folder, "state.pt"))


def newest(folder):
    """The checkpoint folder of the highest step beside `folder` (a "resume from latest")."""
    parent = os.path.dirname(folder)
    steps = [int(n.split("_")[1]) for n in os.listdir(parent) if n.startswith("step_")]
    return os.path.join(parent, f"step_{max(steps)}")


def restore(run):
    folder = newest(ctx.checkpoint) if BUG == "newest" else ctx.checkpoint
    state = torch.load(os.path.join(folder, "state.pt"), weights_only=True)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    step = int(os.path.basename(ctx.checkpoint).split("_")[1])
    run["epoch_start"] = state["epoch_start"]
    if BUG != "unwatched":
        normalizer["mean"] = state["normalizer"]
    if BUG == "loader_reseed":
        loader_generator.manual_seed(7)  # the loader is rebuilt as at start, seed and all
    elif BUG != "no_epoch_shuffle":
        set_shuffle_state(state["epoch_start"])
    batches = None
    if step % PER_EPOCH:
        if SHARDED:
            sampler.set_epoch(step // PER_EPOCH)
        batches = iter(loader)  # the epoch's shuffle again, from the state at its start
        for _ in range(step % PER_EPOCH):
            next(batches)  # the batches the saved steps consumed
    torch.set_rng_state(state["rng"])
    return step, batches


run = {"epoch_start": None}
step, batches = restore(run) if ctx.resuming else (0, None)
while step < ctx.steps:
    if batches is None:
        batches = start_epoch(run, step)
    try:
        _, x = next(batches)
    except StopIteration:
        batches = None
        continue
    loss = model(x).pow(2).mean() / normalizer["mean"]
    normalizer["mean"] = 0.9 * normalizer["mean"] + 0.1 * loss.item()
    opt.zero_grad()
    loss.backward()
    if SHARDED:
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world
    opt.step()
    step += 1
    if SHARDED:  # only the all-reduced loss, recorded by hand (tested with auto=False)
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        req.record(step, loss=mean.item() / world)
    if ctx.should_save(step) or step % SAVE_EVERY == 0:
        save(step, run)
