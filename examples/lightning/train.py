"""A tiny Lightning run that resumes exactly: read it top to bottom.

Run by hand:  torchrun --nproc-per-node=2 train.py --max-steps=6 --save-every=3 --output-dir=out
then resume:  torchrun --nproc-per-node=2 train.py --max-steps=6 --save-every=3 \
                  --output-dir=out2 --resume-from=out/checkpoints/step_3.ckpt

Lightning checkpoints the module, optimizer, scheduler and loop counters, but two things
an exact mid-epoch resume needs are the trainer's job, and this one does both:
- the data must be resumable (`state_dict` / `load_state_dict`), or the resumed epoch starts
  its batches over (Lightning warns, then trains on them again);
- every rank's RNG (here: dropout) must go into the checkpoint, and only rank 0 writes
  it: `on_save_checkpoint` gathers each rank's state, `on_load_checkpoint` takes its own.
Nothing here knows about the plugin: under a resume test every rank records each optimizer
step by itself (the loss of each backward, the batches by content, the module, optimizer and
scheduler, every random stream). `--callback` adds `ResumeEquivCallback`, which records the
loss `training_step` returned, the learning rate and the grad norm as well, and watches
objects no optimizer holds (docs/guides/lightning.md).
`--bug=rank-0-rng` gives every rank rank 0's state after the resume: what a module that
stores `torch.get_rng_state()` in its checkpoint does.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn


class ResumableBatches:
    """Batch `i` of this rank comes from its own seeded generator, so the stream can start
    at any position; Lightning saves `state_dict()` in the checkpoint and hands it back
    through `load_state_dict` before the resumed epoch starts."""

    def __init__(self, rank: int, length: int = 64) -> None:
        self.rank, self.length = rank, length
        self.position = 0  # batches handed out in the current epoch

    def __len__(self) -> int:
        return self.length  # with a length, Lightning does not fetch ahead

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if self.position >= self.length:
            self.position = 0  # a new epoch
        while self.position < self.length:
            generator = torch.Generator().manual_seed(self.rank * 100_003 + self.position)
            x = torch.randn(8, 8, generator=generator)
            self.position += 1
            yield x, x.sum(dim=1, keepdim=True)

    def state_dict(self) -> dict[str, Any]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.position = state["position"]


class TinyRegressor(L.LightningModule):
    def __init__(self, bug: str) -> None:
        super().__init__()
        self.bug = bug
        self.net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.AdamW(self.parameters(), lr=1e-2)
        warmup = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 4))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": warmup, "interval": "step"}}

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # Every rank builds the checkpoint; rank 0 writes it: gather all ranks' states.
        checkpoint["cpu_rng_per_rank"] = self.all_gather(torch.get_rng_state()).reshape(
            self.trainer.world_size, -1
        )

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        rank = 0 if self.bug == "rank-0-rng" else self.trainer.global_rank
        torch.set_rng_state(checkpoint["cpu_rng_per_rank"][rank].clone())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--max-steps", type=int, required=True)
    parser.add_argument("--save-every", type=int, required=True)
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--resume-from", default=None)
    parser.add_argument("--bug", choices=("none", "rank-0-rng"), default="none")
    parser.add_argument("--accelerator", default="cpu", help="Lightning's: cpu, gpu, auto")
    parser.add_argument("--callback", action="store_true", help="record the logged values too")
    args = parser.parse_args()

    callbacks: list[L.Callback] = []
    if args.callback:
        from pytest_resume_equiv.integrations.lightning import ResumeEquivCallback

        callbacks.append(ResumeEquivCallback())
    torch.manual_seed(0)  # the same initial weights on every rank
    module = TinyRegressor(bug=args.bug)
    trainer = L.Trainer(
        accelerator=args.accelerator,
        devices=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        num_nodes=int(os.environ.get("WORLD_SIZE", "1"))
        // int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        strategy="ddp",
        max_steps=args.max_steps,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[
            *callbacks,
            ModelCheckpoint(
                dirpath=os.path.join(args.output_dir, "checkpoints"),
                filename="step_{step}",
                auto_insert_metric_name=False,
                every_n_train_steps=args.save_every,
                save_top_k=-1,
            ),
        ],
    )
    torch.manual_seed(1000 + trainer.global_rank)  # then a per-rank stream for dropout
    trainer.fit(
        module, train_dataloaders=ResumableBatches(trainer.global_rank), ckpt_path=args.resume_from
    )


if __name__ == "__main__":
    main()
