"""Settings and plans for unit tests of the planning, scheduling and judging code."""

from pytest_resume_equiv.checks import build_plan
from pytest_resume_equiv.launch.devices import Device
from pytest_resume_equiv.plan import RunRequest
from pytest_resume_equiv.settings import OPTIONS, Resolved, SessionSettings, resolve_test

CPU = Device("cpu", "gloo", 0)


def settings_for(options=None, **marker):
    """A test's settings: the defaults of every option but `options` (name -> value),
    `marker` over them (steps=6, split=3 unless given)."""
    values = {o.name: Resolved(o.default, "default") for o in OPTIONS.values()}
    values.update({k: Resolved(v, "test") for k, v in (options or {}).items()})
    session = SessionSettings(values)
    return resolve_test(session, (), {"steps": 6, "split": 3, **marker})


def plan_for(
    root, command, shared_root=None, device=CPU, request=None, options=None, golden=None, **marker
):
    settings = settings_for(options, **marker)
    request = request or RunRequest(command, seed=7)
    return settings, build_plan(settings, request, device, str(root), shared_root, golden)


def write_run(
    run_dir,
    steps,
    world_size=1,
    rng=lambda step, rank: f"s{step}",
    loss=None,
    ids=None,
    points=(),
    point=lambda split, rank: {"rng": {"cpu": f"s{split}"}, "watch": {"model.params": "w"}},
):
    """The signature files a trainer would leave in `run_dir`, recording `steps`; `loss(step,
    rank)` gives the recorded value (step / 2 by default), `ids(step, rank)` the sample ids
    (none by default); at each split of `points` a resume-point snapshot, `point(split,
    rank)`, taken at the same place in every run."""
    import json
    import os

    from pytest_resume_equiv.rank.encode import encode
    from pytest_resume_equiv.rank.layout import SIGNATURE_FORMAT, SIGNATURE_VERSION
    from pytest_resume_equiv.rank.run_dir import signature_path

    loss = loss or (lambda step, rank: step / 2)
    for rank in range(world_size):
        path = signature_path(str(run_dir), rank)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        head = {"format": SIGNATURE_FORMAT, "version": SIGNATURE_VERSION, "phase": "x", "pid": 1}
        lines = [{**head, "rank": rank, "world_size": world_size}]
        for split in points:
            lines.append({"resume_point": {"split": split, "at": "t.py:1", **point(split, rank)}})
        for step in steps:
            values = {"loss": encode(loss(step, rank), "loss")}
            if ids is not None:
                values["sample_ids"] = ids(step, rank)
            lines.append({"step": step, "values": values, "rng": {"cpu": rng(step, rank)}})
        lines.append({"end": {"records": len(steps)}})
        with open(path, "w") as f:
            f.write("".join(json.dumps(line) + "\n" for line in lines))
