"""Bad input: every mistake gets a clear error for the test that made it, and nothing else.

One pytest session holds a test per mistake plus a healthy test; each must fail or error with
its own message, the healthy one must pass, and pytest must never print INTERNALERROR. The
trainer's mistakes happen in the resumed launch only (`--bad=...` is a resume argument), so
every such test shares one uninterrupted launch and the whole session costs a few launches.
"""

import json

import pytest
from helpers import CPU, section_of

BAD_TRAINER = """
import atexit, os, sys

import torch

import pytest_resume_equiv as req

def flag(name, default):
    return next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith(f"--{name}=")), default)


bad, save_to = flag("bad", "none"), flag("save-to", None)
ctx = req.context()
torch.manual_seed(0)
w, start = torch.zeros(3), 1
if ctx.resuming:
    state = torch.load(os.path.join(ctx.checkpoint, "state.pt"), weights_only=True)
    w, start = state["w"], state["step"] + 1
    torch.set_rng_state(state["rng"])
steps = list(range(start, int(flag("max-steps", ctx.steps)) + 1))
if bad == "order":
    steps.reverse()
for step in steps:
    w = w + torch.randn(3)
    if bad != "no-record":
        req.record(step, w=w, loss=float(w.sum()))
    if bad == "twice":
        req.record(step, w=w, loss=float(w.sum()))
    if bad == "unstorable":
        req.record(step, handle=open(__file__))
    if ctx.should_save(step):
        path = os.path.join(save_to, str(step)) if save_to else ctx.checkpoint_for(step)
        os.makedirs(path, exist_ok=True)
        state = {"w": w, "step": step, "rng": torch.get_rng_state()}
        torch.save(state, os.path.join(path, "state.pt"))


def damage_signature():
    # Runs after the plugin closed this rank's signature: the file is what the plugin reads.
    path = os.path.join(ctx.run_dir, "signatures", f"rank-{ctx.rank}.jsonl")
    text = open(path).read()
    if bad == "corrupt":
        text = text.replace('{"rng":', '{"rng" ', 1)  # the first step line (after any restores)
    elif bad == "truncate":
        text = text.split("\\n")[0] + "\\n" + text.split("\\n")[1][:20]
    elif bad == "version":
        text = text.replace('"version":2', '"version":99', 1)
    elif bad == "delete":
        os.remove(path)
        return
    else:
        return
    with open(path, "w") as f:
        f.write(text)


atexit.register(damage_signature)
"""

BAD_TESTS = """
import pytest
from pytest_resume_equiv import resume_equivalent

CMD = ["bad_trainer.py"]


def go(resume_equiv, bad=None, **kwargs):
    resume_args = [f"--bad={bad}"] if bad else []
    resume_equiv.run(CMD, resume_args=resume_args, **kwargs)


@resume_equivalent(steps=5, split=2, nproc=1, rng_mutation=False)
def test_healthy(resume_equiv):
    go(resume_equiv)


@resume_equivalent(steps=5, split=2, nprocs=1)
def test_unknown_keyword(resume_equiv):
    go(resume_equiv)


@resume_equivalent(steps="five", split=2, nproc=1)
def test_steps_wrong_type(resume_equiv):
    go(resume_equiv)


@resume_equivalent(steps=5, split=5, nproc=1)
def test_split_not_below_steps(resume_equiv):
    go(resume_equiv)


@resume_equivalent(steps=5, split=[2, 2], nproc=1)
def test_duplicate_splits(resume_equiv):
    go(resume_equiv)


@resume_equivalent(steps=5, split=2, nproc=0)
def test_no_ranks(resume_equiv):
    go(resume_equiv)


@resume_equivalent(steps=5, split=2, nproc=1, env={"SEED": 1})
def test_env_not_strings(resume_equiv):
    go(resume_equiv)


@resume_equivalent(steps=5, split=2, nproc=1, interrupt="pause")
def test_unknown_interrupt_mode(resume_equiv):
    go(resume_equiv)


@resume_equivalent(steps=5, split=2, nproc=1, tolerance="tight")
def test_bad_tolerance(resume_equiv):
    go(resume_equiv)


@resume_equivalent(steps=5, split=2, nproc=1)
def test_unknown_placeholder(resume_equiv):
    resume_equiv.run(["bad_trainer.py", "--steps={stepz}"])


@resume_equivalent(steps=5, split=2, nproc=1)
def test_command_is_a_string(resume_equiv):
    resume_equiv.run("python bad_trainer.py")


@resume_equivalent(steps=5, split=2, nproc=1, rng_mutation=False)
def test_checkpoint_template_never_written(resume_equiv):
    # the trainer saves where --save-to says; checkpoint= names another place
    resume_equiv.run(
        ["bad_trainer.py", "--save-to={run_dir}/ckpts"],
        checkpoint="{run_dir}/elsewhere/step_{split}",
    )


@resume_equivalent(steps=5, split=2, nproc=1, rng_mutation=False)
def test_trainer_never_records(resume_equiv):
    go(resume_equiv, "no-record")


@resume_equivalent(steps=5, split=2, nproc=1, rng_mutation=False)
def test_unstorable_value(resume_equiv):
    go(resume_equiv, "unstorable")


@resume_equivalent(steps=5, split=2, nproc=1, rng_mutation=False)
def test_corrupted_signature(resume_equiv):
    go(resume_equiv, "corrupt")


@resume_equivalent(steps=5, split=2, nproc=1, rng_mutation=False)
def test_truncated_signature(resume_equiv):
    go(resume_equiv, "truncate")


@resume_equivalent(steps=5, split=2, nproc=1, rng_mutation=False)
def test_missing_signature(resume_equiv):
    go(resume_equiv, "delete")


@resume_equivalent(steps=5, split=2, nproc=1, rng_mutation=False)
def test_unknown_signature_version(resume_equiv):
    go(resume_equiv, "version")


@resume_equivalent(steps=5, split=2, nproc=1, rng_mutation=False)
def test_step_recorded_twice(resume_equiv):
    go(resume_equiv, "twice")


@resume_equivalent(steps=5, split=2, nproc=1, rng_mutation=False)
def test_steps_out_of_order(resume_equiv):
    go(resume_equiv, "order")


@resume_equivalent(steps=5, split=2, nproc=1, rng_mutation=False)
def test_rolling_checkpoint_path(resume_equiv):
    # passes, without a warning: the path could be rolling, but this trainer saves once
    resume_equiv.run(CMD, checkpoint="{run_dir}/rolling")


@resume_equivalent(steps=5, split=2, nproc=1, rng_mutation=False, interrupt="stop")
def test_stop_with_a_command_that_ignores_steps(resume_equiv):
    # passes (its one save is at the split), warning that the first launch trained on
    resume_equiv.run(CMD + ["--max-steps=5"])


@resume_equivalent(steps=5, split=2, nproc=1, rng_mutation=False)
def test_resume_args_not_strings(resume_equiv):
    resume_equiv.run(CMD, resume_args=["--bad", 1])


@resume_equivalent(steps=5, split=2, nproc=1, rng_mutation=False)
def test_run_env_not_a_dict(resume_equiv):
    resume_equiv.run(CMD, env=["SEED=1"])
"""

