"""Shared helpers for the plugin's own tests."""

from __future__ import annotations

import json
import os

import pytest

from pytest_resume_equiv.rank import context as context_module
from pytest_resume_equiv.rank import record as record_module
from pytest_resume_equiv.rank.layout import CONTEXT_ENV


@pytest.fixture
def in_rank(tmp_path, monkeypatch):
    """Make this process look like rank `rank` of a launch, so record() writes a signature."""

    def enter(phase="baseline", rank=0, world_size=1, split=3, steps=6, run_dir=None):
        run_dir = str(run_dir or tmp_path / phase)
        record_module.close()
        monkeypatch.setattr(record_module, "_writer", None)
        monkeypatch.setattr(context_module, "_looked", False)
        monkeypatch.setattr(context_module, "_cached", None)
        monkeypatch.setenv(
            CONTEXT_ENV,
            json.dumps(
                {
                    "phase": phase,
                    "run_dir": run_dir,
                    "steps": steps,
                    "split": split,
                    "splits": [split],
                    "checkpoint": None,
                    "checkpoint_template": None,
                    "device_kind": "cpu",
                    "backend": "gloo",
                    "seed": 0,
                }
            ),
        )
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("LOCAL_RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", str(world_size))
        return run_dir

    yield enter
    record_module.close()
    context_module._looked = False
    context_module._cached = None
    record_module._writer = None
    os.environ.pop(CONTEXT_ENV, None)


@pytest.fixture
def trainers(pytester):
    """A pytester directory holding `trainers.py` (see helpers.TRAINERS); returns the pytester."""
    from helpers import TRAINERS

    pytester.makepyfile(trainers=TRAINERS)
    return pytester
