"""The signature format: exact values, a readable prefix after a crash, clear errors."""

import json
import math

import pytest
import torch

import pytest_resume_equiv as req
from pytest_resume_equiv.rank.context import current
from pytest_resume_equiv.rank.encode import UnrecordableValue, encode
from pytest_resume_equiv.rank.fingerprint import content_hash
from pytest_resume_equiv.rank.run_dir import signature_path
from pytest_resume_equiv.signature import SignatureError, read_run, read_signature


def test_record_is_a_noop_outside_a_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert req.context() is None
    req.record(1, loss=0.5)
    assert list(tmp_path.iterdir()) == []


def test_header_steps_and_footer(in_rank):
    run_dir = in_rank(phase="resumed", rank=1, world_size=2, split=3)
    req.record(4, loss=0.1 + 0.2, n=3, ok=True, name="a", nothing=None, nested={"a": [1, 2.5]})
    current().close()
    sig = read_signature(signature_path(run_dir, 1))
    header = sig.header
    assert (header["format"], header["version"], header["rank"], header["world_size"]) == (
        "pytest-resume-equiv/signature",
        2,
        1,
        2,
    )
    assert (header["phase"], header["split"], header["device"]) == ("resumed", 3, "cpu")
    assert header["torch"] == torch.__version__
    assert sig.complete and not sig.truncated_tail
    ((step, values),) = sig.steps
    assert step == 4
    assert values["loss"]["repr"] == repr(0.1 + 0.2)
    assert (
        values["n"] == 3
        and values["ok"] is True
        and values["name"] == "a"
        and values["nothing"] is None
    )
    assert values["nested"]["a"][0] == 1


def test_floats_are_bit_exact():
    a, b = encode(0.1 + 0.2, "x"), encode(0.3, "x")
    assert a != b  # differ in the last bit only
    assert encode(float("nan"), "x") == encode(float("nan"), "x")
    assert encode(-0.0, "x") != encode(0.0, "x")
    assert encode(math.inf, "x")["repr"] == "inf"


def test_tensor_fingerprint_is_exact_and_order_sensitive():
    t = torch.arange(6, dtype=torch.float32)
    assert content_hash(t) == content_hash(t.clone())
    assert content_hash(t) != content_hash(t.flip(0))
    bumped = t.clone()
    bumped[3] = torch.nextafter(bumped[3], torch.tensor(10.0))
    assert content_hash(t) != content_hash(bumped)
    assert content_hash(t) != content_hash(t.to(torch.float64))  # same values, other bits
    assert content_hash(t.reshape(2, 3).t()) == content_hash(t.reshape(2, 3).t().contiguous())
    info = encode(t.reshape(2, 3), "t")["$tensor"]
    assert info["dtype"] == "float32" and info["shape"] == [2, 3]
    assert info["stats"]["max"] == 5.0 and info["values"] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    big = encode(torch.zeros(100, dtype=torch.int64), "t")["$tensor"]
    assert "values" not in big and big["stats"]["norm"] == 0.0
    assert encode(torch.tensor([True, False]), "t")["$tensor"]["dtype"] == "bool"
    assert encode(torch.zeros(0), "t")["$tensor"]["shape"] == [0]


def test_numpy_values():
    np = pytest.importorskip("numpy")
    assert encode(np.int64(3), "x") == 3
    assert encode(np.float32(0.5), "x") == encode(0.5, "x")
    assert encode(np.arange(3), "x")["$tensor"]["dtype"] == "int64"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (object(), "which record\\(\\) cannot store exactly"),
        ({1: 2}, "key 1 of type int"),
        ({"$float": 1}, "reserved"),
        ({1, 2}, "builtins.set"),
    ],
)
def test_unrecordable_values_are_refused_clearly(in_rank, value, message):
    in_rank()
    with pytest.raises(UnrecordableValue, match=message) as err:
        req.record(2, bad=value)
    assert "record(step=2) value 'bad'" in str(err.value)


def test_step_must_be_an_int(in_rank):
    in_rank()
    with pytest.raises(TypeError, match="needs an int step number, got '3'"):
        req.record("3", loss=1.0)


def _write(path, lines):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(lines))


HEADER = (
    json.dumps(
        {
            "format": "pytest-resume-equiv/signature",
            "version": 1,
            "rank": 0,
            "world_size": 1,
            "phase": "uninterrupted",
        }
    )
    + "\n"
)


def test_truncated_last_line_keeps_the_prefix(tmp_path):
    path = tmp_path / "signatures" / "rank-0.jsonl"
    _write(path, [HEADER, '{"step": 1, "values": {}}\n', '{"step": 2, "val'])
    sig = read_signature(str(path))
    assert [s for s, _ in sig.steps] == [1]
    assert sig.truncated_tail and not sig.complete


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ([], "empty signature file"),
        (["not json\n"], "line 1 is not JSON"),
        (['{"format": "other"}\n'], "is not a pytest-resume-equiv/signature header"),
        (
            [HEADER.replace('"version": 1', '"version": 99')],
            "format version 99 is not one this plugin reads",
        ),
        ([HEADER, '{"step": "1", "values": {}}\n'], "line 2 is not a step record"),
        ([HEADER, "[1, 2]\n"], "line 2 is not a JSON object"),
    ],
)
def test_corrupted_files_are_clear_errors(tmp_path, lines, message):
    path = tmp_path / "signatures" / "rank-0.jsonl"
    _write(path, lines)
    with pytest.raises(SignatureError, match=message):
        read_signature(str(path))


def test_missing_files(tmp_path):
    with pytest.raises(SignatureError, match="no signature file"):
        read_run(str(tmp_path), world_size=2)
    with pytest.raises(SignatureError, match="no signatures/ directory"):
        read_run(str(tmp_path))
