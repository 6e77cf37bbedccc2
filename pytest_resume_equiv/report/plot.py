"""A picture of a failed verdict. A resume: each recorded scalar, uninterrupted against
resumed, with the split marked. An equivalence test: both configurations' trajectories (the
step's loss over the global batch, the parameters' norm), the first difference marked. Needs
matplotlib (the `plot` extra); without it there is simply no picture."""

from __future__ import annotations

import functools
import importlib.util
import math
import os
import re
from typing import Any, Optional

from ..checks import Verdict
from ..compare.configurations import ConfigurationFacts
from ..rank.encode import decode_float
from ..rank.layout import AUTO, WATCH, audit_key, is_audit_key, section_of, watched
from ..signature import Signature, scalar
from .picture import Line, Panel, Picture

MAX_SERIES = 6
Run = dict[int, Signature]


def picture_of(verdict: Verdict, directory: str) -> Optional[Picture]:
    """What the figure of a failed verdict shows and where it goes, `plot-splitN.png` for a
    resume, `plot-<variant launch>.png` for an equivalence test's variant; None when there is
    none (no matplotlib, nothing to draw, or the verdict holds). Reading the signatures is
    cheap; the drawing (`draw`) is what costs, and may come later."""
    if verdict.signatures is None or not can_draw():
        return None
    reference, judged = verdict.signatures
    found = next((f for f in verdict.facts if isinstance(f, ConfigurationFacts)), None)
    if verdict.comparison is None and found is not None:  # an equivalence test's variant
        if not verdict.failed:
            return None
        path = os.path.join(directory, f"plot-{_file_name(verdict.launch or 'variant')}.png")
        first = found.differences[0].step if found.differences else None
        return configurations_picture(reference, judged, path, first, verdict.label)
    if verdict.equal or verdict.comparison is None:
        return None
    div = verdict.comparison.divergence
    rank = div.rank if div is not None else 0
    path = os.path.join(directory, f"plot-split{verdict.split}.png")
    return split_picture(reference, judged, verdict.comparison.split, rank, path)


@functools.cache
def can_draw() -> bool:
    """matplotlib is installed (the `plot` extra), found without importing it."""
    try:
        return importlib.util.find_spec("matplotlib") is not None
    except ValueError:  # sys.modules["matplotlib"] is None: blocked on purpose
        return False


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
            loss = _step_value(values, LOSS_KEY)
            if loss is not None:  # a rank with no `backward()` in the step says nothing
                losses.setdefault(step, []).append(loss)
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


def configurations_picture(
    baseline: Run, variant: Run, path: str, first: Optional[int] = None, label: str = "variant"
) -> Optional[Picture]:
    """Both configurations' trajectories (`trajectory`), the variant dashed over the
    baseline, the first step that differs marked; None without anything to draw."""
    runs = (("baseline", "-o", trajectory(baseline)), (label, "--x", trajectory(variant)))
    mark = (first, f"first difference (step {first})") if first is not None else None
    panels = tuple(
        Panel(
            key,
            tuple(
                Line(tuple(sorted(t[key].items())), style, name)
                for name, style, t in runs
                if t[key]
            ),
            mark,
        )
        for key in (LOSS, PARAMS)
        if any(t[key] for _, _, t in runs)
    )
    return Picture(path, panels, "optimizer step", 2.4) if panels else None


def split_picture(
    base: dict[int, Signature], resumed: dict[int, Signature], split: int, rank: int, path: str
) -> Optional[Picture]:
    """One split and rank: each recorded scalar (the first MAX_SERIES), then the loss given to
    `backward()` as recorded automatically (a trainer with no `record` call has only that),
    uninterrupted against resumed, the split marked; None without any series."""
    if rank not in base or rank not in resumed:
        return None
    base_steps, res_steps = base[rank].by_step(), resumed[rank].by_step()
    keys: list[str] = []
    for values in base_steps.values():
        for key, value in values.items():
            if not is_audit_key(key) and key not in keys and scalar(value) is not None:
                keys.append(key)
    if any(_step_value(values, LOSS_KEY) is not None for values in base_steps.values()):
        keys.append(LOSS_KEY)
    panels = []
    for key in keys[:MAX_SERIES]:
        lines = []
        for steps, label, style in (
            (base_steps, "uninterrupted", "-o"),
            (res_steps, "resumed", "--x"),
        ):
            points = sorted((s, _step_value(v, key)) for s, v in steps.items() if key in v)
            points = [(s, y) for s, y in points if y is not None]
            if points:
                lines.append(Line(tuple(points), style, label))
        mark = (split + 0.5, f"resumed after step {split}")
        title = AUTO_LOSS if key == LOSS_KEY else key
        panels.append(Panel(f"{title} (rank {rank})", tuple(lines), mark))
    return Picture(path, tuple(panels), "step", 2.2) if panels else None


AUTO_LOSS = "loss given to backward() in the step, summed (recorded automatically)"


def _step_value(values: dict[str, Any], key: str) -> Optional[float]:
    """A step's value of `key` as one number: the automatic loss is a list (one per
    `backward()` of the step), summed; a recorded scalar is itself."""
    value = values.get(key)
    if key != LOSS_KEY:
        return scalar(value)
    if not isinstance(value, list):
        return None
    numbers = [n for n in (scalar(v) for v in value) if n is not None]
    return sum(numbers) if numbers else None
