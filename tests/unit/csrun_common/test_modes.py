"""csrun_common/modes.py: a run.py's modes, declared once: the runtime's ``--mode`` accepts exactly
them, and the modes that train are among them."""
from __future__ import annotations

import pytest

from csrun_common.modes import MODES, TRAIN_MODES
from csrun_runtime.params import ParamsError, parse_args


def test_the_runtime_accepts_exactly_the_declared_modes():
    for mode in MODES:
        assert parse_args(["--mode", mode]).mode == mode
    with pytest.raises((ParamsError, SystemExit)):
        parse_args(["--mode", "predict"])


def test_the_training_modes_are_modes():
    assert set(TRAIN_MODES) < set(MODES) and "eval" not in TRAIN_MODES
