"""What an equivalence launch (`@equivalent`, checks/equivalent.py) records beside the
automatic step (rank/auto.py), so that a difference between two configurations can be
explained, not only seen.

A gradient is not kept whole: a few numbers per step that round-off barely moves and a real
difference moves. The squared norm of this rank's gradients (its local shards under FSDP2),
summed in float64, is taken
- before and after each `backward()`: what the trainer did to the gradients between two
  backwards of a window shows (zeroed, scaled by a clipping);
- when the step's first optimizer steps: the gradient it steps with. The factor between the
  last backward's and this one is what a clipping did to it (the clip norm, however the
  trainer clips: `clip_grad_norm_`, `clip_grads_with_norm_` or by hand); each rank's own
  factor tells a clipping by the rank's shards from one by the whole gradient.
A micro-batch's token count is taken from its inputs where a loss can be a token mean: the
labels that are not -100, else a mask (an input named `*mask*`, or a floating or boolean
batch of 0s and 1s). Dropout: `off` makes every dropout an identity (masks drawn per
micro-batch cannot equal the big batch's), `on` keeps it; either way the calls that would
draw a mask are counted (`dropout`: masks drawn; `dropout_off`: calls made an identity).

Every value stays on its device until the step's line is written (one transfer)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any, Callable, Optional

from .fingerprint import hash_bytes, local_shard
from .inputs import SAMPLE_BITS, scalar_value
from .patches import Patches

NUMBERS = ("grad_before", "grad_after", "grad_stepped", "tokens")
"""The sketch's numbers per step, each a list in the order taken."""
COUNTS = ("dropout", "dropout_off")
"""The sketch's counts per step: dropout calls that drew a mask, and made an identity."""

DROPOUT_FUNCTIONS = (
    "dropout",
    "dropout1d",
    "dropout2d",
    "dropout3d",
    "alpha_dropout",
    "feature_alpha_dropout",
)
"""`torch.nn.functional`'s dropouts: the modules (`nn.Dropout`, ...) call them."""
ATTENTION = "scaled_dot_product_attention"
"""Attention's own dropout (`dropout_p`)."""
ATTENTION_AFTER_MASK = ("dropout_p", "is_causal", "scale", "enable_gqa")
"""`scaled_dot_product_attention`'s positional parameters after its first four."""


class Sketch:
    """The sketch of one rank's steps; `note(key, value)` files a value under the iteration
    under way (the step counter's)."""

    def __init__(
        self,
        note: Callable[[str, Any], None],
        optimizers: Callable[[], list],
        models: Callable[[], list] = lambda: [],
    ) -> None:
        self.note = note
        self.optimizers = optimizers
        self.models = models
        """The trained modules found so far: their parameters' names."""
        self.patches = Patches(__name__)

    def _grads(self) -> Iterator[tuple[str, Any, Any]]:
        """(place, parameter, gradient) of each parameter the optimizers found so far update
        that has a gradient, once each: its place in the optimizers names it where no model
        does (`optimizer0.group0.3`)."""
        seen: set[int] = set()
        for i, optimizer in enumerate(self.optimizers()):
            for j, group in enumerate(optimizer.param_groups):
                for k, param in enumerate(group["params"]):
                    if param.grad is not None and id(param) not in seen:
                        seen.add(id(param))
                        yield f"optimizer{i}.group{j}.{k}", param, param.grad

    def gradient(self) -> Any:
        """The squared norm of this rank's gradients (its local shards') of every parameter
        the optimizers found so far update (a 0-d float64 tensor on their device)."""
        torch = sys.modules["torch"]
        total = None
        for _, _, grad in self._grads():
            part = _squared_norm(local_shard(grad))
            total = part if total is None else total + part.to(total.device)
        return total if total is not None else torch.zeros((), dtype=torch.float64)

    def sharded(self) -> bool:
        """Whether a gradient is a sharded DTensor (the ranks' norms add up to the whole)."""
        return any(
            p.is_shard() for _, _, grad in self._grads() for p in getattr(grad, "placements", ())
        )

    def before_backward(self) -> None:
        self.note("grad_before", self.gradient())

    def after_backward(self) -> None:
        self.note("grad_after", self.gradient())

    def before_step(self) -> None:
        """The gradient the optimizer steps with: its squared norm, and each parameter's (by
        the name its model gives it), so a difference shows which tensors it is in."""
        per_tensor = self.per_tensor()
        total = None
        for value in per_tensor.values():
            total = value if total is None else total + value.to(total.device)
        torch = sys.modules["torch"]
        self.note(
            "grad_stepped", total if total is not None else torch.zeros((), dtype=torch.float64)
        )
        self.note("grad_tensors", per_tensor)
        if self.sharded():
            self.note("grad_sharded", True)

    def per_tensor(self) -> dict[str, Any]:
        """Each parameter's gradient's squared norm (its local shard's), float64, on its
        device: by its name in the model that holds it, else by its place in the optimizer."""
        names = {id(p): n for m in self.models() for n, p in m.named_parameters()}
        found: dict[str, Any] = {}
        for place, param, grad in self._grads():
            found.setdefault(names.get(id(param), place), _squared_norm(local_shard(grad)))
        return found

    def forward(self, given: list[tuple[str, Any]]) -> None:
        """A training forward's inputs: its token count and its samples' unpadded ids, where
        it has a mask."""
        count = token_count(given)
        if count is not None:
            self.note("tokens", count)
        ids = unpadded_ids(given)
        if ids is not None:
            self.note("samples", ids)

    def install_dropout(self, off: bool) -> None:
        """Count the dropout calls that draw a mask (training, p > 0); `off`: make them an
        identity."""
        import torch.nn.functional as F

        for name in DROPOUT_FUNCTIONS:
            original = getattr(F, name, None)
            if original is not None:
                self.patches.replace(F, name, self._dropout(original, off))
        original = getattr(F, ATTENTION, None)
        if original is not None:
            self.patches.replace(F, ATTENTION, self._attention(original, off))

    def _dropout(self, original: Callable, off: bool) -> Callable:
        def dropout(input: Any, p: float = 0.5, training: bool = True, inplace: bool = False):
            if not (training and p > 0):
                return original(input, p, training, inplace)
            if off:
                self.note("dropout_off", 1)
                return input
            self.note("dropout", 1)
            return original(input, p, training, inplace)

        return dropout

    def _attention(self, original: Callable, off: bool) -> Callable:
        def attention(*args: Any, **kwargs: Any) -> Any:
            # query, key, value, attn_mask, then these: by name from here on
            kwargs.update(zip(ATTENTION_AFTER_MASK, args[4:]))
            args = args[:4]
            if kwargs.get("dropout_p", 0.0) > 0:
                self.note("dropout_off" if off else "dropout", 1)
                if off:
                    kwargs["dropout_p"] = 0.0
            return original(*args, **kwargs)

        return attention

    def uninstall(self) -> None:
        self.patches.restore()


