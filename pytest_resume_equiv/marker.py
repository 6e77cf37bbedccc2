"""The `@resume_equivalent(...)` marker: its keywords, each validated with a message that
names the keyword, the value and what is expected; only the marked test fails."""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable, Optional

from .compare.tolerance import Tolerance, parse_tolerance
from .errors import SettingError

INTERRUPTS = ("continue", "stop", "kill", "crash")
CRASH_POINTS = ("first", "middle", "last", "returned", "pointer", "torn", "step")
CRASH_REFUSAL = ("pass", "fail")
CRASH_MODES = ("kill", "power", "preempt")
CRASH_GRACE = 2.0
"""Seconds between the SIGTERM and the SIGKILL of crash_mode="preempt" by default: small,
for tests; clusters give 30 s (Slurm's KillWait, Kubernetes' terminationGracePeriodSeconds)."""
CRASH_SAVES = ("last", "all")
NOISE = ("auto", "measure", "off")


@dataclass(frozen=True)
class Configuration:
    """One way to run the same training: ranks per node, nodes, arguments appended to the
    command, environment merged over the marker's."""

    nproc: int
    nnodes: int = 1
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()

    def describe(self) -> str:
        world = f"{self.nproc} rank{'s' * (self.nproc != 1)}" + (
            f" x {self.nnodes} nodes" if self.nnodes > 1 else ""
        )
        args = f", args {' '.join(self.args)}" if self.args else ""
        env = f", env {dict(self.env)}" if self.env else ""
        return world + args + env


@dataclass(frozen=True)
class Configurations:
    """What one item of an equivalence test compares: the baseline and its variant."""

    baseline: Configuration
    name: str
    """The variant's name, the item's id (`test_x[dp2]`)."""
    variant: Configuration
    dropout: str = "off"
    """off: every dropout an identity in both launches; on: kept (rank/sketch.py)."""


@dataclass(frozen=True)
class MarkerSpec:
    steps: int
    splits: tuple[int, ...]
    nproc: int = 2
    nnodes: int = 1
    timeout: Optional[float] = None
    tolerance: Optional[Tolerance] = None
    """None: not given on the marker (the session option decides)."""
    env: tuple[tuple[str, str], ...] = ()
    rng_mutation: Optional[bool] = None
    """None: not given on the marker (the session option decides)."""
    interrupt: str = "continue"
    ignore: tuple[str, ...] = ()
    """Patterns of audited keys or fields to leave out of the comparison (listed as ignored)."""
    resume_nproc: Optional[int] = None
    """The resumed launches' ranks per node (None: nproc): a resume on another topology."""
    resume_nnodes: Optional[int] = None
    chain: bool = False
    """Each resumed launch saves at the next split, and the next one resumes from it."""
    noise: Optional[str] = None
    """auto | measure | off; None: not given on the marker (the session option decides)."""
    golden_checkpoint: bool = False
    """With a golden store: keep the checkpoint of each split in the golden too, and resume
    the current code from it (the compatibility check)."""
    crash_points: Any = None
    """interrupt="crash": None (first, middle, last, returned, pointer, torn), "all" (every
    event of the save, returned, and inside every file's write), an int N (N of "all"'s
    points, sampled by `--resume-equiv-crash-seed`), or a tuple of those names and event
    indexes."""
    crash_refusal: str = "pass"
    """interrupt="crash": whether a clean refusal of a torn checkpoint passes or fails."""
    crash_saves: str = "last"
    """interrupt="crash": which saves are crashed: "last" (the last split's) or "all" (every
    split's, each with its own table)."""
    crash_mode: tuple[str, ...] = ("kill",)
    """interrupt="crash": how each point ends the run: "kill" (every rank of the host
    SIGKILLed), "power" (killed, then every write not yet fsynced rolled back), "preempt"
    (SIGTERM, then SIGKILL for what still runs after `crash_grace`), or several."""
    crash_grace: float = CRASH_GRACE
    """crash_mode="preempt": seconds the ranks get between the SIGTERM and the SIGKILL."""
    auto: Optional[bool] = None
    """Automatic recording (False: only the trainer's explicit calls are recorded); None:
    not given on the marker (the session option decides)."""
    configurations: Optional[Configurations] = None
    """An equivalence test (`@equivalent`): the baseline and the variant its item compares;
    no splits then."""

    @property
    def world_size(self) -> int:
        return self.nproc * self.nnodes

    @property
    def resumed_nproc(self) -> int:
        return self.resume_nproc or self.nproc

    @property
    def resumed_nnodes(self) -> int:
        return self.resume_nnodes or self.nnodes

    @property
    def resumed_world_size(self) -> int:
        return self.resumed_nproc * self.resumed_nnodes

    @property
    def topology_changes(self) -> bool:
        return (self.resumed_nproc, self.resumed_nnodes) != (self.nproc, self.nnodes)


