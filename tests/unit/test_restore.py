"""Inside a rank: the restore log, the resume-point snapshot and the draw trace, in-process."""

import os
import random
import sys

import numpy as np
import pytest
import torch
from fakes import DEFAULT_SEED, FakeDeviceModule

import pytest_resume_equiv as req
from pytest_resume_equiv.rank.context import current
from pytest_resume_equiv.signature import read_signature


@pytest.fixture
def audited(in_rank):
    """A rank with the bootstrap's audit installed (restores logged, forwards hooked), in a
    fresh rank state; taken out again at the end."""

    def enter(**kwargs):
        run_dir = in_rank(**kwargs)
        current().install()
        return run_dir

    yield enter
    current().uninstall()


def saved():
    """A CPU RNG state as a checkpoint gives it: read without `torch.get_rng_state`, so never
    one this process read itself (setting such a state again is isolation, no restore)."""
    return torch.default_generator.get_state()


def signature(run_dir):
    current().close()
    return read_signature(os.path.join(run_dir, "signatures", "rank-0.jsonl"))


def test_restores_are_logged_with_their_line_and_named_as_the_audit_names_them(audited):
    run_dir = audited(phase="resumed", split=2)
    model = torch.nn.Linear(2, 2)
    state = model.state_dict()
    cpu = saved()
    owned, made = torch.Generator().manual_seed(1), _line()
    here = f"tests/unit/test_restore.py:{_line() + 1}"
    model.load_state_dict(state)
    torch.set_rng_state(cpu)
    np.random.set_state(np.random.RandomState(7).get_state())
    random.setstate(random.Random(7).getstate())
    owned.set_state(owned.get_state())
    req.watch(model=model)  # after the load: the log still names it as watched
    req.record(3, loss=1.0)
    log = signature(run_dir).restores
    assert [(e["call"], e["what"]) for e in log] == [
        ("Generator.manual_seed", f"rng:generator tests/unit/test_restore.py:{made} #0"),
        ("Module.load_state_dict", "watch:model"),
        ("torch.set_rng_state", "rng:cpu"),
        ("numpy.random.set_state", "rng:numpy"),
        ("random.setstate", "rng:python"),
        ("Generator.set_state", f"rng:generator tests/unit/test_restore.py:{made} #0"),
    ]
    assert log[1]["at"] == here and log[1]["after_step"] is None


def test_device_stream_restores_are_named_by_device(audited):
    """Without an accelerator torch queues these calls until the device is initialized: the
    log still names the stream each one restores, as the audit names it."""
    run_dir = audited(phase="resumed", split=2)
    torch.cuda.manual_seed_all(3)
    torch.cuda.set_rng_state(saved(), device=torch.device("cuda", 1))
    req.record(3, loss=1.0)
    assert [(e["call"], e["what"]) for e in signature(run_dir).restores] == [
        ("torch.cuda.manual_seed_all", "rng:cuda:*"),
        ("torch.cuda.set_rng_state", "rng:cuda:1"),
    ]


@pytest.fixture
def cuda(monkeypatch):
    """A fake torch.cuda with 4 devices, not initialised (tests/fakes.py)."""
    fake = FakeDeviceModule("cuda", 4, real=torch.cuda)
    monkeypatch.setattr(torch, "cuda", fake)
    return fake


def test_device_restores_name_the_device_however_it_is_given(audited, cuda):
    """An index, "cuda:1", torch.device("cuda") (the current device) or nothing; through
    torch.cuda or torch.cuda.random (HF Trainer's path): each names the stream it restores."""
    cuda.set_device(3)  # initialises, as torch.cuda.set_device does
    run_dir = audited(phase="resumed", split=2)
    state = saved()
    torch.cuda.set_rng_state(state, "cuda:1")
    torch.cuda.set_rng_state(state, torch.device("cuda"))
    torch.cuda.set_rng_state(state)
    torch.cuda.random.set_rng_state(state, 2)
    torch.cuda.random.set_rng_state_all([state])
    req.record(3, loss=1.0)
    assert [(e["call"], e["what"]) for e in signature(run_dir).restores] == [
        ("torch.cuda.set_rng_state", "rng:cuda:1"),
        ("torch.cuda.set_rng_state", "rng:cuda:3"),
        ("torch.cuda.set_rng_state", "rng:cuda:3"),
        ("torch.cuda.set_rng_state", "rng:cuda:2"),
        ("torch.cuda.set_rng_state_all", "rng:cuda:*"),
    ]


