"""The golden store without torchrun: environment keys, folder names, atomic writes, a killed
update, format versions, unused goldens, xdist-safe writes."""

import json
import os
import subprocess
import types

import pytest
from plan_helpers import write_run

from pytest_resume_equiv.golden import (
    GOLDEN_VERSION,
    Environment,
    GoldenError,
    GoldenMeta,
    GoldenStore,
    current,
    folder_name,
    git_commit,
)
from pytest_resume_equiv.golden import store as store_module
from pytest_resume_equiv.signature import read_run

CPU = Environment("cpu", 0, 2, "2.13.0")
TEST = "tests/test_a.py::test_resumes[x-1]"


def meta(test=TEST, env=CPU, session="s1", world_size=1):
    return GoldenMeta(
        test, env, world_size, 6, written="2026-01-01T00:00:00+00:00", session=session
    )


def run_dir(tmp_path, name="run", loss=None, world_size=1):
    path = tmp_path / name
    write_run(path, range(1, 7), world_size=world_size, loss=loss)
    return str(path)


def test_the_environment_key_names_what_moves_numbers_and_reads_in_words():
    gpu = Environment("cuda", 2, 2, "2.5.1", "cuda 12.4")
    assert CPU.key == "cpu-ws2-torch2.13.0-sig2"
    assert gpu.key == "cuda2-ws2-torch2.5.1-cuda12.4-sig2"
    assert gpu.words() == (
        "2 cuda devices, world size 2, torch 2.5.1, cuda 12.4, signature format 2"
    )
    assert Environment.from_json(json.loads(json.dumps(gpu.to_json()))) == gpu


def test_the_current_environment_reads_the_runtime_of_the_device_kind():
    torch = types.SimpleNamespace(
        __version__="2.5.1+cu124", version=types.SimpleNamespace(cuda="12.4", hip=None)
    )
    rocm = types.SimpleNamespace(
        __version__="2.5.1", version=types.SimpleNamespace(cuda=None, hip="6.2")
    )
    npu = types.SimpleNamespace(version=types.SimpleNamespace(cann="8.0.RC1"))
    modules = {"torch": torch, "torch_npu": npu}
    assert current("cuda", 2, 2, modules.__getitem__).key == "cuda2-ws2-torch2.5.1-cuda12.4-sig2"
    assert current("cuda", 1, 1, {"torch": rocm}.__getitem__).runtime == "rocm 6.2"
    assert current("npu", 1, 1, modules.__getitem__).runtime == "cann 8.0.RC1"
    assert current("cpu", 2, 0, modules.__getitem__).key == "cpu-ws2-torch2.5.1-sig2"


def test_a_test_folder_is_a_safe_name_and_keeps_the_node_id(tmp_path):
    assert folder_name(TEST) == "tests_test_a.py__test_resumes_x-1_"
    store = GoldenStore(str(tmp_path))
    store.write(meta(), run_dir(tmp_path))
    assert store.tests() == {"tests_test_a.py__test_resumes_x-1_": TEST}
    golden_dir = tmp_path / "tests_test_a.py__test_resumes_x-1_" / CPU.key
    assert sorted(os.listdir(golden_dir)) == ["golden.json", "signatures"]
    written = json.loads((golden_dir / "golden.json").read_text())
    assert written["environment"]["words"] == CPU.words()
    assert written["version"] == GOLDEN_VERSION and written["test"] == TEST


def test_a_written_golden_reads_back_as_the_run_it_was_written_from(tmp_path):
    store = GoldenStore(str(tmp_path / "store"))
    source = run_dir(tmp_path, loss=lambda s, r: s * 3.0)
    golden = store.write(meta(), source)
    assert golden is not None and store.keys(TEST) == [CPU.key]
    loaded = store.load(TEST, CPU.key)
    assert loaded.meta.written == "2026-01-01T00:00:00+00:00"
    assert read_run(loaded.path, 1)[0].steps == read_run(source, 1)[0].steps
    assert store.load(TEST, "cuda1-ws1-torch2.5.1-sig2") is None
    header = read_run(loaded.path, 1)[0].header
    assert "pid" not in header and header["rank"] == 0  # what changes every run is left out


def test_no_golden_says_which_keys_there_are_and_how_to_make_one(tmp_path):
    store = GoldenStore(str(tmp_path))
    assert store.missing_text(TEST, CPU.key) == (
        f"no golden for {CPU.key} (have: none); run with --resume-equiv-update-golden"
    )
    other = Environment("cpu", 0, 4, "2.13.0")
    store.write(meta(env=other), run_dir(tmp_path))
    assert store.missing_text(TEST, CPU.key) == (
        f"no golden for {CPU.key} (have: {other.key}); run with --resume-equiv-update-golden"
    )


def test_an_update_replaces_the_golden_and_a_killed_one_leaves_the_previous(tmp_path, monkeypatch):
    store = GoldenStore(str(tmp_path / "store"))
    store.write(meta(session="s1"), run_dir(tmp_path, "a", loss=lambda s, r: 1.0))
    store.write(meta(session="s2"), run_dir(tmp_path, "b", loss=lambda s, r: 2.0))
    assert store.load(TEST, CPU.key).meta.session == "s2"

    renames = []
    real = os.rename

    def killed_after_the_first_rename(src, dst):
        renames.append((src, dst))
        if len(renames) == 2:
            raise KeyboardInterrupt  # the update dies between moving the old aside and the new in
        real(src, dst)

    monkeypatch.setattr(store_module.os, "rename", killed_after_the_first_rename)
    with pytest.raises(KeyboardInterrupt):
        store.write(meta(session="s3"), run_dir(tmp_path, "c", loss=lambda s, r: 3.0))
    monkeypatch.setattr(store_module.os, "rename", real)
    kept = store.load(TEST, CPU.key)
    assert kept.meta.session == "s2"
    assert read_run(kept.path, 1)[0].steps == read_run(str(tmp_path / "b"), 1)[0].steps
    leftovers = [n for n in os.listdir(store.test_dir(TEST)) if n.startswith(".")]
    assert leftovers == []


