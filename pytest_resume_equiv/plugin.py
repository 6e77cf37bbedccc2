"""pytest hooks only: options, the marker, device skips, fixtures and report sections.

One resume test, from the marker to the verdict:
1. `pytest_runtest_setup` resolves the test's settings (`settings.resolve_test`: its marker
   over the session's options) and its device (skip or fail when there is none);
2. the `resume_equiv` fixture hands both to a `fixtures.ResumeEquiv`;
3. `ResumeEquiv.run` plans the launches (`plan.build_plan`), runs them
   (`schedule.Scheduler`), judges each result (`judge.Judge` dispatching to the `checks`) and fails the test with
   the report's text (`report.format_outcome`);
4. at teardown the test's record goes to the session (`session.ResumeEquivSession`), which
   prints the summary table and writes the JSON report at the end.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Generator
from typing import Any, Callable, Optional

import pytest

from .configurations import MARKER as EQUIVALENT
from .configurations import MARKER_DOC as EQUIVALENT_DOC
from .configurations import variant_names
from .fixtures import ResumeEquiv, RunRoot, Torchrun
from .launch.devices import ACCELERATORS, Device, DeviceUnavailable, HostProbe, select_device
from .launch.forked import ForkServer
from .launch.keep_dir import kept_line
from .report.text import format_golden_summary, format_summary_table
from .session import ResumeEquivSession, is_xdist_worker, session_temp
from .settings import OPTIONS, SettingError, TestSettings, resolve_test

MARKER = "resume_equivalent"
MARKER_DOC = (
    "resume_equivalent(steps, split, nproc=2, nnodes=1, timeout=None, tolerance=None, env=None, "
    "rng_mutation=True, interrupt='continue', ignore=None, resume_nproc=None, resume_nnodes=None, "
    "chain=False, noise='auto', golden_checkpoint=False, crash_points=None, "
    "crash_refusal='pass', crash_saves='last', crash_mode='kill', crash_grace=2.0, auto=None): run the test's "
    "trainer under torchrun "
    "uninterrupted and resumed "
    "from the checkpoint saved at `split` (an int or a list), and require every rank to record "
    "the same values at every step after it. See pytest-resume-equiv's docs/reference/marker.md."
)
"""The `pytest --markers` line; names every keyword, like the marker reference."""

VARIANT = "_resume_equiv_variant"
"""The parameter an `@equivalent` test's items carry: the variant each compares."""

SESSION_KEY = pytest.StashKey[ResumeEquivSession]()
TEST_KEY = pytest.StashKey[tuple[TestSettings, Device]]()
"""A marked test's settings and device, set up before its fixtures run."""
FAILED_KEY = pytest.StashKey[bool]()


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


def _marker(node: Any) -> Optional[pytest.Mark]:
    """The node's `@resume_equivalent` or `@equivalent` marker."""
    return node.get_closest_marker(MARKER) or node.get_closest_marker(EQUIVALENT)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """An `@equivalent` test is one item per variant (`test_x[dp2]`); a marker whose
    variants are no dict gives one item, which fails with the marker's error."""
    marker = metafunc.definition.get_closest_marker(EQUIVALENT)
    if marker is None or VARIANT not in metafunc.fixturenames:
        return
    names = variant_names(marker.kwargs) or ["?"]
    metafunc.parametrize(VARIANT, names, ids=names, indirect=True)


@pytest.fixture
def _resume_equiv_variant(request: pytest.FixtureRequest) -> Optional[str]:
    """The variant an `@equivalent` item compares (None for a resume test)."""
    return getattr(request, "param", None)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", MARKER_DOC)
    config.addinivalue_line("markers", EQUIVALENT_DOC)
    config.stash[SESSION_KEY] = ResumeEquivSession(config)
    config.pluginmanager.register(_Reporter(config), "resume-equiv-reporter")


def _session(config: pytest.Config) -> ResumeEquivSession:
    return config.stash[SESSION_KEY]


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """pytest-xdist controller: a worker starts; its run directories go in this session's
    folder."""
    _session(node.config).for_worker(node.workerinput)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """pytest-xdist controller: a worker ended; merge what it sent."""
    _session(node.config).worker_done(getattr(node, "workeroutput", {}))


