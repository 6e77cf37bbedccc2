"""The one place where options and markers are resolved and validated.

Precedence, lowest to highest: default < ini < environment (`PYTEST_RESUME_EQUIV_*`) <
command line < marker. Each resolved value remembers where it came from, so an error can
say "invalid timeout 'abc' from environment variable PYTEST_RESUME_EQUIV_TIMEOUT".
`resolve_session` does the session's layers once; `resolve_test` lays a test's marker over
them and returns the settings that test runs with.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable, Optional

from .compare.tolerance import PROFILES, Tolerance, parse_tolerance_option
from .configurations import parse_equivalent
from .errors import SettingError
from .launch.spec import LAUNCHERS, Launcher, launcher_named
from .marker import NOISE, MarkerSpec, parse_marker, parse_timeout
from .option_values import (
    choice,
    non_empty,
    parse_bool,
    parse_crash_point,
    parse_preload,
    parse_slurm_args,
    whole_number,
)

DEVICES = ("auto", "cpu", "cuda", "npu", "xpu")
KEEP = ("failed", "all", "none")
ON_OFF = ("on", "off")


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


OPTIONS: dict[str, Option] = {
    opt.name: opt
    for opt in (
        Option(
            "device",
            "where ranks run: auto (first accelerator found: cuda, npu, xpu; skip if none), "
            "cpu (gloo), cuda, npu or xpu",
            "auto",
            choice(DEVICES),
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
            choice(KEEP),
            choices=KEEP,
        ),
        Option(
            "keep_dir",
            "where run directories live, a folder per session, so the kept ones outlast later "
            "pytest sessions; the newest 5 sessions that kept any stay (default: "
            "<rootdir>/.resume-equiv/runs; a relative ini value is relative to the ini file)",
            None,
            non_empty("the directory that holds the run directories", user=True),
        ),
        Option(
            "report",
            "write a JSON report of every resume test to this path",
            None,
            non_empty("a file path for the JSON report"),
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
            "strict_latent",
            "fail, instead of warning, when a random stream differs after the resume but no "
            "compared step draws from it (a latent difference)",
            False,
            parse_bool,
            flag=True,
        ),
        Option(
            "launcher",
            "how launches start: local (torchrun on this host; nnodes= simulated by one agent "
            "per node) or slurm (each launch an srun job step: in the allocation pytest runs "
            "in, or an allocation of its own)",
            "local",
            choice(LAUNCHERS),
            choices=LAUNCHERS,
        ),
        Option(
            "slurm_args",
            "srun options for every Slurm launch, shell-quoted (partition, time, account, "
            "GRES), e.g. '--partition=gpu --time=00:20:00 --gpus-per-node=8'",
            (),
            parse_slurm_args,
        ),
        Option(
            "fork_server",
            "on: fork the ranks of local one-node launches from a per-session process that has "
            "imported torch (a launch starts in milliseconds); off: start every rank as torchrun "
            "would (a launch whose env= changes what torch reads at import always does)",
            "on",
            choice(ON_OFF),
            choices=ON_OFF,
        ),
        Option(
            "preload",
            "modules the fork server imports before it forks ranks, comma-separated "
            "(e.g. transformers,diffusers); one that starts threads or touches a device at "
            "import is refused",
            (),
            parse_preload,
        ),
        Option(
            "tolerance",
            "how far recorded numbers may move after the split: a profile (exact, strict, "
            "standard, relaxed) or RTOL,ATOL; the marker's tolerance= wins",
            PROFILES["exact"],
            parse_tolerance_option,
        ),
        Option(
            "noise",
            "training that does not reproduce itself: auto (measure the noise when the "
            "determinism control finds it), measure (always), off (fail as not deterministic); "
            "the marker's noise= wins",
            "auto",
            choice(NOISE),
            choices=NOISE,
        ),
        Option(
            "noise_runs",
            "uninterrupted runs that measure the noise (the uninterrupted run and its "
            "controls), at least 2",
            2,
            whole_number(2, "uninterrupted runs"),
        ),
        Option(
            "strict_abstain",
            "fail, instead of skipping, a test whose trajectory could not be judged within the "
            "measured noise (abstained)",
            False,
            parse_bool,
            flag=True,
        ),
        Option(
            "golden",
            "the golden store: keep the uninterrupted run's signatures per test and environment "
            "in DIR and compare every later run with them (a relative ini value is relative to "
            "the ini file)",
            None,
            non_empty("the directory of the golden store"),
        ),
        Option(
            "update_golden",
            "write (or replace) the goldens of the tests that ran, and remove the unused ones",
            False,
            parse_bool,
            flag=True,
        ),
        Option(
            "golden_only",
            "for tests whose golden holds a checkpoint (golden_checkpoint=True): only resume the "
            "stored checkpoint and compare with the golden (one launch per split)",
            False,
            parse_bool,
            flag=True,
        ),
        Option(
            "auto",
            "automatic recording: on (default: a step per optimizer step with no call in the "
            "trainer; loss, input data, optimizers and LR schedulers recorded beside explicit "
            "values) or off (only the trainer's record/watch calls); the marker's auto= wins",
            True,
            parse_bool,
            choices=ON_OFF,
        ),
        Option(
            "crash_seed",
            'the seed interrupt="crash" tests sample crash_points=N points with: the same seed, '
            "the same points (the report names it)",
            0,
            whole_number(0),
        ),
        Option(
            "crash_point",
            'run only this crash point of an interrupt="crash" test, and its resume (the id '
            "the report's rerun line gives, e.g. s4.torn1)",
            None,
            parse_crash_point,
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


PATH_OPTIONS = ("golden", "keep_dir")
"""Options naming a directory: a relative ini value is relative to the ini file."""


def _relative_to_ini(option: Option, resolved: Resolved, config: Any) -> Resolved:
    inipath = getattr(config, "inipath", None)
    value = resolved.value
    if option.name not in PATH_OPTIONS or not resolved.source.startswith("ini") or not inipath:
        return resolved
    if value is None or os.path.isabs(value):
        return resolved
    return Resolved(os.path.join(os.path.dirname(str(inipath)), value), resolved.source)


def _check_directory(option: Option, resolved: Resolved) -> None:
    """A directory the plugin makes: nothing on its path may be a file."""
    if option.name != "keep_dir" or resolved.value is None:
        return
    path = os.path.abspath(resolved.value)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    if not os.path.isdir(path):
        raise SettingError(
            f"invalid {option.name} {resolved.value!r} from {resolved.source}: {path} is a file, "
            "not a directory"
        )


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

    @property
    def launcher(self) -> Launcher:
        """The launcher the options name (`launcher`, with `slurm_args`): made here, once for
        every caller, from the validated values."""
        return launcher_named(self["launcher"], self["slurm_args"])


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
            values[option.name] = _relative_to_ini(option, values[option.name], config)
            _check_directory(option, values[option.name])
        except SettingError as exc:
            errors.append(str(exc))
            values[option.name] = Resolved(option.default, "default")
    return SessionSettings(values, "; ".join(errors) or None)


MARKER_OPTIONS = ("timeout", "rng_mutation", "tolerance", "noise", "auto")
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
    keep_dir: Optional[str]
    report: Optional[str]
    strict_shutdown: bool
    strict_latent: bool
    launcher: Launcher
    """`--resume-equiv-launcher`, with `--resume-equiv-slurm-args` for a Slurm launcher."""
    fork_server: str
    preload: tuple[str, ...]
    tolerance: Tolerance
    noise: str
    noise_runs: int
    strict_abstain: bool
    golden: Optional[str]
    update_golden: bool
    golden_only: bool
    rng_mutation: bool
    auto: bool
    crash_seed: int
    crash_point: Optional[str]
    sources: dict[str, str]

    def describe(self, name: str) -> str:
        return f"{getattr(self, name)} ({self.sources[name]})"


def resolve_test(
    session: SessionSettings,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    variant: Optional[str] = None,
) -> TestSettings:
    """The effective settings of a test marked `@resume_equivalent(*args, **kwargs)`, or,
    with `variant` (the item's), `@equivalent(**kwargs)`.

    Raises SettingError for an invalid session option (it concerns every marked test) or an
    invalid marker argument (only this test).
    """
    if session.error:
        raise SettingError(f"pytest-resume-equiv: {session.error}")
    marker = (
        parse_marker(args, kwargs) if variant is None else parse_equivalent(args, kwargs, variant)
    )
    options = dict(session.values)
    which = "resume_equivalent" if variant is None else "equivalent"
    for name in MARKER_OPTIONS:
        value = getattr(marker, name)
        if value is not None:
            options[name] = Resolved(value, f"marker @{which}({name}=...)")
    values = {name: resolved.value for name, resolved in options.items()}
    values["launcher"] = session.launcher  # no marker keyword changes it
    del values["slurm_args"]
    return TestSettings(
        marker, **values, sources={name: resolved.source for name, resolved in options.items()}
    )
