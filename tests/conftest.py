"""Shared helpers for the plugin's own tests."""

from __future__ import annotations

import os

import pytest

from pytest_resume_equiv.rank.context import current, reset
from pytest_resume_equiv.rank.launch_context import CONTEXT_ENV, LaunchContext

# The pytest sessions, servers and ranks these tests start read compiled modules as an
# installed wheel's are (pip compiles them at install). With PYTHONDONTWRITEBYTECODE set (some
# sandboxes and CI images set it) every one of them compiled the plugin's ~140 modules again.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "long(seconds): runs torchrun launches for about this long on 2 cores; starts first",
    )
    config.addinivalue_line(
        "markers",
        "session: starts a pytest session in a subprocess (uses the pytester fixture); "
        "set on every such test at collection, so `-m 'not session'` leaves them out",
    )


@pytest.fixture(autouse=True)
def _environment_as_it_was():
    """Each test ends with the environment it started with. A library a test imports in this
    process may set variables for good: `lightning` sets PYTORCH_NVML_BASED_CUDA_CHECK=1 at
    import, which every later fork server and launch of the worker inherited (a fake CUDA's
    `is_available()` then no longer poisoned fork, and a test of that failed in CI)."""
    before = dict(os.environ)
    yield
    for name in set(os.environ) - set(before):
        del os.environ[name]
    for name, value in before.items():
        if os.environ.get(name) != value:
            os.environ[name] = value


def _mark_sessions(items) -> None:
    """Mark every test that starts a pytest session: the pytester fixture is how our tests
    start one, so the mark cannot drift from what a test does."""
    for item in items:
        if "pytester" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.session)


SLURM_TESTS = "test_slurm.py::"
_slurm_outcomes: dict[str, str] = {}


def pytest_runtest_logreport(report):
    """Remember how the Slurm tests ended (on the xdist controller too), for the summary."""
    if SLURM_TESTS in report.nodeid and (report.when == "call" or report.outcome != "passed"):
        _slurm_outcomes[report.nodeid.split("::", 1)[1]] = report.outcome


def pytest_terminal_summary(terminalreporter):
    """Name the Slurm tests and their outcome even in a quiet run: CI's output shows that the
    two-node tests ran against a real cluster, and did not skip."""
    if _slurm_outcomes:
        terminalreporter.section("slurm launcher (two-node Slurm cluster on localhost)")
        for name, outcome in sorted(_slurm_outcomes.items()):
            terminalreporter.line(f"{outcome.upper():8} {name}")


def _seconds(item) -> float:
    marker = item.get_closest_marker("long")
    return marker.args[0] if marker else 0


def pytest_collection_modifyitems(items):
    """Order the tests for `-n N --dist worksteal`, which first hands worker k the k-th of N
    equal-count slices of this list, then lets idle workers steal from the ends of others'.

    The long tests are dealt longest first to the slice with the least long work, each slice
    starting with its long tests; short tests fill the slices to equal counts. So every
    worker starts on long work at once and the run ends on short, stealable tests, instead
    of a long test starting last on one worker while the other waits.
    """
    _mark_sessions(items)
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers < 2:
        return
    sizes, left = [], len(items)
    for k in range(workers):  # worksteal's first split: len(pending) // nodes_remaining
        sizes.append(left // (workers - k))
        left -= sizes[-1]
    slices: list[list] = [[] for _ in range(workers)]
    load = [0.0] * workers
    for item in sorted((i for i in items if _seconds(i)), key=_seconds, reverse=True):
        k = min(range(workers), key=lambda j: (load[j], len(slices[j])))
        slices[k].append(item)
        load[k] += _seconds(item)
    for item in (i for i in items if not _seconds(i)):
        # the slice with the most room left (a small selection can have no room anywhere)
        k = max(range(workers), key=lambda j: (sizes[j] - len(slices[j]), -j))
        slices[k].append(item)
    items[:] = [item for part in slices for item in part]


@pytest.fixture
def in_rank(tmp_path, monkeypatch):
    """Make this process look like rank `rank` of a launch, so record() writes a signature:
    a fresh rank state (`rank.context.reset`) made from the run context set in the
    environment; each call closes the previous one's signature and starts another."""

    def enter(
        phase="uninterrupted",
        rank=0,
        world_size=1,
        split=3,
        steps=6,
        run_dir=None,
        device_kind="cpu",
        auto=True,
        picks_checkpoint=False,
        equivalence=False,
    ):
        run_dir = str(run_dir or tmp_path / phase)
        current().close()
        launch = LaunchContext(
            phase,
            run_dir,
            device_kind=device_kind,
            steps=steps,
            split=split,
            splits=(split,),
            auto=auto,
            equivalence=equivalence,
            picks_checkpoint=picks_checkpoint,
        )
        monkeypatch.setenv(CONTEXT_ENV, launch.to_json())
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("LOCAL_RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", str(world_size))
        reset()
        return run_dir

    yield enter
    current().close()
    os.environ.pop(CONTEXT_ENV, None)
    reset()  # no longer a rank: every call is a no-op again


@pytest.fixture
def trainers(pytester):
    """A pytester directory holding `trainers.py` (see helpers.TRAINERS); returns the pytester."""
    from helpers import TRAINERS

    pytester.makepyfile(trainers=TRAINERS)
    return pytester
