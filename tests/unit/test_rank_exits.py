"""How a rank that wrote no status file ended: an abort after the launch's last step is a
death in teardown (its work stands), anything else is a failed rank."""

import json
import os
import signal

import pytest

from pytest_resume_equiv.launch.rank_exits import rank_outcomes
from pytest_resume_equiv.rank.layout import SIGNATURE_FORMAT, SIGNATURE_VERSION
from pytest_resume_equiv.rank.run_dir import log_path, signature_path

ABORT = (
    "terminate called without an active exception\nFatal Python error: Aborted\n\n"
    "Current thread 0x00007f0a537bdb80 (most recent call first):\n"
    '  File "/x/distributed_c10d.py", line 2100 in destroy_process_group\n'
    '  File "/x/train.py", line 26 in train\n'
)


def leave(run_dir, recorded, steps=4, stderr=ABORT):
    """Rank 0's signature (its header saying the launch's last step) and stderr, no status."""
    path = signature_path(str(run_dir), 0)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    header = {"format": SIGNATURE_FORMAT, "version": SIGNATURE_VERSION, "rank": 0}
    header.update(world_size=1, phase="resumed", pid=1, steps=steps)
    lines = [header] + [{"step": s, "values": {}} for s in recorded]
    with open(path, "w") as f:
        f.write("".join(json.dumps(line) + "\n" for line in lines))
    log = log_path(str(run_dir), 0, "stderr")
    os.makedirs(os.path.dirname(log), exist_ok=True)
    with open(log, "w") as f:
        f.write(stderr)


def test_an_abort_after_the_last_step_is_a_death_in_teardown(tmp_path):
    leave(tmp_path, recorded=[3, 4])
    (outcome,) = rank_outcomes(str(tmp_path), 1, "", False, {0: -signal.SIGABRT})
    assert outcome.status == "shutdown"
    assert outcome.detail.startswith(
        "recorded its last step (4), then aborted in x/distributed_c10d.py:2100 in "
        "destroy_process_group (SIGABRT: 'terminate called without an active exception')"
    ), outcome.detail


@pytest.mark.parametrize(
    "recorded, code, stderr",
    [
        ([3], -signal.SIGABRT, ABORT),  # before its last step: a failed rank
        ([3, 4], -signal.SIGKILL, ABORT),  # not an abort
        ([3, 4], -signal.SIGABRT, "Segmentation fault\n"),  # no sign of a C++ terminate
    ],
)
def test_any_other_death_without_a_status_is_a_failed_rank(tmp_path, recorded, code, stderr):
    leave(tmp_path, recorded, stderr=stderr)
    (outcome,) = rank_outcomes(str(tmp_path), 1, "", False, {0: code})
    assert outcome.status == "none"
    assert outcome.detail == f"killed by {signal.Signals(-code).name}"