class _Reporter:
    """Lines for the terminal from hooks that are given no config: after each resume test
    with -v, what it proved; on Ctrl-C or SIGTERM, where the partial run directories are."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """pytest-xdist workers' tests too: the line travels in the report's properties."""
        if report.when != "teardown" or self.config.option.verbose < 1:
            return
        proved = dict(report.user_properties).get("resume_equiv_proved")
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if proved and reporter is not None and not is_xdist_worker(self.config):
            reporter.ensure_newline()
            reporter.write_line(f"    resume-equiv: {proved}")

    def pytest_keyboard_interrupt(self, excinfo: pytest.ExceptionInfo[BaseException]) -> None:
        lines = _session(self.config).interrupted()
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        for line in lines if reporter is not None else ():
            reporter.write_line(f"resume-equiv: {line}")


def pytest_sessionfinish(session: pytest.Session) -> None:
    _session(session.config).finish()


def pytest_sessionstart(session: pytest.Session) -> None:
    """Start the fork server before collection when the options say this process will launch
    (`_may_fork`): its imports (torch, `torch._dynamo`: seconds of CPU) then run beside
    collection's own (a test module that imports torch), not after it."""
    settings = _session(session.config).settings
    if _may_fork(session.config) and not settings["preload"]:
        # preload modules wait for collection's end: a conftest or test module may set what
        # they read at import (HF_HUB_OFFLINE, say), which no variable list can know
        ForkServer.prestart(())


def pytest_collection_finish(session: pytest.Session) -> None:
    _collected(session.config, session.items)
    _keep_fork_server(session)


def _may_fork(config: pytest.Config) -> bool:
    """Whether this process may fork launches: resume tests run here (no `--co`, not the
    pytest-xdist controller), on a device named outright (with `auto` they may all skip for
    want of an accelerator), with the server on and a launcher that forks."""
    settings = _session(config).settings
    if config.option.collectonly or settings.error or settings["fork_server"] != "on":
        return False
    if config.pluginmanager.hasplugin("dsession"):  # the pytest-xdist controller
        return False
    return settings["device"] != "auto" and settings.launcher.can_fork


def _keep_fork_server(session: pytest.Session) -> None:
    """Once collected: keep the server when a selected test will launch (a resume test, or
    one using the `torchrun` fixture; restarted if a test module changed a variable torch
    reads at import), stop it when none will. A server left to start on first use is found
    by `ForkServer.get` as before."""
    if not _may_fork(session.config):
        return
    preload = _session(session.config).settings["preload"]
    uses = (getattr(item, "fixturenames", ()) for item in session.items)  # a doctest: none
    if any(_marker(i) is not None for i in session.items) or any("torchrun" in u for u in uses):
        ForkServer.prestart(preload)
    else:
        ForkServer.stop_one(preload)


def pytest_deselected(items: list[pytest.Item]) -> None:
    if items:
        _collected(items[0].config, items)


