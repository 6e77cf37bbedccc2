"""A resume's picture for a trainer with no `record` call: the loss its `backward()` got,
recorded automatically, is what it draws (a newcomer's trainer failed with no picture)."""

import json

from plan_helpers import write_run

from pytest_resume_equiv.rank.encode import encode
from pytest_resume_equiv.rank.run_dir import signature_path
from pytest_resume_equiv.report.plot import AUTO_LOSS, LOSS_KEY, split_picture
from pytest_resume_equiv.signature import read_run


def _auto_only(run_dir, loss):
    """A run whose steps hold only the automatic loss: two backward() calls a step."""
    write_run(run_dir, range(1, 5))
    path = signature_path(str(run_dir), 0)
    lines = [json.loads(x) for x in open(path).read().splitlines()]
    for line in lines:
        if "step" in line:
            step = line["step"]
            line["values"] = {LOSS_KEY: [encode(loss(step), "l"), encode(loss(step), "l")]}
    with open(path, "w") as f:
        f.write("".join(json.dumps(x) + "\n" for x in lines))
    return read_run(str(run_dir), 1)


def test_a_trainer_that_records_nothing_gets_its_automatic_loss_drawn(tmp_path):
    base = _auto_only(tmp_path / "u", lambda step: 1.0 / step)
    resumed = _auto_only(tmp_path / "r", lambda step: 1.0 / step if step < 3 else 9.0)
    picture = split_picture(base, resumed, 2, 0, str(tmp_path / "plot-split2.png"))
    assert picture is not None
    (panel,) = picture.panels
    assert panel.title == f"{AUTO_LOSS} (rank 0)"
    uninterrupted, resumed_line = panel.lines
    assert uninterrupted.points == ((1, 2.0), (2, 1.0), (3, 2 / 3), (4, 0.5))  # both summed
    assert resumed_line.points[2:] == ((3, 18.0), (4, 18.0))
    assert panel.mark == (2.5, "resumed after step 2")
