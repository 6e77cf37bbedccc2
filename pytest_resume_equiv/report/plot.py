"""A picture of a failed verdict. A resume: each recorded scalar, uninterrupted against
resumed, with the split marked. An equivalence test: both configurations' trajectories (the
step's loss over the global batch, the parameters' norm), the first difference marked. Needs
matplotlib (the `plot` extra); without it there is simply no picture."""

from __future__ import annotations

import math
import os
import re
from typing import Any, Optional

from ..checks import Verdict
from ..compare.configurations import ConfigurationFacts
from ..rank.encode import decode_float
from ..rank.layout import AUTO, WATCH, audit_key, is_audit_key, section_of, watched
from ..signature import Signature, scalar

MAX_SERIES = 6
Run = dict[int, Signature]


def plot_verdict(verdict: Verdict, directory: str) -> Optional[str]:
    """The figure of a failed verdict, saved in `directory`: `plot-splitN.png` for a resume,
    `plot-<variant launch>.png` for an equivalence test's variant; None when there is none
    (no matplotlib, nothing to draw, or the verdict holds)."""
    if verdict.signatures is None:
        return None
    reference, judged = verdict.signatures
    found = next((f for f in verdict.facts if isinstance(f, ConfigurationFacts)), None)
    if verdict.comparison is None and found is not None:  # an equivalence test's variant
        if not verdict.failed:
            return None
        path = os.path.join(directory, f"plot-{_file_name(verdict.launch or 'variant')}.png")
        first = found.differences[0].step if found.differences else None
        return plot_configurations(reference, judged, path, first, verdict.label)
    if verdict.equal or verdict.comparison is None:
        return None
    div = verdict.comparison.divergence
    rank = div.rank if div is not None else 0
    path = os.path.join(directory, f"plot-split{verdict.split}.png")
    return plot_split(reference, judged, verdict.comparison.split, rank, path)


def _file_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


LOSS = "loss (the global batch's mean)"
PARAMS = "parameter norm (every watched parameter)"
LOSS_KEY = audit_key(AUTO, "loss")


def trajectory(run: Run) -> dict[str, dict[int, float]]:
    """A run's trajectory over the global batch, per optimizer step: the loss (the losses
    given to `backward()` in the step, summed over its micro-batches, averaged over the
    ranks) and the norm of every watched parameter together (a sharded parameter's shards
    combined, a replicated one read once), as the equivalence check reads them."""
    losses: dict[int, list[float]] = {}
    tensors: dict[int, dict[str, list[dict]]] = {}
    for rank in sorted(run):
        for step, values in run[rank].steps:
            loss = values.get(LOSS_KEY)
            if isinstance(loss, list):
                numbers = [scalar(v) for v in loss]
                losses.setdefault(step, []).append(sum(n for n in numbers if n is not None))
            for name, stats in _params(values).items():
                tensors.setdefault(step, {}).setdefault(name, []).append(stats)
    params = {}
    for step, by_name in tensors.items():
        squares = [_squared_norm(per_rank) for per_rank in by_name.values()]
        if squares and None not in squares:
            params[step] = math.sqrt(sum(x for x in squares if x is not None))
    return {LOSS: {s: sum(v) / len(v) for s, v in losses.items()}, PARAMS: params}


def _params(values: dict[str, Any]) -> dict[str, dict]:
    """One rank's statistics of each parameter of the watched objects that are no
    optimizer."""
    optimizers = {watched(k)[0] for k in values if section_of(k) == WATCH and k.endswith(".lr")}
    found = {}
    for key, value in values.items():
        obj, part = watched(key)
        if part == "params" and obj not in optimizers and isinstance(value, dict):
            found.update({f"{obj}.{n}": t for n, t in value.items() if isinstance(t, dict)})
    return found


def _squared_norm(per_rank: list[dict]) -> Optional[float]:
    """A parameter's squared norm over the whole of it: one rank's where every rank holds the
    same (replicated), else the shards' squares summed (sharded)."""
    norms = [decode_float(t.get("norm")) for t in per_rank]
    if any(n is None for n in norms):
        return None
    if all(t == per_rank[0] for t in per_rank):
        norms = norms[:1]
    return sum(n * n for n in norms if n is not None)


def plot_configurations(
    baseline: Run, variant: Run, path: str, first: Optional[int] = None, label: str = "variant"
) -> Optional[str]:
    """Save both configurations' trajectories (`trajectory`), the variant dashed over the
    baseline, the first step that differs marked; returns the path, or None without
    matplotlib or without anything to draw."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    runs = (("baseline", "-o", trajectory(baseline)), (label, "--x", trajectory(variant)))
    series = [key for key in (LOSS, PARAMS) if any(t[key] for _, _, t in runs)]
    if not series:
        return None
    fig, axes = plt.subplots(len(series), 1, figsize=(7, 2.4 * len(series)), squeeze=False)
    for ax, key in zip(axes[:, 0], series):
        for name, style, found in runs:
            if found[key]:
                ax.plot(*zip(*sorted(found[key].items())), style, label=name, markersize=4)
        if first is not None:
            ax.axvline(first, color="grey", linestyle=":", label=f"first difference (step {first})")
        ax.set_title(key, fontsize=9)
        ax.legend(fontsize=7)
    axes[-1, 0].set_xlabel("optimizer step")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def plot_split(
    base: dict[int, Signature], resumed: dict[int, Signature], split: int, rank: int, path: str
) -> Optional[str]:
    """Save the figure for one split and rank; returns the path, or None without matplotlib or
    without any scalar series."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    if rank not in base or rank not in resumed:
        return None
    base_steps, res_steps = base[rank].by_step(), resumed[rank].by_step()
    keys = []
    for values in base_steps.values():
        for key, value in values.items():
            if not is_audit_key(key) and key not in keys and scalar(value) is not None:
                keys.append(key)
    keys = keys[:MAX_SERIES]
    if not keys:
        return None
    fig, axes = plt.subplots(len(keys), 1, figsize=(7, 2.2 * len(keys)), squeeze=False)
    for ax, key in zip(axes[:, 0], keys):
        for steps, label, style in (
            (base_steps, "uninterrupted", "-o"),
            (res_steps, "resumed", "--x"),
        ):
            points = sorted((s, scalar(v.get(key))) for s, v in steps.items() if key in v)
            points = [(s, y) for s, y in points if y is not None]
            if points:
                ax.plot(*zip(*points), style, label=label, markersize=4)
        ax.axvline(split + 0.5, color="grey", linestyle=":", label=f"resumed after step {split}")
        ax.set_title(f"{key} (rank {rank})", fontsize=9)
        ax.legend(fontsize=7)
    axes[-1, 0].set_xlabel("step")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path
