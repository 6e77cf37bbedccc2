"""pytest hooks: options, the marker, device skips, fixtures and report sections.

Everything else lives in modules that do not need pytest, so it can be unit-tested and
reused offline.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

import pytest

from .devices import Device, DeviceUnavailable, select_device
from .fixtures import ResumeEquiv, RunRoot, Torchrun
from .report import format_summary_table, test_entry
from .settings import (
    OPTIONS,
    MarkerSpec,
    Resolved,
    SessionSettings,
    SettingError,
    parse_marker,
    resolve_session,
)
from .share import SHARED_DIR, clean_shared, mark_kept

MARKER = "resume_equivalent"
MARKER_DOC = (
    "resume_equivalent(steps, split, nproc=2, nnodes=1, timeout=None, tolerance=None, env=None, "
    "rng_mutation=True, interrupt='continue'): run the test's trainer under torchrun "
    "uninterrupted and resumed from the checkpoint saved at `split` (an int or a list), and "
    "require every rank to record the same values at every step after it. See "
    "pytest-resume-equiv's README."
)

SETTINGS_KEY = pytest.StashKey[SessionSettings]()


@dataclass(frozen=True)
class Prepared:
    spec: MarkerSpec
    device: Device
    timeout: Resolved
    rng_mutation: bool
    strict_shutdown: bool = False


PREPARED_KEY = pytest.StashKey[Prepared]()
REPORT_KEY = pytest.StashKey[list]()
FAILED_KEY = pytest.StashKey[bool]()
SHARED_KEY = pytest.StashKey[str]()
ACTIVE_KEY = pytest.StashKey[dict]()
"""node id -> the ResumeEquiv fixture of every resume test running now."""


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("resume-equiv", "resume equivalence (pytest-resume-equiv)")
    for option in OPTIONS.values():
        help_text = f"{option.help} (ini: {option.ini}, env: {option.env})"
        if option.flag:
            group.addoption(
                option.cli,
                action="store_const",
                const=True,
                default=None,
                dest=option.dest,
                help=help_text,
            )
        else:
            group.addoption(
                option.cli, action="store", default=None, dest=option.dest, help=help_text
            )
        parser.addini(option.ini, option.help, default=None)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", MARKER_DOC)
    config.stash[SETTINGS_KEY] = resolve_session(config)
    config.stash[REPORT_KEY] = []
    config.pluginmanager.register(_InterruptReporter(config), "resume-equiv-interrupts")


def _shared_root(request: pytest.FixtureRequest, factory: pytest.TempPathFactory) -> str:
    """The directory of baselines shared across this session's tests (and xdist workers,
    whose base temporary directories sit inside the controller's)."""
    base = factory.getbasetemp()
    worker = getattr(request.config, "workerinput", None)
    path = (base.parent if worker else base) / SHARED_DIR
    path.mkdir(mode=0o700, exist_ok=True)
    request.config.stash[SHARED_KEY] = str(path)
    return str(path)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """pytest-xdist controller: collect the workers' report entries and learn where they
    shared their baselines."""
    output = getattr(node, "workeroutput", {})
    if output.get("resume_equiv_shared"):
        node.config.stash[SHARED_KEY] = output["resume_equiv_shared"]
    node.config.stash[REPORT_KEY].extend(output.get("resume_equiv_tests", []))


class _InterruptReporter:
    """Ctrl-C or SIGTERM: say where the interrupted tests' partial run directories are.
    (A plugin object, because the hook is given no config.)"""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config

    def pytest_keyboard_interrupt(self, excinfo: pytest.ExceptionInfo[BaseException]) -> None:
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        for fixture in self.config.stash.get(ACTIVE_KEY, {}).values():
            if not fixture.running:
                continue
            for path in fixture.shared:
                mark_kept(path)  # the session's cleanup of shared baselines spares them
            paths = [p for p in (fixture.root.path, *fixture.shared) if os.path.isdir(p)]
            line = (
                "resume-equiv: interrupted; every launch was killed; partial run directories "
                "kept: " + ", ".join(paths)
            )
            if reporter is not None:
                reporter.write_line(line)


