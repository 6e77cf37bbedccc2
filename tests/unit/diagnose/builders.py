"""Hand-made signatures for the diagnosis rules (resume-point snapshots, restore logs, draws,
file events and step records written by hand, no launches), and the coverage rows: each test
says which rule it shows firing (`fires`) and which look-alike it tells apart
(`look_alike`); test_registry.py fails for a rule of the registry without both."""

from __future__ import annotations

from typing import Callable, Optional, TypeVar

from pytest_resume_equiv.compare.diff import compare_runs
from pytest_resume_equiv.diagnose import Diagnosis, diagnose
from pytest_resume_equiv.rank.encode import encode
from pytest_resume_equiv.signature import Signature

SPLIT, STEPS = 3, 6

# Coverage rows ------------------------------------------------------------------------------

FIRES: set[str] = set()
"""Rule ids a test shows firing on its own fixture."""
LOOK_ALIKES: set[tuple[str, Optional[str]]] = set()
"""(rule id, the rule that wins instead, or None when none does) a test tells apart."""
NOTED: set[str] = set()
"""Note ids a test shows said."""

Test = TypeVar("Test", bound=Callable)


def fires(*rules: str) -> Callable[[Test], Test]:
    """The test shows each of `rules` naming the cause of its own fixture."""

    def mark(test: Test) -> Test:
        FIRES.update(rules)
        return test

    return mark


def look_alike(rule: str, wins: Optional[str]) -> Callable[[Test], Test]:
    """The test gives evidence that resembles `rule`'s, where `wins` names the cause instead
    (None: no rule of the stage does)."""

    def mark(test: Test) -> Test:
        LOOK_ALIKES.add((rule, wins))
        return test

    return mark


def noted(*notes: str) -> Callable[[Test], Test]:
    """The test shows each of `notes` said beside a cause."""

    def mark(test: Test) -> Test:
        NOTED.update(notes)
        return test

    return mark


def named(d: Optional[Diagnosis], rule: str, bug_class: str, words: str, fix: str = "") -> None:
    """`d` was named by `rule`, under `bug_class`, its cause saying `words` and its fix `fix`
    (an empty fix: the class has none)."""
    assert d is not None, f"no cause where {rule} was expected"
    assert d.rule == rule, (d.rule, d.text())
    assert d.bug_class == bug_class, (d.bug_class, d.text())
    assert words in d.cause, d.cause
    if fix:
        assert fix in d.fix, d.fix
    else:
        assert d.fix == "", d.fix
    assert d.text().count("Fix:") == (1 if fix else 0)


# Signatures ---------------------------------------------------------------------------------


def point(rng=None, watch=None, draws=(), restores=0, checkpoint=None, time_ns=100, at=None):
    """A resume-point snapshot at step SPLIT: `draws` as (op, stream, line, restores before it,
    [time_ns])."""
    return {
        "split": SPLIT,
        "at": at or "train.py:50",
        "time_ns": time_ns,
        "rng": {"cpu": "c0", **(rng or {})},
        "watch": watch or {},
        "checkpoint": checkpoint,
        "draws": [
            {"op": op, "stream": stream, "at": at, "after_restores": after, "shape": None}
            | ({"time_ns": when[0]} if when else {})
            for op, stream, at, after, *when in draws
        ],
        "restores": restores,
    }


def restore(call, what, at="train.py:20"):
    """A restore-log entry."""
    return {"call": call, "what": what, "at": at, "after_step": None}


def saved(op, after_step, time_ns, path="/ckpt/step_3/rank-0.pt", thread=None):
    """A file event of the run that saved the checkpoint."""
    event = {"op": op, "path": path, "after_step": after_step, "time_ns": time_ns}
    return {**event, "thread": thread} if thread else event


LOAD = restore("torch.load", "file /ckpt/step_3/rank-0.pt")
SEED = restore("torch.manual_seed", "rng:cpu", at="train.py:5")
SET_CPU = restore("torch.set_rng_state", "rng:cpu", at="train.py:30")
DCP_LOAD = restore("torch.distributed.checkpoint.load", "file /ckpt/step_3")


def run(phase, steps, values, rank=0, points=(), restores=(), files=(), world_size=1):
    """One rank's signature: `values(step)` -> the step's record (user keys and audit keys)."""
    header = {"rank": rank, "world_size": world_size, "phase": phase}
    recorded = [
        (s, {k: encode(v, k) if ":" not in k else v for k, v in values(s).items()}) for s in steps
    ]
    return Signature(
        f"{phase}/rank-{rank}.jsonl",
        header,
        recorded,
        complete=True,
        restores=list(restores),
        resume_points=list(points),
        files=list(files),
    )


def diagnosed(base: dict[int, Signature], res: dict[int, Signature]) -> Optional[Diagnosis]:
    """diagnose() of two runs of STEPS steps resumed after SPLIT."""
    cmp = compare_runs(base, res, SPLIT, STEPS)
    assert not cmp.equal
    return diagnose(cmp, base, res)


def diagnosis(
    base_point, res_point, restores, base_values=None, res_values=None, files=(), res_files=()
):
    """Diagnose a one-rank resume (steps 4-6 of 6) with these resume points and restore log;
    by default its loss and CPU stream differ from step 4 on."""
    base_values = base_values or (lambda s: {"loss": s / 2, "rng:cpu": f"c{s}"})
    res_values = res_values or (lambda s: {"loss": s / 3, "rng:cpu": f"x{s}"})
    base = {0: run("uninterrupted", range(1, 7), base_values, points=[base_point], files=files)}
    res = {
        0: run(
            "resumed",
            range(4, 7),
            res_values,
            points=[res_point],
            restores=restores,
            files=res_files,
        )
    }
    return diagnosed(base, res)


def without_points(base_values, res_values, ranks=(0,)):
    """Diagnose runs that took no resume-point snapshot: the first divergent step decides."""
    base = {r: run("uninterrupted", range(1, 7), base_values, rank=r) for r in ranks}
    res = {r: run("resumed", range(4, 7), res_values, rank=r) for r in ranks}
    return diagnosed(base, res)


def inputs(step):
    """The model's inputs at `step`, by content (4 samples a step)."""
    return [1000 * step + k for k in range(4)]


def auto_runs(res_inputs, res_steps=range(4, 7), res_rng=None, res_point=None, loaded=None):
    """An exact resume point (the gate held), the resumed run given `res_inputs(step)`;
    `loaded`: (the uninterrupted run's, the resumed run's) batches a DataLoader yielded."""

    def values(batch, rng, yielded=None):
        return lambda s: {
            "auto:loss": [s / 2],
            "auto:data": batch(s),
            "rng:cpu": rng(s),
            **({"auto:batch": yielded(s)} if yielded else {}),
        }

    base_loaded, res_loaded = loaded or (None, None)
    base = {
        0: run(
            "uninterrupted",
            range(1, 7),
            values(inputs, lambda s: f"c{s}", base_loaded),
            points=[point()],
        )
    }
    res = {
        0: run(
            "resumed",
            res_steps,
            values(res_inputs, res_rng or (lambda s: f"c{s}"), res_loaded),
            points=[res_point or point(restores=1)],
            restores=[LOAD],
        )
    }
    return base, res


def params(step):
    """A watched module's parameters as they are after `step`."""
    return {"w": {"hash": f"h{step}", "norm": encode(float(step), "n")}}