def test_naming_a_restore_does_not_initialise_the_device(audited, cuda):
    """An unindexed seed or state before initialisation is queued by torch and applied at
    it, to device 0: named so, without `current_device()` (which would initialise CUDA in a
    device=cpu run, and open a context on NPU 0 in every rank)."""
    run_dir = audited(phase="resumed", split=2)
    torch.cuda.manual_seed(3)
    torch.cuda.set_rng_state(saved())
    torch.cuda.seed()
    torch.cuda.seed_all()
    req.record(3, loss=1.0)
    assert not cuda.is_initialized() and cuda.calls == []
    assert [(e["call"], e["what"]) for e in signature(run_dir).restores] == [
        ("torch.cuda.manual_seed", "rng:cuda:0"),
        ("torch.cuda.set_rng_state", "rng:cuda:0"),
        ("torch.cuda.seed", "rng:cuda:0"),
        ("torch.cuda.seed_all", "rng:cuda:*"),
    ]
    cuda.current_device()  # initialisation applies them to device 0, as named
    assert cuda.default_generators[0].initial_seed() != DEFAULT_SEED


def test_torch_manual_seed_is_logged_as_reseeding_every_device(audited, cuda):
    """torch/random.py: `torch.manual_seed` seeds the CPU and every cuda/xpu/privateuse1
    device (queued until initialisation)."""
    run_dir = audited(phase="resumed", split=2)
    torch.manual_seed(1)
    req.record(3, loss=1.0)
    assert [(e["call"], e["what"]) for e in signature(run_dir).restores] == [
        ("torch.manual_seed", "rng:cpu"),
        ("torch.manual_seed", "rng:cuda:*"),
    ]
    cuda.current_device()
    assert {g.initial_seed() for g in cuda.default_generators} == {1}


def _set_cuda_rng_state(new_state, device=-1):
    """Megatron's way (megatron/core/tensor_parallel/random.py): the default generator set
    directly, not through torch.cuda.set_rng_state."""
    idx = torch.cuda.current_device() if device == -1 else device
    default_generator = torch.cuda.default_generators[idx]
    default_generator.set_state(new_state)


def test_a_default_generator_set_directly_is_a_restore(audited, cuda):
    run_dir = audited(phase="resumed", split=2)
    cuda.current_device()  # initialisation: the watching tuple is put in place then
    state = cuda.default_generators[1].get_state()  # a read is no restore
    _set_cuda_rng_state(state, 1)
    torch.cuda.default_generators[2].manual_seed(7)
    torch.cuda.manual_seed_all(3)  # torch's own fetches inside are not logged twice
    req.record(3, loss=1.0)
    assert [(e["call"], e["what"]) for e in signature(run_dir).restores] == [
        ("torch.cuda.default_generators[1].set_state", "rng:cuda:1"),
        ("torch.cuda.default_generators[2].manual_seed", "rng:cuda:2"),
        ("torch.cuda.manual_seed_all", "rng:cuda:*"),
    ]
    assert sys.getprofile() is None
    current().uninstall()
    assert type(cuda.default_generators) is tuple


