"""A hand-written accelerate loop that resumes exactly, in the style of accelerate's
`examples/by_feature/checkpointing.py`: read it top to bottom.

Run by hand:  accelerate launch --cpu --num_processes=2 train.py --max-steps=8 --save-at=5 \
                  --output-dir=out
then resume:  accelerate launch --cpu --num_processes=2 train.py --max-steps=8 \
                  --output-dir=out2 --resume-from=out/step_5

The data: 32 samples, 4 per process and step on 2 processes, so an epoch is 4 steps and step
5 is the first step of epoch 1. `accelerator.save_state` saves the model, the optimizer, the
scheduler, every process's RNG and the sampler; `load_state` restores them and
`skip_first_batches` skips what the epoch already trained on. `--bug=no-skip` forgets the
skip, the classic accelerate resume bug: the resumed epoch starts over.

Nothing here knows about the plugin: under a resume test every rank records each optimizer
step by itself (the loss of each `accelerator.backward`, the batches by content, the model,
optimizer and scheduler, every random stream). On CPU, accelerate is told so by its own
variable (ACCELERATE_USE_CPU=true, the test's env=). `--watch-accelerator` hands the
`Accelerator` to `req.watch`: what `save_state` saves beyond them (objects registered for
checkpointing, the prepared data loaders' position and sampler) is audited too, and each
step's sample ids are recorded (docs/guides/accelerate.md).
"""

from __future__ import annotations

import argparse
import os

import torch
from accelerate import Accelerator, DataLoaderConfiguration
from accelerate.utils import set_seed
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

SAMPLES, BATCH = 32, 4


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--max-steps", type=int, required=True)
    parser.add_argument("--save-at", default="", help="comma-separated steps to save after")
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--resume-from", default=None)
    parser.add_argument("--bug", choices=("none", "no-skip"), default="none")
    parser.add_argument("--watch-accelerator", action="store_true", help="record more")
    return parser.parse_args()


def make_data() -> TensorDataset:
    generator = torch.Generator().manual_seed(7)  # the same samples in every process
    x = torch.randn(SAMPLES, 8, generator=generator)
    return TensorDataset(x, x.sum(dim=1, keepdim=True), torch.arange(SAMPLES))


def main() -> None:
    args = parse_args()
    save_at = {int(s) for s in args.save_at.split(",") if s}
    accelerator = Accelerator(dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True))
    set_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 4))
    loader = DataLoader(make_data(), batch_size=BATCH, shuffle=True)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    if args.watch_accelerator:
        import pytest_resume_equiv as req  # every call is a no-op outside a test run

        req.watch(accelerator=accelerator)  # everything save_state saves

    step, first_epoch, skip, restored_rng = 0, 0, 0, None
    if args.resume_from:
        accelerator.load_state(args.resume_from)  # also every process's RNG states
        step = int(os.path.basename(args.resume_from).split("_")[-1])
        first_epoch, skip = divmod(step, len(loader))
        restored_rng = torch.get_rng_state()

    for epoch in range(first_epoch, args.max_steps):
        loader.set_epoch(epoch)  # the sampler's permutation is the epoch's, resumed or not
        batches = loader
        if epoch == first_epoch and skip and args.bug != "no-skip":
            batches = accelerator.skip_first_batches(loader, skip)
        model.train()
        for x, y, ids in batches:
            if restored_rng is not None:
                # The DataLoader iterator drew its base seed from the CPU RNG when it started
                # (the first batch). The uninterrupted run did that before it saved, at the
                # start of this epoch; here it came after load_state: restore the RNG again.
                torch.set_rng_state(restored_rng)
                restored_rng = None
            loss = nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            step += 1
            if args.watch_accelerator:  # every process's own sample ids, by dataset index
                req.record(step, sample_ids=ids)
            if step in save_at:
                accelerator.save_state(os.path.join(args.output_dir, f"step_{step}"))
            if step == args.max_steps:
                accelerator.end_training()
                return


if __name__ == "__main__":
    main()
