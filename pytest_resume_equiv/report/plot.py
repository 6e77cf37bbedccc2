"""A picture of a failed resume: each recorded scalar, uninterrupted against resumed, with the
split marked. Needs matplotlib (the `plot` extra); without it there is simply no picture."""

from __future__ import annotations

from typing import Optional

from ..rank.layout import is_audit_key
from ..signature import Signature, scalar

MAX_SERIES = 6


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
