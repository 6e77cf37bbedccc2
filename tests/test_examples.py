"""The shipped examples run as a user runs them: their tests pass on CPU with gloo.

(The toy DiT example runs in tests/test_toy_wan.py, beside its resume bugs; the HF Trainer,
Lightning and accelerate examples in tests/test_integrations.py, beside their adapters.)
"""

import shutil
from pathlib import Path

import pytest
from helpers import CPU

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.mark.long(45)
def test_minimal_example(pytester):
    shutil.copytree(EXAMPLES / "minimal", pytester.path / "minimal")
    result = pytester.runpytest_subprocess(*CPU, "-rP", "minimal")
    result.assert_outcomes(passed=2)
    text = result.stdout.str()
    assert "split 3: equal on all 2 ranks over 3 steps" in text
    assert "split 3: first divergence at step 4, rank 0, key 'loss': float differs" in text


def test_examples_collect_together(pytester):
    """The README's main job runs every example in one session: names must not collide."""
    shutil.copytree(EXAMPLES, pytester.path / "examples")
    result = pytester.runpytest_subprocess(*CPU, "--collect-only", "-q", "examples")
    result.stdout.fnmatch_lines(["*9 tests collected*"])
    assert result.ret == 0
