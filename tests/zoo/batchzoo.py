"""A plain torchrun trainer whose batching and parallelism are flags, with one switch per
configuration-equivalence bug of ../shared/BUGS.md (classes 34-43). No plugin line: what
`@equivalent` tests as it is.

    torchrun --nproc-per-node=1 batchzoo.py --steps 6 --global-batch 16 --out base
    torchrun --nproc-per-node=1 batchzoo.py --steps 6 --global-batch 16 --accum 4 --out acc4
    torchrun --nproc-per-node=2 batchzoo.py --steps 6 --global-batch 16 --accum 2 --out dp2
    torchrun --nproc-per-node=2 batchzoo.py --steps 6 --global-batch 16 --fsdp --out fsdp2

Shaped like the public examples (HF `*_no_trainer`, accelerate's gradient accumulation): a
DataLoader over a DistributedSampler, the global batch `--global-batch` split over the ranks
and `--accum` micro-batches (micro-batch = B / (world * accum)), AdamW, a warmup LR schedule
stepped once per optimizer step, gradient clipping by the whole gradient's norm, DDP (or FSDP2
`fully_shard` with `--fsdp`) with its gradient sync skipped inside the accumulation window.

The global batch of a step is the same set of samples on any world size and accumulation:
the DistributedSampler's permutation depends on its seed and epoch only; rank r takes the
permutation's positions r, r + W, r + 2W, ... (drop_last: the dataset's length is a multiple
of B, so of W) in batches of B / (W K), so the W K micro-batches of step s cover positions
[s B, (s + 1) B) of the epoch's permutation, whatever W and K. An epoch is 4 steps, so 6 steps
cross an epoch boundary (`set_epoch`). The loss of a step is the global batch's mean: per
sample (dense), or per token with `--seq` (the sum of the token losses over the tokens of the
whole global batch, counted over the window's micro-batches and all-reduced), never a mean
of means. The inputs are padded to a fixed length, so a sample's row is the same in any batch.

`--out DIR`: every rank writes one JSON line per optimizer step to DIR/rank{r}.jsonl: the
step, this rank's sample ids and its count of samples (tokens with --seq), `loss` (the global
batch's mean loss, computed aside), `loss_backward` (what the trainer backwarded, summed over
the micro-batches, averaged over the ranks), `grad_norm` (the whole gradient's norm right
before its last clipping: at the step, or at the last micro-batch with clip-per-micro),
`clip_norm` (the norm the clipping divided by: this rank's shards' with local-shard-clip),
`grad_norm_stepped` (after clipping), `lr` (the step's), the full parameters' norm and hash,
this rank's buffers' norm and hash. Rank 0 writes DIR/step{s}.pt with the full gradient the
optimizer stepped with, the full parameters and its buffers after the step (DIR/step0.pt: the
initial parameters).

`--clip` defaults to 0.7 (0.45 with --seq): it bites on some of the first 6 steps, not all.

`--bug NAME`: 34 no-accum-scale, 35 zero-grad-in-window, 36 sched-per-micro, 37
clip-per-micro, 38 token-mean-per-micro (with --seq), 39 world-scale, 40 same-data, 41
no-sync-bn (with --bn), 43 local-shard-clip (with --fsdp). `--dropout P` draws masks per
micro-batch and rank: not a bug, but another world size trains otherwise then (class 42; on
CPU, one rank's micro-batches draw the very masks of the whole batch, the generator being
sequential). BatchNorm with --accum differs by construction too: statistics per micro-batch.
`--compile BACKEND` compiles the model (DDP or FSDP2 included) with torch.compile: the same
training, its sums in another order.
"""

import argparse
import gc
import hashlib
import json
import math
import os
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_fn
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler

BUGS = {
    "none": None,
    "no-accum-scale": None,  # 34
    "zero-grad-in-window": None,  # 35
    "sched-per-micro": None,  # 36
    "clip-per-micro": None,  # 37
    "token-mean-per-micro": "seq",  # 38
    "world-scale": None,  # 39
    "same-data": None,  # 40
    "no-sync-bn": "bn",  # 41
    "local-shard-clip": "fsdp",  # 43
}
"""Each bug, and the flag it needs to mean anything."""
SEED = 1234
STEPS_PER_EPOCH = 4
FEATURES = 8
VOCAB = 32
SEQ_LEN = 16
"""Every sequence is padded to SEQ_LEN: a sample's row does not depend on its micro-batch."""