def _collected(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Resume tests collected, selected or not: the goldens they use are not unused."""
    found = {item.nodeid for item in items if _marker(item) is not None}
    _session(config).collected |= found


def pytest_unconfigure(config: pytest.Config) -> None:
    """The session's fork servers go with it (they also leave if pytest dies)."""
    ForkServer.stop_all()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    session = _session(terminalreporter.config)
    records = session.records
    if records:
        terminalreporter.write_sep("=", "resume equivalence")
        for line in format_summary_table(records):
            terminalreporter.write_line(line)
    if session.kept_in:
        stopped = any(r.verdict == "interrupted" for r in records)
        terminalreporter.write_line(kept_line(session.kept_in, session.settings["keep"], stopped))
    if session.settings.error or session.settings["golden"] is None:
        return
    lines = format_golden_summary(records, session.unused, session.settings["update_golden"])
    if lines:
        terminalreporter.write_sep("-", f"resume-equiv goldens in {session.settings['golden']}")
        for line in lines:
            terminalreporter.write_line(line)


def _progress_writer(config: pytest.Config) -> Optional[Callable[[str], None]]:
    """With -v (and not inside a pytest-xdist worker), a line per launch event, written as
    it happens: output capture is suspended for the line, as pytest's live logging does."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None or config.option.verbose < 1 or is_xdist_worker(config):
        return None
    capture = config.pluginmanager.get_plugin("capturemanager")

    def write(text: str) -> None:
        with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
            reporter.ensure_newline()
            reporter.write_line(f"    resume-equiv: {text}")

    return write


def pytest_report_header(config: pytest.Config) -> str:
    settings = _session(config).settings
    if settings.error:
        return f"resume-equiv: invalid settings, resume tests will fail: {settings.error}"
    device = settings.describe("device")
    if settings["device"] == "auto":
        device = f"auto -> {_auto_device()} ({settings.values['device'].source})"
    launcher = settings.launcher.header(settings.describe("launcher"))
    return (
        f"resume-equiv: device={device}, timeout={settings['timeout']:g}s "
        f"({settings.values['timeout'].source}), keep={settings.describe('keep')}{launcher}"
    )


def _auto_device() -> str:
    """What `--resume-equiv-device=auto` finds, for the header, without importing torch or
    starting a child: a session without resume tests pays nothing for it."""
    probe = HostProbe(use_child=False)
    for kind in ACCELERATORS:
        count = probe.count(kind)
        if count is None:
            return "probed when a resume test starts"
        if count:
            return f"{kind} x{count}"
    return "no accelerator, resume tests skip"


def _devices_needed(settings: TestSettings) -> tuple[int, str]:
    """The devices the test's largest launch uses on this host, and why so many (for the skip
    or failure message): a resumed launch on another topology may need more than the first."""
    marker = settings.marker
    launcher = settings.launcher
    first = launcher.devices_per_host(marker.nproc, marker.nnodes)
    resumed = launcher.devices_per_host(marker.resumed_nproc, marker.resumed_nnodes)
    if resumed > first:
        return resumed, (
            f"its resumed launches: resume_nproc={marker.resumed_nproc} x "
            f"resume_nnodes={marker.resumed_nnodes} on this host"
        )
    if marker.nnodes > 1 and first > marker.nproc:
        return first, f"nproc={marker.nproc} x nnodes={marker.nnodes} simulated on this host"
    return first, ""


def _device(requested: str, require: bool, devices: int, why: str = "") -> Device:
    """The device for launches that use `devices` devices of this host, or skip/fail the test
    with the precise reason."""
    try:
        return select_device(requested, devices, why=why)
    except DeviceUnavailable as exc:
        if require:
            pytest.fail(f"{exc} (--resume-equiv-require-device is set)", pytrace=False)
        pytest.skip(str(exc))
    raise AssertionError("unreachable")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    marker = _marker(item)
    if marker is None:
        return
    callspec = getattr(item, "callspec", None)
    variant = callspec.params.get(VARIANT) if callspec is not None else None
    if marker.name == EQUIVALENT and variant is None:
        variant = "?"  # a test that does not take the resume_equiv fixture
    try:
        settings, problem = (
            resolve_test(_session(item.config).settings, marker.args, marker.kwargs, variant),
            "",
        )
    except SettingError as exc:
        problem = str(exc)
    if problem:
        pytest.fail(problem, pytrace=False)  # outside the except: no chained exception shown
    device = _device(settings.device, settings.require_device, *_devices_needed(settings))
    item.stash[TEST_KEY] = (settings, device)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any, Any]:
    report = yield
    if report.failed:
        item.stash[FAILED_KEY] = True
    return report


def _run_root(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> RunRoot:
    """A fresh private (0700) directory for one test's launches, in the session's folder of
    the keep directory, where later pytest sessions do not delete it."""
    name = re.sub(r"\W", "_", request.node.name)[:30]
    session = _session(request.config)
    try:
        path, problem = session.run_root(name, tmp_path_factory), ""
    except SettingError as exc:
        problem = str(exc)
    if problem:
        pytest.fail(problem, pytrace=False)
    return RunRoot(path, session.settings["keep"])


@pytest.fixture
def resume_equiv(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    _resume_equiv_variant: Optional[str],
) -> Generator[ResumeEquiv, None, None]:
    """Orchestrates a test marked @resume_equivalent (or @equivalent): call
    `resume_equiv.run(command_or_fn)`."""
    node = request.node
    if _marker(node) is None:
        pytest.fail(
            "the resume_equiv fixture needs @resume_equivalent(steps=..., split=...) or "
            "@equivalent(steps=..., variants=...) on the test",
            pytrace=False,
        )
    session = _session(request.config)
    settings, device = node.stash[TEST_KEY]
    root = _run_root(request, tmp_path_factory)
    fixture = ResumeEquiv(
        settings,
        device,
        root,
        owner=node.nodeid,
        shared_root=session.shared_dir(tmp_path_factory),
        golden=session.golden_for(node.nodeid, settings, device),
        report_section=lambda text: node.add_report_section("call", "resume-equiv", text),
        progress=_progress_writer(request.config),
    )
    session.launching[node.nodeid] = fixture
    yield fixture
    failed = node.stash.get(FAILED_KEY, False)
    record = session.test_done(fixture, failed)
    node.user_properties.extend(record.junit_properties())  # JUnit XML
    if root.keeps(failed or fixture.launching):
        for picture in fixture.pictures:
            session.drawer.later(picture)
    root.finish(failed or fixture.launching)


@pytest.fixture
def torchrun(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Generator[Torchrun, None, None]:
    """Launch a script, `["-m", module, ...]` or module-level function under torchrun."""
    settings = _session(request.config).settings
    root = _run_root(request, tmp_path_factory)
    yield Torchrun(
        lambda n, why: _device(settings["device"], settings["require_device"], n, why),
        settings["timeout"],
        root,
        strict_shutdown=not settings.error and settings["strict_shutdown"],
        launcher=settings.launcher,
        fork_server=not settings.error and settings["fork_server"] == "on",
        preload=() if settings.error else settings["preload"],
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

    shared = session_temp(request.config, tmp_path_factory)
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
