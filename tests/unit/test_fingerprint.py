"""Tensor fingerprints on the real CPU torch: the device digest on every kind of view, meta
tensors, and the cost of one audit (host copies, temporary memory)."""

import subprocess
import sys
import textwrap

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import pytest_resume_equiv as req
from pytest_resume_equiv.rank import fingerprint
from pytest_resume_equiv.rank.encode import tensor_fingerprint
from pytest_resume_equiv.rank.fingerprint import (
    NO_DATA,
    content_hash,
    describe,
    device_digest,
    one_transfer,
)
from pytest_resume_equiv.signature import read_signature

DTYPES = [torch.bfloat16, torch.float16, torch.int8, torch.uint8, torch.float8_e4m3fn]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("start", [1, 3])
def test_the_device_digest_reads_views_at_any_byte_offset(dtype, start):
    """A recorded `x[1:]`, a bf16 FSDP2 gradient inside its reduce-scatter buffer, a bucket
    view: contiguous, at a byte offset that is not a multiple of 4 (no int32 view there)."""
    base = torch.arange(37, dtype=torch.float32).to(dtype)
    view = base[start:]
    assert view.is_contiguous() and (view.storage_offset() * view.element_size()) % 4
    assert device_digest(view) == device_digest(view.clone())
    assert device_digest(view) != device_digest(base[start - 1 : -1].clone())


def test_the_device_digest_is_the_same_in_pieces(monkeypatch):
    """Pieces of DEVICE_CHUNK words, each padded or realigned on its own: the digest of a
    misaligned view equals that of its aligned copy whatever the piece size."""
    view = torch.arange(1001, dtype=torch.float32).to(torch.bfloat16)[1:]
    whole = device_digest(view.clone())
    monkeypatch.setattr(fingerprint, "DEVICE_CHUNK", 7)
    assert device_digest(view) == device_digest(view.clone()) == whole


def test_meta_tensors_have_no_contents_to_read():
    """A model offloaded with accelerate's device_map holds meta tensors between forwards;
    the hashing fallback read address 0 for them (a segfault), so this runs in a child."""
    script = textwrap.dedent(
        """
        import torch
        from pytest_resume_equiv.rank.fingerprint import content_hash, describe
        from pytest_resume_equiv.rank.encode import tensor_fingerprint
        from pytest_resume_equiv.rank.watch import Watched, shard_norm
        meta = torch.empty(5, 3, device="meta")
        print(content_hash(meta))
        print(sorted(describe(meta)))
        print(sorted(tensor_fingerprint(meta)))
        print(shard_norm(meta))
        watched = Watched()
        watched.watch(model=torch.nn.Linear(3, 2, device="meta"))
        print(watched.audit()["model.params"]["weight"]["hash"])
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.splitlines() == [
        NO_DATA,
        "['dtype', 'hash', 'shape']",
        "['hash']",
        "nan",
        NO_DATA,
    ]


class Copies(TorchDispatchMode):
    """The float32 tensors every op makes, by size."""

    def __init__(self):
        super().__init__()
        self.float32_sizes = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(tensor, torch.Tensor) and tensor.dtype == torch.float32:
                self.float32_sizes.append(tensor.numel())
        return out


def test_statistics_need_no_float32_copy_of_the_tensor(monkeypatch):
    """bf16 statistics on CPU: a chunk at a time (at most STATS_CHUNK elements in float32),
    and the same numbers as through a full float32 copy."""
    monkeypatch.setattr(fingerprint, "STATS_CHUNK", 1000)
    big = torch.randn(10_000, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    with Copies() as copies:
        found = tensor_fingerprint(big)
        stats = describe(big)["stats"]
    assert max(copies.float32_sizes) <= 1000
    wide = big.float()
    norm = float(torch.linalg.vector_norm(wide))
    assert float(found["norm"]["repr"]) == pytest.approx(norm, rel=1e-5)
    assert float(found["mean"]["repr"]) == pytest.approx(float(wide.mean()), abs=1e-6)
    assert float(found["absmax"]["repr"]) == float(wide.abs().max())
    assert (stats["min"], stats["max"]) == (float(wide.min()), float(wide.max()))


def test_statistics_of_a_small_tensor_are_those_of_its_float32_copy():
    """One chunk: exactly the numbers the float32 copy gives (golden files keep them)."""
    t = torch.tensor([1.5, -2.25, 3.0], dtype=torch.bfloat16)
    stats = describe(t)["stats"]
    wide = t.float()
    assert stats == {
        "mean": float(wide.mean()),
        "min": -2.25,
        "max": 3.0,
        "norm": float(torch.linalg.vector_norm(wide)),
    }
    assert describe(t)["values"] == [1.5, -2.25, 3.0]


def test_one_audit_crosses_to_the_host_once(in_rank, monkeypatch):
    """Every parameter's digest and statistics, both AdamW moments: one copy per record
    (a device sync each on an accelerator), not three per tensor."""
    crossings = []
    real = fingerprint.to_host
    monkeypatch.setattr(fingerprint, "to_host", lambda words: crossings.append(1) or real(words))
    run_dir = in_rank()
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    opt = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 4)).sum().backward()
    opt.step()
    req.watch(model=model, optimizer=opt)
    req.record(1, loss=1.0, out=torch.ones(3))
    # the recorded tensor value in one copy, the audit (4 params, 8 moments) in another
    assert len(crossings) == 2
    from pytest_resume_equiv.rank.context import current

    current().close()
    sig = read_signature(f"{run_dir}/signatures/rank-0.jsonl")
    watched = sig.steps[0][1]
    assert watched["watch:model.params"]["0.weight"]["hash"] == content_hash(model[0].weight)
    with one_transfer() as batch:
        pending = tensor_fingerprint(model[0].weight)
        assert isinstance(pending["norm"], fingerprint.Later)
    assert batch.resolve(pending) == tensor_fingerprint(model[0].weight)
