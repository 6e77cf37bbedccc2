"""The HF Trainer and Lightning adapters: their callbacks' rules, then each example run as a
user runs it (a passing resume test and a caught bug, on CPU with gloo)."""

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers import CPU

from pytest_resume_equiv.rank.layout import signature_path
from pytest_resume_equiv.signature import Signature, read_signature

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


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


def _baseline_signature(root: Path) -> Signature:
    """Rank 0's signature of the shared uninterrupted launch under `root`."""
    shared = root / "runpytest-0" / "resume-equiv-shared"
    (run_dir,) = [p for p in shared.iterdir() if p.is_dir() and not p.name.endswith("-control")]
    return read_signature(signature_path(str(run_dir), 0))


@pytest.mark.parametrize(
    "example, framework, caught",
    [
        ("hf_trainer", "transformers", "likely cause (cpu RNG): rank 0, step 4"),
        ("lightning", "lightning", "rank 1's cpu RNG state equals rank 0's"),
    ],
)
@pytest.mark.long(55)
def test_example_resumes_exactly_and_catches_its_bug(pytester, example, framework, caught):
    if importlib.util.find_spec(framework) is None:
        pytest.skip(f"needs {framework}")
    # find_spec, not importorskip: pytester would drop the modules imported here at teardown,
    # and a later import of transformers would load numpy's C extension a second time
    shutil.copytree(EXAMPLES / example, pytester.path / example)
    # no teeth check: the caught bug already shows the recorded values depend on the RNG
    args = ("-rP", "--resume-equiv-keep=all", "--resume-equiv-rng-mutation=false")
    result = pytester.runpytest_subprocess(*CPU, *args, example)
    result.assert_outcomes(passed=2)
    text = result.stdout.str()
    assert "split 3: equal on all 2 ranks over 3 steps" in text
    assert "split 3: first divergence at step 4" in text
    assert caught in text
    signature = _baseline_signature(pytester.path)
    assert signature.complete
    assert [step for step, _ in signature.steps] == [1, 2, 3, 4, 5, 6]
    first = signature.steps[0][1]
    assert {key for key in first if ":" not in key} == {"loss", "lr", "grad_norm"}
    watched = {key[len("watch:") :].split(".")[0] for key in first if key.startswith("watch:")}
    assert watched == {"model", "optimizer", "scheduler"}


def test_code_that_runs_in_ranks_never_imports_pytest():
    """Ranks are plain training processes: the in-rank API, the bootstrap and the adapters
    load without pytest (and the API without torch)."""
    modules = ["pytest_resume_equiv.rank.bootstrap", "pytest_resume_equiv.integrations"]
    for optional, adapter in (("transformers", "hf"), ("lightning", "lightning")):
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
