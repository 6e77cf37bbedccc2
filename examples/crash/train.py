"""A trainer whose checkpoint save must survive a crash at any point: read it top to bottom.

There is no --resume-from: on start the trainer always looks under --ckpt-root for the
latest complete checkpoint and resumes from it, else starts from step 0. That is how
preempted jobs restart, and what `interrupt="crash"` tests: a launch is SIGKILLed in the
middle of a save, and the next launch, on the same root, must resume from a checkpoint that
was complete (or start over when there was none), never from a torn or mixed one.

Run by hand:  torchrun --nproc-per-node=2 train.py --max-steps=6 --save-at=2,4 \
                  --ckpt-root=/tmp/x/checkpoints --saver=atomic
then again, same command: it resumes from step 4 and runs steps 5-6.

Nothing here knows about the plugin: under a resume test every rank records each optimizer
step by itself, so this file is tested as it is.

`--saver=...` picks how a checkpoint is written and found again. Only `atomic` is correct;
the others are classic crash-consistency bugs, there to show that the test catches them:

- `atomic`: write into `ROOT/tmp-step_S/`, fsync the files, rename the folder to
  `ROOT/step_S`, fsync the root, then move the pointer `ROOT/latest` (itself written to
  `latest.tmp`, fsynced and renamed). Older checkpoints are kept.
- `in-place`: overwrite `ROOT/current/{model,optim}.pt` and `meta.json`. A crash between the
  files leaves the new weights with the old optimizer and the old step: a mixed checkpoint.
- `latest-first`: write `ROOT/latest` first, then the step folder. A crash in between leaves
  a pointer to a folder that is missing or half written, and the resume trusts it.
- `delete-previous`: like `atomic`, but delete the older checkpoints before writing the new
  one. A crash in between leaves no checkpoint at all: the run starts over from step 0.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import sys
from typing import Optional

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

SAVERS = ("atomic", "in-place", "latest-first", "delete-previous")
BATCH = 4  # samples per rank per step


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--max-steps", type=int, required=True)
    parser.add_argument("--save-at", default="", help="comma-separated steps to checkpoint after")
    parser.add_argument(
        "--ckpt-root", required=True, help="where checkpoints are written and found"
    )
    parser.add_argument("--saver", choices=SAVERS, default="atomic")
    parser.add_argument(
        "--metrics", default=None, help="write the per-step loss as JSON here (rank 0)"
    )
    return parser.parse_args()


# --- Data: a pure function of (step, rank), so a checkpoint needs nothing else for it. -------


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's samples of `step`: inputs and targets."""
    generator = torch.Generator().manual_seed(step * 1000 + rank)
    x = torch.randn(BATCH, 8, generator=generator)
    return x, x.sum(dim=1, keepdim=True)


# --- Writing files: the small steps every saver is made of. ----------------------------------


