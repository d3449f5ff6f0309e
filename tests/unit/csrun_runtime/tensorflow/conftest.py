"""Fixtures of the TensorFlow runtime's unit tests (no TensorFlow import here)."""
from __future__ import annotations

import logging
import os
import signal

import pytest

from csrun_runtime import preemption


@pytest.fixture()
def quiet_task(monkeypatch):
    """A task's process state restored after the test: no csrun/Slurm variables from the session,
    the stop-signal handlers and the recorded stop, the runtime logger's handlers and level."""
    for var in list(os.environ):
        if var.startswith(("CSRUN_", "SLURM_")) and var != "SLURM_CONF":
            monkeypatch.delenv(var)
    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)}
    log = logging.getLogger("csrun.runtime")
    handlers, level, propagate = list(log.handlers), log.level, log.propagate
    preemption.reset()
    yield
    for s, h in old.items():
        signal.signal(s, h)
    preemption.reset()
    log.handlers[:] = handlers
    log.setLevel(level)
    log.propagate = propagate
