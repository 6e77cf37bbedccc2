"""A toy Wan DiT trainer with FSDP2 and DCP checkpoints that resumes exactly.

Read it top to bottom: data, model, condition model, the loop, the checkpoint. It runs on CPU
with gloo and on CUDA / Ascend NPU with nccl / hccl (`--device`).

Nothing here knows about the plugin unless `--record-noise` asks: under a resume test every
rank records each optimizer step by itself (the loss, the model's inputs by content, the
model, optimizer and scheduler, every random stream, the condition model's generator
included). `--record-noise` records the noise and timestep ids the condition model drew with
`req.record`, so that a report names them first: the sample identities, before the values
computed from them (docs/guides/recording-more.md).

    torchrun --nproc-per-node=2 train.py --model-dir=DIR --max-steps=6 --save-at=3 --output-dir=out
    torchrun --nproc-per-node=2 train.py --model-dir=DIR --max-steps=6 --output-dir=out2 \
        --resume-from=out/checkpoints/step_3

`--bug=...` switches on a classic resume bug of diffusion trainers, to show the test catches it.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh

try:
    from torch.distributed.fsdp import fully_shard
except ImportError:  # torch < 2.6 keeps FSDP2 here
    from torch.distributed._composable.fsdp import fully_shard

from pytest_resume_equiv.toy import ToyFlowMatchingCondition, load_toy_wan

BUGS = ("none", "no-condition-rng", "rank0-extra-state", "no-device-rng")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model-dir", required=True, help="a toy Wan model (toy_wan_model_dir)")
    parser.add_argument("--max-steps", type=int, required=True)
    parser.add_argument("--save-at", default="", help="comma-separated steps to checkpoint after")
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--resume-from", default=None)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--bug", choices=BUGS, default="none")
    parser.add_argument(
        "--device", default="cpu", help="cpu (gloo), cuda (nccl) or npu (hccl): LOCAL_RANK's"
    )
    parser.add_argument(
        "--record-noise", action="store_true", help="record more: noise and timestep ids"
    )
    return parser.parse_args()


def latents_for(step: int, rank: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The "dataset": video latents and text embeddings, a pure function of (step, rank)."""
    g = torch.Generator().manual_seed(10_000 * step + rank)
    latents = torch.randn(2, 4, 2, 4, 4, generator=g)
    text = torch.randn(2, 4, 16, generator=g)
    return latents.to(device), text.to(device)


def init_distributed(kind: str) -> torch.device:
    """The process group, and this rank's device: `LOCAL_RANK`'s of the kind asked for."""
    if kind == "cpu":
        dist.init_process_group("gloo")
        return torch.device("cpu")
    if kind == "npu":
        import torch_npu  # noqa: F401  (registers torch.npu)
    device = torch.device(kind, int(os.environ.get("LOCAL_RANK", "0")))
    getattr(torch, kind).set_device(device)
    dist.init_process_group({"cuda": "nccl", "npu": "hccl"}[kind], device_id=device)
    return device


def device_rng_state(device: torch.device) -> torch.Tensor:
    if device.type == "cpu":
        return torch.get_rng_state()
    return getattr(torch, device.type).get_rng_state(device)


def set_device_rng_state(device: torch.device, state: torch.Tensor) -> None:
    if device.type == "cpu":
        torch.set_rng_state(state)
    else:
        getattr(torch, device.type).set_rng_state(state, device)


def main() -> None:
    args = parse_args()
    save_at = {int(s) for s in args.save_at.split(",") if s}
    device = init_distributed(args.device)
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh(device.type, (world,))

    # Model: the toy Wan DiT (eager RoPE, native attention), dropout on, sharded with FSDP2.
    torch.manual_seed(args.seed)
    model = load_toy_wan(args.model_dir).to(device)
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.5
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 4))
    condition = ToyFlowMatchingCondition(seed=args.seed, dp_rank=rank, device=device)
    torch.manual_seed(args.seed + rank)  # per-rank default stream (dropout, device noise)

    start = 1
    if args.resume_from:
        # Sharded model and optimizer state: DCP, every rank loads its shards.
        model_state, optim_state = get_state_dict(model, optimizer)
        state = {"model": model_state, "optimizer": optim_state}
        dcp.load(state, checkpoint_id=os.path.join(args.resume_from, "dcp"))
        set_state_dict(
            model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"]
        )
        # Per-rank extra state: our own file, written below, so weights_only loading is safe.
        owner = 0 if args.bug == "rank0-extra-state" else rank
        extra = torch.load(
            os.path.join(args.resume_from, "extra", f"rank-{owner}.pt"), weights_only=True
        )
        scheduler.load_state_dict(extra["scheduler"])
        torch.set_rng_state(extra["cpu_rng"])
        if args.bug != "no-device-rng":
            set_device_rng_state(device, extra["device_rng"])
        if args.bug != "no-condition-rng":
            condition.load_rng_state_dict(extra["condition_rng"])
        start = extra["step"] + 1

    for step in range(start, args.max_steps + 1):
        latents, text = latents_for(step, rank, device)
        sample = condition.sample(latents, text)
        prediction = model(sample["noisy"], sample["timestep_ids"], sample["text"]).sample
        loss = torch.nn.functional.mse_loss(prediction, sample["target"])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        if args.record_noise:
            import pytest_resume_equiv as req  # every call is a no-op outside a test run

            req.record(step, noise=sample["noise"], timestep_ids=sample["timestep_ids"])

        if step in save_at:
            ckpt = os.path.join(args.output_dir, "checkpoints", f"step_{step}")
            model_state, optim_state = get_state_dict(model, optimizer)
            dcp.save(
                {"model": model_state, "optimizer": optim_state},
                checkpoint_id=os.path.join(ckpt, "dcp"),
            )
            os.makedirs(os.path.join(ckpt, "extra"), exist_ok=True)
            extra = {
                "step": step,
                "scheduler": scheduler.state_dict(),
                "cpu_rng": torch.get_rng_state(),
                "device_rng": device_rng_state(device),
                "condition_rng": condition.rng_state_dict(),
            }
            torch.save(extra, os.path.join(ckpt, "extra", f"rank-{rank}.pt"))
            dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
