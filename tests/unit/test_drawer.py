"""The failed tests' pictures are drawn by a process of their own beside the next tests, and
all of them before the session ends (report/drawer.py, report/picture.py)."""

import pytest

from pytest_resume_equiv.report import drawer as drawer_module
from pytest_resume_equiv.report.drawer import Drawer
from pytest_resume_equiv.report.picture import Line, Panel, Picture

PNG = b"\x89PNG\r\n\x1a\n"


def _picture(path):
    line = Line(((1, 1.0), (2, 0.5)), "-o", "uninterrupted")
    mark = (1.5, "resumed after step 1")
    return Picture(str(path), (Panel("loss (rank 0)", (line,), mark),), "step", 2.2)


def test_a_picture_travels_as_one_json_line_and_comes_back_the_same(tmp_path):
    picture = _picture(tmp_path / "plot-split1.png")
    text = picture.to_json()
    assert "\n" not in text and Picture.from_json(text) == picture


def test_every_picture_handed_over_is_drawn_by_finish_and_the_process_is_gone(tmp_path):
    pytest.importorskip("matplotlib")
    drawer = Drawer()
    paths = [drawer.later(_picture(tmp_path / f"plot-split{n}.png")) for n in (2, 3)]
    assert paths == [str(tmp_path / "plot-split2.png"), str(tmp_path / "plot-split3.png")]
    proc = drawer._proc
    assert proc is not None  # drawn elsewhere, not in this process
    drawer.finish()
    for path in paths:
        with open(path, "rb") as f:
            assert f.read(8) == PNG
    assert proc.poll() == 0 and drawer.failed == []
    drawer.finish()  # a second finish (nothing handed over) returns at once


def test_a_picture_that_cannot_be_drawn_is_named_and_the_others_still_are(tmp_path):
    pytest.importorskip("matplotlib")
    (tmp_path / "plot-split2.png").mkdir()  # a folder where the picture goes
    drawer = Drawer()
    drawer.later(_picture(tmp_path / "plot-split2.png"))
    drawer.later(_picture(tmp_path / "gone" / "plot-split4.png"))  # its folder was not kept
    drawer.later(_picture(tmp_path / "plot-split3.png"))
    drawer.finish()
    assert len(drawer.failed) == 1
    assert drawer.failed[0].startswith(f"{tmp_path / 'plot-split2.png'}: IsADirectoryError")
    assert (tmp_path / "plot-split3.png").read_bytes()[:8] == PNG
    assert not (tmp_path / "gone").exists()


def test_a_drawing_process_that_dies_is_said_and_a_later_picture_is_drawn_here(
    tmp_path, monkeypatch
):
    pytest.importorskip("matplotlib")
    monkeypatch.setattr(drawer_module, "DRAWER", "no_such_module_for_pictures")
    drawer = Drawer()
    drawer._process().wait(timeout=60)  # it could not start its module, and left
    path = drawer.later(_picture(tmp_path / "plot-split2.png"))  # the pipe is broken
    assert (tmp_path / "plot-split2.png").read_bytes()[:8] == PNG and path.endswith("split2.png")
    drawer.finish()
    assert drawer.failed == ["the drawing process ended with exit status 1"]
