"""What `record` + `watch` add to a training step of a model with more than 10M parameters,
what the restore log and the resume-point hook add outside the window, and what the window's
draw trace costs inside it.

One process plays one rank: the same training loop runs with the in-rank API switched off
(no run context: every call is a no-op), switched on (a run context, `watch(model=,
optimizer=, scheduler=)`, `record(step, loss=, ...)` every step, which fingerprints every
parameter, every optimizer moment and every RNG stream), and on with the rest of the
bootstrap's audit installed (restore functions wrapped, the global forward pre-hook).
Targets: record + watch at most 3% of the step; the restore log and the hook under 1% more.
Automatic recording (no call in the loop: a step line per optimizer step with the loss, an id
per input sample, every optimizer, scheduler and the model found) is timed as whole steps,
with the time spent writing their lines, alone and with an explicit `watch`: at most 3% of
the step too.
The window (from the load to the first resumed step) is traced, op by op: its cost is that
of a step run inside it, measured last.

    python benchmarks/bench_record_overhead.py [--steps 10]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch
from common import machine, median_of, table

import pytest_resume_equiv as req
from pytest_resume_equiv.rank.context import current, reset
from pytest_resume_equiv.rank.launch_context import CONTEXT_ENV, LaunchContext


def build(seed: int = 0) -> tuple[torch.nn.Module, torch.optim.Optimizer, object]:
    torch.manual_seed(seed)
    layer = torch.nn.TransformerEncoderLayer(
        d_model=512, nhead=8, dim_feedforward=2048, dropout=0.1, batch_first=True
    )
    model = torch.nn.Sequential(
        torch.nn.Embedding(1024, 512),
        torch.nn.TransformerEncoder(layer, num_layers=4, enable_nested_tensor=False),
        torch.nn.Linear(512, 1024),
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 10))
    return model, opt, sched


def train_step(
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    sched: torch.optim.lr_scheduler.LRScheduler,
    tokens: tuple[int, int],
) -> tuple[torch.Tensor, torch.Tensor]:
    """One step of the model both measurements train: (its input, its loss)."""
    x = torch.randint(0, 1024, tokens)
    logits = model(x)
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 1024), x.reshape(-1))
    opt.zero_grad()
    loss.backward()
    opt.step()
    sched.step()
    return x, loss


def step_times(
    steps: int, api_on: bool, tokens: tuple[int, int]
) -> tuple[list[float], list[float]]:
    """(seconds of each training step without the record call, seconds inside record)."""
    model, opt, sched = build()
    if api_on:
        req.watch(model=model, optimizer=opt, scheduler=sched)
    train, recording = [], []
    for step in range(1, steps + 2):
        start = time.perf_counter()
        x, loss = train_step(model, opt, sched, tokens)
        middle = time.perf_counter()
        req.record(step, loss=loss.item(), tokens=x, lr=sched.get_last_lr()[0])
        end = time.perf_counter()
        if step > 1:  # the first step allocates optimizer state
            train.append(middle - start)
            recording.append(end - middle)
    return train, recording


def auto_step_times(
    steps: int, tokens: tuple[int, int], watch: bool
) -> tuple[list[float], list[float]]:
    """(seconds of each whole training step with no call in the loop, seconds of it spent
    writing the automatic step line): the line of a step is written in the next step's first
    forward, so it is inside the step's time; the hooks' own cost (an id per input row, the
    loss kept on its device) is in the step time, outside the line's."""
    model, opt, sched = build()
    if watch:
        req.watch(model=model, optimizer=opt, scheduler=sched)
    auto = current().auto
    assert auto is not None, "automatic recording is not installed"
    emit, writing = auto.emit, []

    def timed(step: object) -> None:
        start = time.perf_counter()
        emit(step)  # type: ignore[arg-type]
        writing.append(time.perf_counter() - start)

    auto.emit = timed
    times, lines = [], []
    for step in range(1, steps + 2):
        start, before = time.perf_counter(), len(writing)
        train_step(model, opt, sched, tokens)
        if step > 2:  # step 2 writes step 1's line, which allocated optimizer state
            times.append(time.perf_counter() - start)
            lines.append(sum(writing[before:]))
    return times, lines