def _squared_norm(tensor: Any) -> Any:
    """A tensor's squared norm in float64 (one way for every sketch value, so two of them
    taken of the same tensors are equal)."""
    torch = sys.modules["torch"]
    norm = torch.linalg.vector_norm(tensor.detach(), dtype=torch.float64)
    return norm * norm


def token_count(given: list[tuple[str, Any]]) -> Any:
    """The tokens of a forward's batch a token-mean loss divides by: its labels that are not
    -100 (the ignore index), else the ones of a mask; -1 when the named mask is not 0s and
    1s; None with neither."""
    torch = sys.modules["torch"]
    given = [(where, t) for where, t in given if isinstance(t, torch.Tensor)]
    labels = [t for where, t in given if where.rsplit(".", 1)[-1] == "labels"]
    if labels and not labels[0].is_floating_point():
        return (labels[0] != -100).sum().to(torch.float64)
    for where, t in given:
        named = "mask" in where.rsplit(".", 1)[-1]
        batch_of_flags = t.dim() >= 2 and (t.is_floating_point() or t.dtype == torch.bool)
        if named or batch_of_flags:
            flags = ((t == 0) | (t == 1)).all()
            if named or bool(flags):  # an unnamed tensor counts only when it is flags
                count = t.to(torch.float64).sum()
                return torch.where(flags, count, torch.full_like(count, -1.0))
    return None


def pending(notes: list[dict[str, list[Any]]], defer: Callable[[Any], Any]) -> dict[str, Any]:
    """The sketch of the steps whose `notes` one line holds, its device values deferred to the
    line's one transfer (`defer`)."""
    numbers = {
        key: [defer(scalar_value(v)) for n in notes for v in n.get(key, [])] for key in NUMBERS
    }
    tensors = [found for n in notes[:1] for found in n.get("grad_tensors", [])[:1]]
    numbers["grad_tensors"] = {k: defer(scalar_value(v)) for t in tensors for k, v in t.items()}
    numbers["samples"] = [i for n in notes for ids in n.get("samples", []) for i in ids]
    return numbers


def written(held: dict[str, Any], notes: list[dict[str, list[Any]]]) -> dict[str, Any]:
    """The `auto` values of the sketch, once its device values are read: only what it has."""
    out = {key: value for key, value in held.items() if value}
    for key in COUNTS:
        calls = sum(len(n.get(key, [])) for n in notes)
        if calls:
            out[key] = calls
    if any(n.get("grad_sharded") for n in notes):
        out["grad_sharded"] = True
    return out


def unpadded_ids(given: list[tuple[str, Any]]) -> Optional[list[int]]:
    """Each sample's id from its tokens alone, where a forward's batch comes with a mask (an
    input named `*mask*` of shape (batch, length)): every (batch, length, ...) tensor's row
    taken at the mask's non-zeros, every other row whole; None without a mask. Padded to its
    micro-batch's longest member (dynamic padding), a sample's row changes with the batching;
    its tokens do not. Read on the host: an equivalence launch only."""
    torch = sys.modules["torch"]
    tensors = [(w, local_shard(t)) for w, t in given if isinstance(t, torch.Tensor) and t.dim()]
    mask = next((t for w, t in tensors if "mask" in w.rsplit(".", 1)[-1] and t.dim() == 2), None)
    if mask is None:
        return None
    keep = mask.detach().cpu() != 0
    rows, length = keep.shape
    batched = [(w, t.cpu()) for w, t in tensors if t.shape[0] == rows]
    ids = []
    for i in range(rows):
        parts = []
        for where, t in batched:
            row = t[i][keep[i]] if t.dim() >= 2 and t.shape[1] == length else t[i]
            raw = row.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
            parts.append(f"{where}:{row.dtype}{list(row.shape)}=".encode() + raw)
        ids.append(int(hash_bytes(b"|".join(parts))[:16], 16) >> (64 - SAMPLE_BITS))
    return ids
