"""A tiny diffusers `WanTransformer3DModel`: config, in-process build, and weights on disk."""

from __future__ import annotations

import json
import os
from typing import Any, Optional

WAN_INSTALL_HINT = "pip install 'pytest-resume-equiv[wan]'  (installs diffusers)"
ROPE_IMPL = "eager"
ATTENTION_BACKEND = "native"
PINS_FILE = "resume_equiv.json"
"""Written beside config.json in a materialized model dir: the pins the weights were made with."""

_DEFAULTS: dict[str, Any] = {
    "patch_size": (1, 2, 2),
    "num_attention_heads": 2,
    "attention_head_dim": 8,
    "in_channels": 4,
    "out_channels": 4,
    "text_dim": 16,
    "freq_dim": 16,
    "ffn_dim": 32,
    "num_layers": 2,
    "cross_attn_norm": True,
    "qk_norm": "rms_norm_across_heads",
    "eps": 1e-6,
    "rope_max_seq_len": 32,
}


class ToyWanConfigError(ValueError):
    """A toy Wan config asked for something the toy cannot honour; the message says why."""


def toy_wan_config(**overrides: Any) -> dict[str, Any]:
    """The tiny `WanTransformer3DModel` config, with `rope_impl` and `attention_backend`
    recorded beside the model's own keys (pinned: see `build_toy_wan`)."""
    config = {**_DEFAULTS, "rope_impl": ROPE_IMPL, "attention_backend": ATTENTION_BACKEND}
    config.update(overrides)
    _check_pins(config)
    return config


def _check_pins(config: dict[str, Any]) -> None:
    rope = config.get("rope_impl", ROPE_IMPL)
    if rope != ROPE_IMPL:
        raise ToyWanConfigError(
            f"toy Wan config: rope_impl={rope!r} is not supported; RoPE is pinned to 'eager' "
            "because fused RoPE kernels are not available on every device (CUDA, NPU, XPU, CPU) "
            "and are not bitwise reproducible across restarts, which a resume-equivalence "
            "test needs"
        )
    attention = config.get("attention_backend", ATTENTION_BACKEND)
    if attention != ATTENTION_BACKEND:
        raise ToyWanConfigError(
            f"toy Wan config: attention_backend={attention!r} is not supported; attention is "
            "pinned to PyTorch's native scaled_dot_product_attention path, which every device "
            "has (flash/xformers/NPU kernels are not on every machine)"
        )


def _model_kwargs(config: dict[str, Any]) -> dict[str, Any]:
    _check_pins(config)
    kwargs = {k: v for k, v in config.items() if k not in ("rope_impl", "attention_backend")}
    if "patch_size" in kwargs:
        kwargs["patch_size"] = tuple(kwargs["patch_size"])
    return kwargs


def _wan_class() -> Any:
    try:
        from diffusers import WanTransformer3DModel
    except ImportError as exc:
        raise ImportError(
            f"the toy Wan model needs diffusers: {WAN_INSTALL_HINT} ({exc})"
        ) from None
    return WanTransformer3DModel


def _pin_attention(model: Any) -> Any:
    setter = getattr(model, "set_attention_backend", None)
    if callable(setter):
        setter(ATTENTION_BACKEND)
    return model


def build_toy_wan(config: Optional[dict[str, Any]] = None, seed: int = 0, **overrides: Any) -> Any:
    """Build the toy model in-process, float32, weights from `seed`."""
    import torch

    config = toy_wan_config(**{**(config or {}), **overrides})
    cls = _wan_class()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = cls(**_model_kwargs(config))
    return _pin_attention(model)


def materialize_toy_wan(path: str, config: Optional[dict[str, Any]] = None, seed: int = 0) -> str:
    """Write the toy model where `WanTransformer3DModel.from_pretrained(path)` loads it."""
    config = toy_wan_config(**(config or {}))
    model = build_toy_wan(config, seed=seed)
    tmp = f"{path}.tmp-{os.getpid()}"
    model.save_pretrained(tmp, safe_serialization=True)
    with open(os.path.join(tmp, PINS_FILE), "w", encoding="utf-8") as f:
        json.dump({"rope_impl": ROPE_IMPL, "attention_backend": ATTENTION_BACKEND, "seed": seed}, f)
    os.replace(tmp, path)  # readers never see a half-written directory
    return path


def load_toy_wan(path: str) -> Any:
    """Load a materialized toy model, float32 as saved, with its pins applied.

    Reads config.json and the safetensors weights directly (never pickles), so it needs
    neither accelerate nor a hub; `WanTransformer3DModel.from_pretrained(path)` reads the
    same directory where accelerate is installed.
    """
    from safetensors.torch import load_file

    with open(os.path.join(path, PINS_FILE), encoding="utf-8") as f:
        _check_pins(json.load(f))
    cls = _wan_class()
    model = cls.from_config(cls.load_config(path))
    model.load_state_dict(load_file(os.path.join(path, "diffusion_pytorch_model.safetensors")))
    return _pin_attention(model)
