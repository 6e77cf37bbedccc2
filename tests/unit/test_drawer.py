"""The failed tests' pictures are drawn beside the next tests, and all of them before the
session ends (report/drawer.py)."""

import threading

import pytest

from pytest_resume_equiv.report.drawer import Drawer
from pytest_resume_equiv.report.plot import Line, Panel, Picture


def _picture(path):
    line = Line(((1, 1.0), (2, 0.5)), "-o", "uninterrupted")
    return Picture(
        str(path), (Panel("loss (rank 0)", (line,), (1.5, "resumed after step 1")),), "step", 2.2
    )


def test_every_queued_picture_is_drawn_by_finish_and_off_the_callers_thread(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    drawn_in = []
    import pytest_resume_equiv.report.drawer as drawer_module

    real = drawer_module.draw
    monkeypatch.setattr(
        drawer_module, "draw", lambda p: drawn_in.append(threading.current_thread()) or real(p)
    )
    drawer = Drawer()
    paths = [drawer.later(_picture(tmp_path / f"plot-split{n}.png")) for n in (2, 3)]
    assert paths == [str(tmp_path / "plot-split2.png"), str(tmp_path / "plot-split3.png")]
    drawer.finish()
    for path in paths:
        with open(path, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert drawn_in and threading.main_thread() not in drawn_in
    assert drawer.failed == []
    drawer.finish()  # a second finish (nothing queued) returns at once


def test_a_picture_that_cannot_be_drawn_is_named_and_the_others_still_are(tmp_path):
    pytest.importorskip("matplotlib")
    drawer = Drawer()
    drawer.later(_picture(tmp_path / "gone" / "plot-split2.png"))  # no such folder
    good = drawer.later(_picture(tmp_path / "plot-split3.png"))
    drawer.finish()
    assert len(drawer.failed) == 1 and drawer.failed[0].startswith(
        f"{tmp_path / 'gone' / 'plot-split2.png'}: FileNotFoundError"
    )
    assert (tmp_path / "plot-split3.png").stat().st_size > 0 and good.endswith("split3.png")
