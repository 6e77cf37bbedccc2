"""Where run directories live: a folder per session in the keep directory (pytest-xdist workers
share the controller's), removed when nothing is kept, and the keep directory bounded to the
newest sessions that kept anything, never touching a live one. No launch."""

import json
import os
import subprocess
import sys
import threading

import pytest

from pytest_resume_equiv.errors import ResumeEquivWarning, SettingError
from pytest_resume_equiv.launch.keep_dir import (
    KEEP_SESSIONS,
    OWNER_FILE,
    SessionFolder,
    kept_line,
    make_private_dirs,
    new_session_id,
    prune,
)
from pytest_resume_equiv.session import ResumeEquivSession
from pytest_resume_equiv.settings import resolve_session


class Config:
    """What ResumeEquivSession reads of a pytest config; `workerinput` makes it a worker."""

    def __init__(self, rootpath, cli=None, ini=None, inipath=None, workerinput=None):
        self.rootpath = rootpath
        self.inipath = inipath
        self.args = []
        self._cli = cli or {}
        self._ini = ini or {}
        if workerinput is not None:
            self.workerinput = workerinput
            self.workeroutput = {}

    def getini(self, name):
        return self._ini.get(name)

    def getoption(self, name, default=None):
        return self._cli.get(name, default)


class Factory:
    """A TempPathFactory stand-in: pytest's base temporary directory."""

    def __init__(self, path):
        self.path = path

    def getbasetemp(self):
        self.path.mkdir(exist_ok=True)
        return self.path


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def mode(path) -> str:
    return oct(os.stat(path).st_mode & 0o777)


