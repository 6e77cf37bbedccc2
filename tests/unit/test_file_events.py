"""Inside a rank: the file-event log (rank/files.py), in-process."""

import os
import shutil
import threading

import pytest
import torch

import pytest_resume_equiv as req
from pytest_resume_equiv.rank.context import current
from pytest_resume_equiv.signature import read_signature


@pytest.fixture
def rank_dir(in_rank):
    run_dir = in_rank(phase="uninterrupted", split=2, steps=4)
    os.makedirs(run_dir, exist_ok=True)
    current().install()
    yield run_dir
    current().uninstall()


def events(run_dir):
    current().close()
    sig = read_signature(os.path.join(run_dir, "signatures", "rank-0.jsonl"))
    return [
        (
            e["op"],
            os.path.relpath(e["path"], run_dir),
            e.get("to") and os.path.relpath(e["to"], run_dir),
            e["after_step"],
        )
        for e in sig.files
    ]


def test_a_save_is_logged_event_by_event_with_the_step_it_came_after(rank_dir, tmp_path):
    req.record(1, loss=1.0)
    req.record(2, loss=1.0)
    folder = os.path.join(rank_dir, "ckpt")
    os.makedirs(folder)
    torch.save({"w": torch.ones(2)}, os.path.join(folder, "tmp.pt"))  # opens its file: one event
    with open(os.path.join(folder, "latest"), "w") as f:
        f.write("step_2")
        f.flush()
        os.fsync(f.fileno())
    os.replace(os.path.join(folder, "tmp.pt"), os.path.join(folder, "step_2.pt"))
    with open(os.path.join(folder, "latest")) as f:  # reading is no event
        f.read()
    (tmp_path / "elsewhere.txt").write_text("not in a watched folder")
    with open(os.path.join(rank_dir, "store-port.tmp"), "w") as f:  # the plugin's own
        f.write("0")
    req.record(3, loss=1.0)
    os.unlink(os.path.join(folder, "latest"))
    shutil.rmtree(folder)
    assert events(rank_dir) == [
        ("torch.save", "ckpt/tmp.pt", None, 2),
        ("open", "ckpt/latest", None, 2),
        ("os.fsync", "ckpt/latest", None, 2),
        ("os.replace", "ckpt/tmp.pt", "ckpt/step_2.pt", 2),
        ("os.unlink", "ckpt/latest", None, 3),
        ("shutil.rmtree", "ckpt", None, 3),
    ]


def test_a_background_thread_says_so(rank_dir):
    def save():
        with open(os.path.join(rank_dir, "async.bin"), "wb") as f:
            f.write(b"x")

    current().open()  # as the bootstrap does before the user's code
    worker = threading.Thread(target=save, name="checkpoint-writer")
    worker.start()
    worker.join()
    current().close()
    sig = read_signature(os.path.join(rank_dir, "signatures", "rank-0.jsonl"))
    assert [(e["op"], e.get("thread")) for e in sig.files] == [("open", "checkpoint-writer")]