def test_libraries_named_like_torch_are_not_torch(audited):
    """torch's folder is .../site-packages/torch: torch_npu, torchvision, torchtitan,
    torchtune, torchao and torchdata sit beside it, and their re-seeds are the user's."""
    run_dir = audited(phase="resumed", split=2)
    site = os.path.dirname(os.path.dirname(torch.__file__))
    for library in ("torch_npu", "torchtitan"):
        code = compile(
            "def reseed():\n    torch.manual_seed(1)\n",
            os.path.join(site, library, "utils.py"),
            "exec",
        )
        namespace = {"torch": torch}
        exec(code, namespace)
        namespace["reseed"]()
    req.record(3, loss=1.0)
    log = signature(run_dir).restores
    assert [e["call"] for e in log] == ["torch.manual_seed", "torch.manual_seed"]
    assert "torch_npu/utils.py:2 (from tests/unit/test_restore.py:" in log[0]["at"]


def test_npu_streams_are_seeded_when_the_plugin_imports_torch_npu(in_rank, tmp_path, monkeypatch):
    """Without torch's device autoload torch_npu is not imported until the bootstrap imports
    it for an npu launch: the rank's seed must reach its streams all the same."""
    package = tmp_path / "site" / "torch_npu"
    package.mkdir(parents=True)
    package.joinpath("__init__.py").write_text(
        "import torch\nfrom fakes import FakeDeviceModule\n"
        "torch.npu = FakeDeviceModule('npu', 2)  # torch_npu registers torch.npu on import\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.delitem(sys.modules, "torch_npu", raising=False)
    try:
        in_rank(device_kind="npu")
        current().install(seed=11)
        npu = torch.npu
        npu.current_device()
        assert {g.initial_seed() for g in npu.default_generators} == {11}
    finally:
        current().uninstall()
        sys.modules.pop("torch_npu", None)
        if hasattr(torch, "npu"):
            del torch.npu


def test_rng_states_torch_puts_back_itself_are_not_restores(audited):
    """fork_rng and activation checkpointing's recompute set RNG states again: torch's own
    bookkeeping, not a restore of the user's (it would read as a re-seeding after the load)."""
    run_dir = audited(phase="resumed", split=2)
    layer = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.5))
    x = torch.ones(3, 2, requires_grad=True)
    with torch.random.fork_rng(devices=[]):
        torch.rand(2)
    out = torch.utils.checkpoint.checkpoint(layer, x, use_reentrant=False)
    out.sum().backward()
    torch.set_rng_state(saved())  # the user's, as from a checkpoint: logged
    req.record(3, loss=1.0)
    assert [(e["call"], e["what"]) for e in signature(run_dir).restores] == [
        ("torch.set_rng_state", "rng:cpu"),
    ]


def test_a_state_the_users_code_read_and_sets_again_is_no_restore(audited, cuda):
    """Lightning's `isolate_rng()` (around its sanity check) and an evaluation put between a
    get and a set give back a state this process read itself: no restore, so a stream the
    trainer never restored is not named "restored wrong" (a newcomer's Lightning trial). A
    state this process never read (a checkpoint's) is a restore; the plugin's own reads of
    every stream are not the user's."""
    run_dir = audited(phase="resumed", split=2)
    req.record(2, loss=1.0)  # the plugin reads every stream's state for its audit
    after_audit = saved()
    torch.rand(1)
    cpu, python, numpy_state = torch.get_rng_state(), random.getstate(), np.random.get_state()
    devices = torch.cuda.get_rng_state_all()
    torch.rand(3), random.random(), np.random.rand()
    torch.set_rng_state(cpu)
    random.setstate(state=python)  # by keyword, too
    np.random.set_state(numpy_state)
    torch.cuda.set_rng_state_all(devices)
    torch.set_rng_state(after_audit)  # read by the plugin only: a restore
    req.record(3, loss=1.0)
    assert [(e["call"], e["what"]) for e in signature(run_dir).restores] == [
        ("torch.set_rng_state", "rng:cpu"),
    ]