EXPECTED = {
    # test name: (outcome, the words its report must contain)
    "test_unknown_keyword": ("error", "unknown keyword 'nprocs' (did you mean 'nproc'?)"),
    "test_steps_wrong_type": ("error", "invalid steps='five': must be an int >= 2"),
    "test_split_not_below_steps": ("error", "every split must be an int with 1 <= split < steps=5"),
    "test_duplicate_splits": ("error", "split"),
    "test_no_ranks": ("error", "invalid nproc=0"),
    "test_env_not_strings": ("error", "env"),
    "test_unknown_interrupt_mode": ("error", "interrupt='pause'"),
    "test_bad_tolerance": ("error", "tolerance='tight'"),
    "test_unknown_placeholder": ("failed", "unknown placeholder {stepz} in command argument"),
    "test_command_is_a_string": ("failed", "command must be a list of strings, got str"),
    "test_checkpoint_template_never_written": (
        "failed",
        "the trainer must save there after step 2, or pass checkpoint= with the path it does "
        "use. Its run directory holds: ckpts",
    ),
    "test_trainer_never_records": ("failed", "never calls pytest_resume_equiv.record"),
    "test_unstorable_value": ("failed", "record(step=3) value 'handle' is a _io.TextIOWrapper"),
    "test_corrupted_signature": ("failed", "rank-0.jsonl: line 6 is not JSON"),
    "test_truncated_signature": ("failed", "left a truncated signature"),
    "test_missing_signature": ("failed", "no signature file"),
    "test_unknown_signature_version": ("failed", "signature format version 99 is not one"),
    "test_step_recorded_twice": ("failed", "recorded steps 3-5 more than once"),
    "test_steps_out_of_order": ("failed", "out of order"),
    "test_resume_args_not_strings": ("failed", "resume_args must hold only strings, got 1"),
    "test_run_env_not_a_dict": ("failed", "run(env=...) must be a dict of str to str"),
}


@pytest.mark.long(70)
def test_each_mistake_fails_its_own_test_with_a_clear_message(pytester):
    pytester.makepyfile(bad_trainer=BAD_TRAINER, test_mistakes=BAD_TESTS)
    result = pytester.runpytest_subprocess(*CPU, "-rfE", "--resume-equiv-report=report.json")
    text = result.stdout.str()
    assert "INTERNALERROR" not in text
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed") == 3, text[-3000:]
    assert "wrote to it again" not in text
    report = json.loads((pytester.path / "report.json").read_text())
    rolling = next(t for t in report["tests"] if t["test"].endswith("test_rolling_checkpoint_path"))
    assert rolling["runs"][0]["warnings"] == []
    stop = next(t for t in report["tests"] if t["test"].endswith("_that_ignores_steps"))
    (warning,) = stop["runs"][0]["warnings"]
    assert warning.startswith(
        "split 2: the launch 'interrupted-split2' (interrupt=\"stop\") should end at step 2 but "
        "recorded up to step 5: its command ignores {steps}"
    )
    assert len(EXPECTED) >= 15
    summary = {}
    for line in result.stdout.lines:
        for kind in ("FAILED", "ERROR"):
            prefix = f"{kind} test_mistakes.py::"
            if line.startswith(prefix):
                name = line[len(prefix) :].split(" ", 1)[0]
                summary[name] = "failed" if kind == "FAILED" else "error"
    assert summary == {name: outcome for name, (outcome, _) in EXPECTED.items()}, text[-3000:]
    for name, (_, words) in EXPECTED.items():
        section = section_of(text, name)
        assert words in section, f"{name}: report lacks {words!r}:\n{section[-1500:]}"
        assert "During handling of the above exception" not in section
        assert "Traceback (most recent call last)" not in section or name == "test_unstorable_value"
