"""Determinism of this box: two uninterrupted runs of the tiny trainer, bitwise equal or how
far apart (`compare/noise.py` measures it, as for a test's determinism control); the
preflight's settings that make a step nondeterministic, each with its fix
(`diagnose/preflight.py`); and whether a fresh process computes the first step as the same
process computes it again (kernel choice and autotuning happen per process)."""

from __future__ import annotations

from ..compare.noise import deviation, measure, size_words
from ..diagnose.preflight import KNOBS, findings
from ..signature import Signature, SignatureError, read_run
from .launches import REPEAT_STEPS, Ran
from .ranks import FIRST_STEP_KEYS
from .rows import FAIL, OK, WARN, Row

Run = dict[int, Signature]
NOISE_FIX = (
    "set what the preflight rows name; until then the plugin measures the noise and judges "
    "within it (noise='auto', docs/guides/accelerators.md), and the resume point stays exact"
)


def _row(check: str, status: str, seen: str, fix: str = "") -> Row:
    return Row("determinism", check, status, seen, fix)


def _read(ran: Ran) -> tuple[Run, str]:
    """The run's signatures, or why there are none."""
    result = ran.result
    if result is None:
        return {}, f"{ran.name} could not start: {ran.error}"
    if not result.ok:
        bad = [f"rank {r.rank}: {r.status} {r.detail}".strip() for r in result.ranks if not r.ok]
        return {}, f"{ran.name} {result.status}: {'; '.join(bad)}"
    try:
        return read_run(result.spec.run_dir, result.spec.world_size), ""
    except SignatureError as exc:
        return {}, f"{ran.name}: {exc}"


def rows(runs: list[Ran], device_kind: str) -> list[Row]:
    (first, why_a), (second, why_b) = _read(runs[0]), _read(runs[1])
    if why_a or why_b:
        return [
            _row(
                "two runs",
                FAIL,
                f"the tiny trainer did not run: {why_a or why_b}",
                "the rank's log above says why; the backend rows say whether the process "
                "group comes up",
            )
        ]
    return [
        _repeat_row(first, second, runs[1]),
        *_preflight_rows(first, second, device_kind),
        _first_step_row(first),
    ]


def _repeat_row(first: Run, second: Run, ran: Ran) -> Row:
    directory = ran.result.spec.run_dir if ran.result is not None else ""
    noise = measure(first, [second], 1, REPEAT_STEPS, "uninterrupted", [directory])
    ranks = len(first)
    if not noise.noisy and not noise.unjudgeable:
        return _row(
            "two runs",
            OK,
            f"two uninterrupted runs in fresh processes are bitwise equal over {REPEAT_STEPS} "
            f"steps on {ranks} ranks: verdicts here are exact, bit for bit",
        )
    if noise.unjudgeable:
        seen = f"two uninterrupted runs differ beyond numbers at {noise.unjudgeable[0]}"
    else:
        worst = sorted(noise.relative.items(), key=lambda kv: -kv[1])[:3]
        spread = ", ".join(f"{key} relative {value:.2g}" for key, value in worst)
        seen = f"two uninterrupted runs differ (largest spread: {spread})"
    return _row(
        "two runs", WARN, f"{seen}: verdicts here are judged within measured noise", NOISE_FIX
    )


def _preflight_rows(first: Run, second: Run, device_kind: str) -> list[Row]:
    recorded = {
        "run 1": first[0].preflight if 0 in first else None,
        "run 2": second[0].preflight if 0 in second else None,
    }
    found = findings(recorded, device_kind)
    if not found:
        return [
            _row(
                "preflight",
                OK,
                f"no setting that makes a step nondeterministic on {device_kind} "
                "(as the tiny trainer runs, with this box's defaults)",
            )
        ]
    out = []
    for finding in found:
        fix = KNOBS[finding.knob].fix
        seen = finding.text
        if seen.endswith(fix):
            seen = seen[: -len(fix)].rstrip(": ")
        out.append(_row(f"preflight {finding.knob}", WARN, seen, fix))
    return out


def _first_step_row(first: Run) -> Row:
    cold_key, warm_key = FIRST_STEP_KEYS
    apart = []
    for rank, sig in sorted(first.items()):
        values = sig.by_step().get(1, {})
        cold, warm = values.get(cold_key), values.get(warm_key)
        if cold is None or warm is None:
            return _row("first step", FAIL, f"rank {rank} recorded no first step", "")
        if deviation(cold, warm) != 0:
            apart.append(f"rank {rank}: {size_words(cold, warm) or 'differs'}")
    if apart:
        return _row(
            "first step",
            WARN,
            "a fresh process computes the first step's gradients differently from the same "
            f"process computing them again ({'; '.join(apart)}): kernel choice or "
            "autotuning per process, so a resumed process differs at rounding level",
            "torch.backends.cudnn.benchmark = False, no max_autotune, TRITON_CACHE_AUTOTUNING=1 "
            "with a shared TRITON_CACHE_DIR; noise='auto' measures two resumed processes",
        )
    return _row(
        "first step",
        OK,
        "a fresh process computes the first step as the same process computes it again",
    )
