"""launcher/runs/states.py: the seven states, Slurm's mapped onto them, het components combined,
and the markers' state when Slurm no longer knows the job."""
from __future__ import annotations

import pytest

from launcher.runs import states as S


def test_every_slurm_word_maps_to_one_of_the_seven():
    assert set(S.SLURM_STATES.values()) <= set(S.STATES)
    assert S.from_slurm("CANCELLED by 0") == S.CANCELLED
    assert S.from_slurm("COMPLETED") == S.SUCCEEDED and S.from_slurm("NODE_FAIL") == S.FAILED
    assert S.from_slurm("COMPLETING") == S.RUNNING and S.from_slurm("REQUEUE_HOLD") == S.REQUEUED
    assert S.from_slurm("SOME_FUTURE_STATE") == S.RUNNING  # squeue still holds the job


@pytest.mark.parametrize("components, expected", [
    ([S.RUNNING, S.PENDING], S.RUNNING),            # the workers' component started first
    ([S.PENDING, S.PENDING], S.PENDING),
    ([S.SUCCEEDED, S.RUNNING], S.RUNNING),           # one component still leaving
    ([S.SUCCEEDED, S.SUCCEEDED], S.SUCCEEDED),
    ([S.CANCELLED, S.FAILED], S.FAILED),             # the chief failed; srun then ended the workers
    ([S.CANCELLED, S.TIMEOUT], S.TIMEOUT),
    ([S.SUCCEEDED, S.CANCELLED], S.CANCELLED),
])
def test_components_combined(components, expected):
    assert S.combine(components) == expected


def test_combine_needs_a_state():
    with pytest.raises(ValueError):
        S.combine([])


def test_run_state_pending_after_an_attempt_is_requeued_and_a_cancel_wins():
    assert S.run_state(["PENDING", "PENDING"], ended_attempts=1, cancel_requested=False) == S.REQUEUED
    assert S.run_state(["PENDING"], ended_attempts=0, cancel_requested=False) == S.PENDING
    assert S.run_state(["FAILED", "CANCELLED by 0"], 1, cancel_requested=True) == S.CANCELLED  # exit 130 on SIGINT
    assert S.run_state(["COMPLETED"], 1, cancel_requested=True) == S.SUCCEEDED


@pytest.mark.parametrize("end, cancel, elapsed, limit, state", [
    ({"status": 0}, False, 10, None, S.SUCCEEDED),
    ({"status": 1}, False, 10, None, S.FAILED),
    ({"status": 75}, False, 10, None, S.FAILED),     # stopped at a checkpoint, not requeued: left failed
    ({"status": 130}, True, 10, None, S.CANCELLED),  # csrun cancel --checkpoint: the tasks' SIGINT
    ({"status": None}, False, 10, 600, S.CANCELLED),  # output cut short: scancel
    ({"status": None}, False, 598, 600, S.TIMEOUT),   # ... at its time limit
    (None, False, 10, None, S.FAILED),                 # no end marker: the filter was killed
    (None, True, 10, None, S.CANCELLED),
])
def test_from_markers(end, cancel, elapsed, limit, state):
    got, reason = S.from_markers(end, cancel_requested=cancel, elapsed_s=elapsed, time_limit_s=limit)
    assert got == state and reason