def test_xdist_workers_use_the_controllers_session_folder(tmp_path):
    controller = ResumeEquivSession(Config(tmp_path))
    inputs = [{}, {}]
    for workerinput in inputs:
        controller.for_worker(workerinput)  # pytest_configure_node, per worker
    workers = [ResumeEquivSession(Config(tmp_path, workerinput=w)) for w in inputs]
    folder = controller.folder.path
    assert [w.folder.path for w in workers] == [folder, folder]
    assert os.path.dirname(folder) == str(tmp_path / ".resume-equiv" / "runs")
    assert os.path.basename(folder).endswith(f"-{os.getpid()}")  # the controller's pid
    assert not os.path.exists(tmp_path / ".resume-equiv")  # made on first use only
    # both workers make their first run root at once: one folder, one owner, the controller
    roots = []
    threads = [
        threading.Thread(target=lambda w=w: roots.append(w.run_root("test_x", None)))
        for w in workers
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(os.path.dirname(r) for r in roots) == [folder, folder] and len(set(roots)) == 2
    assert all(os.path.basename(r).startswith("test_x-") and mode(r) == "0o700" for r in roots)
    assert mode(folder) == "0o700"
    with open(os.path.join(folder, OWNER_FILE)) as f:
        assert json.load(f)["pid"] == os.getpid()
    assert workers[0].shared_dir(None) == os.path.join(folder, "shared")
    assert (tmp_path / ".resume-equiv" / ".gitignore").read_text().splitlines()[-1] == "*"


def test_session_ids_sort_by_time():
    early, late = new_session_id(0, 99), new_session_id(3600 * 24 * 400, 7)
    assert (early, late) == ("19700101-000000-99", "19710205-000000-7")
    assert sorted([late, early]) == [early, late]


def test_private_dirs_and_the_gitignore_of_the_topmost_one_made(tmp_path):
    make_private_dirs(str(tmp_path / "a" / "b" / "c"))
    assert [mode(tmp_path / p) for p in ("a", "a/b", "a/b/c")] == ["0o700"] * 3
    assert (tmp_path / "a" / ".gitignore").exists()
    assert not (tmp_path / "a" / "b" / ".gitignore").exists()
    make_private_dirs(str(tmp_path / "a" / "b" / "c"))  # there already: nothing changes
    assert sorted(os.listdir(tmp_path / "a" / "b")) == ["c"]


def test_the_session_folder_goes_when_nothing_is_kept(tmp_path):
    session = ResumeEquivSession(Config(tmp_path))
    root = session.run_root("test_ok", None)
    session.shared_dir(None)
    os.rmdir(root)  # a passing test's root, removed at its teardown
    session.finish()
    assert session.kept_in is None and not os.path.exists(session.folder.path)
    failed = ResumeEquivSession(Config(tmp_path))
    kept = failed.run_root("test_bad", None)
    failed.finish()
    assert failed.kept_in == failed.folder.path and os.path.isdir(kept)
    assert kept_line(failed.kept_in, "failed") == (
        f"resume-equiv: run directories of failed tests kept in {failed.folder.path} (the last "
        f"{KEEP_SESSIONS} sessions are kept; delete {tmp_path / '.resume-equiv' / 'runs'} to clean)"
    )
    assert "run directories of failed and interrupted tests kept in " in kept_line(
        failed.kept_in, "failed", interrupted=True
    )


def _session_folder(keep_dir, name, pid, host="here", content=True):
    folder = keep_dir / name
    folder.mkdir(parents=True)
    (folder / OWNER_FILE).write_text(json.dumps({"host": host, "pid": pid}))
    if content:
        (folder / "test_x-abc").mkdir()
    return folder.name


def test_pruning_keeps_the_newest_sessions_that_hold_anything_and_spares_live_ones(tmp_path):
    keep_dir = tmp_path / "runs"
    dead = dead_pid()
    now = 1_800_000_000.0  # 2027-01-15
    old = [_session_folder(keep_dir, f"2026010{d}-120000-{dead}", dead) for d in range(1, 9)]
    live = _session_folder(keep_dir, "20251231-120000-1", os.getpid())
    empty = _session_folder(keep_dir, f"20270101-000000-{dead}", dead, content=False)
    elsewhere_young = _session_folder(keep_dir, "20270115-000000-5", 5, host="there")
    elsewhere_old = _session_folder(keep_dir, "20250101-000000-5", 5, host="there")
    (keep_dir / "20240101-000000-3").mkdir()  # no owner: not known to be ours
    (keep_dir / "notes").mkdir()
    (keep_dir / ".gitignore").write_text("*\n")
    current = new_session_id(now)
    removed = prune(str(keep_dir), current, host="here", now=now)
    left = sorted(os.listdir(keep_dir))
    newest = old[-(KEEP_SESSIONS - 1) :]  # with the young one of another host: 5
    assert left == sorted(
        [*newest, live, elsewhere_young, "20240101-000000-3", "notes", ".gitignore"]
    )
    assert sorted(os.path.basename(p) for p in removed) == sorted(
        [*old[: -(KEEP_SESSIONS - 1)], empty, elsewhere_old]
    )


def test_the_current_session_is_never_pruned(tmp_path):
    keep_dir = tmp_path / "runs"
    dead = dead_pid()
    names = [_session_folder(keep_dir, f"2026010{d}-120000-{dead}", dead) for d in range(1, 8)]
    assert prune(str(keep_dir), names[0], keep=2, host="here")
    assert sorted(os.listdir(keep_dir)) == [names[0], *names[-2:]]


@pytest.mark.parametrize("source", ["cli", "ini", "env"])
def test_a_keep_dir_that_is_a_file_is_an_error_naming_its_source(tmp_path, source):
    (tmp_path / "taken").write_text("")
    ini = str(tmp_path / "pytest.ini")
    config = Config(
        tmp_path,
        cli={"resume_equiv_keep_dir": str(tmp_path / "taken")} if source == "cli" else None,
        ini={"resume_equiv_keep_dir": "taken/runs"} if source == "ini" else None,
        inipath=ini,
    )
    env = {"PYTEST_RESUME_EQUIV_KEEP_DIR": str(tmp_path / "taken")} if source == "env" else {}
    settings = resolve_session(config, env=env)
    where = {
        "cli": f"'{tmp_path / 'taken'}' from command line --resume-equiv-keep-dir",
        "ini": f"'{tmp_path / 'taken' / 'runs'}' from ini option resume_equiv_keep_dir in {ini}",
        "env": f"'{tmp_path / 'taken'}' from environment variable PYTEST_RESUME_EQUIV_KEEP_DIR",
    }[source]
    assert settings.error == (
        f"invalid keep_dir {where}: {tmp_path / 'taken'} is a file, not a directory"
    )


def test_keep_dir_values(tmp_path):
    ini = str(tmp_path / "sub" / "pytest.ini")
    settings = resolve_session(
        Config(tmp_path, ini={"resume_equiv_keep_dir": "runs"}, inipath=ini), env={}
    )
    assert settings["keep_dir"] == str(tmp_path / "sub" / "runs")  # beside the ini file
    assert resolve_session(Config(tmp_path), env={})["keep_dir"] is None  # the rootdir's
    home = resolve_session(Config(tmp_path, cli={"resume_equiv_keep_dir": "~/r"}), env={})
    assert home["keep_dir"] == os.path.expanduser("~/r")
    blank = resolve_session(Config(tmp_path, cli={"resume_equiv_keep_dir": " "}), env={})
    assert "invalid keep_dir ' ' from command line --resume-equiv-keep-dir" in blank.error


def test_an_unmakeable_keep_dir(tmp_path):
    """The default falls back to pytest's temporary directory with a warning (a read-only
    checkout); a directory an option named is an error."""
    (tmp_path / "checkout").write_text("")  # nothing can be made under a file
    session = ResumeEquivSession(Config(tmp_path / "checkout"))
    with pytest.warns(ResumeEquivWarning, match="run directories stay in pytest's temporary"):
        root = session.run_root("test_x", Factory(tmp_path / "basetemp"))
    assert os.path.dirname(root) == str(tmp_path / "basetemp")
    shared = session.shared_dir(Factory(tmp_path / "basetemp"))
    assert shared == str(tmp_path / "basetemp" / "resume-equiv-shared")
    named = ResumeEquivSession(Config(tmp_path, cli={"resume_equiv_keep_dir": str(tmp_path / "x")}))
    (tmp_path / "x").write_text("")  # after the settings were checked
    with pytest.raises(SettingError, match="cannot make the keep directory .*command line"):
        named.run_root("test_x", Factory(tmp_path / "basetemp"))


def test_a_session_folder_is_made_once_with_its_owner(tmp_path):
    folder = SessionFolder(str(tmp_path / "runs" / "20260101-000000-42"))
    folder.create()
    folder.create()
    assert (
        json.loads((tmp_path / "runs" / "20260101-000000-42" / OWNER_FILE).read_text())["pid"] == 42
    )
    assert folder.finish() is None and not os.path.exists(folder.path)
