"""The automatic input fingerprint on a device (rank/inputs.py `device_row_digests`), run on
CPU tensors: reduced a band of columns at a time it gives what one pass over the whole
batch gives, and nothing crosses to the host before the step's line is written."""

import pytest
import torch
from torch.overrides import TorchFunctionMode

from pytest_resume_equiv.rank import inputs

MASK = (1 << 64) - 1


def whole_batch_digests(raw: torch.Tensor) -> list[int]:
    """The same digest computed over every column at once (what a band must add up to)."""
    rows = raw.shape[0]
    pad = (-raw.shape[1]) % 4
    if pad:
        raw = torch.nn.functional.pad(raw, (0, pad))
    words = raw.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    idx = torch.arange(words.shape[1], dtype=torch.int64)
    mixed = (words + 0x9E3779B1) * ((idx * 0x632BE5AB + 0x7F4A7C15) | 1)
    mixed = mixed ^ (mixed >> 31)
    first, second = mixed.sum(dim=1).tolist(), (mixed * ((idx << 1) | 1)).sum(dim=1).tolist()
    return [
        ((first[i] & MASK) * 0x9E3779B97F4A7C15 ^ (second[i] & MASK)) & MASK for i in range(rows)
    ]


class HostCopies(TorchFunctionMode):
    """Counts what would move a device tensor's data to the host."""

    NAMES = {"cpu", "item", "tolist", "numpy", "__array__"}

    def __init__(self):
        super().__init__()
        self.copies = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in self.NAMES or (
            name == "to" and "cpu" in map(str, [*args[1:], *(kwargs or {}).values()])
        ):
            self.copies.append(name)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("band_words", [1, 3, 1 << 24])
@pytest.mark.parametrize(
    "dtype,shape", [(torch.float32, (5, 7)), (torch.bfloat16, (4, 3, 3)), (torch.uint8, (3, 11))]
)
def test_bands_add_up_to_the_whole_batch(monkeypatch, band_words, dtype, shape):
    rows = shape[0]
    monkeypatch.setattr(inputs, "BAND_WORDS", band_words * rows)
    batch = (torch.arange(torch.Size(shape).numel()) % 251).to(dtype).reshape(shape)
    raw = batch.reshape(-1).view(torch.uint8).reshape(rows, -1)
    later = inputs.device_row_digests(raw)
    assert later.finish(later.words.tolist()) == whole_batch_digests(raw)


def test_rows_that_differ_in_one_element_have_other_digests(monkeypatch):
    monkeypatch.setattr(inputs, "BAND_WORDS", 8)
    batch = torch.zeros(4, 33)
    batch[2, 31] = 1.0
    raw = batch.view(torch.uint8).reshape(4, -1)
    later = inputs.device_row_digests(raw)
    digests = later.finish(later.words.tolist())
    assert digests[0] == digests[1] == digests[3] != digests[2]


def test_no_copy_to_the_host_until_the_line_is_written(monkeypatch):
    monkeypatch.setattr(inputs, "BAND_WORDS", 64)
    batch = torch.randn(16, 3, 8, 8)
    raw = batch.reshape(-1).view(torch.uint8).reshape(16, -1)
    with HostCopies() as mode:
        later = inputs.device_row_digests(raw)
    assert mode.copies == []
    assert later.words.shape == (32,)  # two sums per row: all that crosses, in one copy
    with HostCopies() as mode:
        later.words.cpu()
    assert mode.copies == ["cpu"]  # the counter sees a copy when there is one


def test_cpu_rows_and_contents_hash_alike_without_numpy(monkeypatch):
    """numpy is not a dependency (torch runs without it, and `Tensor.numpy()` then raises
    'Numpy is not available'): the CPU row digests and content hashes fall back to the bytes
    and stay the same."""
    from pytest_resume_equiv.rank import fingerprint

    batch = torch.arange(60, dtype=torch.float32).reshape(5, 3, 4)
    flags = torch.tensor([[True, False], [False, True], [True, True]])
    before = [inputs._row_digests(t) for t in (batch, flags)]
    hashed = fingerprint.content_hash(batch)

    def unavailable(self):
        raise RuntimeError("Numpy is not available")

    monkeypatch.setattr(torch.Tensor, "numpy", unavailable)
    assert [inputs._row_digests(t) for t in (batch, flags)] == before
    assert fingerprint.content_hash(batch) == hashed
    assert len(set(before[0])) == 5