def test_the_resume_point_is_the_first_forward_with_the_draws_since_the_last_restore(audited):
    run_dir = audited(phase="resumed", split=2)
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.5))
    state = saved()
    torch.rand(3)  # before the last restore: cannot have advanced what it restored
    torch.set_rng_state(state)
    loader = torch.utils.data.DataLoader(list(range(4)), shuffle=True)
    next(iter(loader))  # the iterator draws its base seed, then the sampler draws
    model(torch.ones(1, 2))
    req.record(3, loss=1.0)
    (point,) = signature(run_dir).resume_points
    assert point["split"] == 2 and point["at"].startswith("first forward of Sequential at ")
    assert point["rng"]["cpu"] and point["checkpoint"] is None
    ops = [(d["op"], d["stream"]) for d in point["draws"]]
    assert ("random_", "rng:cpu") in ops and ("rand", "rng:cpu") not in ops
    assert all(
        d["at"].startswith("tests/unit/test_restore.py:") or "dataloader" in d["at"]
        for d in point["draws"]
    )


def test_a_resume_point_call_after_an_eval_forward_is_the_point(audited):
    """Rank 0 evaluates before its training step, which calls resume_point(): the snapshot is
    taken at that call (where the uninterrupted run takes it), not at the eval's forward, and
    says a forward came first; the eval's draws are in its window."""
    run_dir = audited(phase="resumed", split=2)
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.5))
    torch.set_rng_state(saved())
    model.eval()
    torch.randint(0, 4, (2,))  # the eval samples its batch from the CPU RNG
    model(torch.ones(1, 2))  # the eval's forward
    model.train()
    here = f"tests/unit/test_restore.py:{_line() + 1}"
    req.resume_point()
    model(torch.ones(1, 2))
    req.record(3, loss=1.0)
    (point,) = signature(run_dir).resume_points
    assert point["at"] == here
    assert point["forward_before"].startswith("first forward of Sequential at ")
    assert ("randint", "rng:cpu") in [(d["op"], d["stream"]) for d in point["draws"]]


def test_without_a_resume_point_call_the_first_forward_is_the_point(audited):
    run_dir = audited(phase="resumed", split=2)
    model = torch.nn.Linear(2, 2)
    model(torch.ones(1, 2))
    model(torch.ones(1, 2))
    req.record(3, loss=1.0)
    req.record(4, loss=1.0)
    (point,) = signature(run_dir).resume_points
    assert point["at"].startswith("first forward of Linear at ") and "forward_before" not in point


def test_the_uninterrupted_run_takes_it_after_recording_the_split(audited):
    run_dir = audited(phase="uninterrupted", split=2, steps=4)
    model = torch.nn.Linear(2, 2)
    for step in (1, 2, 3):
        req.resume_point()  # explicit: forwards no longer count
        model(torch.ones(1, 2))
        if step == 2:
            random.random()  # after record(1), before record(2): not in the window
        req.record(step, loss=float(step))
        if step == 2:
            np.random.rand()  # in the window: between record(split) and the resume point
    (point,) = signature(run_dir).resume_points
    assert point["split"] == 2 and point["at"].startswith("tests/unit/test_restore.py:")
    assert [(d["op"], d["stream"]) for d in point["draws"]] == [("rand", "rng:numpy")]


def test_plugin_seeding_and_the_teeth_mutation_are_not_restores(audited):
    run_dir = audited(phase="teeth", split=2)
    with current().restores.unlogged():
        torch.manual_seed(5)
    req.record(3, loss=1.0)  # the teeth phase mutates every stream after its first record
    req.record(4, loss=1.0)
    assert signature(run_dir).restores == []


def test_an_ignored_generator_is_listed_not_audited(audited):
    run_dir = audited(phase="uninterrupted")
    kept, left = torch.Generator(), torch.Generator()
    req.track(left, "eval noise", ignore=True)
    req.record(1, loss=1.0)
    sig = signature(run_dir)
    streams = {k for k in sig.steps[0][1] if k.startswith("rng:generator")}
    assert not any("eval noise" in k for k in streams) and len(streams) == 1
    assert sig.ignored == ["rng:generator eval noise"]
    del kept


def _line():
    import sys

    return sys._getframe(1).f_lineno
