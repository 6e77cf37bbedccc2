"""A trainer in several versions, to show what goldens catch that a resume test cannot.

- `--version=1`: the release whose golden (trajectory and checkpoint) is kept;
- `--version=2-renamed-key`: saves the optimizer under a new key ("optim") and its loader
  skips what it does not find, as `strict=False` loaders do: it resumes its own checkpoints
  exactly, but a checkpoint version 1 wrote loads without its optimizer state;
- `--version=2-new-init`: initializes the model differently: the uninterrupted and resumed
  runs move alike, so its resume test passes, and the golden trajectory does not;
- `--version=2-refactor`: the same training written differently (and a version field in the
  checkpoint that version 1 lacks, read with a default): compatible, passes everything.

Nothing here knows about the plugin: under a resume test every rank records each optimizer
step by itself, so each version is tested as it is.

Run by hand:  torchrun --nproc-per-node=1 train.py --version=1 --max-steps=4 --save-at=2 \
                  --output-dir=out
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn

VERSIONS = ("1", "2-renamed-key", "2-new-init", "2-refactor")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--version", choices=VERSIONS, default="1")
    parser.add_argument("--max-steps", type=int, required=True)
    parser.add_argument("--save-at", default="", help="comma-separated steps to checkpoint after")
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--resume-from", default=None)
    return parser.parse_args()


def build(version: str) -> nn.Module:
    torch.manual_seed(1 if version == "2-new-init" else 0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))


def optimizer_key(version: str) -> str:
    return "optim" if version == "2-renamed-key" else "optimizer"


def load(path: str, version: str, model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """The step the checkpoint at `path` was saved after; everything restored from it."""
    # Our own per-rank file: weights_only=True keeps torch.load from running pickled code.
    state = torch.load(path, weights_only=True)
    model.load_state_dict(state["model"])
    key = optimizer_key(version)
    if key in state:  # the silent fallback: a missing key leaves a fresh optimizer
        optimizer.load_state_dict(state[key])
    torch.set_rng_state(state["cpu_rng"])
    if version == "2-refactor":
        _ = state.get("format", 1)  # version 1 wrote none: read with a default
    return int(state["step"])


def save(path: str, version: str, step: int, model: nn.Module, optimizer) -> None:
    state = {
        "model": model.state_dict(),
        optimizer_key(version): optimizer.state_dict(),
        "cpu_rng": torch.get_rng_state(),
        "step": step,
    }
    if version == "2-refactor":
        state["format"] = 2
    torch.save(state, path)


def main() -> None:
    args = parse_args()
    save_at = {int(s) for s in args.save_at.split(",") if s}
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = build(args.version)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    torch.manual_seed(1000 + rank)

    start = 1
    if args.resume_from:
        start = (
            load(os.path.join(args.resume_from, f"rank-{rank}.pt"), args.version, model, optimizer)
            + 1
        )
    for step in range(start, args.max_steps + 1):
        x = torch.randn(16, 8)
        loss = nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
        optimizer.zero_grad()
        loss.backward()
        for p in model.parameters():  # one process group, as a DDP trainer would have
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()
        optimizer.step()
        if step in save_at:
            ckpt = os.path.join(args.output_dir, "checkpoints", f"step_{step}")
            os.makedirs(ckpt, exist_ok=True)
            save(os.path.join(ckpt, f"rank-{rank}.pt"), args.version, step, model, optimizer)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
