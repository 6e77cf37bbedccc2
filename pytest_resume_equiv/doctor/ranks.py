"""What the doctor runs inside ranks: a backend probe and a tiny trainer that resumes exactly.

Runs in every rank (as a `train(ctx)` function target), so it imports neither pytest nor the
plugin side. The trainer keeps every audited stream busy (the CPU generator, the device's,
a generator it owns, Python's `random`), saves and restores each of them, and uses SGD with
momentum written out: the first `torch.optim` step of a process imports `torch._dynamo`
(about 2 s of CPU per rank), which the doctor's budget of a minute cannot spare.
"""

from __future__ import annotations

import json
import os
import random
import time
from typing import Any

import pytest_resume_equiv as req
from pytest_resume_equiv.rank.context import RunContext

BACKEND_ENV = "RESUME_EQUIV_DOCTOR_BACKEND"
"""The backend a probe initialises (gloo on CPU tensors, the device's on device tensors)."""
STEPS_ENV = "RESUME_EQUIV_DOCTOR_STEPS"
"""Steps of a plain launch of the trainer (a resume test's launches are told theirs)."""
DEFAULT_STEPS = 4
FIRST_STEP_KEYS = ("first_step_cold", "first_step_warm")
"""The first step's gradients computed in a fresh process, then again in the same process."""


def probe_path(run_dir: str, rank: int) -> str:
    """Where a probe rank writes what it saw (the doctor reads it back as JSON)."""
    return os.path.join(run_dir, f"probe-rank-{rank}.json")


def _write(path: str, data: dict[str, Any]) -> None:
    with open(f"{path}.tmp", "w", encoding="utf-8") as f:
        json.dump(data, f)
    os.replace(f"{path}.tmp", path)


def all_reduce(ctx: RunContext) -> None:
    """Initialise the process group with one backend, all-reduce one tensor, tear down.

    Writes the sum and the time `destroy_process_group` returned, so the doctor can tell a
    backend that does not come up from a rank that hangs on its way out."""
    import torch
    import torch.distributed as dist

    backend = os.environ.get(BACKEND_ENV, ctx.backend)
    device = torch.device("cpu") if backend == "gloo" else ctx.device
    if device.type != "cpu":
        getattr(torch, device.type).set_device(device)
    path = probe_path(ctx.run_dir, ctx.rank)
    dist.init_process_group(backend=backend)
    tensor = torch.full((1,), float(ctx.rank + 1), device=device)
    dist.all_reduce(tensor)
    total = float(tensor.item())
    _write(path, {"backend": backend, "device": str(device), "sum": total})
    dist.destroy_process_group()
    _write(
        path, {"backend": backend, "device": str(device), "sum": total, "destroyed": time.time()}
    )


def _accelerator(kind: str) -> Any:
    import torch

    return None if kind == "cpu" else getattr(torch, kind)


def _grads(model: Any, x: Any) -> Any:
    import torch

    loss = model(x).pow(2).mean()
    grads = torch.autograd.grad(loss, list(model.parameters()))
    return torch.cat([g.reshape(-1) for g in grads]).detach().cpu()


def train(ctx: RunContext) -> None:
    """A data-parallel trainer that resumes exactly from `ctx.checkpoint`."""
    import torch
    import torch.distributed as dist
    from torch import nn

    ctx.init_process_group()
    device, rank = ctx.device, ctx.rank
    accel = _accelerator(device.type)
    steps = ctx.steps or int(os.environ.get(STEPS_ENV, DEFAULT_STEPS))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 1)).to(device)
    momentum = [torch.zeros_like(p) for p in model.parameters()]
    data = torch.Generator().manual_seed(1000 + rank)  # the data order: a generator it owns
    torch.manual_seed(100 + rank)
    if accel is not None:
        accel.manual_seed(100 + rank)
    random.seed(100 + rank)
    start = 1
    if ctx.resuming:
        assert ctx.checkpoint is not None
        state = torch.load(os.path.join(ctx.checkpoint, f"rank-{rank}.pt"), weights_only=True)
        model.load_state_dict(state["model"])
        for buf, saved in zip(momentum, state["momentum"]):
            buf.copy_(saved.to(device))
        torch.set_rng_state(state["cpu_rng"])
        if accel is not None:
            accel.set_rng_state(state["device_rng"])
        data.set_state(state["data_rng"])
        random.setstate(state["python_rng"])
        start = state["step"] + 1
    for step in range(start, steps + 1):
        x = torch.randn(16, 32, generator=data).to(device)
        x = x + 0.01 * torch.randn(16, 32, device=device)  # the device's generator
        x = x * (1.0 + 0.01 * random.random())
        extra = {}
        if step == 1:
            # a fresh process picks kernels (and autotunes) on its first call: the same
            # gradients computed again in this process say whether that changed anything
            extra = dict(zip(FIRST_STEP_KEYS, (_grads(model, x), _grads(model, x))))
        loss = model(x).pow(2).mean()
        loss.backward()
        with torch.no_grad():
            for p, buf in zip(model.parameters(), momentum):
                dist.all_reduce(p.grad)
                buf.mul_(0.9).add_(p.grad / ctx.world_size)
                p.sub_(0.05 * buf)
                p.grad = None
        req.record(step, loss=loss.item(), weight=model[0].weight, **extra)
        if ctx.should_save(step):
            path = ctx.checkpoint_for(step)
            os.makedirs(path, exist_ok=True)
            state = {
                "model": {k: v.detach().cpu().clone() for k, v in model.state_dict().items()},
                "momentum": [b.detach().cpu().clone() for b in momentum],
                "cpu_rng": torch.get_rng_state(),
                "device_rng": accel.get_rng_state() if accel is not None else None,
                "data_rng": data.get_state(),
                "python_rng": random.getstate(),
                "step": step,
            }
            torch.save(state, os.path.join(path, f"rank-{rank}.pt"))
    dist.destroy_process_group()