def pytest_sessionfinish(session: pytest.Session) -> None:
    config = session.config
    shared = config.stash.get(SHARED_KEY, None)
    if shared:
        if hasattr(config, "workeroutput"):
            config.workeroutput["resume_equiv_shared"] = shared  # the controller cleans up
        elif not _settings(config).error:
            clean_shared(shared, _settings(config)["keep"])
    _write_report(session)


def _write_report(session: pytest.Session) -> None:
    config = session.config
    entries = config.stash[REPORT_KEY]
    if hasattr(config, "workeroutput"):  # pytest-xdist worker: the controller writes it all
        config.workeroutput["resume_equiv_tests"] = entries
        return
    path = _settings(config)["report"] if not _settings(config).error else None
    if not path:
        return
    entries.sort(key=lambda e: e["test"])
    with open(path, "w", encoding="utf-8") as f:
        json.dump(
            {"format": "pytest-resume-equiv/report", "version": 1, "tests": entries}, f, indent=2
        )


def pytest_terminal_summary(terminalreporter: Any) -> None:
    entries = terminalreporter.config.stash.get(REPORT_KEY, [])
    if entries:
        terminalreporter.write_sep("=", "resume equivalence")
        for line in format_summary_table(sorted(entries, key=lambda e: e["test"])):
            terminalreporter.write_line(line)


