"""The one place where options and markers are resolved and validated.

Precedence, lowest to highest: default < ini < environment (`PYTEST_RESUME_EQUIV_*`) <
command line < marker. Each resolved value remembers where it came from, so an error can
say "invalid timeout 'abc' from environment variable PYTEST_RESUME_EQUIV_TIMEOUT".
`resolve_session` does the session's layers once; `resolve_test` lays a test's marker over
them and returns the settings that test runs with.
"""

from __future__ import annotations

import difflib
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable, Optional

DEVICES = ("auto", "cpu", "cuda", "npu", "xpu")
KEEP = ("failed", "all", "none")
INTERRUPTS = ("continue", "stop", "kill")


class SettingError(ValueError):
    """A bad option value; the message names the value, its source and the valid choices."""


@dataclass(frozen=True)
class Option:
    name: str
    help: str
    default: Any
    parse: Callable[[Any], Any]
    choices: Optional[tuple[str, ...]] = None
    flag: bool = False

    @property
    def cli(self) -> str:
        return f"--resume-equiv-{self.name.replace('_', '-')}"

    @property
    def ini(self) -> str:
        return f"resume_equiv_{self.name}"

    @property
    def dest(self) -> str:
        return self.ini

    @property
    def env(self) -> str:
        return f"PYTEST_RESUME_EQUIV_{self.name.upper()}"


def _choice(choices: tuple[str, ...]) -> Callable[[Any], str]:
    def parse(raw: Any) -> str:
        value = str(raw).strip().lower()
        if value not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}")
        return value

    return parse


