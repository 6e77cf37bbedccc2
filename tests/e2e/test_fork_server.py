"""The fork server: a forked rank is a fresh process with torchrun's environment, a launch
that the server cannot serve starts plainly and says why, a preload module that would make
forking unsafe is refused, and nothing outlives pytest, even after SIGKILL."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import time

import pytest
from helpers import interrupt_long_test, processes_mentioning

from pytest_resume_equiv.errors import ResumeEquivError
from pytest_resume_equiv.launch.agents import OneRank, Standalone
from pytest_resume_equiv.launch.forked import Forked, ForkServer, agents_for, fork_refusal
from pytest_resume_equiv.launch.running import LaunchSpec, Target, launch
from pytest_resume_equiv.launch.spec import default_env, launcher_named
from pytest_resume_equiv.option_values import parse_preload
from pytest_resume_equiv.rank.launch_context import LaunchContext

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
"""tests/: where the shared fakes are (fakes.py)."""

# Each rank writes what a fresh process would have: its RNG streams as the bootstrap left
# them, the torchrun variables, its process group, and whether a module global set by the
# previous launch leaked into it.
PROBE = """
import json, os, random, sys, tempfile
dynamo_at_start = "torch._dynamo" in sys.modules
import numpy, torch
import pytest_resume_equiv.rank.bootstrap as bootstrap

leaked = getattr(bootstrap, "_set_by_a_previous_launch", None)
bootstrap._set_by_a_previous_launch = os.getpid()
keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
        "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "TORCHELASTIC_RESTART_COUNT",
        "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_USE_AGENT_STORE", "OMP_NUM_THREADS",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCHELASTIC_SIGNALS_TO_HANDLE")
torch.distributed.init_process_group("gloo")
facts = {
    "leaked": leaked,
    "initial_seed": torch.initial_seed(),
    "torch": torch.rand(4).tolist(),
    "python": random.random(),
    "numpy": float(numpy.random.rand()),
    "generator": torch.Generator().initial_seed(),
    "env": {k: os.environ.get(k) for k in keys},
    "torchelastic": sorted(k for k in os.environ if k.startswith(("TORCHELASTIC_", "MASTER_"))),
    "own_group": os.getpgid(0) == os.getpid(),
    "cwd": os.getcwd(),
    "path0": sys.path[0],
    "threads": torch.get_num_threads(),
    "cuda": torch.cuda.is_initialized(),
    "dynamo_at_start": dynamo_at_start,
    "tempdir": tempfile.gettempdir(),
}
group = torch.distributed.group.WORLD
# a rank that leaves as soon as its own side of the mesh is up closes a pair its peer may
# still be connecting (gloo: "Connection closed by peer"): both pass a barrier first
torch.distributed.barrier()
torch.distributed.destroy_process_group()
from pytest_resume_equiv.rank import forkserver
facts["kept"] = [g is group for g in forkserver.KEPT_GROUPS]
facts["destroyed"] = not torch.distributed.is_initialized()
rank = os.environ["RANK"]
with open(os.path.join(os.environ["PROBE_DIR"], f"{os.environ['PROBE_TAG']}-{rank}.json"), "w") as f:
    json.dump(facts, f)
