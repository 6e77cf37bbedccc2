"""One trainer with a switch per resume bug of ../shared/BUGS.md (`--bug=NAME`; none: correct).

Written to be read: every bug is one `if BUG == ...` at the place where a real trainer gets it
wrong. Runs inside ranks launched by the plugin, as a script:
`bugzoo.py --trainer=train --bug=NAME`. A bug on the load path is passed to the resumed launch
only (resume_args), so the uninterrupted launch is the correct trainer's and tests share it; a
bug on the save path or in training itself is passed to every launch.

The trainer makes no `record` call: the plugin records every optimizer step on its own (a
step here is an optimizer step, one per ACCUM micro-batches). `req.context()` is how the zoo
reads its launch arguments (steps, split, checkpoint folder); the one `watch` call adds the
EMA, which no optimizer holds and so nothing automatic finds. `--bug=workers` (given to every
launch) records the sample ids too: the plugin tells samples apart by their content, and a
worker's augmentation changes the content of the very same samples, so only ids the trainer
records say "the same samples, made otherwise".
"""

import copy
import os
import random
import sys

import numpy as np
import torch
import torch.distributed as dist

import pytest_resume_equiv as req


def _flag(name, default):
    prefix = f"--{name}="
    return next((a[len(prefix) :] for a in sys.argv[1:] if a.startswith(prefix)), default)


BUG = _flag("bug", "none")
BATCH = 2
BATCHES_PER_EPOCH = 4
ACCUM = 2  # optimizer step every ACCUM batches (gradient accumulation)


class Condition(torch.nn.Module):
    """The model's first layer, the training-time augmentation: noise from a generator it owns
    (seeded at construction, like a diffusion condition model), scaled by numpy's and Python's
    global RNGs, less a running mean of this rank's inputs (an input normalizer: rank-local
    state, no buffer). The model's inputs are the samples as loaded, so the content that the
    plugin fingerprints tells the samples apart."""

    def __init__(self, seed):
        super().__init__()
        self.generator = torch.Generator().manual_seed(seed)
        self.running = torch.zeros(4)

    def forward(self, batch):
        batch = batch + torch.randn(batch.shape, generator=self.generator) * 0.1
        batch = batch * (1.0 + 0.01 * float(np.random.rand()) + 0.01 * random.random())
        batch = batch - self.running
        self.running = 0.5 * self.running + 0.5 * batch.detach().mean(0)
        return batch


def loss_scaler():
    """A dynamic loss scaler (torch's, on CPU): doubles its scale every 2 clean steps (powers
    of two: exact)."""
    return torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=2)


def epoch_order(epoch, world):
    """The sampler: a permutation per epoch (seeded by the epoch, like DistributedSampler)."""
    n = BATCHES_PER_EPOCH * BATCH * world
    return torch.randperm(n, generator=torch.Generator().manual_seed(1000 + epoch)).tolist()


def load_sample(index, worker_seed):
    """A dataloader worker's augmentation: depends on the worker seed and the sample."""
    g = torch.Generator().manual_seed(worker_seed * 1000 + index)
    return torch.randn(4, generator=g) + index


def restore_optional(obj, state, key):
    """Load `obj` from `state[key]` if the checkpoint has it: optional state, old checkpoints."""
    if key not in state:
        return
    obj.load_state_dict(state[key])


def save(path, rank, state):
    os.makedirs(path, exist_ok=True)
    torch.save(state, os.path.join(path, f"rank-{rank}.pt"))


