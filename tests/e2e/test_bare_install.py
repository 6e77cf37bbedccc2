"""The package as a user installs it: a wheel built from this tree, installed with its declared
dependencies only (no test extra: no numpy, no xdist) beside the running torch, into a fresh
venv, runs the examples that need no extra framework.

`scripts/support_matrix.sh bare` runs the same check by hand (and the matrix of Python and
torch versions); this test keeps the declared dependencies honest in CI.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ("minimal", "crash", "equivalent")
"""Examples without an extra framework (no torchdata, transformers, lightning...) that cover
the plugin side and the ranks: a resume and a caught bug, the crash tester (file events, the
kill), an equivalence test (the sketch); tests/e2e/test_examples.py runs all of them."""


def _run(args, **kwargs):
    proc = subprocess.run(args, capture_output=True, text=True, timeout=900, **kwargs)
    assert proc.returncode == 0, f"{args}:\n{proc.stdout[-6000:]}\n{proc.stderr[-6000:]}"
    return proc.stdout


def _torch_requirement() -> str:
    import torch

    version, _, build = torch.__version__.partition("+")
    if build != "cpu":
        pytest.skip(
            f"torch {torch.__version__} is not a CPU build: a fresh venv would download "
            "several GB of CUDA libraries (scripts/support_matrix.sh bare runs this check)"
        )
    return f"torch=={version}"


@pytest.mark.long(90)
def test_a_wheel_with_its_declared_dependencies_runs_the_examples(tmp_path):
    torch_requirement = _torch_requirement()
    source = tmp_path / "source"
    shutil.copytree(
        ROOT / "pytest_resume_equiv",
        source / "pytest_resume_equiv",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    _run([*pip, "wheel", "--no-deps", "-w", str(tmp_path / "dist"), str(source)])
    (wheel,) = (tmp_path / "dist").glob("pytest_resume_equiv-*.whl")
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)])
    python = str(venv / "bin" / "python")
    # the venv sees nothing of this tree: with PYTHONPATH on it, pip takes the checkout's
    # metadata (an editable install's egg-info) for the package installed, and skips the wheel
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # --no-compile: byte-compiling torch's files at install is two thirds of the install's
    # time (30 s against 10 s) and no part of what this test checks
    install = ["install", "-q", "--no-compile", str(wheel), torch_requirement]
    _run([python, "-m", "pip", *install], env=env)

    probe = (
        "import importlib.util, pytest_resume_equiv as p; "
        "print(p.__file__); print(importlib.util.find_spec('numpy') is None)"
    )
    where, no_numpy = _run([python, "-c", probe], env=env, cwd=tmp_path).split()
    assert str(venv) in where  # the installed wheel, not this tree
    assert no_numpy == "True"  # the test extra stays out: the ranks must not need it

    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    proc = subprocess.run(
        [python, "-m", "pytest", "-p", "resume_equiv", "--resume-equiv-device=cpu"]
        + ["-p", "no:cacheprovider", "-q", *EXAMPLES],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path / "examples",
        env=env,
    )
    assert proc.returncode == 0, proc.stdout[-8000:] + proc.stderr[-4000:]
    assert "9 passed" in proc.stdout.splitlines()[-1], proc.stdout[-3000:]
