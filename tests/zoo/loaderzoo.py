"""A trainer fed by a DataLoader with a persistent worker, resuming mid-epoch by telling the
dataset how many samples of the epoch to skip (`--bug=persistent_carry`: the dataset keeps
that skip, and its persistent worker applies it again in every later epoch).

Runs inside ranks launched by the plugin, as a script: `loaderzoo.py [--bug=NAME]`. It makes
no `record` or `watch` call: the plugin records every optimizer step, its loss and the samples
given to the model on its own; `req.context()` is how it reads its launch arguments.
"""

import os
import sys

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, IterableDataset

import pytest_resume_equiv as req

BUG = next((a[6:] for a in sys.argv[1:] if a.startswith("--bug=")), "none")
SAMPLES, BATCH = 6, 2


class Epoch(IterableDataset):
    """One pass over the samples, starting after `skip` of them (set once, at a resume)."""

    def __init__(self):
        self.skip = 0

    def __iter__(self):
        start = self.skip
        if BUG != "persistent_carry":
            self.skip = 0  # used once: the next epoch starts at its beginning
        yield from range(start, SAMPLES)


def main(ctx):
    ctx.init_process_group()
    torch.manual_seed(0)
    data = Epoch()
    loader = DataLoader(data, batch_size=BATCH, num_workers=1, persistent_workers=True)
    model = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    step = 0
    if ctx.resuming:
        state = torch.load(os.path.join(ctx.checkpoint, "state.pt"), weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step = state["step"]
        data.skip = (step * BATCH) % SAMPLES  # set before the worker starts: it copies data
    while step < ctx.steps:
        for ids in loader:
            loss = (model(ids.float().unsqueeze(1)) - 1).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            if ctx.should_save(step):
                os.makedirs(ctx.checkpoint_for(step), exist_ok=True)
                state = {"model": model.state_dict(), "opt": opt.state_dict(), "step": step}
                torch.save(state, os.path.join(ctx.checkpoint_for(step), "state.pt"))
            if step >= ctx.steps:
                break
    dist.destroy_process_group()


if __name__ == "__main__":
    main(req.context())
