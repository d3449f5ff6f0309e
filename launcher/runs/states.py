"""A run's states, defined once: the seven states, Slurm's job states mapped onto them, the
het components combined into one, and the state an attempt's markers give when Slurm no
longer knows the job (docs/RUNS.md "States"). Pure."""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

PENDING, RUNNING, REQUEUED = "PENDING", "RUNNING", "REQUEUED"
SUCCEEDED, FAILED, CANCELLED, TIMEOUT = "SUCCEEDED", "FAILED", "CANCELLED", "TIMEOUT"
#: Every state, in the order a run passes through them.
STATES = (PENDING, RUNNING, REQUEUED, SUCCEEDED, FAILED, CANCELLED, TIMEOUT)
#: States a run never leaves.
TERMINAL = frozenset({SUCCEEDED, FAILED, CANCELLED, TIMEOUT})

#: Slurm's job states (squeue(1) "JOB STATE CODES", sacct(1) "JOB STATE CODES") as run states.
#: A job requeued and waiting again is PENDING to Slurm and REQUEUED here (:func:`run_state`);
#: COMPLETING still runs (its processes are leaving); PREEMPTED without a requeue ended it.
SLURM_STATES: Mapping[str, str] = {
    "PENDING": PENDING, "CONFIGURING": PENDING, "RESV_DEL_HOLD": PENDING,
    "RUNNING": RUNNING, "COMPLETING": RUNNING, "SUSPENDED": RUNNING, "STOPPED": RUNNING, "SIGNALING": RUNNING,
    "STAGE_OUT": RUNNING, "RESIZING": RUNNING,
    "REQUEUED": REQUEUED, "REQUEUE_FED": REQUEUED, "REQUEUE_HOLD": REQUEUED,
    "COMPLETED": SUCCEEDED,
    "FAILED": FAILED, "NODE_FAIL": FAILED, "BOOT_FAIL": FAILED, "OUT_OF_MEMORY": FAILED, "PREEMPTED": FAILED,
    "DEADLINE": FAILED, "SPECIAL_EXIT": FAILED,
    "CANCELLED": CANCELLED, "REVOKED": CANCELLED,
    "TIMEOUT": TIMEOUT,
}
#: Terminal states in the order one component's decides the run's: a failed component failed
#: the run, whatever the others then became (srun's --kill-on-bad-exit ends them).
PRECEDENCE = (FAILED, TIMEOUT, CANCELLED, SUCCEEDED)


def from_slurm(word: str) -> str:
    """A Slurm state word (``CANCELLED by 0`` too) as a run state; one not in :data:`SLURM_STATES`: RUNNING."""
    return SLURM_STATES.get(word.split()[0] if word else "", RUNNING)


def combine(states: Iterable[str]) -> str:
    """One state of several het components' run states: RUNNING while any runs, else REQUEUED,
    else PENDING while any is not terminal; else the first of :data:`PRECEDENCE` present.
    Raises ValueError on no state."""
    have = set(states)
    if not have:
        raise ValueError("no component state")
    active = have - TERMINAL
    for state in (RUNNING, REQUEUED, PENDING):
        if state in active:
            return state
    return next(s for s in PRECEDENCE if s in have)


def run_state(components: Iterable[str], ended_attempts: int, cancel_requested: bool) -> str:
    """The run's state from its current job's components (Slurm words): PENDING after an ended
    attempt is REQUEUED; a run cancelled through csrun that then failed or was cancelled (its
    tasks stopped on the signal, exit 130) is CANCELLED."""
    state = combine(from_slurm(w) for w in components)
    if state == PENDING and ended_attempts > 0:
        return REQUEUED
    if cancel_requested and state in (FAILED, CANCELLED):
        return CANCELLED
    return state


def from_markers(end: Mapping[str, Any] | None, *, cancel_requested: bool, elapsed_s: float | None,
                 time_limit_s: float | None) -> tuple[str, str]:
    """``(state, reason)`` of a job Slurm no longer knows, from its last attempt's ``end.json``
    (:mod:`launcher.attempts`): srun's status 0 SUCCEEDED; no status (the output ended without
    it: the job was cancelled or killed) CANCELLED, or TIMEOUT when the attempt had run its
    whole time limit; no end marker at all FAILED (its filter was killed: a lost node); any
    other status FAILED, or CANCELLED when csrun cancelled it."""
    if end is None:
        return (CANCELLED, "cancelled (no end marker)") if cancel_requested else \
            (FAILED, "the job ended without its end marker (killed, or its node lost)")
    status = end.get("status")
    if status == 0:
        return SUCCEEDED, "exit 0"
    if cancel_requested:
        return CANCELLED, "cancelled through csrun"
    if status is None:
        if time_limit_s and elapsed_s is not None and elapsed_s >= time_limit_s - 5:
            return TIMEOUT, "ended at its time limit"
        return CANCELLED, "its output ended without srun's status: cancelled"
    return FAILED, f"exit {status}"
