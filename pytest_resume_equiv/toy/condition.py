"""A flow-matching condition model that owns its random streams, like real Wan trainers'.

It samples noise, timestep ids and the CFG drop from its own `torch.Generator` seeded with
`seed + dp_rank` at construction, and some noise from the device's default RNG: exactly the
streams a checkpoint forgets. `rng_state_dict()` / `load_rng_state_dict()` restore them.
"""

from __future__ import annotations

from typing import Any


class ToyFlowMatchingCondition:
    def __init__(
        self,
        seed: int,
        dp_rank: int = 0,
        device: Any = "cpu",
        num_timesteps: int = 1000,
        cfg_drop: float = 0.1,
    ) -> None:
        import torch

        self.device = torch.device(device)
        self.num_timesteps = num_timesteps
        self.cfg_drop = cfg_drop
        # On the CPU: generator states are device-independent, so runs compare across devices.
        self.generator = torch.Generator().manual_seed(seed + dp_rank)

    def sample(self, latents: Any, text: Any) -> dict[str, Any]:
        """Noise, timesteps, noisy input, velocity target and CFG-dropped text for a batch."""
        import torch

        batch = latents.shape[0]
        noise = torch.randn(latents.shape, generator=self.generator).to(self.device)
        timestep_ids = torch.randint(0, self.num_timesteps, (batch,), generator=self.generator)
        drop = torch.rand(batch, generator=self.generator) < self.cfg_drop
        # A little jitter from the device's default RNG (what torch.randn(device=...) uses).
        jitter = torch.randn(latents.shape, device=self.device) * 1e-3
        t = (
            (timestep_ids.to(torch.float32) / self.num_timesteps)
            .to(self.device)
            .view(-1, 1, 1, 1, 1)
        )
        noisy = (1 - t) * latents + t * (noise + jitter)
        text = torch.where(drop.to(self.device).view(-1, 1, 1), torch.zeros_like(text), text)
        return {
            "noisy": noisy,
            "target": noise - latents,
            "timestep_ids": timestep_ids.to(self.device),
            "noise": noise,
            "text": text,
            "cfg_drop": drop,
        }

    def rng_state_dict(self) -> dict[str, Any]:
        return {"generator": self.generator.get_state()}

    def load_rng_state_dict(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["generator"])