def train(ctx):
    ctx.init_process_group()
    rank, world = ctx.rank, ctx.world_size
    torch.manual_seed(0)
    cond = Condition(ctx.seed + rank)
    model = torch.nn.Sequential(
        cond,
        torch.nn.Linear(4, 8),
        torch.nn.BatchNorm1d(8),
        torch.nn.ReLU(),
        torch.nn.Dropout(0.25),
        torch.nn.Linear(8, 1),
    )
    ema = copy.deepcopy(model[1:])  # the layers with weights
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.9**s)
    scaler = loss_scaler()
    torch.manual_seed(100 + rank)
    np.random.seed(200 + rank)
    random.seed(300 + rank)
    worker_rng = random.Random(ctx.seed)  # private: derives the workers' seed each epoch

    # step: optimizer steps; micro: micro-batches consumed (the optimizer steps every ACCUM)
    step, epoch, skip, micro = 0, 0, 0, 0
    worker_seed = worker_rng.randrange(2**31)
    saved_ema = ema  # what the save below reads (a stale reference: chain_stale)
    if ctx.resuming:
        state = torch.load(os.path.join(ctx.checkpoint, f"rank-{rank}.pt"), weights_only=True)
        rank0 = torch.load(os.path.join(ctx.checkpoint, "rank-0.pt"), weights_only=True)
        weights = state["model"]
        if BUG == "buffers":
            weights = {
                k: v for k, v in weights.items() if "running" not in k and "num_batches" not in k
            }
        model.load_state_dict(weights, strict=BUG != "buffers")
        if BUG == "chain_stale":
            ema = copy.deepcopy(model[1:])  # a new object; the save still reads the pre-load one
        else:
            saved_ema = ema
        if BUG == "never_applied":
            restore_optional(ema, state, "ema_state")  # saved as "ema": skipped, silently
        elif BUG != "ema":
            ema.load_state_dict(state["ema"])
        if BUG != "optimizer":
            opt.load_state_dict(state["opt"])
        if BUG != "lr_missing":
            sched.load_state_dict(state["sched"])
        if BUG == "lr_off_by_one":
            sched.step()  # rebuilt and stepped once more after loading
        if BUG != "scaler":
            scaler.load_state_dict(state["scaler"])
        rng = rank0 if BUG == "rng_collapse" else state
        if BUG != "cpu_rng":
            torch.set_rng_state(rng["cpu_rng"])
        if BUG != "numpy":
            np.random.set_state(
                (
                    "MT19937",
                    rng["np_keys"].numpy().astype(np.uint32),
                    *rng["np_rest"][:2],
                    float(rng["np_gauss"]),
                )
            )
        if BUG != "python_random":
            random.setstate((rng["py"][0], tuple(rng["py"][1]), rng["py"][2]))
        if BUG == "rank_local_generator":
            cond.generator.set_state(rank0["cond_rng"])  # the sampler state of rank 0's file
        elif BUG != "owned_generator":
            cond.generator.set_state(state["cond_rng"])
        extra = rank0 if BUG == "rank_local" else state
        step, epoch, skip = state["step"], state["epoch"], state["skip"]
        cond.running = extra["running"]
        worker_rng.setstate(
            (state["worker_rng"][0], tuple(state["worker_rng"][1]), state["worker_rng"][2])
        )
        worker_seed = state["worker_seed"]
        micro = state["micro"]
        if BUG == "workers":
            worker_seed = random.Random(ctx.seed + 1).randrange(2**31)  # re-derived, not restored
        if BUG == "sampler_epoch":
            epoch = 0
        if BUG == "skip":
            skip += 1
        if BUG == "grad_accum":
            micro = step  # the micro-batch counter restored in optimizer steps, not x ACCUM
        if BUG == "step_off_by_one":
            step -= 1
        if BUG == "restart":  # the saved place is ignored: training and its data start over
            step, epoch, skip = 0, 0, 0
            worker_rng = random.Random(ctx.seed)
            worker_seed = worker_rng.randrange(2**31)
        if BUG == "epoch_boundary" and skip == BATCHES_PER_EPOCH:
            return  # the restored iterator is exhausted: this trainer thinks training is over
        if BUG == "eval_after_load":
            model.eval()  # a validation pass after loading, and no model.train() after it

    # The EMA: no optimizer holds it and no forward trains it, so only this call audits it.
    req.watch(ema=ema)
    torn, step_ids = None, []
    while step < ctx.steps:
        order = epoch_order(epoch, world)[rank::world]
        for index in range(skip, BATCHES_PER_EPOCH):
            ids = order[index * BATCH : (index + 1) * BATCH]
            batch = torch.stack([load_sample(i, worker_seed) for i in ids])
            loss = model(batch).pow(2).mean()
            scaler.scale(loss).backward()
            micro += 1
            step_ids += ids
            if micro % ACCUM:
                continue  # accumulating: the optimizer steps every ACCUM micro-batches
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= world * ACCUM  # the scaler divides by its scale (unscale_)
            scaler.step(opt)
            scaler.update()
            sched.step()
            opt.zero_grad()
            with torch.no_grad():
                for e, p in zip(ema.parameters(), model.parameters()):
                    e.mul_(0.9).add_(p, alpha=0.1)
            step += 1
            if BUG == "workers":  # an explicit call: the ids, apart from the content
                req.record(step, ids=step_ids)
            step_ids = []
            if BUG == "eval_flags" and step == 2:
                model[2].eval()  # "freeze BatchNorm after step 2": a resume past it never does
            if torn is not None:
                save(*torn)  # the "background" write, after the update mutated the tensors
                torn = None
            if ctx.should_save(step):
                state = {
                    "model": model.state_dict(),
                    "ema": saved_ema.state_dict(),
                    "opt": opt.state_dict(),
                    "sched": sched.state_dict(),
                    "scaler": scaler.state_dict(),
                    "cpu_rng": torch.get_rng_state(),
                    "np_keys": torch.from_numpy(np.random.get_state()[1].astype(np.int64)),
                    "np_rest": list(np.random.get_state()[2:4]),
                    "np_gauss": np.random.get_state()[4],
                    "py": list(random.getstate()),
                    "cond_rng": cond.generator.get_state(),
                    "worker_rng": list(worker_rng.getstate()),
                    "worker_seed": worker_seed,
                    "step": step,
                    "epoch": epoch,
                    "skip": index + 1,
                    "micro": micro,
                    "running": cond.running,
                }
                if BUG == "torn":
                    torn = (ctx.checkpoint_for(step), rank, state)
                else:
                    save(ctx.checkpoint_for(step), rank, copy.deepcopy(state))
            if step >= ctx.steps:
                break
        else:
            epoch += 1
            skip = 0
            worker_seed = worker_rng.randrange(2**31)
    dist.destroy_process_group()


