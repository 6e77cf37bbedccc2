"""One trainer in 15 cases (controls and resume bugs), for benchmarks/bench_phases.py: function
mode, 1 rank, a real torch optimizer and scheduler, a checkpoint per split in a folder. Each
case is a module-level function (`train_<name>(ctx)`), as a user's function-mode test names
it; `floor()` runs every case in one process the way an in-process tool does (train, save to
memory, load, train on, compare the losses), the floor a launch per run is measured against.
"""

from __future__ import annotations

import io
import os

import torch

STEPS, SPLIT = 8, 3

CASES: dict[str, dict] = {
    "correct": {},
    "correct_adam": {"adam": True},
    "correct_accum": {"accum": 2},
    "correct_dropout": {"dropout": 0.2},
    "correct_wide": {"width": 64},
    "forgets_rng": {"restore_rng": False, "dropout": 0.2},
    "forgets_optimizer": {"restore_optimizer": False, "adam": True},
    "forgets_scheduler": {"restore_scheduler": False},
    "restarts_from_zero": {"restart": True},
    "reseeds_after_load": {"reseed": True, "dropout": 0.2},
    "fresh_model": {"restore_model": False},
    "lr_changed": {"resume_lr": 0.05},
    "skips_a_batch": {"skip": 1},
    "replays_a_batch": {"skip": -1},
    "accum_lost": {"accum": 2, "restart_window": True},
}
"""15 cases: 5 controls, 10 bugs."""


DEVICE = os.environ.get("PHASE_CASES_DEVICE", "cpu")
"""Where the cases train (benchmarks/bench_phases.py --device): a GPU run's phases include
its context creation and first kernels."""


def _data(step: int, micro: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * step + micro)
    return torch.randn(8, 4, generator=g).to(DEVICE)


def _build(options: dict) -> tuple:
    torch.manual_seed(0)
    width = options.get("width", 16)
    model = torch.nn.Sequential(
        torch.nn.Linear(4, width),
        torch.nn.Dropout(options.get("dropout", 0.0)),
        torch.nn.Linear(width, 1),
    ).to(DEVICE)
    make = torch.optim.Adam if options.get("adam") else torch.optim.SGD
    optimizer = make(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.9)
    return model, optimizer, scheduler


def _state(model, optimizer, scheduler, step: int) -> dict:
    return {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "rng": torch.get_rng_state(),
        **({"device_rng": torch.cuda.get_rng_state()} if DEVICE.startswith("cuda") else {}),
        "step": step,
    }


def _load(options: dict, state: dict, model, optimizer, scheduler) -> int:
    if options.get("restore_model", True):
        model.load_state_dict(state["model"])
    if options.get("restore_optimizer", True):
        optimizer.load_state_dict(state["optimizer"])
    if options.get("restore_scheduler", True):
        scheduler.load_state_dict(state["scheduler"])
    if options.get("restore_rng", True):
        torch.set_rng_state(state["rng"])
        if "device_rng" in state:
            torch.cuda.set_rng_state(state["device_rng"])
    if options.get("reseed"):
        torch.manual_seed(1)
    if "resume_lr" in options:
        for group in optimizer.param_groups:
            group["lr"] = options["resume_lr"]
    return 1 if options.get("restart") else state["step"] + 1 + options.get("skip", 0)


def _steps(options: dict, first: int, last: int, parts: tuple, record, resumed: bool) -> None:
    model, optimizer, scheduler = parts
    accum = options.get("accum", 1)
    for step in range(first, last + 1):
        micro_first = 1 if (resumed and step == first and options.get("restart_window")) else 0
        for micro in range(micro_first, accum):
            loss = model(_data(step, micro)).pow(2).mean() / accum
            loss.backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        record(step, float(loss.detach()))


def _train(ctx, options: dict) -> None:
    import pytest_resume_equiv as req

    torch.manual_seed(0)
    parts = _build(options)
    first = 1
    if ctx.resuming:
        state = torch.load(os.path.join(ctx.checkpoint, "state.pt"), weights_only=True)
        first = _load(options if ctx.resuming else {}, state, *parts)

    def record(step: int, loss: float) -> None:
        req.record(step, loss=loss)
        if ctx.should_save(step):
            os.makedirs(ctx.checkpoint_for(step), exist_ok=True)
            path = os.path.join(ctx.checkpoint_for(step), "state.pt")
            torch.save(_state(*parts, step), path)

    _steps(options, first, ctx.steps, parts, record, ctx.resuming)


# one module-level function per case: function mode imports it by name in every rank


def train_correct(ctx) -> None:
    _train(ctx, CASES["correct"])


def train_correct_adam(ctx) -> None:
    _train(ctx, CASES["correct_adam"])


def train_correct_accum(ctx) -> None:
    _train(ctx, CASES["correct_accum"])


def train_correct_dropout(ctx) -> None:
    _train(ctx, CASES["correct_dropout"])


def train_correct_wide(ctx) -> None:
    _train(ctx, CASES["correct_wide"])


def train_forgets_rng(ctx) -> None:
    _train(ctx, CASES["forgets_rng"])


def train_forgets_optimizer(ctx) -> None:
    _train(ctx, CASES["forgets_optimizer"])


def train_forgets_scheduler(ctx) -> None:
    _train(ctx, CASES["forgets_scheduler"])


def train_restarts_from_zero(ctx) -> None:
    _train(ctx, CASES["restarts_from_zero"])


def train_reseeds_after_load(ctx) -> None:
    _train(ctx, CASES["reseeds_after_load"])


def train_fresh_model(ctx) -> None:
    _train(ctx, CASES["fresh_model"])


def train_lr_changed(ctx) -> None:
    _train(ctx, CASES["lr_changed"])


def train_skips_a_batch(ctx) -> None:
    _train(ctx, CASES["skips_a_batch"])


def train_replays_a_batch(ctx) -> None:
    _train(ctx, CASES["replays_a_batch"])


def train_accum_lost(ctx) -> None:
    _train(ctx, CASES["accum_lost"])


def floor() -> dict[str, bool]:
    """Every case in this process: the uninterrupted run, a save at SPLIT to memory, a fresh
    build loaded from it, the steps after it, and the losses compared. True: equal."""
    return {name: _in_process(options) for name, options in CASES.items()}


def _in_process(options: dict) -> bool:
    losses: dict[int, float] = {}
    saved = io.BytesIO()
    torch.manual_seed(0)
    parts = _build(options)

    def keep(step: int, loss: float) -> None:
        losses[step] = loss
        if step == SPLIT:
            torch.save(_state(*parts, step), saved)

    _steps(options, 1, STEPS, parts, keep, False)
    resumed: dict[int, float] = {}
    torch.manual_seed(0)
    again = _build(options)
    saved.seek(0)
    first = _load(options, torch.load(saved, weights_only=True), *again)
    _steps(options, first, STEPS, again, resumed.__setitem__, True)
    return all(resumed.get(s) == losses[s] for s in range(SPLIT + 1, STEPS + 1))


if __name__ == "__main__":
    print(floor())
