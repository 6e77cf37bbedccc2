"""A zero-edit trainer shaped like VeOmni's DiT trainer (Wan2.1 text-to-video, offline
training on precomputed latents and text embeddings), tiny, on CPU with gloo: no plugin line
(tests/e2e/test_dit_zoo.py).

    torchrun --nproc-per-node=2 dit_train.py --max-steps=6 --save-at=3 --output-dir=o
    torchrun --nproc-per-node=2 dit_train.py --max-steps=6 --output-dir=o2 \
        --resume-from=o/checkpoints/global_step_3

What makes it a DiT trainer of that shape, and not a plain loop:
- batches are lists: each sample's latent is its own tensor (clips of different frame counts)
  and so is its text embedding (prompts of different lengths); the collate function returns a
  dict of lists, and the DiT's forward takes the lists (`model(latents, timesteps, text)`);
- a condition component (a plain class, no `nn.Module`) owns its own `torch.Generator` and
  draws each micro-batch's noise and timesteps from it before the forward;
- gradient accumulation, 2 micro-batches per optimizer step;
- a `StatefulDataLoader` over a `DistributedSampler`, its state saved and loaded;
- FSDP2 (`fully_shard` per block and at the root, over a CPU mesh) and DCP for the model and
  the optimizer (`get_state_dict` / `set_state_dict`), plus a per-rank extra-state file
  (`torch.save`): the condition generator, the CPU RNG and Python's `random`, the loader's
  state, the LR scheduler (a warmup that changes the learning rate every step), the step;
- the restore code restores the CPU RNG, then the loader's iterator starts and draws its base
  seed from it: a latent difference, since nothing after the resume draws from the CPU RNG.

`--bug=...` switches on one resume bug: `generator-not-saved` (the condition generator's state
is not in the extra state: the resumed run draws the noise of step 1 again),
`scheduler-not-restored`, `optimizer-not-loaded` (DCP loads the model only), and
`latent-rng` (Python's `random`, saved and restored, then advanced by a draw that nothing after
the resume uses: a latent difference only, the run is still exact). `generator-not-saved` is a
bug of the save: give it to both launches; the others are bugs of the restore.

`--loss-log=PATH` appends each micro-batch's loss (`float.hex`) to `PATH.rank<R>`: with
`--save-at=3,4,5,6` in both launches, the losses and the checkpoints of steps 4-6 of a resumed
run compare bit for bit with the uninterrupted run's (how the correct resume was checked by
hand; the CPU RNG in the extra state differs, by the loader's base seed draw).
"""

import argparse
import math
import os
import random

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh

try:
    from torch.distributed.fsdp import fully_shard
except ImportError:  # torch < 2.6 keeps FSDP2 here
    from torch.distributed._composable.fsdp import fully_shard
from torch.utils.data import Dataset
from torch.utils.data.distributed import DistributedSampler
from torchdata.stateful_dataloader import StatefulDataLoader

BUGS = (
    "none",
    "generator-not-saved",
    "scheduler-not-restored",
    "optimizer-not-loaded",
    "latent-rng",
)
CHANNELS, PATCH, HIDDEN, TEXT_DIM, HEADS = 4, 2, 32, 16, 2
SAMPLES = 64
"""32 samples a rank, 2 a micro-batch, 2 micro-batches a step: an epoch is 8 steps."""
MICRO_BATCH, ACCUMULATION = 2, 2


class LatentDataset(Dataset):
    """Precomputed Wan latents and umT5 text embeddings, of different sizes per sample; one
    latent is corrupt (a NaN), as a real dataset's can be."""

    def __init__(self, corrupt: int = -1) -> None:
        self.corrupt = corrupt

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, index: int) -> dict:
        g = torch.Generator().manual_seed(index)
        frames, words = 1 + index % 3, 3 + index % 4
        latents = torch.randn(CHANNELS, frames, 4, 4, generator=g)
        if index == self.corrupt:
            latents[0, 0, 0, 0] = float("nan")
        return {"latents": latents, "text": torch.randn(words, TEXT_DIM, generator=g)}


class LatentCheck(torch.nn.Module):
    """Refuses a micro-batch with a corrupt latent: its forward raises, and the loop skips
    the micro-batch (the uninterrupted run meets one at step 1 on rank 0; the resumed run
    never does). A forward that raises must leave the recording of later steps whole."""

    def forward(self, latents: list) -> list:
        if any(torch.isnan(latent).any() for latent in latents):
            raise ValueError("a corrupt latent")
        return latents