def _progress_writer(config: pytest.Config) -> Any:
    """With -v (and not inside a pytest-xdist worker), a line per launch event."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None or config.option.verbose < 1 or hasattr(config, "workerinput"):
        return None

    def write(text: str) -> None:
        reporter.ensure_newline()
        reporter.write_line(f"    resume-equiv: {text}")

    return write


def _settings(config: pytest.Config) -> SessionSettings:
    return config.stash[SETTINGS_KEY]


def pytest_report_header(config: pytest.Config) -> str:
    settings = _settings(config)
    if settings.error:
        return f"resume-equiv: invalid settings, resume tests will fail: {settings.error}"
    requested = settings["device"]
    if requested == "auto":
        try:
            found = select_device("auto", 1)
            device = f"auto -> {found.kind} x{found.count} ({settings.values['device'].source})"
        except DeviceUnavailable:
            device = (
                f"auto -> no accelerator, resume tests skip ({settings.values['device'].source})"
            )
    else:
        device = settings.describe("device")
    return (
        f"resume-equiv: device={device}, timeout={settings['timeout']:g}s "
        f"({settings.values['timeout'].source}), keep={settings.describe('keep')}"
    )


def _device(config: pytest.Config, ranks_per_node: int) -> Device:
    """The device for a launch, or skip/fail the test with the precise reason."""
    settings = _settings(config)
    try:
        return select_device(settings["device"], ranks_per_node)
    except DeviceUnavailable as exc:
        if settings["require_device"]:
            pytest.fail(f"{exc} (--resume-equiv-require-device is set)", pytrace=False)
        pytest.skip(str(exc))
    raise AssertionError("unreachable")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    marker = item.get_closest_marker(MARKER)
    if marker is None:
        return
    settings = _settings(item.config)
    if settings.error:
        pytest.fail(f"pytest-resume-equiv: {settings.error}", pytrace=False)
    try:
        spec, problem = parse_marker(marker.args, marker.kwargs), ""
    except SettingError as exc:
        problem = str(exc)
    if problem:
        pytest.fail(problem, pytrace=False)  # outside the except: no chained exception shown
    timeout = settings.values["timeout"]
    if spec.timeout is not None:
        timeout = Resolved(spec.timeout, "marker @resume_equivalent(timeout=...)")
    rng_mutation = settings["rng_mutation"] if spec.rng_mutation is None else spec.rng_mutation
    device = _device(item.config, spec.nproc)
    item.stash[PREPARED_KEY] = Prepared(
        spec, device, timeout, rng_mutation, settings["strict_shutdown"]
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any, Any]:
    report = yield
    if report.failed:
        item.stash[FAILED_KEY] = True
    return report


def _run_root(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> RunRoot:
    """A fresh private (0700) directory under pytest's base temp for one test's launches."""
    name = re.sub(r"\W", "_", request.node.name)[:30]
    path = tempfile.mkdtemp(prefix=f"resume-equiv-{name}-", dir=tmp_path_factory.getbasetemp())
    return RunRoot(path, _settings(request.config)["keep"])


@pytest.fixture
def resume_equiv(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Generator[ResumeEquiv, None, None]:
    """Orchestrates a test marked @resume_equivalent: call `resume_equiv.run(command_or_fn)`."""
    node = request.node
    if node.get_closest_marker(MARKER) is None:
        pytest.fail(
            "the resume_equiv fixture needs @resume_equivalent(steps=..., split=...) on the test",
            pytrace=False,
        )
    prepared = node.stash[PREPARED_KEY]
    root = _run_root(request, tmp_path_factory)

    def section(text: str) -> None:
        node.add_report_section("call", "resume-equiv", text)

    fixture = ResumeEquiv(
        prepared, root, section, _shared_root(request, tmp_path_factory), owner=node.nodeid
    )
    fixture.progress = _progress_writer(request.config)
    active = request.config.stash.setdefault(ACTIVE_KEY, {})
    active[node.nodeid] = fixture
    yield fixture
    active.pop(node.nodeid, None)
    # A test stopped mid-run (Ctrl-C, SIGTERM) keeps what its launches wrote so far.
    failed = node.stash.get(FAILED_KEY, False) or fixture.running
    if failed:
        for path in fixture.shared:
            mark_kept(path)
    entry = test_entry(node.nodeid, failed, prepared.spec, prepared.device.kind, fixture)
    request.config.stash[REPORT_KEY].append(entry)
    for name in ("verdict", "launches", "wall_seconds", "first_divergence"):
        node.user_properties.append((f"resume_equiv_{name}", entry[name]))  # JUnit XML
    root.finish(failed)


@pytest.fixture
def torchrun(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Generator[Torchrun, None, None]:
    """Launch a script, `["-m", module, ...]` or module-level function under torchrun."""
    root = _run_root(request, tmp_path_factory)
    settings = _settings(request.config)
    yield Torchrun(
        lambda n: _device(request.config, n),
        settings.values["timeout"],
        root,
        strict_shutdown=not settings.error and settings["strict_shutdown"],
    )
    root.finish(request.node.stash.get(FAILED_KEY, False))


def _require_diffusers() -> None:
    from .toy.wan import WAN_INSTALL_HINT

    pytest.importorskip(
        "diffusers", reason=f"the toy Wan fixtures need diffusers: {WAN_INSTALL_HINT}"
    )


@pytest.fixture(scope="session")
def toy_wan_config() -> dict[str, Any]:
    """A tiny WanTransformer3DModel config (2 layers), RoPE pinned to eager, attention native."""
    _require_diffusers()
    from .toy import toy_wan_config as make

    return make()


@pytest.fixture(scope="session")
def toy_wan_model_dir(
    request: pytest.FixtureRequest,
    toy_wan_config: dict[str, Any],
    tmp_path_factory: pytest.TempPathFactory,
) -> str:
    """The toy model's weights on disk, made once per session (once across xdist workers)."""
    from filelock import FileLock

    from .toy import materialize_toy_wan

    base = tmp_path_factory.getbasetemp()
    worker = getattr(request.config, "workerinput", None)
    shared = base.parent if worker else base  # pytest-xdist workers share the parent
    path = shared / "resume-equiv-toy-wan"
    with FileLock(str(shared / "resume-equiv-toy-wan.lock")):
        if not path.exists():
            materialize_toy_wan(str(path), toy_wan_config, seed=0)
    return str(path)


@pytest.fixture
def toy_wan(toy_wan_config: dict[str, Any]) -> Any:
    """Factory: `toy_wan(seed=0, **overrides)` builds the toy Wan model in-process."""
    from .toy import build_toy_wan

    def build(seed: int = 0, **overrides: Any) -> Any:
        return build_toy_wan(toy_wan_config, seed=seed, **overrides)

    return build