"""


@pytest.fixture
def probe(tmp_path):
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    yield script
    ForkServer.stop_all()


def _launch(tmp_path, script, tag, nproc, fork, env=None):
    run_dir = tmp_path / f"run-{tag}"
    run_dir.mkdir(mode=0o700)
    spec = LaunchSpec(
        tag,
        Target("script", str(script)),
        str(run_dir),
        nproc,
        1,
        120.0,
        LaunchContext("launch", str(run_dir), "cpu", "gloo", seed=0),
        {"PROBE_DIR": str(tmp_path), "PROBE_TAG": tag, **(env or {})},
        str(tmp_path),
        fork_server=fork,
    )
    result = launch(spec)
    assert result.ok, [result.tail(result.rank_log(r)) for r in range(nproc)]
    return result, [json.loads((tmp_path / f"{tag}-{r}.json").read_text()) for r in range(nproc)]


def test_a_forked_rank_is_a_fresh_process_with_torchruns_environment(tmp_path, probe):
    _, plain = _launch(tmp_path, probe, "plain", 2, fork=False)  # torchrun --standalone
    first, forked = _launch(tmp_path, probe, "forked", 2, fork=True)
    _, again = _launch(tmp_path, probe, "again", 2, fork=True)
    assert len(first.returncodes) == 2  # one process per rank, no agent
    for rank in range(2):
        for facts in (forked[rank], again[rank]):
            assert facts["leaked"] is None  # the previous launch's module global is not here
            for key in ("initial_seed", "torch", "python", "numpy", "generator", "env"):
                assert facts[key] == plain[rank][key], key
            assert facts["torchelastic"] == plain[rank]["torchelastic"]
            assert facts["own_group"] and not facts["cuda"]
            assert facts["cwd"] == plain[rank]["cwd"] == str(tmp_path)
            assert facts["path0"] == str(tmp_path)  # sys.path[0] of `python -m` in the cwd
            assert facts["threads"] == plain[rank]["threads"]
            # the server imported torch._dynamo (the first optimizer step does not pay it),
            # and destroy_process_group() keeps the group alive until the rank leaves: its
            # destructor can deadlock on the GIL with a gloo worker thread
            # (forkserver.keep_process_groups). Destroying still does what it did.
            assert facts["dynamo_at_start"] and not plain[rank]["dynamo_at_start"]
            assert facts["kept"] == [True] and plain[rank]["kept"] == []
            assert facts["destroyed"] and plain[rank]["destroyed"]
    assert forked[0]["python"] != forked[1]["python"]  # seeded per rank, as today


def test_one_rank_forked_matches_its_plain_start(tmp_path, probe):
    """The launch's env= reaches what the standard library read from the environment and
    keeps (`tempfile`'s folder, which the server had read from its own)."""
    own = tmp_path / "own-tmp"
    own.mkdir()
    _, plain = _launch(tmp_path, probe, "plain", 1, fork=False, env={"TMPDIR": str(own)})
    _, forked = _launch(tmp_path, probe, "forked", 1, fork=True, env={"TMPDIR": str(own)})
    for key in ("initial_seed", "torch", "python", "numpy", "env", "torchelastic", "tempdir"):
        assert forked[0][key] == plain[0][key], key
    assert forked[0]["tempdir"] == str(own)


def _spec(tmp_path, env, nproc=2, nnodes=1, launcher="local", fork=True):
    context = LaunchContext("launch", str(tmp_path), "cpu", "gloo", seed=0)
    return LaunchSpec(
        "x",
        Target("script", "t.py"),
        str(tmp_path),
        nproc,
        nnodes,
        60.0,
        context,
        env,
        launcher=launcher_named(launcher),
        fork_server=fork,
    )


def test_an_import_time_switch_in_env_starts_plainly_and_says_why(tmp_path):
    spec = _spec(tmp_path, {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"})
    agents = agents_for(spec, {**os.environ, **default_env(), **spec.env})
    assert isinstance(agents, Standalone)
    assert agents.note == (
        "started without the fork server: its environment changes "
        "PYTORCH_NO_CUDA_MEMORY_CACHING, read when torch is imported"
    )
    assert "LD_PRELOAD" in fork_refusal({}, {"LD_PRELOAD": "x.so"})
    # read when torch._dynamo (which the server imports) loads its config and inductor's
    for name in ("TORCHDYNAMO_VERBOSE", "TORCHINDUCTOR_FREEZING", "SYMPY_USE_CACHE"):
        assert name in fork_refusal({}, {name: "1"})
    assert fork_refusal({}, {"CUDA_VISIBLE_DEVICES": "1", "PYTHONPATH": "x", "A": "b"}) == ""
    # read at each torch.cuda.is_available(); lightning's import sets it in pytest's process
    assert fork_refusal({}, {"PYTORCH_NVML_BASED_CUDA_CHECK": "1"}) == ""


def test_a_variable_the_servers_own_imports_set_does_not_stop_launches_forking(
    tmp_path, monkeypatch
):
    """`torch._dynamo`'s import sets TORCHINDUCTOR_CACHE_DIR (to the folder it computed) in
    the process that imports it. Once a fixture or a test module imported it in pytest's
    process (the toy Wan fixture does), every launch used to start plainly. The server says
    what its own imports set: a launch given those values is forked, another value is not."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    try:
        ForkServer.prestart(())
        server = ForkServer.running[()]
        folder = cache_dir()  # what the import of torch._dynamo does in pytest's process
        assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == folder
        ForkServer.prestart(())  # collection's end: waits for its first line, keeps it
        assert ForkServer.running[()] is server
        assert server.set_by_imports["TORCHINDUCTOR_CACHE_DIR"] == folder
        spec = _spec(tmp_path, {})
        agents = agents_for(spec, {**os.environ, **default_env()})
        assert isinstance(agents, Forked), agents.note
        elsewhere = {**os.environ, **default_env(), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path)}
        assert "TORCHINDUCTOR_CACHE_DIR" in agents_for(spec, elsewhere).note
    finally:
        ForkServer.stop_all()


def test_a_server_waited_for_that_fails_is_refused_with_its_own_reason(tmp_path, monkeypatch):
    """A launch whose environment adds a variable read at import waits for a server still
    importing (its imports may have written it). A server that fails meanwhile is refused for
    the session with its own reason, which is the launch's note; one given another value of
    a variable the server started with is decided at once, without waiting."""
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("MKL_NUM_THREADS", "1")
    bad, base = ("no_such_module_here",), _spec(tmp_path, {})
    try:
        ForkServer.prestart(())
        server = ForkServer.running[()]
        other = {**os.environ, **default_env(), "MKL_NUM_THREADS": "2"}
        assert "MKL_NUM_THREADS" in agents_for(base, other).note
        assert not server.ready  # still importing: nothing to wait for
        ForkServer.prestart(bad)
        added = {**os.environ, **default_env(), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path)}
        note = agents_for(dataclasses.replace(base, preload=bad), added).note
        assert "importing no_such_module_here failed: ModuleNotFoundError" in note
        assert bad not in ForkServer.running and note.endswith(ForkServer.refused[bad])
    finally:
        ForkServer.stop_all()


def test_server_off_nodes_and_slurm_keep_todays_agents(tmp_path):
    env = dict(os.environ)
    assert isinstance(agents_for(_spec(tmp_path, {}, nproc=1, fork=False), env), OneRank)
    assert not isinstance(agents_for(_spec(tmp_path, {}, nnodes=2), env), Forked)
    assert not isinstance(agents_for(_spec(tmp_path, {}, launcher="slurm"), env), Forked)


def test_a_preload_module_that_starts_a_thread_is_refused_by_name(tmp_path, monkeypatch):
    (tmp_path / "spins_up.py").write_text(
        "import threading, time\nthreading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
    )
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    with pytest.raises(ResumeEquivError, match="preload module 'spins_up' starts threads"):
        ForkServer.get(("spins_up",))
    # a server that cannot start fails no launch: each starts plainly and says why
    spec = dataclasses.replace(_spec(tmp_path, {}), preload=("spins_up",))
    agents = agents_for(spec, {**os.environ, **default_env()})
    assert isinstance(agents, Standalone)
    assert "started without the fork server: --resume-equiv-preload: preload module " in agents.note
    ForkServer.stop_all()


# Follows torch 2.13: torch.cuda.is_available() calls torch._C._cuda_getDeviceCount(), which
# poisons fork (torch/csrc/cuda/Module.cpp) but leaves is_initialized() False; the fake
# (tests/fakes.py, FakeDeviceModule) does the same in the server that imports this module.
POISONS_FORK = """
import torch
from fakes import FakeDeviceModule

torch.cuda = FakeDeviceModule("cuda", 2)
torch.cuda.is_available()  # what many libraries do at import
"""


def test_a_preload_that_poisons_fork_starts_every_launch_plainly_with_a_note(
    tmp_path, probe, monkeypatch
):
    """Checking is_initialized() alone let such a server start, and then every forked rank
    failed with "Cannot re-initialize CUDA in forked subprocess"."""
    (tmp_path / "poisons_fork.py").write_text(POISONS_FORK)
    # torch's default check; lightning's import sets the NVML one, which does not poison
    monkeypatch.delenv("PYTORCH_NVML_BASED_CUDA_CHECK", raising=False)
    path = [str(tmp_path), TESTS, os.environ.get("PYTHONPATH", "")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in path if p))
    run_dir = tmp_path / "run-poisoned"
    run_dir.mkdir(mode=0o700)
    spec = LaunchSpec(
        "poisoned",
        Target("script", str(probe)),
        str(run_dir),
        2,
        1,
        120.0,
        LaunchContext("launch", str(run_dir), "cpu", "gloo", seed=0),
        {"PROBE_DIR": str(tmp_path), "PROBE_TAG": "poisoned"},
        str(tmp_path),
        fork_server=True,
        preload=("poisons_fork",),
    )
    result = launch(spec)
    assert result.ok, [result.tail(result.rank_log(r)) for r in range(2)]
    assert result.note == (
        "started without the fork server: --resume-equiv-preload: importing 'poisons_fork' "
        "poisons fork for cuda (something asked the driver, e.g. torch.cuda.is_available()); "
        "a forked rank could not use the device: import it in the training code instead"
    )
    assert ForkServer.refused[("poisons_fork",)]  # the next launch does not try again
    assert ("poisons_fork",) not in ForkServer.running


def test_preload_setting_takes_module_names():
    assert parse_preload("transformers, diffusers.models") == ("transformers", "diffusers.models")
    with pytest.raises(ValueError, match="'not a module' is not a module name"):
        parse_preload("not a module")


def test_sigkill_of_pytest_leaves_no_server_and_no_rank(trainers, tmp_path):
    code, _ = interrupt_long_test(trainers, tmp_path, signal.SIGKILL)
    assert code == -signal.SIGKILL
    deadline = time.monotonic() + 30  # a bounded wait for the kernel's death signals
    while processes_mentioning(str(trainers.path)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_mentioning(str(trainers.path)) == []


def test_a_prestarted_server_serves_and_its_refusal_comes_at_first_use():
    """`prestart` (at collection, when resume tests will launch) starts the server without
    waiting for its imports; the first launch waits for it. A server that cannot serve has
    written why and left by then: its own reason is read, not a bare exit status."""
    try:
        ForkServer.prestart(())
        server = ForkServer.running[()]
        assert ForkServer.get(()) is server and server.ready
        ForkServer.prestart(())  # one per preload list
        assert ForkServer.running[()] is server
        ForkServer.prestart(("no_such_module_here",))
        ForkServer.running[("no_such_module_here",)].proc.wait(timeout=120)
        with pytest.raises(ResumeEquivError, match="importing no_such_module_here failed"):
            ForkServer.get(("no_such_module_here",))
        assert ("no_such_module_here",) not in ForkServer.running
    finally:
        ForkServer.stop_all()


def test_the_server_starts_before_collection_and_stays_only_for_resume_tests(pytester, monkeypatch):
    """At the session's start, on a device named outright with the server on, the server
    starts (its imports run beside collection's); once collected it stays when a selected
    test will launch (a resume test, or one using `torchrun`), and is stopped when none will.
    `--co`, `device=auto`, the server off and the pytest-xdist controller start none."""
    calls = []
    monkeypatch.setattr(
        ForkServer, "prestart", classmethod(lambda cls, p: calls.append(("start", p)))
    )
    monkeypatch.setattr(
        ForkServer, "stop_one", classmethod(lambda cls, p: calls.append(("stop", p)))
    )
    pytester.makepyfile(
        test_marked="""
        from pytest_resume_equiv import resume_equivalent

        @resume_equivalent(steps=2, split=1, nproc=1)
        def test_marked():
            pass

        def test_plain():
            pass

        def test_uses_torchrun(torchrun):
            pass
        """
    )
    cpu = "--resume-equiv-device=cpu"
    runs = (
        ([cpu, "--co"], []),
        ([cpu, "-k", "plain"], [("start", ()), ("stop", ())]),
        (["--resume-equiv-device=auto"], []),
        ([cpu, "--resume-equiv-fork-server=off", "-k", "plain or marked"], []),
        # preload modules wait for collection's end (a conftest may set what they read)
        ([cpu, "--resume-equiv-preload=json", "-k", "marked"], [("start", ("json",))]),
        ([cpu, "-k", "uses_torchrun"], [("start", ())] * 2),  # the fixture launches too
        ([cpu, "-n", "1", "-k", "marked"], []),  # the controller; its worker is a subprocess
    )
    for args, expected in runs:
        calls.clear()
        pytester.runpytest_inprocess(*args)
        assert calls == expected, args


def test_a_server_started_before_a_module_changed_an_import_time_variable_is_replaced(
    monkeypatch,
):
    """A test module may set such a variable when it is imported, after the session's start:
    a launch could not be forked from the server started before it, so collection's end
    replaces it."""
    try:
        ForkServer.prestart(())
        first = ForkServer.running[()]
        ForkServer.prestart(())
        assert ForkServer.running[()] is first  # nothing changed: kept
        monkeypatch.setenv("PYTORCH_NO_CUDA_MEMORY_CACHING", "1")
        ForkServer.prestart(())
        second = ForkServer.running[()]
        assert second is not first and first.proc.poll() is not None
        assert second.env["PYTORCH_NO_CUDA_MEMORY_CACHING"] == "1"
        ForkServer.stop_one(())
        assert () not in ForkServer.running and second.proc.poll() is not None
    finally:
        ForkServer.stop_all()
