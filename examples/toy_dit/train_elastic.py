"""A toy Wan DiT trainer with FSDP2 and DCP checkpoints that resumes on any number of ranks.

Read it top to bottom: data, model, the resume, the loop, the checkpoint. What makes it
elastic: a step consumes a global batch of 4 samples whatever the number of ranks (rank r of
W takes every W-th); each sample's noise and timestep come from a generator seeded by the
sample and the step, not from a rank's RNG; dropout is off (its mask would come from a rank's
RNG, which has no counterpart on another number of ranks); the loss is scaled so that FSDP's
gradient average is the global batch's gradient; and DCP reshards the model and optimizer
state onto the new number of ranks at load.

    torchrun --nproc-per-node=2 train_elastic.py --model-dir=DIR --max-steps=6 --save-at=3 \
        --output-dir=out
    torchrun --nproc-per-node=1 train_elastic.py --model-dir=DIR --max-steps=6 \
        --output-dir=out2 --resume-from=out/checkpoints/step_3

Nothing here knows about the plugin: under a resume test every rank records each optimizer
step by itself; the samples of a global batch are known by their content, on any number of
ranks.
"""

from __future__ import annotations

import argparse
import json
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

from pytest_resume_equiv.toy import load_toy_wan

SAMPLES, GLOBAL_BATCH, TIMESTEPS = 32, 4, 1000


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model-dir", required=True, help="a toy Wan model (toy_wan_model_dir)")
    parser.add_argument("--max-steps", type=int, required=True)
    parser.add_argument("--save-at", default="", help="comma-separated steps to checkpoint after")
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--resume-from", default=None)
    parser.add_argument(
        "--device", default="cpu", help="cpu (gloo), cuda (nccl) or npu (hccl): LOCAL_RANK's"
    )
    return parser.parse_args()


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


def sample(i: int, step: int, device: torch.device) -> dict[str, torch.Tensor]:
    """Sample i's latents and text (a pure function of i), and its noise and timestep at this
    step (a pure function of i and the step): the same on any number of ranks."""
    g = torch.Generator().manual_seed(i)
    latents, text = torch.randn(1, 4, 2, 4, 4, generator=g), torch.randn(1, 4, 16, generator=g)
    g = torch.Generator().manual_seed(1_000_003 * step + i)
    noise = torch.randn(latents.shape, generator=g)
    timestep = torch.randint(0, TIMESTEPS, (1,), generator=g)
    t = timestep.float().view(-1, 1, 1, 1, 1) / TIMESTEPS
    out = {"noisy": (1 - t) * latents + t * noise, "target": noise - latents}
    out.update(timestep=timestep, text=text)
    return {k: v.to(device) for k, v in out.items()}


def main() -> None:
    args = parse_args()
    save_at = {int(s) for s in args.save_at.split(",") if s}
    device = init_distributed(args.device)
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh(device.type, (world,))

    torch.manual_seed(0)
    model = load_toy_wan(args.model_dir).to(device)
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    start = 1
    if args.resume_from:
        model_state, optim_state = get_state_dict(model, optimizer)
        state = {"model": model_state, "optimizer": optim_state}
        dcp.load(state, checkpoint_id=os.path.join(args.resume_from, "dcp"))  # reshards
        set_state_dict(
            model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"]
        )
        with open(os.path.join(args.resume_from, "progress.json")) as f:
            start = json.load(f)["step"] + 1

    for step in range(start, args.max_steps + 1):
        first = (step - 1) * GLOBAL_BATCH
        ids = [(first + k) % SAMPLES for k in range(GLOBAL_BATCH)][rank::world]
        batch = [sample(i, step, device) for i in ids]
        inputs = {k: torch.cat([b[k] for b in batch]) for k in batch[0]}
        prediction = model(inputs["noisy"], inputs["timestep"], inputs["text"]).sample
        per_sample = (prediction - inputs["target"]).pow(2).flatten(1).mean(1)
        # FSDP averages gradients over the W ranks: scaled by W, the average is the
        # gradient of the global batch's mean loss.
        loss = per_sample.sum() * world / GLOBAL_BATCH
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

        if step in save_at:
            ckpt = os.path.join(args.output_dir, "checkpoints", f"step_{step}")
            model_state, optim_state = get_state_dict(model, optimizer)
            dcp.save(
                {"model": model_state, "optimizer": optim_state},
                checkpoint_id=os.path.join(ckpt, "dcp"),
            )
            if rank == 0:
                with open(os.path.join(ckpt, "progress.json"), "w") as f:
                    json.dump({"step": step}, f)
            dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
