"""A trainer shaped like the public `*_no_trainer.py` scripts, for the look-alike causes of
issue 41: bugs whose evidence reads like another cause's, and a correct resume whose fresh
process computes at another rounding.

The shape: a shuffled DataLoader (torch's RandomSampler, seeded from the CPU RNG whenever an
iterator starts) yielding dicts; noise drawn from the CPU RNG before each forward; dropout;
AdamW and a warmup LR scheduler; optional gradient accumulation counted in
micro-batches; a running loss normalizer kept in a plain dict; a checkpoint folder per saved
step. The restore function does what the public scripts do for a mid-epoch resume: it puts
back the CPU RNG state saved at the epoch's start, starts the iterator again (its shuffle
drawn again), skips the batches the saved steps consumed, then puts back the CPU RNG state of
the save. A resumed run keeps saving into the folder it resumed from.

`lookalikezoo.py [--accum=K] [--save-check=sync|completed] [--no-noise] [--bug=NAME]`:
- `--accum` (launch argument): micro-batches per optimizer step (1);
- `--no-noise` (launch argument): no dropout and no input noise, so nothing random is drawn
  inside a step (the data's shuffle still is);
- `--save-check` (launch argument): when a checkpoint is due, `sync` saves only right after an
  optimizer step; `completed` saves whenever the completed-step count is due, as the public
  scripts did before they checked `sync_gradients`: with `--accum=2` the split's folder is
  written again after the next window's first micro-batch, whose gradient is not saved (a
  partial accumulation window lost at the resume);
- `--bug` (a resume argument: the resumed launch only):
  - `none`: the exact resume;
  - `epoch_rng_only`: the CPU RNG is put back to the epoch's start to draw the shuffle again,
    and the state saved at the split is never put back (the resumed steps draw their noise
    and dropout from the epoch's start state, advanced by the iterator's draws);
  - `no_skip`: the shuffle is drawn again but the consumed batches are not skipped: the
    resumed run consumes the epoch's first batches again (the sampler's seed is drawn lazily,
    at the first fetch, so after the state of the split was put back);
  - `counter_in_steps`: (with --accum) the micro-step counter is restored in optimizer steps,
    not micro-batches: the resumed run accumulates out of phase;
  - `resumed_chunks`: not a bug: the resumed process, which still holds the loaded
    checkpoint, evaluates the model's head in two chunks (a memory-saving path chosen at
    load), so it sums in another order, at rounding level only, deterministically (a fresh
    process that picked another kernel, simulated on the CPU);
  - `normalizer`: the running loss normalizer, kept in a plain dict, is saved but not loaded:
    it starts over in the resumed process (state the audit does not see).

The trainer makes no `record` or `watch` call: the plugin records it on its own;
`req.context()` is how it reads its launch arguments.
"""

import os
import sys

import torch
from torch.utils.data import DataLoader, Dataset

import pytest_resume_equiv as req


def _flag(name, default):
    prefix = f"--{name}="
    return next((a[len(prefix) :] for a in sys.argv[1:] if a.startswith(prefix)), default)


BUG = _flag("bug", "none")
ACCUM = int(_flag("accum", "1"))
SAVE_CHECK = _flag("save-check", "sync")
QUIET = "--no-noise" in sys.argv[1:]
DROPOUT, NOISE = (0.0, 0.0) if QUIET else (0.2, 0.01)
SAMPLES, BATCH, SAVE_EVERY = 16, 4, 4


class Rows(Dataset):
    """Samples as dicts, as a tokenized dataset yields them."""

    def __len__(self):
        return SAMPLES

    def __getitem__(self, i):
        return {"ids": i, "x": torch.linspace(-1, 1, 4) * (i + 1) / SAMPLES + i / 10}


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Dropout(DROPOUT)
        )
        self.head = torch.nn.Linear(16, 4)
        self.chunks = 1
        """How many chunks the head's matmul is split into (a memory-saving path)."""

    def forward(self, x):
        h = self.body(x)
        if self.chunks == 1:
            return self.head(h)
        parts = zip(h.chunk(self.chunks, dim=1), self.head.weight.chunk(self.chunks, dim=1))
        return sum(a @ w.T for a, w in parts) + self.head.bias


ctx = req.context()
ctx.init_process_group()
torch.manual_seed(0)
model = Net()
opt = torch.optim.AdamW(model.parameters(), lr=0.01)
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 4))
loader = DataLoader(Rows(), batch_size=BATCH, shuffle=True)
normalizer = {"mean": 1.0}
"""A running loss scale the script keeps outside every watched object."""


def start_epoch(run):
    run["epoch_rng"] = torch.get_rng_state()  # to draw this epoch's shuffle again at a resume
    run["position"] = 0
    return iter(loader)


def save(run, completed, micro):
    if ctx.resuming:  # into the folder it resumed from, beside what it loaded
        folder = ctx.checkpoint
        name = f"resumed-step_{completed}-{os.getpid()}.pt"
    else:
        folder, name = ctx.checkpoint_for(completed), "state.pt"
    os.makedirs(folder, exist_ok=True)
    state = {
        "model": model.state_dict(),
        "opt": opt.state_dict(),
        "sched": sched.state_dict(),
        "completed": completed,
        "micro": micro,
        "epoch": run["epoch"],
        "position": run["position"],
        "epoch_rng": run["epoch_rng"],
        "rng": torch.get_rng_state(),
        "normalizer": normalizer["mean"],
    }
    torch.save(state, os.path.join(folder, name))


def restore(run):
    state = torch.load(os.path.join(ctx.checkpoint, "state.pt"), weights_only=True)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    sched.load_state_dict(state["sched"])
    if BUG != "normalizer":
        normalizer["mean"] = state["normalizer"]
    run.update(epoch=state["epoch"], position=state["position"], epoch_rng=state["epoch_rng"])
    micro = state["completed"] if BUG == "counter_in_steps" else state["micro"]
    torch.set_rng_state(state["epoch_rng"])  # the epoch's shuffle again
    batches = iter(loader)
    if BUG != "no_skip":
        for _ in range(state["position"]):
            next(batches)  # the batches the saved steps consumed
    if BUG != "epoch_rng_only":
        torch.set_rng_state(state["rng"])
    if BUG == "resumed_chunks":
        model.chunks = 2  # the loaded checkpoint still held: the memory-saving path
    return state["completed"], micro, batches


run = {"epoch": 0, "position": 0, "epoch_rng": None}
completed, micro, batches = restore(run) if ctx.resuming else (0, 0, None)
while completed < ctx.steps:
    if batches is None:
        batches = start_epoch(run)
    try:
        batch = next(batches)
    except StopIteration:
        batches = None
        run["epoch"] += 1
        continue
    run["position"] += 1
    x = batch["x"]
    if NOISE:
        x = x + NOISE * torch.randn(x.shape)  # input noise, drawn before the forward
    loss = model(x).pow(2).mean() / normalizer["mean"]
    normalizer["mean"] = 0.9 * normalizer["mean"] + 0.1 * loss.item()
    (loss / ACCUM).backward()
    micro += 1
    synced = micro % ACCUM == 0
    if synced:
        opt.step()
        sched.step()
        opt.zero_grad()
        completed += 1
    due = ctx.should_save(completed) or (completed and completed % SAVE_EVERY == 0)
    if due and (synced or SAVE_CHECK == "completed"):
        save(run, completed, micro)
