"""csrun_runtime/input_backend.py: what every framework's input backend shares: a build error's one
line and its detail, a built input's defaults, and the samples in an element from its flattened
tensors (the leading dimension of the first; 1 when there is none)."""
from __future__ import annotations

import numpy as np

from csrun_runtime.input_backend import BuiltInput, InputBuildError, samples_in


def test_a_build_error_is_one_line_with_its_detail_apart():
    e = InputBuildError("train_input: the DataLoader raised ValueError: bad row", "  File \"data.py\", line 3\n")
    assert str(e) == "train_input: the DataLoader raised ValueError: bad row" and e.detail.startswith("  File")
    assert isinstance(e, ValueError) and InputBuildError("x").detail == ""


def test_a_built_input_counts_no_restart_and_closes_idempotently():
    built = BuiltInput(iter([1, 2]), measure=lambda b: (1, 8))
    assert built.restarts == [0] and built.info == {} and built.close() is None and built.close() is None
    assert next(built.batches) == 1 and built.measure(1) == (1, 8)


def test_samples_in_an_element():
    assert samples_in([np.zeros((32, 3)), np.zeros(32)]) == 32
    assert samples_in([np.float32(1.0)]) == 1 and samples_in([]) == 1

    class Unknown:  # a symbolic tensor whose batch dimension is not known
        shape = (None, 3)

    assert samples_in([Unknown()]) == 1
