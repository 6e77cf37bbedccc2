"""A zero-edit trainer whose model is not given the samples: a shuffling DataLoader yields
them, and the loop adds noise to each batch before the forward (as a diffusion trainer noises
its latents). Its own save and resume, no plugin line (tests/e2e/test_zero_edits.py).

    python noised_train.py --max-steps=6 --save-at=3 --out=o
    python noised_train.py --max-steps=6 --out=o2 --resume-from=o/step_3

The resume is right: the shuffle comes from a generator of the loader's own, seeded per
epoch, and the resumed run skips the batches of the epoch the saved steps consumed; the noise
comes from torch's RNG, saved and restored. `--bug=skip-batch` skips one batch too many: the
model's inputs are then new at every resumed step (other samples, the same noise), and only
the batches the loader yielded say that the batch of step 4 was never consumed.
"""

import argparse
import itertools
import os

import torch

EPOCH = 8
"""Batches per epoch (32 samples, batches of 4): the split of the tests is mid-epoch."""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-steps", type=int, required=True)
    parser.add_argument("--save-at", default="")
    parser.add_argument("--out", required=True)
    parser.add_argument("--resume-from", default=None)
    parser.add_argument("--bug", choices=("none", "skip-batch"), default="none")
    args = parser.parse_args()
    save_at = {int(s) for s in args.save_at.split(",") if s}
    torch.manual_seed(0)
    x = torch.randn(32, 4)
    data = torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True))
    order = torch.Generator()
    loader = torch.utils.data.DataLoader(data, batch_size=4, shuffle=True, generator=order)
    model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    torch.manual_seed(100)
    step = 0
    if args.resume_from:
        state = torch.load(os.path.join(args.resume_from, "state.pt"), weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["rng"])
        step = state["step"]
    while step < args.max_steps:
        epoch, done = divmod(step, EPOCH)
        order.manual_seed(1234 + epoch)  # the epoch's shuffle, whenever its iterator starts
        skip = done + (1 if args.bug == "skip-batch" and args.resume_from and done else 0)
        for noised, target in itertools.islice(loader, skip, None):
            noised = noised + 0.1 * torch.randn_like(noised)  # the noise, added in the loop
            loss = torch.nn.functional.mse_loss(model(noised), target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            if step in save_at:
                folder = os.path.join(args.out, f"step_{step}")
                os.makedirs(folder, exist_ok=True)
                state = {
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "rng": torch.get_rng_state(),
                    "step": step,
                }
                torch.save(state, os.path.join(folder, "state.pt"))
            if step == args.max_steps:
                break
        args.bug = "none"  # a skip of the resumed epoch only


if __name__ == "__main__":
    main()
