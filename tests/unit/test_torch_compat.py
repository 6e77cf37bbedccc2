"""The switches between torch releases (rank/torch_compat.py), each path run on this torch:
the stand-in for an API an older torch lacks is forced here, to be checked against the API."""

from pathlib import Path

import pytest
import torch

from pytest_resume_equiv.rank import torch_compat
from pytest_resume_equiv.rank.patches import PATCHES

ROOT = Path(__file__).resolve().parents[2]


class Outer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = torch.nn.Linear(2, 2)

    def forward(self, x, *, scale=1.0):
        return self.inner(x) * scale


def _calls(register):
    seen = []

    def hook(module, args, kwargs, output):
        seen.append((type(module).__name__, len(args), dict(kwargs), tuple(output.shape)))

    handle = register(hook)
    try:
        Outer()(torch.ones(3, 2), scale=2.0)
    finally:
        handle.remove()
    Outer()(torch.ones(3, 2), scale=3.0)  # removed: no more calls
    return seen


def test_the_stand_in_for_forward_hooks_with_kwargs_gives_what_torch_gives():
    """torch 2.4's global forward hooks get no keyword arguments: `Module.__call__` hands
    them over, each call its own (the inner module's call has none), and `remove` puts
    `__call__` back."""
    call = torch.nn.Module.__call__
    forced = _calls(lambda hook: torch_compat._KwargsHook(hook, always_call=True))
    assert forced == [("Linear", 1, {}, (3, 2)), ("Outer", 1, {"scale": 2.0}, (3, 2))]
    assert torch.nn.Module.__call__ is call
    chosen = _calls(
        lambda hook: torch_compat.register_module_forward_hook_with_kwargs(hook, always_call=True)
    )
    assert chosen == forced


class Fails(torch.nn.Module):
    def forward(self, x, *, flag):
        raise ValueError("boom")


def _failed_call(register):
    """What the hook is given for a forward that raised (always called): torch passes no
    keyword arguments then."""
    seen = []
    handle = register(lambda *given: seen.append(len(given)))
    try:
        with pytest.raises(ValueError, match="boom"):
            Fails()(torch.ones(1), flag=True)
        try:  # a call inside the trainer's own `except` is not a failed one
            raise KeyError("handled")
        except KeyError:
            torch.nn.Identity()(torch.ones(1))
    finally:
        handle.remove()
    return seen


def test_the_stand_in_is_called_as_torch_calls_it_when_the_forward_raises():
    forced = _failed_call(lambda hook: torch_compat._KwargsHook(hook, always_call=True))
    assert forced == [3, 4]
    chosen = _failed_call(
        lambda hook: torch_compat.register_module_forward_hook_with_kwargs(hook, always_call=True)
    )
    assert chosen == forced


def test_the_stand_in_has_its_row_in_the_patches_table():
    (row,) = [row for row in PATCHES if row.owner == "rank/torch_compat.py"]
    assert row.targets == ("torch.nn.modules.module.Module.__call__",)


def test_fully_shard_is_found_where_this_torch_keeps_it():
    fully_shard = torch_compat.fully_shard()
    assert fully_shard is not None and fully_shard.__name__ == "fully_shard"


def test_versions_are_placed_against_the_tested_matrix_by_minor_release():
    assert torch_compat.release("2.4.1+cu121") == (2, 4, 1)
    assert torch_compat.release("2.16.0.dev20270101+cpu") == (2, 16, 0)
    assert torch_compat.against_tested("2.4.0", "3.9.18") == (
        True,
        "torch 2.4.0: tested (2.4.1); Python 3.9.18: tested (3.9)",
    )
    ok, words = torch_compat.against_tested("2.16.0", "3.11.7")
    assert not ok and "torch 2.16.0: not tested: newer than the newest tested (2.15.0)" in words
    ok, words = torch_compat.against_tested("2.3.1", "3.8.10")
    assert not ok and "older than the oldest tested (2.4.1)" in words and "(3.9)" in words
    assert torch_compat.against_tested("2.5.1", "3.12.1")[0]
    assert torch_compat.against_tested(torch.__version__, "3.11.7")[0]  # this torch


def test_the_features_of_this_torch_are_named():
    found = torch_compat.features()
    assert len(found) == 3 and found[1].startswith("FSDP2 fully_shard: torch.distributed.")


def test_the_support_page_lists_the_tested_corners():
    """docs/reference/support.md's table and TESTED (what doctor compares with) agree."""
    page = (ROOT / "docs" / "reference" / "support.md").read_text()
    for python, version in torch_compat.TESTED:
        assert f"| {python} | {version} |" in page, (python, version)
