"""One rank state per process, and one declaration of the signature's sections: the keys a
step line is read back as, built and split by the helpers of rank/layout.py."""

import os
import subprocess
import sys

import torch

import pytest_resume_equiv as req
from pytest_resume_equiv.rank import layout
from pytest_resume_equiv.rank.context import CAPTURES, current, reset
from pytest_resume_equiv.rank.layout import (
    Section,
    audit_key,
    device_index,
    file_target,
    generator_site,
    is_audit_key,
    is_fingerprint_key,
    line_kind,
    section_names,
    split_key,
    stream_kind,
    subject_of,
    target_covers,
    target_file,
    watch_key,
    watched,
)
from pytest_resume_equiv.rank.run_dir import signature_path
from pytest_resume_equiv.signature import read_signature


def test_keys_are_built_and_split_by_section():
    assert audit_key("rng", "cpu") == "rng:cpu" and split_key("rng:cpu") == ("rng", "cpu")
    assert split_key("loss") == ("", "loss") and not is_audit_key("loss")
    assert split_key("odd:name") == ("", "odd:name")  # not a declared section: the user's
    assert watch_key("model", "params") == "watch:model.params"
    assert watched("watch:a.b.params") == ("a.b", "params")  # a part never holds a dot
    assert watched("rng:cpu") == ("", "") and watched("loss") == ("", "")
    assert subject_of("watch:model.params") == "watch:model"
    assert subject_of("rng:cuda:1") == "rng:cuda:1"
    assert is_fingerprint_key("watch:model.params") and not is_fingerprint_key("rng:cpu")


def test_stream_keys_say_their_kind_device_and_generator_site():
    generator = "rng:generator train.py:12 #0"
    assert generator_site(generator) == "train.py:12 #0" and stream_kind(generator) == "generator"
    assert generator_site("rng:cpu") is None and generator_site("watch:generator x.y") is None
    assert (stream_kind("rng:cuda:1"), device_index("rng:cuda:1")) == ("cuda", "1")
    assert (stream_kind("rng:numpy"), device_index("rng:numpy")) == ("numpy", "")
    assert stream_kind("watch:model.params") == "" == stream_kind("loss")


def test_restore_targets_cover_their_keys():
    assert target_covers("rng:cuda:*", "rng:cuda:3") and not target_covers(
        "rng:cuda:*", "rng:npu:0"
    )
    assert target_covers("watch:model (encoder.0)", "watch:model")
    assert not target_covers("watch:model", "watch:model2")
    assert target_file(file_target("/ckpt/model.pt")) == "/ckpt/model.pt"
    assert target_file("watch:model") is None and file_target("") == "file"


def test_line_kinds():
    assert line_kind({"step": 3, "values": {}}) == "step"
    assert [line_kind({kind: {}}) for kind in layout.LINE_KINDS] == list(layout.LINE_KINDS)


def test_every_section_has_one_capture():
    assert set(CAPTURES) == set(section_names())


def test_a_new_section_is_one_declaration_and_one_capture(in_rank, monkeypatch):
    """What a GradScaler capture would add: written in every step line and the resume-point
    snapshot, read back as `amp:<entry>` keys that count as audit keys."""
    monkeypatch.setattr(layout, "SECTIONS", (*layout.SECTIONS, Section("amp", "the loss scale")))
    monkeypatch.setitem(CAPTURES, "amp", lambda state: {"scale": 1024})
    run_dir = in_rank(phase="uninterrupted", split=1, steps=2)
    req.record(1, loss=0.5)
    req.resume_point()
    current().close()
    sig = read_signature(signature_path(run_dir, 0))
    ((_, values),) = sig.steps
    assert values["amp:scale"] == 1024 and is_audit_key("amp:scale")
    assert sig.resume_points[0]["amp"] == {"scale": 1024}


def test_every_call_is_a_noop_without_a_run_context(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    state = reset({})
    generator = torch.Generator()
    req.record(1, loss=1.0)
    req.watch(model=torch.nn.Linear(1, 1))
    req.track(generator, "g", ignore=True)
    req.resume_point()
    assert req.context() is None and state.writer is None
    assert state.watched.objects == {} and state.generators.entries == []
    assert list(tmp_path.iterdir()) == []


def test_reset_reads_the_environment_again_and_undoes_what_was_installed(in_rank, monkeypatch):
    """What `bootstrap.main` relies on: a process that looked before the run context was set
    (a fork server's parent) gives its child nothing but a fresh state."""
    real = torch.Generator
    run_dir = in_rank()
    env = dict(os.environ)
    old = reset({})
    assert old.context is None
    state = reset(env)
    assert state is current() and state is not old and state.context.run_dir == run_dir
    state.install()
    assert torch.Generator is not real
    reset(env)
    assert torch.Generator is real


def test_the_rank_side_never_imports_the_integrations():
    """`req.watch(accelerator=acc)` works without our accelerate integration imported."""
    code = (
        "import sys, pytest_resume_equiv, pytest_resume_equiv.rank.bootstrap\n"
        "print(sorted(m for m in sys.modules if m.startswith('pytest_resume_equiv.integrations')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