def test_a_write_that_fails_midway_leaves_the_golden_and_no_temp_dir(tmp_path):
    store = GoldenStore(str(tmp_path / "store"))
    store.write(meta(session="s1"), run_dir(tmp_path, "a"))
    with pytest.raises(GoldenError, match="rank-1.jsonl: missing"):
        store.write(meta(session="s2", world_size=2), run_dir(tmp_path, "b"))
    assert store.load(TEST, CPU.key).meta.session == "s1"
    assert sorted(os.listdir(store.test_dir(TEST))) == [CPU.key, "test.txt"]


def test_a_session_writes_a_golden_once_however_many_workers_ask(tmp_path):
    store = GoldenStore(str(tmp_path / "store"))
    assert store.write(meta(session="run-7"), run_dir(tmp_path, "a")) is not None
    assert store.write(meta(session="run-7"), run_dir(tmp_path, "b")) is None


def test_a_lock_held_by_a_live_writer_waits_and_a_dead_ones_is_taken_over(tmp_path):
    lock = tmp_path / "g.lock"
    lock.write_text(str(os.getpid()))
    with pytest.raises(GoldenError, match="held for 0s by another writer"):
        with store_module.exclusive(str(lock), timeout=0.1):
            pass
    gone = subprocess.Popen(["true"])
    gone.wait()
    lock.write_text(str(gone.pid))
    with store_module.exclusive(str(lock)):
        assert lock.read_text() == str(os.getpid())
    assert not lock.exists()


def test_a_newer_golden_format_is_refused_by_name(tmp_path):
    store = GoldenStore(str(tmp_path))
    golden = store.write(meta(), run_dir(tmp_path))
    path = os.path.join(golden.path, "golden.json")
    data = json.load(open(path))
    data["version"] = GOLDEN_VERSION + 1
    json.dump(data, open(path, "w"))
    with pytest.raises(GoldenError) as info:
        store.load(TEST, CPU.key)
    assert f"golden format version {GOLDEN_VERSION + 1} is newer than this plugin's" in str(
        info.value
    )
    assert path in str(info.value)


@pytest.mark.parametrize(
    "text, problem",
    [("{not json", "unreadable"), ('{"format": "other"}', "not a pytest-resume-equiv/golden")],
)
def test_a_corrupted_golden_is_a_clear_error(tmp_path, text, problem):
    store = GoldenStore(str(tmp_path))
    golden = store.write(meta(), run_dir(tmp_path))
    with open(os.path.join(golden.path, "golden.json"), "w") as f:
        f.write(text)
    with pytest.raises(GoldenError, match=problem):
        store.load(TEST, CPU.key)
    store.write(meta(session="update"), run_dir(tmp_path, "again"))  # an update replaces it
    assert store.load(TEST, CPU.key).meta.session == "update"


def test_unused_goldens_are_those_of_tests_gone_from_the_files_that_were_collected(tmp_path):
    store = GoldenStore(str(tmp_path / "store"))
    source = run_dir(tmp_path)
    for test in ("tests/test_a.py::test_kept", "tests/test_a.py::test_gone", "tests/test_b.py::t"):
        store.write(meta(test=test), source)
    assert store.unused(["tests/test_a.py::test_kept"]) == ["tests/test_a.py::test_gone"]
    # `pytest tests/test_a.py::test_kept` collects one test of the file: the others stay
    assert store.unused(["tests/test_a.py::test_kept"], ["tests/test_a.py"]) == []
    store.remove("tests/test_a.py::test_gone")
    assert store.unused(["tests/test_a.py::test_kept"]) == []


def test_checkpoints_are_copied_into_the_golden_not_opened(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "state.pt").write_bytes(b"\x80 not for the plugin to unpickle")
    store = GoldenStore(str(tmp_path / "store"))
    golden = store.write(meta(), run_dir(tmp_path), {3: str(ckpt)})
    assert golden.meta.checkpoints == {3: "checkpoints/split-3"}
    loaded = store.load(TEST, CPU.key)
    assert open(os.path.join(loaded.checkpoint(3), "state.pt"), "rb").read().startswith(b"\x80")
    assert loaded.size(3) == len(b"\x80 not for the plugin to unpickle")


def test_the_commit_is_named_when_the_store_is_in_a_git_work_tree(tmp_path):
    assert git_commit(str(tmp_path)) == ""
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True, env=env)
    (tmp_path / "f").write_text("x")
    subprocess.run(["git", "-C", str(tmp_path), "add", "f"], check=True, env=env)
    subprocess.run(["git", "-C", str(tmp_path), "commit", "-qm", "c"], check=True, env=env)
    head = subprocess.run(
        ["git", "-C", str(tmp_path), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    assert git_commit(str(tmp_path)) == head[:12]
    (tmp_path / "f").write_text("y")
    assert git_commit(str(tmp_path)) == head[:12] + "-dirty"
