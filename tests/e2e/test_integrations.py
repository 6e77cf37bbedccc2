"""The HF Trainer, Lightning and accelerate adapters: their rules, then each example run as a
user runs it (a passing resume test and a caught bug, on CPU with gloo)."""

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers import CPU

from pytest_resume_equiv.rank.run_dir import signature_path
from pytest_resume_equiv.signature import Signature, read_signature

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


class Recorder:
    """Stands in for the in-rank API inside an adapter module: keeps what it was given."""

    def __init__(self, monkeypatch, module, in_test_run=True):
        self.records, self.watched = [], {}
        ctx = SimpleNamespace(phase="uninterrupted") if in_test_run else None
        monkeypatch.setattr(module, "context", lambda: ctx)
        monkeypatch.setattr(module, "record", lambda step, **v: self.records.append((step, v)))
        monkeypatch.setattr(module, "watch", lambda **objects: self.watched.update(objects))


def test_hf_callback_records_each_logged_step_once(monkeypatch):
    hf = pytest.importorskip("pytest_resume_equiv.integrations.hf")
    seen = Recorder(monkeypatch, hf)
    callback = hf.ResumeEquivCallback(ema="ema-model")
    inner_opt, inner_sched = object(), object()
    callback.on_train_begin(
        None,
        None,
        None,
        model="model",
        optimizer=SimpleNamespace(optimizer=inner_opt),  # accelerate's wrappers are unwrapped
        lr_scheduler=SimpleNamespace(scheduler=inner_sched),
    )
    assert seen.watched == {
        "model": "model",
        "optimizer": inner_opt,
        "scheduler": inner_sched,
        "ema": "ema-model",
    }
    control = SimpleNamespace(should_log=False)
    callback.on_step_end(None, None, control)
    assert control.should_log  # every step is logged in a test run, whatever logging_steps says
    state = SimpleNamespace(global_step=1)
    logs = {"loss": 0.5, "learning_rate": 0.01, "grad_norm": 2.0, "epoch": 0.1}
    callback.on_log(None, state, control, logs=logs)
    callback.on_log(None, state, control, logs=logs)  # the same step again: recorded once
    callback.on_log(None, state, control, logs={"eval_loss": 0.3})  # evaluation: not a step
    callback.on_log(None, SimpleNamespace(global_step=2), control, logs={"train_runtime": 1.0})
    assert seen.records == [(1, {"loss": 0.5, "lr": 0.01, "grad_norm": 2.0})]


def test_hf_callback_does_nothing_outside_a_test_run(monkeypatch):
    hf = pytest.importorskip("pytest_resume_equiv.integrations.hf")
    seen = Recorder(monkeypatch, hf, in_test_run=False)
    callback = hf.ResumeEquivCallback()
    callback.on_train_begin(None, None, None, model="model")
    control = SimpleNamespace(should_log=False)
    callback.on_step_end(None, None, control)
    callback.on_log(None, SimpleNamespace(global_step=1), control, logs={"loss": 1.0})
    assert (control.should_log, seen.records, seen.watched) == (False, [], {})


def test_lightning_callback_records_optimizer_steps_only(monkeypatch):
    lightning = pytest.importorskip("pytest_resume_equiv.integrations.lightning")
    torch = pytest.importorskip("torch")
    seen = Recorder(monkeypatch, lightning)
    module = torch.nn.Linear(2, 1, bias=False)
    module.weight.grad = torch.tensor([[3.0, 4.0]])
    optimizer = torch.optim.SGD(module.parameters(), lr=0.25)
    second = torch.optim.SGD(module.parameters(), lr=0.5)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1)
    trainer = SimpleNamespace(
        optimizers=[optimizer, second],
        lr_scheduler_configs=[SimpleNamespace(scheduler=scheduler)],
        global_step=0,
    )
    callback = lightning.ResumeEquivCallback()
    callback.on_train_start(trainer, module)
    assert seen.watched == {
        "model": module,
        "optimizer": optimizer,
        "optimizer1": second,
        "scheduler": scheduler,
    }
    loss = {"loss": torch.tensor(0.75)}
    callback.on_train_batch_end(trainer, module, loss, None, 0)  # accumulating: no step yet
    callback.on_before_optimizer_step(trainer, module, optimizer)
    trainer.global_step = 1
    callback.on_train_batch_end(trainer, module, loss, None, 1)
    callback.on_train_batch_end(trainer, module, loss, None, 2)  # still step 1: accumulating
    assert seen.records == [(1, {"loss": 0.75, "lr": 0.25, "grad_norm": 5.0})]


def _baseline_signatures(root: Path) -> list[Signature]:
    """Rank 0's signature of each shared uninterrupted launch under `root`."""
    (shared,) = root.glob("**/.resume-equiv/runs/*/shared")  # the rootdir: the example's
    runs = [p for p in shared.iterdir() if p.is_dir() and not p.name.endswith("-control")]
    return [read_signature(signature_path(str(run_dir), 0)) for run_dir in runs]


EXAMPLE_RUNS = {
    # example: (framework, split, steps, phrases of the caught bug's report, the explicit
    # call's keys, the objects watched with it)
    "hf_trainer": (
        "transformers",
        3,
        6,
        (  # the data replayed leads; the RNG restored then advanced by the loader is noted
            "likely cause (data order): step 4: the batches the DataLoader yielded (auto:batch, "
            "by content over every rank's batch) show the resumed run consumed at steps 4-6 the "
            "samples of steps 1-3",
        ),
        {"loss", "lr", "grad_norm"},
        {"model", "optimizer", "scheduler"},
    ),
    "lightning": (
        "lightning",
        3,
        6,
        ("rank 1: at the resume point rng:cpu equals rank 0's saved state",),
        {"loss", "lr", "grad_norm"},
        {"model", "optimizer", "scheduler"},
    ),
    "accelerate": (
        "accelerate",
        5,
        7,
        (  # told from the batches the DataLoader yielded (auto:batch) or its inputs (auto:data)
            "likely cause (data order): step 6: the ",
            "by content over every rank's batch) show step 6 consumed the batch of step 5 again",
        ),
        {"sample_ids"},
        {"model", "optimizer", "scheduler", "loader"},
    ),
}