class Synthetic(Dataset):
    """Deterministic samples, a function of their index: no download, no global RNG."""

    def __init__(self, size: int, seq: bool) -> None:
        self.size = size
        self.seq = seq
        self.teacher = torch.randn(FEATURES, generator=torch.Generator().manual_seed(SEED))

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, idx: int) -> dict:
        gen = torch.Generator().manual_seed(SEED * 1009 + idx)
        if not self.seq:
            x = torch.randn(FEATURES, generator=gen)
            y = torch.sin(2 * x @ self.teacher) + 0.1 * x[0]
            return {"idx": idx, "x": x, "y": y.reshape(1)}
        length = int(torch.randint(2, SEQ_LEN + 1, (1,), generator=gen))
        tokens = torch.zeros(SEQ_LEN, dtype=torch.long)
        tokens[:length] = torch.randint(1, VOCAB, (length,), generator=gen)
        mask = torch.zeros(SEQ_LEN)
        mask[:length] = 1.0
        target = (3 * tokens + tokens[0]) % VOCAB
        return {"idx": idx, "tokens": tokens, "mask": mask, "target": target}


class SyncBatchNorm1d(nn.BatchNorm1d):
    """BatchNorm whose batch statistics are the global batch's across the ranks (what
    `nn.SyncBatchNorm` does, which runs on GPUs only): two differentiable all-reduces."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or not dist.is_initialized() or dist.get_world_size() == 1:
            return super().forward(x)
        count = dist_fn.all_reduce(torch.tensor([float(x.shape[0])]))
        mean = dist_fn.all_reduce(x.sum(0)) / count
        var = dist_fn.all_reduce(((x - mean) ** 2).sum(0)) / count
        with torch.no_grad():
            self.num_batches_tracked += 1
            unbiased = var * count / (count - 1)
            self.running_mean.mul_(1 - self.momentum).add_(self.momentum * mean)
            self.running_var.mul_(1 - self.momentum).add_(self.momentum * unbiased)
        return (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias


class DenseNet(nn.Module):
    def __init__(self, dropout: float, bn: bool, sync_bn: bool) -> None:
        super().__init__()
        self.inp = nn.Linear(FEATURES, 32, bias=not bn)  # a bias before BatchNorm: no gradient
        norm = SyncBatchNorm1d if sync_bn else nn.BatchNorm1d
        self.norm = norm(32) if bn else nn.Identity()
        self.hidden = nn.Sequential(nn.Tanh(), nn.Dropout(dropout), nn.Linear(32, 32), nn.Tanh())
        self.out = nn.Linear(32, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.hidden(self.norm(self.inp(x))))


class SeqNet(nn.Module):
    """Token embeddings, a masked mean-pooled context added to every token, a token MLP,
    logits per token."""

    def __init__(self, dropout: float) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 16)
        self.context = nn.Linear(16, 16)
        self.mlp = nn.Sequential(
            nn.Linear(16, 32), nn.GELU(), nn.Dropout(dropout), nn.Linear(32, 16)
        )
        self.head = nn.Linear(16, VOCAB)

    def forward(self, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens)
        pooled = (h * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
        h = h + self.context(pooled)[:, None, :]
        return self.head(h + self.mlp(h))


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, required=True, help="optimizer steps")
    p.add_argument("--global-batch", type=int, default=16)
    p.add_argument("--accum", type=int, default=1)
    p.add_argument("--seq", action="store_true", help="variable-length token sequences")
    p.add_argument("--bn", action="store_true", help="a BatchNorm layer (dense model)")
    p.add_argument("--fsdp", action="store_true", help="FSDP2 fully_shard instead of DDP")
    p.add_argument("--clip", type=float, default=None, help="max grad norm; 0: no clipping")
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument(
        "--compile", default="", help="torch.compile the model with this backend (inductor, ...)"
    )
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--bug", choices=sorted(BUGS), default="none")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    if args.clip is None:  # bites on some of the first 6 steps, not all, in either model
        args.clip = 0.45 if args.seq else 0.7
    need = BUGS[args.bug]
    if need and not getattr(args, need):
        p.error(f"--bug {args.bug} needs --{need}")
    if args.bn and args.seq:
        p.error("--bn is for the dense model")
    if args.bug == "no-accum-scale" and args.seq:
        p.error("--seq normalizes by the global batch's tokens: no division by --accum to forget")
    return args


def full(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a DTensor (a collective: every rank calls it), a tensor as it is."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def total_norm(tensors: list) -> torch.Tensor:
    norm = torch.nn.utils.get_total_norm(tensors)
    return full(norm)


def digest(tensors: dict) -> tuple[float, str]:
    h = hashlib.sha256()
    sq = 0.0
    for name, t in tensors.items():
        t = t.detach().contiguous()
        h.update(name.encode())
        h.update(t.numpy().tobytes())
        sq += float(t.double().pow(2).sum())
    return math.sqrt(sq), h.hexdigest()[:16]


def main() -> None:
    args = parse()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.global_batch % (world * args.accum):
        raise SystemExit(
            f"--global-batch {args.global_batch} is not a multiple of {world}x{args.accum}"
        )
    micro = args.global_batch // (world * args.accum)

    torch.manual_seed(SEED)  # the same initial weights on every rank
    sync_bn = args.bn and world > 1 and args.bug != "no-sync-bn"
    model = SeqNet(args.dropout) if args.seq else DenseNet(args.dropout, args.bn, sync_bn)
    if args.fsdp:
        from torch.distributed.device_mesh import init_device_mesh

        try:
            from torch.distributed.fsdp import fully_shard
        except ImportError:  # torch < 2.6 keeps FSDP2 here
            from torch.distributed._composable.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (world,))
        for child in model.children():
            if any(True for _ in child.parameters()):
                fully_shard(child, mesh=mesh)
        fully_shard(model, mesh=mesh)
        trained = model
    else:
        trained = nn.parallel.DistributedDataParallel(model)
    if args.compile:
        trained = torch.compile(trained, backend=args.compile)
    model.train()
    torch.manual_seed(SEED + 1 + rank)  # dropout: each rank its own masks

    dataset = Synthetic(args.global_batch * STEPS_PER_EPOCH, args.seq)
    sampler_rank = 0 if args.bug == "same-data" else rank
    sampler = DistributedSampler(
        dataset, num_replicas=world, rank=sampler_rank, shuffle=True, seed=SEED, drop_last=True
    )
    loader = DataLoader(dataset, batch_size=micro, sampler=sampler, drop_last=True)

    params = [p for p in model.parameters()]
    optimizer = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.01)

    def warmup_then_decay(step: int) -> float:
        if step < args.warmup:
            return (step + 1) / args.warmup
        return max(0.1, 1.0 - (step - args.warmup) / max(1, args.steps))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_then_decay)
    if args.out and rank == 0:
        os.makedirs(args.out, exist_ok=True)
    dist.barrier()
    initial = {n: full(p.detach()) for n, p in model.named_parameters()}
    if args.out and rank == 0:
        torch.save({"params": initial}, os.path.join(args.out, "step0.pt"))
    log = open(os.path.join(args.out, f"rank{rank}.jsonl"), "w") if args.out else None

    def sync_context(last: bool):
        """No gradient sync inside the accumulation window, one at its last micro-batch."""
        if args.fsdp:
            model.set_requires_gradient_sync(last)
            return nullcontext()
        return nullcontext() if last else trained.no_sync()

    def clip(max_norm: float) -> float:
        """Clip the gradients by their whole norm (of the full gradient, over the shards of
        every rank under FSDP2); the norm it clipped by."""
        grads = [p.grad for p in params if p.grad is not None]
        if args.bug == "local-shard-clip":  # the norm of this rank's shards only
            norm = torch.nn.utils.get_total_norm([g.to_local() for g in grads])
        else:
            norm = total_norm(grads)
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)
        return float(norm)

    step = 0
    epoch = 0
    while step < args.steps:
        sampler.set_epoch(epoch)
        batches = iter(loader)
        for _ in range(len(loader) // args.accum):
            if step == args.steps:
                break
            window = [next(batches) for _ in range(args.accum)]
            # what the global batch holds: samples, or tokens with --seq
            if args.seq:
                count = torch.tensor(float(sum(b["mask"].sum() for b in window)))
            else:
                count = torch.tensor(float(sum(len(b["idx"]) for b in window)))
            local_count = float(count)
            dist.all_reduce(count)
            loss_sum = torch.zeros((), dtype=torch.float64)
            backward_sum = torch.zeros((), dtype=torch.float64)
            for j, batch in enumerate(window):
                last = j == args.accum - 1
                if args.bug == "zero-grad-in-window":
                    optimizer.zero_grad()
                with sync_context(last):
                    if args.seq:
                        logits = trained(batch["tokens"], batch["mask"])
                        token_loss = nn.functional.cross_entropy(
                            logits.reshape(-1, VOCAB), batch["target"].reshape(-1), reduction="none"
                        ) * batch["mask"].reshape(-1)
                        summed = token_loss.sum()
                        if args.bug == "token-mean-per-micro":
                            loss = summed / batch["mask"].sum() / args.accum
                        else:  # the global batch's token mean; DDP/FSDP average over ranks
                            loss = summed * world / count
                    else:
                        per_sample = (trained(batch["x"]) - batch["y"]).pow(2).mean(1)
                        summed = per_sample.sum()
                        loss = per_sample.mean()
                        if args.bug != "no-accum-scale":
                            loss = loss / args.accum
                    if args.bug == "world-scale":
                        loss = loss * world
                    loss.backward()
                loss_sum += summed.detach().double()
                backward_sum += loss.detach().double()
                if args.bug == "clip-per-micro" and args.clip > 0:
                    grad_norm = float(total_norm([p.grad for p in params]))
                    clip_norm = clip(args.clip)
                if args.bug == "sched-per-micro":
                    scheduler.step()
            grads = [p.grad for p in params]
            if args.bug != "clip-per-micro" or args.clip == 0:
                grad_norm = float(total_norm(grads))
                clip_norm = clip(args.clip) if args.clip > 0 else None
            stepped_norm = float(total_norm(grads))
            lr = optimizer.param_groups[0]["lr"]
            optimizer.step()
            if args.bug != "sched-per-micro":
                scheduler.step()
            step += 1

            dist.all_reduce(loss_sum)
            dist.all_reduce(backward_sum)
            full_params = {n: full(p.detach()) for n, p in model.named_parameters()}
            buffers = {n: b.detach() for n, b in model.named_buffers()}
            if args.out and rank == 0:
                full_grads = {n: full(p.grad) for n, p in model.named_parameters()}
                torch.save(
                    {"grads": full_grads, "params": full_params, "buffers": buffers},
                    os.path.join(args.out, f"step{step}.pt"),
                )
            elif args.fsdp:  # full_tensor is a collective
                for p in model.parameters():
                    full(p.grad)
            optimizer.zero_grad()
            param_norm, param_hash = digest(full_params)
            buffer_norm, buffer_hash = digest(buffers)
            record = {
                "step": step,
                "rank": rank,
                "world": world,
                "accum": args.accum,
                "micro": micro,
                "samples": [int(i) for b in window for i in b["idx"]],
                "count": local_count,
                "loss": float(loss_sum) / float(count),
                "loss_backward": float(backward_sum) / world,
                "grad_norm": grad_norm,
                "clip_norm": clip_norm,
                "grad_norm_stepped": stepped_norm,
                "clipped": args.clip > 0 and grad_norm > args.clip,
                "lr": lr,
                "param_norm": param_norm,
                "param_hash": param_hash,
                "buffer_norm": buffer_norm,
                "buffer_hash": buffer_hash,
            }
            if log:
                log.write(json.dumps(record) + "\n")
                log.flush()
        epoch += 1
    if log:
        log.close()
    # Release DDP before the process group. Otherwise its Reducer holds the group's last
    # reference when main() returns, and ~ProcessGroupGloo joins gloo's worker threads with
    # the GIL held while a worker waits for the GIL to free its last work's tensors: a
    # deadlock at exit (torch 2.13, about one launch in four here).
    trained = None
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