def install_audit() -> None:
    """What the bootstrap installs before the user's code (rank/bootstrap.py)."""
    current().install()


def window_factor(steps: int, tokens: tuple[int, int]) -> float:
    """Median step time with the draw trace active over the median without it."""
    from pytest_resume_equiv.rank.trace import DrawTrace

    model, opt, _ = build()
    times: dict[bool, list[float]] = {False: [], True: []}
    for step in range(2 * steps + 2):
        traced = step % 2 == 1
        window = DrawTrace(lambda: 0, lambda generator: "g")
        if traced:
            window.start()
        start = time.perf_counter()
        x = torch.randint(0, 1024, tokens)
        loss = torch.nn.functional.cross_entropy(model(x).reshape(-1, 1024), x.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        elapsed = time.perf_counter() - start
        window.stop()
        if step > 1:
            times[traced].append(elapsed)
    return median_of(times[True]) / median_of(times[False])


def api(on: bool, run_dir: str, auto: bool = False) -> None:
    """Switch the in-rank API on (a run context, as the bootstrap gives a rank; `auto`:
    automatic recording on) or off: a fresh rank state either way."""
    current().close()
    if on:
        launch = LaunchContext("uninterrupted", run_dir, steps=100, split=1, splits=(1,), auto=auto)
        os.environ[CONTEXT_ENV] = launch.to_json()
    else:
        os.environ.pop(CONTEXT_ENV, None)
    reset()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=256)
    args = parser.parse_args()
    torch.set_num_threads(1)  # what a rank gets (OMP_NUM_THREADS=1)
    params = sum(p.numel() for p in build()[0].parameters())
    run_dir = tempfile.mkdtemp(prefix="bench-record-")
    rows = [["variant", "median step s", "median in record s", "record / step"]]
    shares = []
    medians = {}
    variants = (
        ("API off", False, False),
        ("record + watch", True, False),
        ("+ restore log, resume-point hook", True, True),
    )
    for label, on, audit in variants:
        api(on, run_dir)
        if audit:
            install_audit()  # once: the wrappers stay, as in a rank
        train, recording = step_times(args.steps, on, (args.batch, args.seq))
        api(False, run_dir)
        medians[label] = median_of(train) + median_of(recording)
        share = median_of(recording) / median_of(train)
        if on:
            shares.append(share)
        rows.append(
            [label, f"{median_of(train):.3f}", f"{median_of(recording):.4f}", f"{share * 100:.2f}%"]
        )
    for label, watch in (("automatic, no call", False), ("automatic + watch", True)):
        api(True, run_dir, auto=True)
        install_audit()
        current().open()
        whole, lines = auto_step_times(args.steps, (args.batch, args.seq), watch)
        current().finish()
        api(False, run_dir)
        share = median_of(lines) / (median_of(whole) - median_of(lines))
        rows.append(
            [label, f"{median_of(whole):.3f}", f"{median_of(lines):.4f}", f"{share * 100:.2f}%"]
        )
    window = window_factor(args.steps, (args.batch, args.seq))
    print(machine())
    print(
        f"model: {params / 1e6:.1f}M parameters (4-layer transformer, d=512), AdamW, batch "
        f"{args.batch}x{args.seq} tokens, 1 thread, median of {args.steps} steps"
    )
    print(table(rows))
    print(
        "record + watch fingerprint every parameter, both AdamW moments and every RNG stream "
        "and write one signature line per step; target: <= 3% of the step"
    )
    print(
        "automatic (no call in the loop): the time writing each step's line (the loss, an id "
        "per input sample, every parameter, AdamW moment, scheduler and RNG stream) over the "
        "rest of the step; target: <= 3% of the step"
    )
    extra = medians["+ restore log, resume-point hook"] / medians["record + watch"] - 1
    print(f"restore log + resume-point hook outside the window: {extra * 100:+.2f}% (target < 1%)")
    print(f"a step inside the window (every op traced): {window:.2f}x a step outside it")


if __name__ == "__main__":
    main()