@pytest.mark.parametrize("example", sorted(EXAMPLE_RUNS))
@pytest.mark.long(70)
def test_example_resumes_exactly_and_catches_its_bug(pytester, example):
    """The example's script has no plugin line: it resumes exactly and its bug is caught
    from what every rank recorded by itself (the loss of each backward, the inputs of the
    outermost module, the optimizer and scheduler the framework built); its explicit-call
    variant (a callback, or `watch(accelerator=...)`) records more beside."""
    framework, split, steps, caught, explicit, watched_objects = EXAMPLE_RUNS[example]
    if importlib.util.find_spec(framework) is None:
        pytest.skip(f"needs {framework}")
    # find_spec, not importorskip: pytester would drop the modules imported here at teardown,
    # and a later import of transformers would load numpy's C extension a second time
    shutil.copytree(EXAMPLES / example, pytester.path / example)
    script = (pytester.path / example / "train.py").read_text()
    assert not re.search(r"^(import|from) pytest_resume_equiv", script, re.M)  # only behind a flag
    # no teeth check: the caught bug already shows the recorded values depend on the RNG
    args = ("-rP", "--resume-equiv-keep=all", "--resume-equiv-rng-mutation=false")
    result = pytester.runpytest_subprocess(*CPU, *args, example)
    text = result.stdout.str()
    result.assert_outcomes(passed=3)
    assert f"split {split}: equal on all 2 ranks over {steps - split} steps" in text
    assert f"split {split}: first divergence at step {split + 1}" in text
    for phrase in caught:
        assert phrase in text, phrase
    found = re.findall(r"^recorded automatically: (.*)$", text, re.M)
    assert found, text
    for keys in found:  # auto:batch besides where a DataLoader fed the model
        assert {"auto:data", "auto:loss"} <= set(keys.split(", ")), keys
    assert any(
        {"watch:lr_scheduler", "watch:model", "watch:optimizer"} <= set(keys.split(", "))
        for keys in found
    ), found
    by_keys = {}
    for signature in _baseline_signatures(pytester.path):
        assert signature.complete
        assert [step for step, _ in signature.steps] == list(range(1, steps + 1))
        first = signature.steps[0][1]
        assert {"auto:loss", "auto:data"} <= set(first)
        by_keys[frozenset(k for k in first if ":" not in k)] = first
    # the zero-edit launch, and the explicit call's
    assert set(by_keys) == {frozenset(), frozenset(explicit)}, set(by_keys)
    watched = {
        key[len("watch:") :].split(".")[0]
        for key in by_keys[frozenset(explicit)]
        if key.startswith("watch:")
    }
    assert watched_objects <= watched, watched
    plain = {key.split(".")[0] for key in by_keys[frozenset()] if key.startswith("watch:")}
    assert plain == {"watch:model", "watch:optimizer", "watch:lr_scheduler"}, plain


def test_watching_an_accelerator_watches_what_save_state_saves(in_rank, monkeypatch):
    """`req.watch(accelerator=...)` before `prepare()`: each record reads the prepared model,
    optimizer and scheduler (unwrapped), and the objects registered for checkpointing."""
    if importlib.util.find_spec("accelerate") is None:
        pytest.skip("needs accelerate")
    import torch
    from accelerate import Accelerator

    import pytest_resume_equiv as req
    from pytest_resume_equiv.integrations.accelerate import checkpointed_objects
    from pytest_resume_equiv.rank.context import current

    class Counter:
        def __init__(self):
            self.n = 0

        def state_dict(self):
            return {"n": self.n}

        def load_state_dict(self, state):
            self.n = state["n"]

    in_rank()
    assert req.context() is not None  # read now: accelerate must not see a distributed launch
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name)
    accelerator = Accelerator(cpu=True)
    req.watch(accelerator=accelerator)
    assert current().watched.audit() == {}  # nothing prepared yet
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    counter = Counter()
    accelerator.register_for_checkpointing(counter)
    objects = checkpointed_objects(accelerator)
    assert list(objects) == ["model", "optimizer", "scheduler", "checkpointed"]
    assert type(objects["optimizer"]) is torch.optim.SGD  # accelerate's wrapper unwrapped
    assert objects["scheduler"] is scheduler.scheduler and objects["checkpointed"] is counter
    audit = current().watched.audit()
    assert {"model.params", "optimizer.lr", "scheduler.last_lr", "checkpointed.state"} <= set(audit)
    counter.n = 3
    assert current().watched.audit()["checkpointed.state"] == {"n": 3}


def test_code_that_runs_in_ranks_never_imports_pytest():
    """Ranks are plain training processes: the in-rank API, the bootstrap and the adapters
    load without pytest (and the API without torch)."""
    modules = ["pytest_resume_equiv.rank.bootstrap", "pytest_resume_equiv.integrations"]
    for optional, adapter in (
        ("transformers", "hf"),
        ("lightning", "lightning"),
        ("accelerate", "accelerate"),
    ):
        if importlib.util.find_spec(optional) is not None:
            modules.append(f"pytest_resume_equiv.integrations.{adapter}")
    code = (
        "import sys, pytest_resume_equiv\n"
        "assert 'torch' not in sys.modules, 'the in-rank API imported torch'\n"
        f"for name in {modules!r}: __import__(name)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pytest', '_pytest')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
