"""A correct trainer on hardware that does not reproduce itself, and real resume bugs in it.

`noisezoo.py --noise=KIND --bug=NAME`, inside ranks launched by the plugin. Two ranks, DDP-like
gradient all-reduce by hand, AdamW, a warmup scheduler, dropout and a condition model that
owns a `torch.Generator`. The noise, as GPUs and NPUs make it:

- `unseeded`: every rank perturbs its local gradients by a relative 1e-7 drawn from the OS
  (atomics in a backward kernel), every step, in every process;
- `resumed-order`: only a resumed process sums its micro-batch gradients in another order,
  with atomics (a relative 1e-7 from the OS): a fresh process that picked another kernel by
  autotuning;
- `coarse`: like `unseeded` at 1e-3 (bf16 with atomics).

Bugs (`--bug`, on the load path: the resumed launch only): `optimizer_moments` (moments
zeroed after the load), `owned_generator` (the condition model's generator not restored),
`cpu_rng` (the CPU RNG not restored), `scheduler` (the LR scheduler not restored).

No `record` or `watch` call: the plugin records every optimizer step (the loss of each
micro-batch's backward, the inputs, the model, optimizer and scheduler) on its own;
`req.context()` is how it reads its launch arguments.
"""

import os
import sys

import torch
import torch.distributed as dist

import pytest_resume_equiv as req


def _flag(name, default):
    prefix = f"--{name}="
    return next((a[len(prefix) :] for a in sys.argv[1:] if a.startswith(prefix)), default)


NOISE = _flag("noise", "none")
BUG = _flag("bug", "none")
MICRO = 3  # micro-batches per step


class Condition(torch.nn.Module):
    """Owns a generator seeded at construction, like a diffusion condition model."""

    def __init__(self, seed):
        super().__init__()
        self.generator = torch.Generator().manual_seed(seed)

    def noise(self, shape):
        return torch.randn(shape, generator=self.generator)


def unseeded(scale):
    """A relative perturbation from the OS: nothing the plugin or the trainer seeds."""
    return 1.0 + scale * (int.from_bytes(os.urandom(4), "little") / 2**32 - 0.5)


def gradients(model, micro_batches, resumed):
    """The step's gradient, summed over micro-batches; in a resumed process with the
    `resumed-order` noise, summed in another order (as another kernel would)."""
    grads = []
    for x in micro_batches:
        model.zero_grad()
        model(x).pow(2).mean().backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    other = NOISE == "resumed-order" and resumed
    order = list(range(len(grads)))[:: -1 if other else 1]
    total = [torch.zeros_like(p) for p in model.parameters()]
    for i in order:
        total = [t + g * (unseeded(1e-7) if other else 1.0) for t, g in zip(total, grads[i])]
    return total


def train(ctx):
    ctx.init_process_group()
    rank, world = ctx.rank, ctx.world_size
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 16), torch.nn.Dropout(0.25), torch.nn.ReLU(), torch.nn.Linear(16, 1)
    )
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 4))
    cond = Condition(ctx.seed + rank)
    torch.manual_seed(100 + rank)
    start = 1
    if ctx.resuming:
        state = torch.load(os.path.join(ctx.checkpoint, f"rank-{rank}.pt"), weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        if BUG == "optimizer_moments":
            for entry in opt.state.values():
                entry["exp_avg"].zero_()
                entry["exp_avg_sq"].zero_()
        if BUG != "scheduler":
            sched.load_state_dict(state["sched"])
        if BUG != "cpu_rng":
            torch.set_rng_state(state["cpu_rng"])
        if BUG != "owned_generator":
            cond.generator.set_state(state["cond_rng"])
        start = state["step"] + 1
    scale = {"unseeded": 1e-7, "coarse": 1e-3}.get(NOISE, 0.0)
    for step in range(start, ctx.steps + 1):
        micro = [torch.randn(4, 4) + cond.noise((4, 4)) * 0.1 for _ in range(MICRO)]
        grads = gradients(model, micro, ctx.resuming)
        for p, g in zip(model.parameters(), grads):
            if scale:
                g = g * unseeded(scale)
            dist.all_reduce(g)
            p.grad = g / world
        opt.step()
        sched.step()
        with torch.no_grad():  # the loss after the step, logged (under no_grad: no input)
            loss = sum(model(x).pow(2).mean() for x in micro) / MICRO
        dist.all_reduce(loss)
        if ctx.should_save(step):
            path = ctx.checkpoint_for(step)
            os.makedirs(path, exist_ok=True)
            state = {
                "model": model.state_dict(),
                "opt": opt.state_dict(),
                "sched": sched.state_dict(),
                "cpu_rng": torch.get_rng_state(),
                "cond_rng": cond.generator.get_state(),
                "step": step,
            }
            torch.save(state, os.path.join(path, f"rank-{rank}.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    train(req.context())