def train_master_weights(ctx):
    """bf16 model, fp32 master weights in the optimizer (BUG=master_weights rebuilds them)."""
    ctx.init_process_group()
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 1).to(torch.bfloat16)
    master = [p.detach().float().clone().requires_grad_(True) for p in model.parameters()]
    opt = torch.optim.SGD(master, lr=0.01)
    torch.manual_seed(100 + ctx.rank)
    start = 1
    if ctx.resuming:
        state = torch.load(os.path.join(ctx.checkpoint, f"rank-{ctx.rank}.pt"), weights_only=True)
        model.load_state_dict(state["model"])
        with torch.no_grad():
            sources = model.parameters() if BUG == "master_weights" else state["master"]
            for m, src in zip(master, sources):
                m.copy_(src.float())
        opt.load_state_dict(state["opt"])
        torch.set_rng_state(state["cpu_rng"])
        start = state["step"] + 1
    for step in range(start, ctx.steps + 1):
        x = torch.randn(8, 16)
        loss = model(x.to(torch.bfloat16)).float().pow(2).mean()
        loss.backward()
        for m, p in zip(master, model.parameters()):
            m.grad = p.grad.float()
            p.grad = None
        opt.step()
        with torch.no_grad():
            for m, p in zip(master, model.parameters()):
                p.copy_(m.to(torch.bfloat16))
        if ctx.should_save(step):
            save(
                ctx.checkpoint_for(step),
                ctx.rank,
                {
                    "model": model.state_dict(),
                    "master": [m.detach().clone() for m in master],
                    "opt": opt.state_dict(),
                    "cpu_rng": torch.get_rng_state(),
                    "step": step,
                },
            )
    dist.destroy_process_group()


if __name__ == "__main__":
    {"train": train, "train_master_weights": train_master_weights}[_flag("trainer", "train")](
        req.context()
    )
