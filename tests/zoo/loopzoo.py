"""A training loop of the shape public GPT scripts have, for the causes that are easy to get
wrong on it: rank 0 evaluates at the top of an iteration (its batches sampled from the CPU
RNG) and the checkpoint is written there, after the eval; every step fetches the next batch
at its end (a prefetch); each rank keeps its RNG state and its prefetched batch in a file
beside rank 0's checkpoint; the resumed run writes its state back into the folder it resumed
from; `resume_point()` is called at the top of the training step, as docs/diagnosis.md says.

`loopzoo.py --bug=NAME` (a resume argument: the resumed launch only):
- `none`: the exact resume;
- `eval_redo`: the resumed run evaluates again at the iteration it resumes at;
- `prefetch`: the prefetched batch is not restored: the resumed run fetches a new one;
- `cpu_rng`: the per-rank CPU RNG state is never restored.

No `record` or `watch` call: the plugin records every optimizer step on its own;
`req.context()` is how it reads its launch arguments, and `req.resume_point()` stays: rank 0's
eval forwards come first, so only that call puts both runs' resume point at the training step.
"""

import os
import sys

import torch
import torch.distributed as dist

import pytest_resume_equiv as req

BUG = next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--bug=")), "none")
EVAL_EVERY = 3

ctx = req.context()
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)  # the same init on every rank
model = torch.nn.Sequential(
    torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Dropout(0.1), torch.nn.Linear(8, 1)
)
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
DATA = torch.linspace(-1, 1, 64 * 4).reshape(64, 4)
torch.manual_seed(100 + rank)  # each rank samples its own batches


def get_batch():
    ix = torch.randint(0, len(DATA), (4,))
    return ix, DATA[ix]


def evaluate():
    model.eval()
    with torch.no_grad():
        for _ in range(2):
            model(get_batch()[1])
    model.train()


def save(folder, it, batch, prefix=""):
    os.makedirs(folder, exist_ok=True)
    if rank == 0:
        state = {"model": model.state_dict(), "opt": opt.state_dict(), "it": it}
        torch.save(state, os.path.join(folder, f"{prefix}ckpt.pt"))
    mine = {"rng": torch.get_rng_state(), "ix": batch[0], "x": batch[1]}
    torch.save(mine, os.path.join(folder, f"{prefix}rank{rank}.pt"))
    dist.barrier()


it, start = 0, None
batch = get_batch()
if ctx.resuming:
    state = torch.load(os.path.join(ctx.checkpoint, "ckpt.pt"), weights_only=True)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    it = start = state["it"]
    mine = torch.load(os.path.join(ctx.checkpoint, f"rank{rank}.pt"), weights_only=True)
    if BUG != "cpu_rng":
        torch.set_rng_state(mine["rng"])
    batch = get_batch() if BUG == "prefetch" else (mine["ix"], mine["x"])
while True:
    if it % EVAL_EVERY == 0 and (it != start or BUG == "eval_redo"):
        if rank == 0:
            evaluate()
        if ctx.should_save(it):
            save(ctx.checkpoint_for(it), it, batch)
        elif ctx.resuming and it > start:
            # its state back into the folder it resumed from (beside what it loaded there)
            save(ctx.checkpoint, it, batch, prefix=f"resumed-{it}-")
    if it >= ctx.steps:
        break
    req.resume_point()
    _, x = batch
    loss = model(x).pow(2).mean()
    batch = get_batch()  # the next step's batch, fetched now
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= world
    opt.step()
    opt.zero_grad()
    it += 1
dist.destroy_process_group()
