"""interrupt="crash" beyond the last save's default points, without torchrun: every save
crashed (`crash_saves="all"`), points sampled by seed (`crash_points=N`), and one point rerun
alone by its id (`--resume-equiv-crash-point`)."""

import pytest
from helpers import CRASH_ROOT as ROOT
from helpers import file_event as event
from plan_helpers import plan_for, settings_for
from test_crash_points import ATOMIC, saving_run

from pytest_resume_equiv.checks.base import Outcome, Verdict
from pytest_resume_equiv.checks.crash import Crash
from pytest_resume_equiv.checks.crash_points import find_points, only_point, point_split
from pytest_resume_equiv.checks.crash_table import CrashTable
from pytest_resume_equiv.errors import ResumeEquivError, SettingError
from pytest_resume_equiv.marker import parse_marker
from pytest_resume_equiv.option_values import parse_crash_point
from pytest_resume_equiv.plan import RunRequest
from pytest_resume_equiv.signature import Signature

CRASH = {"steps": 6, "split": [2, 4], "interrupt": "crash"}


def ids(points):
    return [p.id for p in points]


def test_a_point_is_named_by_its_split_kind_index_thread_and_mode():
    points = find_points(saving_run(ATOMIC), 4, (2, 4), None, "/runs/u", ("kill", "power"))
    assert ids(points) == [
        "s4.event0",
        "s4.event0.power",
        "s4.event3",
        "s4.event3.power",
        "s4.written4",
        "s4.written4.power",
        "s4.event5",
        "s4.event5.power",
        "s4.returned5",
        "s4.returned5.power",
    ]
    files = [event("open", f"{ROOT}/step_4/meta.json"), event("open", "x.bin", thread="w")]
    background = find_points(saving_run(files), 4, (2, 4), "all", "/runs/u")
    assert "s4.event0.background" in ids(background)


def test_n_points_are_drawn_from_all_of_them_the_same_for_the_same_seed():
    run = saving_run(ATOMIC)
    every = ids(find_points(run, 4, (2, 4), ["all", "pointer"], "/runs/u"))
    draws = {seed: ids(find_points(run, 4, (2, 4), 3, "/runs/u", seed=seed)) for seed in range(6)}
    assert all(len(d) == 3 and set(d) <= set(every) for d in draws.values())
    again = ids(find_points(run, 4, (2, 4), 3, "/runs/u", seed=2))
    assert again == draws[2]  # reproducible
    assert len({tuple(d) for d in draws.values()}) > 1  # and the seed changes them
    assert len(ids(find_points(run, 4, (2, 4), 50, "/runs/u"))) == len(every)


def test_the_point_id_picks_one_point_and_a_wrong_one_lists_them():
    points = find_points(saving_run(ATOMIC), 4, (2, 4), "all", "/runs/u")
    assert ids(only_point(points, "s4.torn1", 4)) == ["s4.torn1"]
    with pytest.raises(ResumeEquivError, match=r"has no such point; its points are s4.event0, "):
        only_point(points, "s4.torn9", 4)
    assert point_split("s2.event0", (2, 4)) == 2
    with pytest.raises(ResumeEquivError, match="one of this test's splits 2, 4"):
        point_split("s3.event0", (2, 4))
    with pytest.raises(ValueError, match="e.g. s4.torn1"):
        parse_crash_point("torn1")
    assert parse_crash_point(" ") is None


@pytest.mark.parametrize(
    "marker, message",
    [
        ({"crash_points": 0}, "invalid crash_points=0: a number of sampled points must be >= 1"),
        ({"crash_saves": "every"}, "invalid crash_saves='every': supported: 'last', 'all'"),
        ({"interrupt": "stop", "crash_saves": "all"}, "crash_saves= applies to interrupt="),
    ],
)
def test_the_new_crash_keywords_are_validated(marker, message):
    with pytest.raises(SettingError, match=message):
        parse_marker((), {**CRASH, **marker})
    assert parse_marker((), {**CRASH, "crash_points": 4}).crash_points == 4
    assert parse_marker((), {**CRASH, "crash_points": [4]}).crash_points == (4,)


def crash_checks(tmp_path, options=None, **marker):
    request = RunRequest(["t.py"], checkpoint="{run_dir}/c")
    _, plan = plan_for(tmp_path, None, options=options, request=request, **marker)
    return [c for c in plan.checks if isinstance(c, Crash)]


def test_every_save_is_crashed_with_its_own_check_and_launch_names(tmp_path):
    last = crash_checks(tmp_path / "a", **CRASH)
    assert [(c.split, c.prefix) for c in last] == [(4, "crash")]
    every = crash_checks(tmp_path / "b", **CRASH, crash_saves="all")
    assert [(c.split, c.prefix, c.label) for c in every] == [
        (2, "crash-split2", "crash at split 2"),
        (4, "crash-split4", "crash at split 4"),
    ]
    assert every[0].full is every[1].full  # one uninterrupted launch for both
    one = crash_checks(tmp_path / "c", {"crash_point": "s2.event0"}, **CRASH)
    assert [c.split for c in one] == [2]


class Said:
    """The part of the judge a crash check talks to before its launches start."""

    def __init__(self, run):
        self.run, self.lines, self.started = run, [], []

    def signatures(self, launch):
        return self.run

    def say(self, text):
        self.lines.append(text)

    def start(self, launch):
        self.started.append(launch.name)


def test_the_launches_are_said_before_they_start_and_sampling_names_its_seed(tmp_path):
    (check,) = crash_checks(tmp_path, {"crash_seed": 5}, **CRASH, crash_points=2)
    judge = Said(saving_run(ATOMIC))
    check.start_points(judge)
    assert judge.lines == ["crash at split 4: 2 crash points, 4 launches"]
    assert judge.started == ["crash-1", "resumed-crash-1", "crash-2", "resumed-crash-2"]
    assert check.sampled == "2 of 12 sampled, seed 5"  # "all" and the pointer's own
    assert [p.row.id for p in check.pairs] == ids(
        find_points(saving_run(ATOMIC), 4, (2, 4), 2, check.full.spec.run_dir, seed=5)
    )


def test_the_first_failing_point_has_a_line_that_reruns_it_alone(tmp_path):
    from pytest_resume_equiv.checks.after_crash import Row

    (check,) = crash_checks(tmp_path, **CRASH)
    row = Row("middle", "rank 0: after x", status="failed", why="crashed", id="s4.event3")
    verdict = Verdict("crash", "failed", "crash at split 4", 4, facts=[check.table([row])])
    outcome = Outcome(None, test_id="tests/test_t.py::test_crash")
    lines = Crash.block(verdict, outcome, "kept")
    assert (
        "  rerun this point alone: pytest 'tests/test_t.py::test_crash' -p resume_equiv "
        "--resume-equiv-device=cpu --resume-equiv-crash-point=s4.event3"
    ) in lines
    assert isinstance(verdict.facts[0], CrashTable)


def test_a_sampled_table_says_how_its_points_were_drawn():
    table = CrashTable(4, [], sampled="2 of 11 sampled, seed 5")
    assert table.lines("crash at split 4")[0] == (
        "crash at split 4: 0 crash points (2 of 11 sampled, seed 5) in the save at step 4"
    )


def test_options_reach_the_test_settings():
    settings = settings_for({"crash_seed": 3, "crash_point": "s3.event0"}, **CRASH)
    assert (settings.crash_seed, settings.crash_point) == (3, "s3.event0")
    assert Signature  # the run helpers build signatures
