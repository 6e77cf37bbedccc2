"""A tiny Hugging Face `Trainer` run that resumes exactly: read it top to bottom.

Run by hand:  torchrun --nproc-per-node=2 train.py --max-steps=6 --save-steps=3 --output-dir=out
then resume:  torchrun --nproc-per-node=2 train.py --max-steps=6 --save-steps=3 \
                  --output-dir=out2 --resume-from=out/checkpoint-3

The Trainer saves and restores everything itself (weights, optimizer, scheduler, every
rank's RNG, and the position in the data). Nothing here knows about the plugin: under a
resume test every rank records each optimizer step by itself (the loss of each backward, the
batches by content, the model, optimizer and scheduler, every random stream). `--callback`
adds `ResumeEquivCallback`, which records what the Trainer logs as well (its loss, learning
rate and grad norm) and watches objects no optimizer holds (docs/guides/hf-trainer.md).
`--bug=ignore-data-skip` sets `ignore_data_skip=True`: the resumed run starts its epoch's
data over instead of skipping the batches it already trained on.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn
from transformers import Trainer, TrainingArguments


class TinyRegressor(nn.Module):
    """Any module whose forward returns {"loss": ...} trains under the Trainer."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 1))

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": nn.functional.mse_loss(self.net(x), labels)}


def make_dataset(n: int = 256) -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(7)  # the same examples in every process
    x = torch.randn(n, 8, generator=generator)
    y = x.sum(dim=1, keepdim=True)
    return [{"x": x[i], "labels": y[i]} for i in range(n)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--max-steps", type=int, required=True)
    parser.add_argument("--save-steps", type=int, required=True)
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--resume-from", default=None)
    parser.add_argument("--bug", choices=("none", "ignore-data-skip"), default="none")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--callback", action="store_true", help="record the logged values too")
    args = parser.parse_args()

    torch.manual_seed(0)
    training_args = TrainingArguments(
        output_dir=args.output_dir,
        max_steps=args.max_steps,
        per_device_train_batch_size=8,
        learning_rate=1e-2,
        lr_scheduler_type="linear",
        warmup_steps=2,
        save_strategy="steps",
        save_steps=args.save_steps,
        logging_steps=1,
        report_to="none",
        disable_tqdm=True,
        use_cpu=args.device == "cpu",
        ddp_backend="gloo" if args.device == "cpu" else "nccl",
        dataloader_num_workers=0,
        seed=0,
        ignore_data_skip=args.bug == "ignore-data-skip",
    )
    callbacks = []
    if args.callback:
        from pytest_resume_equiv.integrations.hf import ResumeEquivCallback

        callbacks.append(ResumeEquivCallback())
    trainer = Trainer(
        model=TinyRegressor(),
        args=training_args,
        train_dataset=make_dataset(),
        callbacks=callbacks,
    )
    trainer.train(resume_from_checkpoint=args.resume_from)


if __name__ == "__main__":
    main()
