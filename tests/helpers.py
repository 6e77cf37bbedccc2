"""Helpers for the end-to-end tests: the trainers they run, and a process-leak probe."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

CPU = ("-p", "resume_equiv", "--resume-equiv-device=cpu")
"""Arguments that load the plugin and run ranks on CPU with gloo."""

# The trainers every scenario writes into its pytester directory: one loop, one switch per bug.

TRAINERS = """
import atexit
import copy
import os
import shutil
import signal
import threading
import time

import torch
import torch.distributed as dist

import pytest_resume_equiv as req


def _loop(ctx, restore_rng=True, restart=False, save=True, state_rank=None, background=False):
    ctx.init_process_group()
    rank = ctx.rank
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.5), torch.nn.Linear(8, 1))
    # SGD with momentum by hand: the first torch.optim optimizer of a process imports
    # torch._dynamo (about 2 s of CPU per rank), and these trainers test the plugin, not torch
    momentum = [torch.zeros_like(p) for p in model.parameters()]
    torch.manual_seed(100 + rank)
    start = 1
    own = rank if state_rank is None else state_rank
    if ctx.resuming:
        state = torch.load(os.path.join(ctx.checkpoint, f"rank-{own}.pt"), weights_only=True)
        model.load_state_dict(state["model"])
        for buf, saved in zip(momentum, state["momentum"]):
            buf.copy_(saved)
        if restore_rng:
            torch.set_rng_state(state["rng"])
        start = 1 if restart else state["step"] + 1
    for step in range(start, ctx.steps + 1):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        loss.backward()
        with torch.no_grad():
            for p, buf in zip(model.parameters(), momentum):
                dist.all_reduce(p.grad)
                buf.mul_(0.9).add_(p.grad / ctx.world_size)
                p.sub_(0.1 * buf)
                p.grad = None
        req.record(step, loss=loss.item(), weight=model[0].weight)
        if save and ctx.should_save(step):
            path = ctx.checkpoint_for(step)
            os.makedirs(path, exist_ok=True)
            state = {"model": copy.deepcopy(model.state_dict()), "momentum": copy.deepcopy(momentum),
                     "rng": torch.get_rng_state(), "step": step}
            tmp = os.path.join(path, f".rank-{rank}.tmp")
            final = os.path.join(path, f"rank-{own}.pt")

            def write(state=state, tmp=tmp, final=final):
                if background:
                    time.sleep(5)  # a slow background write, still running when the job dies
                torch.save(state, tmp)
                os.replace(tmp, final)  # atomic: the last writer wins, nothing torn

            if background:
                threading.Thread(target=write, daemon=True).start()
            else:
                write()
        if background and step > ctx.steps // 2:
            # training goes on while the save runs, slowly enough that interrupt="kill"
            # lands before the last step: 20 ms steps outran the host's look under load
            time.sleep(0.5)
    dist.destroy_process_group()


def train(ctx):
    _loop(ctx)


def train_forgets_cpu_rng(ctx):
    _loop(ctx, restore_rng=False)


def train_restarts_from_zero(ctx):
    _loop(ctx, restart=True)


def train_never_saves(ctx):
    _loop(ctx, save=False)


def train_rank1_raises(ctx):
    if ctx.rank == 1:
        raise ValueError("boom on rank 1")
    _loop(ctx)


def rank1_killed(ctx):
    ctx.init_process_group()
    print(f"rank {ctx.rank} says hello", flush=True)
    dist.barrier()  # every rank has spoken
    if ctx.rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)  # the others wait until torchrun stops them


def _steps_after_resume(ctx):
    for step in range(ctx.split + 1 if ctx.resuming else 1, ctx.steps + 1):
        yield step
        if ctx.should_save(step):
            os.makedirs(ctx.checkpoint_for(step), exist_ok=True)


def toothless(ctx):
    if ctx.resuming:  # restores its random state exactly...
        torch.set_rng_state(torch.load(os.path.join(ctx.checkpoint, "rng.pt"), weights_only=True))
    for step in _steps_after_resume(ctx):
        torch.nn.functional.dropout(torch.ones(4), 0.5)  # ...draws random numbers...
        req.record(step, value=float(step))  # ...but records nothing that depends on them
        if ctx.should_save(step):
            os.makedirs(ctx.checkpoint_for(step), exist_ok=True)
            torch.save(torch.get_rng_state(), os.path.join(ctx.checkpoint_for(step), "rng.pt"))


def no_randomness(ctx):
    for step in _steps_after_resume(ctx):
        req.record(step, value=float(step))  # draws no random number at all


def nondeterministic(ctx):
    for step in _steps_after_resume(ctx):
        req.record(step, value=int.from_bytes(os.urandom(4), "little"))


def train_state_by_local_rank(ctx):
    # per-rank state keyed by the local rank: on 2 nodes both ranks are local rank 0
    _loop(ctx, state_rank=ctx.local_rank)


def train_saves_in_background(ctx):
    _loop(ctx, background=True)