def parse_bool(raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    value = str(raw).strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise ValueError("expected true/false (1/0, yes/no, on/off)")


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


def parse_report(raw: Any) -> Optional[str]:
    value = str(raw).strip()
    if not value:
        raise ValueError("expected a file path for the JSON report")
    return value


OPTIONS: dict[str, Option] = {
    opt.name: opt
    for opt in (
        Option(
            "device",
            "where ranks run: auto (first accelerator found: cuda, npu, xpu; skip if none), "
            "cpu (gloo), cuda, npu or xpu",
            "auto",
            _choice(DEVICES),
            choices=DEVICES,
        ),
        Option(
            "require_device",
            "fail, instead of skipping, when the requested device is missing or too few",
            False,
            parse_bool,
            flag=True,
        ),
        Option(
            "timeout",
            "seconds one torchrun launch may take before it is killed",
            600.0,
            parse_timeout,
        ),
        Option(
            "keep",
            "which run directories to keep: failed (default), all, none",
            "failed",
            _choice(KEEP),
            choices=KEEP,
        ),
        Option(
            "report", "write a JSON report of every resume test to this path", None, parse_report
        ),
        Option(
            "strict_shutdown",
            "fail, instead of warning, when a rank finished its work and closed its signature "
            "but then died during interpreter shutdown (e.g. SIGABRT in a gloo/NCCL thread)",
            False,
            parse_bool,
            flag=True,
        ),
        Option(
            "rng_mutation",
            "run the teeth check (one extra resumed launch with every RNG stream mutated): "
            "true (default) or false; the marker's rng_mutation= wins",
            True,
            parse_bool,
        ),
    )
}


@dataclass(frozen=True)
class Resolved:
    value: Any
    source: str


def resolve(
    option: Option, ini: Optional[tuple[Any, str]], env: Mapping[str, str], cli: Any
) -> Resolved:
    """Resolve one option from the session's sources; `ini` is (raw value, file) or None."""
    candidates: list[tuple[Any, str]] = []
    if ini is not None and ini[0] not in (None, "", []):
        candidates.append((ini[0], f"ini option {option.ini} in {ini[1]}"))
    if env.get(option.env, "") != "":
        candidates.append((env[option.env], f"environment variable {option.env}"))
    if cli is not None:
        candidates.append((cli, f"command line {option.cli}"))
    if not candidates:
        return Resolved(option.default, "default")
    raw, source = candidates[-1]
    try:
        return Resolved(option.parse(raw), source)
    except ValueError as exc:
        raise SettingError(f"invalid {option.name} {raw!r} from {source}: {exc}") from None


@dataclass(frozen=True)
class SessionSettings:
    """Session-wide options; `error` is set when one was invalid (marked tests then fail)."""

    values: dict[str, Resolved]
    error: Optional[str] = None

    def __getitem__(self, name: str) -> Any:
        return self.values[name].value

    def describe(self, name: str) -> str:
        item = self.values[name]
        return f"{item.value} ({item.source})"


def resolve_session(config: Any, env: Optional[Mapping[str, str]] = None) -> SessionSettings:
    """Resolve every session option from a pytest config; collects errors instead of raising."""
    env = os.environ if env is None else env
    inifile = str(config.inipath) if getattr(config, "inipath", None) else "the ini file"
    values: dict[str, Resolved] = {}
    errors: list[str] = []
    for option in OPTIONS.values():
        cli = config.getoption(option.dest, default=None)
        try:
            values[option.name] = resolve(option, (config.getini(option.ini), inifile), env, cli)
        except SettingError as exc:
            errors.append(str(exc))
            values[option.name] = Resolved(option.default, "default")
    return SessionSettings(values, "; ".join(errors) or None)


# ---------------------------------------------------------------------------------------
# The marker

MARKER_KEYWORDS = (
    "steps",
    "split",
    "nproc",
    "nnodes",
    "timeout",
    "tolerance",
    "env",
    "rng_mutation",
    "interrupt",
)


@dataclass(frozen=True)
class MarkerSpec:
    steps: int
    splits: tuple[int, ...]
    nproc: int = 2
    nnodes: int = 1
    timeout: Optional[float] = None
    tolerance: tuple[tuple[str, float, float], ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    rng_mutation: Optional[bool] = None
    """None: not given on the marker (the session option decides)."""
    interrupt: str = "continue"

    @property
    def world_size(self) -> int:
        return self.nproc * self.nnodes


def _marker_error(keyword: str, value: Any, why: str) -> SettingError:
    return SettingError(f"@resume_equivalent: invalid {keyword}={value!r}: {why}")


def _int(keyword: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _marker_error(keyword, value, f"must be an int >= {minimum}")
    if value < minimum:
        raise _marker_error(keyword, value, f"must be >= {minimum}")
    return value


def _tolerance(value: Any) -> tuple[tuple[str, float, float], ...]:
    if value is None:
        return ()
    why = (
        "expected (rtol, atol) for every key, or a dict of key patterns to (rtol, atol), "
        'e.g. {"loss": (1e-6, 0.0), "param*": (1e-5, 1e-8)}'
    )
    items = value.items() if isinstance(value, Mapping) else [("*", value)]
    rules = []
    for pattern, pair in items:
        if not isinstance(pattern, str) or not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise _marker_error("tolerance", value, why)
        nums = []
        for x in pair:
            if (
                isinstance(x, bool)
                or not isinstance(x, (int, float))
                or not x >= 0
                or math.isinf(x)
            ):
                raise _marker_error(
                    "tolerance", value, f"rtol and atol must be finite numbers >= 0; {why}"
                )
            nums.append(float(x))
        rules.append((pattern, nums[0], nums[1]))
    return tuple(rules)


def _env(value: Any) -> tuple[tuple[str, str], ...]:
    if value is None:
        return ()
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and k and isinstance(v, str) for k, v in value.items()
    ):
        raise _marker_error(
            "env", value, 'expected a dict of str to str, e.g. {"OMP_NUM_THREADS": "1"}'
        )
    return tuple(sorted(value.items()))


def parse_marker(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> MarkerSpec:
    """Validate the marker's arguments; raises SettingError naming the keyword and value."""
    unknown = [k for k in kwargs if k not in MARKER_KEYWORDS]
    if unknown:
        key = unknown[0]
        close = difflib.get_close_matches(key, MARKER_KEYWORDS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise SettingError(
            f"@resume_equivalent: unknown keyword {key!r}{hint}; valid keywords: {', '.join(MARKER_KEYWORDS)}"
        )
    if len(args) > 2:
        raise SettingError(
            f"@resume_equivalent takes at most 2 positional arguments (steps, split), got {len(args)}"
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
    steps = _int("steps", merged["steps"], 2)
    raw_split = merged["split"]
    split_list = list(raw_split) if isinstance(raw_split, (list, tuple)) else [raw_split]
    if not split_list:
        raise _marker_error("split", raw_split, "needs at least one step")
    for s in split_list:
        if isinstance(s, bool) or not isinstance(s, int) or not 1 <= s < steps:
            raise _marker_error(
                "split", raw_split, f"every split must be an int with 1 <= split < steps={steps}"
            )
    if len(set(split_list)) != len(split_list):
        raise _marker_error("split", raw_split, "splits must be distinct")
    timeout = merged.get("timeout")
    if timeout is not None:
        try:
            timeout = parse_timeout(timeout)
        except ValueError as exc:
            raise _marker_error("timeout", timeout, str(exc)) from None
    rng_mutation = merged.get("rng_mutation")
    if rng_mutation is not None and not isinstance(rng_mutation, bool):
        raise _marker_error("rng_mutation", rng_mutation, "must be True or False")
    interrupt = merged.get("interrupt", "continue")
    if interrupt not in INTERRUPTS:
        raise _marker_error(
            "interrupt", interrupt, f"supported: {', '.join(map(repr, INTERRUPTS))}"
        )
    return MarkerSpec(
        steps=steps,
        splits=tuple(sorted(split_list)),
        nproc=_int("nproc", merged.get("nproc", 2), 1),
        nnodes=_int("nnodes", merged.get("nnodes", 1), 1),
        timeout=timeout,
        tolerance=_tolerance(merged.get("tolerance")),
        env=_env(merged.get("env")),
        rng_mutation=rng_mutation,
        interrupt=interrupt,
    )


MARKER_OPTIONS = ("timeout", "rng_mutation")
"""Options a marker may set for its test (the top layer of the precedence)."""


@dataclass(frozen=True)
class TestSettings:
    """What one marked test runs with: its validated marker, and the options with the
    marker's layer applied. `sources` says where each option's value came from."""

    __test__ = False  # not a pytest test class
    marker: MarkerSpec
    device: str
    require_device: bool
    timeout: float
    keep: str
    report: Optional[str]
    strict_shutdown: bool
    rng_mutation: bool
    sources: dict[str, str]

    def describe(self, name: str) -> str:
        return f"{getattr(self, name)} ({self.sources[name]})"


def resolve_test(
    session: SessionSettings, args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> TestSettings:
    """The effective settings of a test marked `@resume_equivalent(*args, **kwargs)`.

    Raises SettingError for an invalid session option (it concerns every marked test) or an
    invalid marker argument (only this test).
    """
    if session.error:
        raise SettingError(f"pytest-resume-equiv: {session.error}")
    marker = parse_marker(args, kwargs)
    options = dict(session.values)
    for name in MARKER_OPTIONS:
        value = getattr(marker, name)
        if value is not None:
            options[name] = Resolved(value, f"marker @resume_equivalent({name}=...)")
    return TestSettings(
        marker,
        **{name: resolved.value for name, resolved in options.items()},
        sources={name: resolved.source for name, resolved in options.items()},
    )
