"""Names shared by the ranks that write a run directory and the plugin that reads it.

Kept in one place so the writer and the reader cannot drift apart.
"""

from __future__ import annotations

import os

CONTEXT_ENV = "RESUME_EQUIV_CONTEXT"
"""Environment variable holding the JSON run context; its presence switches the API on."""

SIGNATURE_FORMAT = "pytest-resume-equiv/signature"
SIGNATURE_VERSION = 1

FLOAT_TAG = "$float"
TENSOR_TAG = "$tensor"


def signature_path(run_dir: str, rank: int) -> str:
    return os.path.join(run_dir, "signatures", f"rank-{rank}.jsonl")


def log_path(run_dir: str, rank: int, stream: str) -> str:
    return os.path.join(run_dir, "logs", f"rank-{rank}.{stream}")


def status_path(run_dir: str, rank: int) -> str:
    return os.path.join(run_dir, "status", f"rank-{rank}.json")


def pid_dir(run_dir: str) -> str:
    return os.path.join(run_dir, "pids")


def gate_path(run_dir: str) -> str:
    """Created by the plugin when a prestarted launch may run the user's code."""
    return os.path.join(run_dir, "go")