def train_aborts_at_exit(ctx):
    _loop(ctx)
    # after the work: a teardown abort like gloo's "terminate called without an active exception"
    atexit.register(os.abort)


def hangs_in_collective(ctx):
    ctx.init_process_group()
    if ctx.rank == 0:
        time.sleep(300)  # never joins the collective
    dist.all_reduce(torch.ones(1))


def sleeps_after_start(ctx):
    # tells the test it started, then runs long enough to be interrupted
    with open(os.environ["STARTED_FILE"], "a") as f:
        f.write(f"{ctx.phase} {ctx.rank}\\n")
    time.sleep(300)


def forgets_cpu_rng_and_its_control_sleeps(ctx):
    # the resume diverges; the determinism control then tells the test it started, and runs
    # long enough to be interrupted
    if ctx.run_dir.endswith("-control"):
        with open(os.environ["STARTED_FILE"], "a") as f:
            f.write(f"control {ctx.rank}\\n")
        time.sleep(300)
    _loop(ctx, restore_rng=False)


def hello(ctx):
    print(f"hello from rank {ctx.rank} of {ctx.world_size}")
    req.record(1, rank=ctx.rank)
"""


LONG_TEST = """
from pytest_resume_equiv import resume_equivalent
from trainers import sleeps_after_start

@resume_equivalent(steps=4, split=2, nproc=2)
def test_long(resume_equiv):
    resume_equiv.run(sleeps_after_start)
"""


def interrupt_long_test(trainers, tmp_path, sig) -> tuple[int, str]:
    """A two-rank resume test of a trainer that sleeps once started, interrupted with `sig`
    once every rank began (`interrupt_once_started`); the trainers' folder on PYTHONPATH, in
    front of the branch's own (a replaced PYTHONPATH would run the installed copy)."""
    trainers.makepyfile(test_long=LONG_TEST)
    # Python stacks on SIGUSR1, should it not stop (`where_stuck`)
    trainers.makeconftest(
        "import faulthandler, signal\nfaulthandler.register(signal.SIGUSR1, all_threads=True)\n"
    )
    started = tmp_path / "started.txt"
    path = os.pathsep.join([str(trainers.path), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "STARTED_FILE": str(started), "PYTHONPATH": path}
    return interrupt_once_started(trainers.path, [*CPU, "test_long.py"], env, started, 2, sig)


AS_IN_A_TERMINAL = (
    "import signal, sys\n"
    "import pytest\n"
    "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
    "sys.exit(pytest.main(sys.argv[1:]))\n"
)
"""`python -m pytest` as a terminal starts it, Ctrl-C raising KeyboardInterrupt, whatever the
suite inherited: a background job of a non-interactive shell (a CI step, `cmd &`) ignores
SIGINT, POSIX keeps an ignored signal ignored across fork and exec, and Python installs its
KeyboardInterrupt handler only where SIGINT is at its default. The inner pytest then ignored
the test's Ctrl-C and ran on until the test's timeout (issue 39: 2 of 3 clean-clone suite
runs, each one started in the background)."""


def interrupt_once_started(cwd, args, env, started, ranks, sig) -> tuple[int, str]:
    """Run pytest with `args` in `cwd`; once `ranks` lines are in the file `started` (every
    rank began), send `sig` to pytest alone, as a terminal or a CI runner would. Returns
    pytest's exit status and output.

    The inner pytest starts as from a terminal (`AS_IN_A_TERMINAL`), and gets a base temporary
    directory of its own, as pytester gives one: with pytest's default it would take a
    numbered directory beside every other session's of the user and, at its session's end,
    delete the old ones, the last suite run's whole base directory among them (27 s for a
    1.5 GB one under load, inside the test's 60 s)."""
    basetemp = os.path.join(str(cwd), "interrupted-basetemp")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            AS_IN_A_TERMINAL,
            *args,
            "-p",
            "no:cacheprovider",
            f"--basetemp={basetemp}",
        ],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not (started.exists() and len(started.read_text().splitlines()) == ranks):
            assert proc.poll() is None, proc.stdout.read()
            assert time.monotonic() < deadline, "the ranks never started"
            time.sleep(0.2)
        proc.send_signal(sig)
        try:
            output, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired as exc:
            raise AssertionError(f"pytest did not stop: {where_stuck(proc)}") from exc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode, output