def parse_timeout(raw: Any) -> float:
    if isinstance(raw, bool):
        raise ValueError("expected a positive number of seconds")
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise ValueError("expected a positive number of seconds") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError("expected a positive number of seconds")
    return value


def _error(keyword: str, value: Any, why: str) -> SettingError:
    return SettingError(f"@resume_equivalent: invalid {keyword}={value!r}: {why}")


def _int(keyword: str, minimum: int) -> Callable[[Any], int]:
    def parse(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _error(keyword, value, f"must be an int >= {minimum}")
        if value < minimum:
            raise _error(keyword, value, f"must be >= {minimum}")
        return value

    return parse


def _tolerance(value: Any) -> Optional[Tolerance]:
    if value is None:
        return None
    try:
        return parse_tolerance(value)
    except ValueError as exc:
        raise _error("tolerance", value, str(exc)) from None


def _noise(value: Any) -> Optional[str]:
    if value is not None and value not in NOISE:
        raise _error("noise", value, f"supported: {', '.join(map(repr, NOISE))}")
    return value


def _env(value: Any) -> tuple[tuple[str, str], ...]:
    if value is None:
        return ()
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and k and isinstance(v, str) for k, v in value.items()
    ):
        raise _error("env", value, 'expected a dict of str to str, e.g. {"OMP_NUM_THREADS": "1"}')
    return tuple(sorted(value.items()))


def _timeout(value: Any) -> Optional[float]:
    if value is None:
        return None
    try:
        return parse_timeout(value)
    except ValueError as exc:
        raise _error("timeout", value, str(exc)) from None


def _rng_mutation(value: Any) -> Optional[bool]:
    if value is not None and not isinstance(value, bool):
        raise _error("rng_mutation", value, "must be True or False")
    return value


def _auto(value: Any) -> Optional[bool]:
    if value is not None and not isinstance(value, bool):
        raise _error(
            "auto",
            value,
            "must be True (record every optimizer step) or False (explicit calls only)",
        )
    return value


def _interrupt(value: Any) -> str:
    if value not in INTERRUPTS:
        raise _error("interrupt", value, f"supported: {', '.join(map(repr, INTERRUPTS))}")
    return value