def fsync_path(path: str) -> None:
    """Flush a file's or a folder's data to disk (a folder: the names it holds)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_text(path: str, text: str, durable: bool) -> None:
    with open(path, "w") as f:
        f.write(text)
        if durable:
            f.flush()
            os.fsync(f.fileno())


def write_step_files(folder: str, step: int, model: nn.Module, optimizer, durable: bool) -> None:
    """model.pt, optim.pt, then meta.json LAST: a folder with meta.json has all three."""
    os.makedirs(folder, exist_ok=True)
    for name, state in (("model.pt", model.state_dict()), ("optim.pt", optimizer.state_dict())):
        path = os.path.join(folder, name)
        torch.save(state, path)
        if durable:
            fsync_path(path)
    write_text(os.path.join(folder, "meta.json"), json.dumps({"step": step}), durable)


def complete(folder: str) -> bool:
    return os.path.isfile(os.path.join(folder, "meta.json"))


def step_folders(root: str) -> list[str]:
    """`ROOT/step_*` folders, oldest first (never `tmp-step_*`)."""
    found = glob.glob(os.path.join(root, "step_*"))
    return sorted(found, key=lambda p: int(os.path.basename(p).split("_")[1]))


def write_latest(root: str, step: int) -> None:
    """The pointer, atomically: `latest.tmp`, fsync, rename over `latest`, fsync the root."""
    tmp = os.path.join(root, "latest.tmp")
    write_text(tmp, f"step_{step}", durable=True)
    os.replace(tmp, os.path.join(root, "latest"))
    fsync_path(root)


# --- The savers. Each writes the checkpoint of `step` under `root`. --------------------------


def save_atomic(root: str, step: int, model: nn.Module, optimizer, delete_first=False) -> None:
    final = os.path.join(root, f"step_{step}")
    tmp = os.path.join(root, f"tmp-step_{step}")
    if delete_first:  # BUG (delete-previous): the only complete checkpoints go first
        for old in step_folders(root):
            shutil.rmtree(old)
    if os.path.exists(tmp):  # left by a launch that died while writing it
        shutil.rmtree(tmp)
    write_step_files(tmp, step, model, optimizer, durable=True)
    if os.path.exists(final):
        # Renamed by a launch that died before it moved `latest`; `latest` still names an
        # older, complete checkpoint, so replacing this one loses nothing.
        shutil.rmtree(final)
    os.replace(tmp, final)
    fsync_path(root)
    write_latest(root, step)


def save_in_place(root: str, step: int, model: nn.Module, optimizer) -> None:
    # BUG: overwrites the previous checkpoint's files one by one.
    write_step_files(os.path.join(root, "current"), step, model, optimizer, durable=False)


def save_latest_first(root: str, step: int, model: nn.Module, optimizer) -> None:
    # BUG: the pointer names a folder that does not exist yet.
    write_text(os.path.join(root, "latest"), f"step_{step}", durable=False)
    write_step_files(os.path.join(root, f"step_{step}"), step, model, optimizer, durable=False)


def save(saver: str, root: str, step: int, model: nn.Module, optimizer) -> None:
    os.makedirs(root, exist_ok=True)
    if saver == "atomic":
        save_atomic(root, step, model, optimizer)
    elif saver == "delete-previous":
        save_atomic(root, step, model, optimizer, delete_first=True)
    elif saver == "in-place":
        save_in_place(root, step, model, optimizer)
    else:
        save_latest_first(root, step, model, optimizer)


# --- Finding the checkpoint to resume from: the folder, or None to start over. ---------------


def find_checkpoint(saver: str, root: str) -> Optional[str]:
    latest = os.path.join(root, "latest")
    if saver == "in-place":
        current = os.path.join(root, "current")
        return current if complete(current) else None
    if saver == "latest-first":  # BUG: trusts the pointer blindly
        if not os.path.isfile(latest):
            return None
        with open(latest) as f:
            return os.path.join(root, f.read().strip())
    # atomic and delete-previous: the pointer if it names a complete folder, else the newest
    # complete step folder (a crash after the rename but before the pointer moved).
    if os.path.isfile(latest):
        with open(latest) as f:
            named = os.path.join(root, f.read().strip())
        if complete(named):
            return named
    done = [folder for folder in step_folders(root) if complete(folder)]
    return done[-1] if done else None


def broadcast_path(path: Optional[str]) -> Optional[str]:
    """Rank 0's `path` on every rank, sent as bytes in a tensor: torch's object collectives
    (`broadcast_object_list`) need numpy, which torch does not install."""
    size = torch.tensor([-1 if path is None else len(path.encode())])
    dist.broadcast(size, src=0)
    if size.item() < 0:
        return None
    data = torch.tensor(list(path.encode()) if path is not None else [0] * size.item())
    dist.broadcast(data, src=0)
    return bytes(data.tolist()).decode()


def load_checkpoint(folder: str, model: nn.Module, optimizer) -> int:
    """Load `folder` into `model` and `optimizer`; return the step it was saved after."""
    # Our own files, written above: weights_only loading is safe.
    model.load_state_dict(torch.load(os.path.join(folder, "model.pt"), weights_only=True))
    optimizer.load_state_dict(torch.load(os.path.join(folder, "optim.pt"), weights_only=True))
    with open(os.path.join(folder, "meta.json")) as f:
        return json.load(f)["step"]


def main() -> None:
    args = parse_args()
    save_at = {int(s) for s in args.save_at.split(",") if s}
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(0)  # same initial weights on every rank; no RNG is drawn after this
    model = nn.Linear(8, 1)
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=1e-2)

    # Rank 0 picks the checkpoint, so that every rank loads the same one.
    picked = broadcast_path(find_checkpoint(args.saver, args.ckpt_root) if rank == 0 else None)
    start = 1
    if picked is None:
        if rank == 0:
            print(
                f"no complete checkpoint under {args.ckpt_root}: starting from step 0",
                file=sys.stderr,
            )
    else:
        start = load_checkpoint(picked, model, optimizer) + 1
        if rank == 0:
            print(f"resuming from {picked} (step {start - 1})", file=sys.stderr)

    losses: dict[int, float] = {}
    for step in range(start, args.max_steps + 1):
        x, y = batch(step, rank)
        loss = nn.functional.mse_loss(ddp(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        total = loss.detach().clone()
        dist.all_reduce(total)  # the global batch's loss, for the --metrics file
        losses[step] = total.item() / world

        if step in save_at:
            if rank == 0:  # only rank 0 writes; the others wait until the save is over
                save(args.saver, args.ckpt_root, step, model, optimizer)
            dist.barrier()

    if args.metrics and rank == 0:
        with open(args.metrics, "w") as f:
            json.dump(losses, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
