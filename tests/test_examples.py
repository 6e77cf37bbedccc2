"""The shipped examples run as a user runs them: their tests pass on CPU with gloo."""

import shutil
from pathlib import Path

import pytest
from helpers import CPU

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_minimal_example(pytester):
    shutil.copytree(EXAMPLES / "minimal", pytester.path / "minimal")
    result = pytester.runpytest_subprocess(*CPU, "-rP", "minimal")
    result.assert_outcomes(passed=2)
    text = result.stdout.str()
    assert "split 3: equal on all 2 ranks over 3 steps" in text
    assert "split 3: first divergence at step 4, rank 0, key 'loss': float differs" in text


def test_toy_dit_example(pytester):
    pytest.importorskip(
        "diffusers", reason="the toy DiT example needs diffusers: pip install -e '.[wan]'"
    )
    shutil.copytree(EXAMPLES / "toy_dit", pytester.path / "toy_dit")
    result = pytester.runpytest_subprocess(*CPU, "toy_dit")
    result.assert_outcomes(passed=1)


def test_examples_collect_together(pytester):
    """The README's main job runs every example in one session: names must not collide."""
    shutil.copytree(EXAMPLES, pytester.path / "examples")
    result = pytester.runpytest_subprocess(*CPU, "--collect-only", "-q", "examples")
    result.stdout.fnmatch_lines(["*3 tests collected*"])
    assert result.ret == 0