def _ignore(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not all(isinstance(x, str) and x for x in items):
        raise _error(
            "ignore",
            value,
            "expected a list of patterns of audited keys or fields, e.g. "
            '["rng:generator eval.py:*", "watch:loader.state.dataset_state*"]',
        )
    return tuple(items)


def _chain(value: Any) -> bool:
    if not isinstance(value, bool):
        raise _error("chain", value, "must be True or False")
    return value


def _golden_checkpoint(value: Any) -> bool:
    if not isinstance(value, bool):
        raise _error("golden_checkpoint", value, "must be True or False")
    return value


def _crash_points(value: Any) -> Any:
    if value is None or value == "all":
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 1:
            raise _error("crash_points", value, "a number of sampled points must be >= 1")
        return value  # N points sampled from "all"; a list of ints names event indexes
    items = [value] if isinstance(value, (str, int)) else value
    ok = isinstance(items, (list, tuple)) and items
    for item in items if ok else ():
        if isinstance(item, bool) or not (
            item in CRASH_POINTS or (isinstance(item, int) and item >= 0)
        ):
            ok = False
    if not ok:
        raise _error(
            "crash_points",
            value,
            f'expected "all", a number of points to sample (an int >= 1), or a list of '
            f"{', '.join(map(repr, CRASH_POINTS))} and event indexes (ints >= 0)",
        )
    return tuple(items)


def _crash_refusal(value: Any) -> str:
    if value not in CRASH_REFUSAL:
        raise _error("crash_refusal", value, f"supported: {', '.join(map(repr, CRASH_REFUSAL))}")
    return value


def _crash_saves(value: Any) -> str:
    if value not in CRASH_SAVES:
        raise _error("crash_saves", value, f"supported: {', '.join(map(repr, CRASH_SAVES))}")
    return value


def _crash_mode(value: Any) -> tuple[str, ...]:
    items = [value] if isinstance(value, str) else value
    ok = isinstance(items, (list, tuple)) and items and all(i in CRASH_MODES for i in items)
    if not ok or len(set(items)) < len(items):
        raise _error(
            "crash_mode",
            value,
            f"expected one of {', '.join(map(repr, CRASH_MODES))}, or a list of them",
        )
    return tuple(m for m in CRASH_MODES if m in items)


def _crash_grace(value: Any) -> float:
    try:
        return parse_timeout(value)
    except ValueError:
        raise _error(
            "crash_grace",
            value,
            "expected a positive number of seconds between the SIGTERM and the SIGKILL "
            "(clusters give 30: Slurm's KillWait, Kubernetes' terminationGracePeriodSeconds)",
        ) from None


def _optional_int(keyword: str) -> Callable[[Any], Optional[int]]:
    parse = _int(keyword, 1)
    return lambda value: None if value is None else parse(value)


KEYWORDS: dict[str, Callable[[Any], Any]] = {
    "nproc": _int("nproc", 1),
    "nnodes": _int("nnodes", 1),
    "timeout": _timeout,
    "tolerance": _tolerance,
    "env": _env,
    "rng_mutation": _rng_mutation,
    "interrupt": _interrupt,
    "ignore": _ignore,
    "resume_nproc": _optional_int("resume_nproc"),
    "resume_nnodes": _optional_int("resume_nnodes"),
    "chain": _chain,
    "noise": _noise,
    "golden_checkpoint": _golden_checkpoint,
    "crash_points": _crash_points,
    "crash_refusal": _crash_refusal,
    "crash_saves": _crash_saves,
    "crash_mode": _crash_mode,
    "crash_grace": _crash_grace,
    "auto": _auto,
}
"""Every keyword beside steps and split, with its validator."""
MARKER_KEYWORDS = ("steps", "split", *KEYWORDS)
CRASH_KEYWORDS = tuple(k for k in KEYWORDS if k.startswith("crash_"))
"""The keywords that apply to interrupt="crash" only."""


def _splits(raw: Any, steps: int) -> tuple[int, ...]:
    splits = list(raw) if isinstance(raw, (list, tuple)) else [raw]
    if not splits:
        raise _error("split", raw, "needs at least one step")
    for s in splits:
        if isinstance(s, bool) or not isinstance(s, int) or not 1 <= s < steps:
            raise _error(
                "split", raw, f"every split must be an int with 1 <= split < steps={steps}"
            )
    if len(set(splits)) != len(splits):
        raise _error("split", raw, "splits must be distinct")
    return tuple(sorted(splits))


def _arguments(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """Positional and keyword arguments as one dict, or a SettingError saying what is wrong."""
    unknown = [k for k in kwargs if k not in MARKER_KEYWORDS]
    if unknown:
        key = unknown[0]
        close = difflib.get_close_matches(key, MARKER_KEYWORDS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise SettingError(
            f"@resume_equivalent: unknown keyword {key!r}{hint}; valid keywords: "
            + ", ".join(MARKER_KEYWORDS)
        )
    if len(args) > 2:
        raise SettingError(
            "@resume_equivalent takes at most 2 positional arguments (steps, split), "
            f"got {len(args)}"
        )
    merged = dict(zip(("steps", "split"), args))
    for key in merged:
        if key in kwargs:
            raise SettingError(
                f"@resume_equivalent: {key} given both positionally and as a keyword"
            )
    merged.update(kwargs)
    for required in ("steps", "split"):
        if required not in merged:
            raise SettingError(
                f"@resume_equivalent needs {required}=..., e.g. @resume_equivalent(steps=6, split=3)"
            )
    return merged


def parse_marker(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> MarkerSpec:
    """Validate the marker's arguments; raises SettingError naming the keyword and value."""
    merged = _arguments(args, kwargs)
    steps = _int("steps", 2)(merged["steps"])
    values = {k: parse(merged[k]) for k, parse in KEYWORDS.items() if k in merged}
    spec = MarkerSpec(steps=steps, splits=_splits(merged["split"], steps), **values)
    if spec.chain and len(spec.splits) < 2:
        raise _error("chain", True, "a chain needs several splits, e.g. split=[2, 4]")
    if spec.chain and (spec.topology_changes or spec.interrupt != "continue"):
        raise SettingError(
            "@resume_equivalent: chain=True goes with the uninterrupted topology and "
            'interrupt="continue" (drop resume_nproc/resume_nnodes/interrupt, or chain)'
        )
    crash_only = [k for k in CRASH_KEYWORDS if k in merged]
    if crash_only and spec.interrupt != "crash":
        raise SettingError(
            f'@resume_equivalent: {crash_only[0]}= applies to interrupt="crash" only '
            f"(interrupt={spec.interrupt!r})"
        )
    if "crash_grace" in merged and "preempt" not in spec.crash_mode:
        raise _error(
            "crash_grace",
            merged["crash_grace"],
            f'applies to crash_mode="preempt" only (crash_mode={list(spec.crash_mode)!r})',
        )
    if spec.interrupt == "crash" and spec.topology_changes:
        raise SettingError(
            '@resume_equivalent: interrupt="crash" resumes on the topology that crashed '
            "(drop resume_nproc/resume_nnodes)"
        )
    return spec