def collate(samples: list) -> dict:
    """A dict of lists: the latents and the text embeddings stay one tensor per sample."""
    return {key: [sample[key] for sample in samples] for key in ("latents", "text")}


class FlowMatchCondition:
    """What VeOmni's Wan condition model does before the DiT: per sample, a timestep and the
    noise, drawn from a generator of its own, and the noised latent and flow target."""

    def __init__(self, seed: int) -> None:
        self.generator = torch.Generator().manual_seed(seed)

    def __call__(self, latents: list) -> tuple:
        noised, targets, timesteps = [], [], []
        for latent in latents:
            t = torch.sigmoid(torch.randn((), generator=self.generator))
            noise = torch.randn(latent.shape, generator=self.generator)
            noised.append((1 - t) * latent + t * noise)
            targets.append(noise - latent)
            timesteps.append(t)
        return noised, torch.stack(timesteps), targets


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm1 = torch.nn.LayerNorm(HIDDEN)
        self.qkv = torch.nn.Linear(HIDDEN, 3 * HIDDEN)
        self.norm2 = torch.nn.LayerNorm(HIDDEN)
        self.q = torch.nn.Linear(HIDDEN, HIDDEN)
        self.kv = torch.nn.Linear(HIDDEN, 2 * HIDDEN)
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(HIDDEN, 2 * HIDDEN),
            torch.nn.GELU(),
            torch.nn.Linear(2 * HIDDEN, HIDDEN),
        )
        self.modulation = torch.nn.Linear(HIDDEN, 2 * HIDDEN)

    def heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.unflatten(-1, (HEADS, -1)).transpose(0, 1)

    def forward(self, x: torch.Tensor, t: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        shift, scale = self.modulation(t).chunk(2, dim=-1)
        h = self.norm1(x) * (1 + scale) + shift
        q, k, v = (self.heads(p) for p in self.qkv(h).chunk(3, dim=-1))
        x = x + F.scaled_dot_product_attention(q, k, v).transpose(0, 1).flatten(-2)
        k, v = (self.heads(p) for p in self.kv(text).chunk(2, dim=-1))
        q = self.heads(self.q(self.norm2(x)))
        x = x + F.scaled_dot_product_attention(q, k, v).transpose(0, 1).flatten(-2)
        return x + self.mlp(x)


class TinyWanDiT(torch.nn.Module):
    """A Wan-like DiT: each latent patchified into its own token sequence, the timestep's
    sinusoidal embedding modulating every block, cross-attention to the sample's text."""

    def __init__(self) -> None:
        super().__init__()
        self.patch = torch.nn.Linear(CHANNELS * PATCH * PATCH, HIDDEN)
        self.time = torch.nn.Sequential(
            torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.SiLU(), torch.nn.Linear(HIDDEN, HIDDEN)
        )
        self.text = torch.nn.Linear(TEXT_DIM, HIDDEN)
        self.blocks = torch.nn.ModuleList(Block() for _ in range(2))
        self.out = torch.nn.Linear(HIDDEN, CHANNELS * PATCH * PATCH)

    def forward(self, latents: list, timesteps: torch.Tensor, text: list) -> list:
        half = HIDDEN // 2
        freqs = torch.exp(-math.log(10_000) * torch.arange(half) / half)
        angles = 1000 * timesteps[:, None] * freqs
        t_emb = self.time(torch.cat([angles.cos(), angles.sin()], dim=-1))
        outputs = []
        for latent, t, words in zip(latents, t_emb, text):
            c, f, h, w = latent.shape
            tokens = latent.reshape(c, f, h // PATCH, PATCH, w // PATCH, PATCH)
            tokens = tokens.permute(1, 2, 4, 0, 3, 5).reshape(-1, c * PATCH * PATCH)
            x, context = self.patch(tokens), self.text(words)
            for block in self.blocks:
                x = block(x, t, context)
            x = self.out(x).reshape(f, h // PATCH, w // PATCH, c, PATCH, PATCH)
            outputs.append(x.permute(3, 0, 1, 4, 2, 5).reshape(c, f, h, w))
        return outputs


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-steps", type=int, required=True)
    parser.add_argument("--save-at", default="")
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--resume-from", default=None)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--bug", choices=BUGS, default="none")
    parser.add_argument("--loss-log", default=None, help="append each micro-batch's loss here")
    args = parser.parse_args()
    save_at = {int(s) for s in args.save_at.split(",") if s}
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(args.seed)
    random.seed(args.seed)

    # the corrupt sample: rank 0's first of epoch 0, the same in every launch
    first = next(
        iter(DistributedSampler(range(SAMPLES), num_replicas=world, rank=0, seed=args.seed))
    )
    dataset = LatentDataset(corrupt=first)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, seed=args.seed)
    loader = StatefulDataLoader(
        dataset, batch_size=MICRO_BATCH, sampler=sampler, collate_fn=collate
    )
    model = TinyWanDiT()
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 10))
    condition = FlowMatchCondition(seed=args.seed + rank)
    check = LatentCheck()

    step, epoch = 0, 0
    if args.resume_from:
        if args.bug == "optimizer-not-loaded":
            state = {"model": get_model_state_dict(model)}
            dcp.load(state, checkpoint_id=args.resume_from)
            set_model_state_dict(model, state["model"])
        else:
            model_state, optim_state = get_state_dict(model, optimizer)
            state = {"model": model_state, "optimizer": optim_state}
            dcp.load(state, checkpoint_id=args.resume_from)
            set_state_dict(
                model,
                optimizer,
                model_state_dict=state["model"],
                optim_state_dict=state["optimizer"],
            )
        extra = torch.load(
            os.path.join(args.resume_from, "extra_state", f"extra_state_rank_{rank}.pt"),
            weights_only=True,
        )
        if "condition_generator" in extra:
            condition.generator.set_state(extra["condition_generator"])
        if args.bug != "scheduler-not-restored":
            scheduler.load_state_dict(extra["lr_scheduler"])
        loader.load_state_dict(extra["dataloader"])
        torch.set_rng_state(extra["cpu_rng"])
        random.setstate(extra["python_rng"])
        if args.bug == "latent-rng":
            random.random()  # a jitter for a retry, say: nothing after the resume draws again
        step, epoch = extra["global_step"], extra["epoch"]

    model.train()
    while step < args.max_steps:
        sampler.set_epoch(epoch)
        micro = 0
        for batch in loader:  # a resumed iterator starts where the saved one was
            try:
                latents = check(batch["latents"])
            except ValueError:
                continue  # skip the micro-batch
            noised, timesteps, targets = condition(latents)
            predictions = model(noised, timesteps, batch["text"])
            loss = torch.stack(
                [F.mse_loss(p, target) for p, target in zip(predictions, targets)]
            ).mean()
            (loss / ACCUMULATION).backward()
            micro += 1
            if args.loss_log:
                with open(f"{args.loss_log}.rank{rank}", "a") as log:
                    log.write(f"{step + 1} {micro} {loss.item().hex()}\n")
            if micro % ACCUMULATION:
                continue
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            step += 1
            if step in save_at:
                save(args, step, epoch, model, optimizer, scheduler, condition, loader, rank)
            if step == args.max_steps:
                break
        else:
            epoch += 1
    dist.destroy_process_group()


def save(args, step, epoch, model, optimizer, scheduler, condition, loader, rank) -> None:
    """VeOmni's layout: DCP shards of the model and the optimizer in the step's folder, and
    the rest in a file per rank under extra_state/."""
    folder = os.path.join(args.output_dir, "checkpoints", f"global_step_{step}")
    model_state, optim_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optimizer": optim_state}, checkpoint_id=folder)
    extra = {
        "global_step": step,
        "epoch": epoch,
        "lr_scheduler": scheduler.state_dict(),
        "dataloader": loader.state_dict(),
        "cpu_rng": torch.get_rng_state(),
        "python_rng": random.getstate(),
    }
    if args.bug != "generator-not-saved":
        extra["condition_generator"] = condition.generator.get_state()
    os.makedirs(os.path.join(folder, "extra_state"), exist_ok=True)
    torch.save(extra, os.path.join(folder, "extra_state", f"extra_state_rank_{rank}.pt"))
    dist.barrier()


if __name__ == "__main__":
    main()
