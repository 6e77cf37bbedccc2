"""Trainers for crash_mode="preempt" (tests/e2e/test_preemption.py): a SIGTERM, then a grace,
then SIGKILL. The loop, the data and the atomic saver are crashzoo.py's; what differs is what
each trainer does on SIGTERM.

- `train_stops_at_step_boundary`: the handler only sets a flag; the loop agrees on it over
  the ranks at each step boundary, saves that step (atomically, unless it just saved) and
  exits 0. Correct.
- `train_without_handler`: no handler: the SIGTERM kills it, as a kill would.
- `train_saves_in_handler`: the handler saves at once, wherever the step is, under the number
  of the step being trained, and exits: inside a step (after backward, before the optimizer
  step) its checkpoint of step k holds the state of step k-1.
- `train_steps_with_a_closure`: the flag trainer, but each step is `opt.step(closure)` (Adam),
  the closure running zero_grad, forward and backward inside the optimizer step (LBFGS-style,
  as Lightning steps), and no `record` call: automatic recording writes step k at step k+1's
  forward, inside its optimizer step. Correct: the SIGTERM lands at the start of step 5's
  optimizer step and the flag saves step 5.
- `train_checks_flag_each_epoch`: the flag is looked at only at the end of an epoch of three
  steps: a SIGTERM inside step 5 is acted on after step 6, the last, so the run finishes (its
  save holds step 6) and the restarted job has nothing left to train. Correct.
- `train_saves_slowly_in_place`: a flag at the step boundary, as it should, but the save
  overwrites model.pt, optim.pt and the `step` marker in place, and the save on SIGTERM is
  slow (a pause between two writes, as a big optimizer state takes): it does not fit the
  grace and is killed inside it, leaving the new model beside the old optimizer.
"""

import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from crashzoo import find, load_folder, save_atomic, saved_step, setup, train_from, train_step

SLOW = 5.0
"""Seconds the slow saver pauses between model.pt and optim.pt when it saves on SIGTERM."""


class Flag:
    """A SIGTERM handler that only notes the request."""

    def __init__(self):
        self.asked = False
        signal.signal(signal.SIGTERM, self)

    def __call__(self, signum, frame):
        self.asked = True

    def agreed(self):
        """Whether any rank was asked to stop (all ranks stop at the same step)."""
        asked = torch.tensor([float(self.asked)])
        dist.all_reduce(asked, op=dist.ReduceOp.MAX)
        return bool(asked.item())


def resume(ctx, model, opt):
    """The checkpoint root, and the step its newest complete folder holds (0: none)."""
    root = ctx.checkpoint if ctx.resuming else ctx.checkpoint_for(0)
    found = find(ctx, root)
    dist.barrier()
    if not found:
        return root, 0
    load_folder(found, model, opt)
    return root, saved_step(found)


def stop(code=0):
    dist.destroy_process_group()
    sys.exit(code)


def train_with_flag(
    ctx, find_start, save, save_on_sigterm, start=setup, one_step=train_step, every=1
):
    """The loop of a trainer that stops at the step boundary after a SIGTERM, saving that
    step (`save_on_sigterm`) unless it has just saved it (`save`, at the splits); it looks at
    its flag after every `every`-th step."""
    flag = Flag()
    rank, model, opt = start(ctx)
    root, first = find_start(ctx, model, opt)
    for step in range(first + 1, ctx.steps + 1):
        one_step(model, opt, step, rank)
        saved = step in ctx.splits
        if saved and rank == 0:
            save(root, step, model, opt)
        if saved:
            dist.barrier()
        if step % every == 0 and flag.agreed():
            if not saved and rank == 0:
                save_on_sigterm(root, step, model, opt)
            dist.barrier()
            stop()
    dist.destroy_process_group()


def train_stops_at_step_boundary(ctx):
    train_with_flag(ctx, resume, save_atomic, save_atomic)


def setup_adam(ctx):
    """The model of `setup`, with Adam (its step counter tells automatic recording which step
    a restarted job's checkpoint is of), found by automatic recording: no `watch`."""
    ctx.init_process_group()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    return dist.get_rank(), model, torch.optim.Adam(model.parameters(), lr=0.05)


def closure_step(model, opt, step, rank):
    """One step whose forward and backward run inside `opt.step(closure)`; no `record`."""
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(10 * step + rank))

    def closure():
        opt.zero_grad()
        loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()
        return loss

    opt.step(closure)


def train_steps_with_a_closure(ctx):
    train_with_flag(ctx, resume, save_atomic, save_atomic, setup_adam, closure_step)


def train_checks_flag_each_epoch(ctx):
    train_with_flag(ctx, resume, save_atomic, save_atomic, every=3)


def train_without_handler(ctx):
    rank, model, opt = setup(ctx)
    root, start = resume(ctx, model, opt)
    train_from(ctx, rank, model, opt, start, lambda step: save_atomic(root, step, model, opt))
    dist.destroy_process_group()


def train_saves_in_handler(ctx):
    rank, model, opt = setup(ctx)
    root, start = resume(ctx, model, opt)
    current = {"step": start}

    def save_now(signum, frame):
        if rank == 0:
            save_atomic(root, current["step"], model, opt)
        sys.exit(0)

    signal.signal(signal.SIGTERM, save_now)
    for step in range(start + 1, ctx.steps + 1):
        current["step"] = step  # the step being trained, saved as if it were done
        train_step(model, opt, step, rank)
        if step in ctx.splits:
            if rank == 0:
                save_atomic(root, step, model, opt)
            dist.barrier()
    dist.destroy_process_group()


def save_in_place(root, step, model, opt, on_sigterm=False):
    """model.pt, optim.pt, then the `step` marker, each written over the last save's."""
    os.makedirs(root, exist_ok=True)
    torch.save(model.state_dict(), os.path.join(root, "model.pt"))
    if on_sigterm:
        time.sleep(SLOW)  # the bigger part of the state, still being written
    torch.save(opt.state_dict(), os.path.join(root, "optim.pt"))
    with open(os.path.join(root, "step"), "w") as f:
        f.write(str(step))


def latest_in_place(ctx, model, opt):
    root = ctx.checkpoint if ctx.resuming else ctx.checkpoint_for(0)
    marker, step = os.path.join(root, "step"), 0
    if os.path.exists(marker):
        with open(marker) as f:
            step = int(f.read())
        load_folder(root, model, opt)
    dist.barrier()
    return root, step


def save_in_place_slowly(root, step, model, opt):
    save_in_place(root, step, model, opt, on_sigterm=True)


def train_saves_slowly_in_place(ctx):
    train_with_flag(ctx, latest_in_place, save_in_place, save_in_place_slowly)