def where_stuck(proc: subprocess.Popen) -> str:
    """A pytest that did not stop: each of its threads' kernel wait channel, its Python stacks
    (faulthandler, registered on SIGUSR1 by the conftest `interrupt_long_test` writes), py-spy's
    view of it and its children when py-spy is installed, and what it printed."""
    pid = proc.pid
    with open(f"/proc/{pid}/status") as f:
        ignored = [line.strip() for line in f if line.startswith(("SigIgn", "SigCgt"))]
    threads = []
    for task in sorted(os.listdir(f"/proc/{pid}/task")):
        try:
            with (
                open(f"/proc/{pid}/task/{task}/wchan") as f,
                open(f"/proc/{pid}/task/{task}/comm") as g,
            ):
                threads.append(f"{task} {g.read().strip()} {f.read().strip()}")
        except OSError:
            continue
    os.kill(pid, signal.SIGUSR1)
    time.sleep(2)
    spy = shutil.which("py-spy")
    dump = ""
    if spy:
        found = subprocess.run(
            [spy, "dump", "--subprocesses", "--pid", str(pid)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        dump = found.stdout + found.stderr
    os.killpg(pid, signal.SIGKILL)
    output = proc.communicate(timeout=30)[0]
    return (
        ", ".join(ignored)
        + "; threads (tid comm wchan): "
        + "; ".join(threads)
        + "\n"
        + dump
        + "\noutput:\n"
        + output
    )


def processes_mentioning(text: str) -> list[int]:
    """Live processes whose environment or command line contains `text` (Linux /proc)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        for part in ("environ", "cmdline"):
            try:
                with open(f"/proc/{name}/{part}", "rb") as f:
                    if text.encode() in f.read():
                        found.append(int(name))
                        break
            except OSError:
                continue
    return found


def section_of(text: str, name: str) -> str:
    """The part of a pytest run's output about one test (its failure or error section)."""
    start = text.find(f"_ {name} _")
    if start < 0:
        start = text.find(f"_ ERROR at setup of {name} _")
    if start < 0:
        return ""
    end = text.find("\n___", start + 1)
    return text[start : end if end > 0 else None]


def check_rng_report(path):
    """The JSON report of test_rng carries the conclusions, not only the first divergence."""
    report = json.loads(path.read_text())
    (test,) = report["tests"]
    assert (test["test"], test["outcome"], test["ranks"], test["splits"]) == (
        "test_rng.py::test_rng",
        "failed",
        2,
        [3],
    )
    (run,) = test["runs"]
    assert [launch["name"] for launch in run["launches"]] == [
        "uninterrupted",
        "resumed-split3",
        "uninterrupted-control",
    ]
    (verdict,) = run["verdicts"]
    first = verdict["first_divergence"]
    assert (verdict["equal"], first["step"], first["rank"], first["key"]) == (False, 4, 0, "loss")
    # the report carries the conclusions, not only the first divergence
    assert verdict["likely_cause"]["class"] == "never restored"
    assert "was never restored" in verdict["likely_cause"]["cause"]
    assert run["teeth"] == {"status": "cancelled", "why": "the resume from step 3 diverged"}
    assert run["control"] == {"ran": True, "deterministic": True, "first_difference": ""}
    assert run["failure"] == "split 3: step 4, rank 0, 'loss'" and run["warnings"] == []
    assert [x["role"] for x in run["launches"]] == ["uninterrupted", "resumed", "control"]


# The resume-point gate and the causes (issue 30, item 3)

HELD_CAUSES = (
    "computed differently after an exact resume",
    "gradient accumulation",
    "data order",
    "skipped again",
    "dataloader workers",
    "resumed-process compute",
    "saved wrong by the launch that wrote it",
)
"""The classes of cause that may stand when the resume point matched bit for bit: what the
audit does not see (state outside the watched objects, the data order after the first step,
worker seeds, another kernel in a fresh process), or a state that the launch which wrote the
checkpoint saved wrong (the gate compares with that launch). Any other blames the save or
restore of an audited object that matched there."""


def gate_contradictions(report_path):
    """Failed resumes of a session's JSON report (`--resume-equiv-report`) whose resume point
    held and whose likely cause still blames an audited object's save or restore."""
    with open(report_path, encoding="utf-8") as f:
        report = json.load(f)
    found = []
    for test in report["tests"]:
        for run in test["runs"]:
            for verdict in run["verdicts"]:
                gate = next((f for f in verdict["facts"] if f.get("kind") == "gate"), {})
                cause = verdict.get("likely_cause") or {}
                if gate.get("status") == "held" and cause and cause["class"] not in HELD_CAUSES:
                    found.append(f"{test['test']}: {cause['class']}: {cause['cause']}")
    return found


def held_gates(report_path):
    """How many failed resumes of the report had a resume point that held."""
    with open(report_path, encoding="utf-8") as f:
        report = json.load(f)
    return sum(
        1
        for test in report["tests"]
        for run in test["runs"]
        for verdict in run["verdicts"]
        if verdict["status"] == "failed"
        and any(f.get("kind") == "gate" and f.get("status") == "held" for f in verdict["facts"])
    )


def hangs_after_destroy(ctx):
    """The doctor's backend probe, then a rank that never leaves (a destructor stuck after
    teardown): the doctor's teardown row must fail on it."""
    from pytest_resume_equiv.doctor.ranks import all_reduce

    all_reduce(ctx)
    time.sleep(300)


CRASH_ROOT = "/runs/u/checkpoints"
"""Where the hand-made file events of the crash tests happen."""


def file_event(op, path, after=4, to=None, thread=None):
    """One file event of a rank's log, as rank/files.py writes it (the crash tests' input)."""
    found = {"op": op, "path": path, "after_step": after}
    if to:
        found["to"] = to
    if thread:
        found["thread"] = thread
    return found
