"""csrun_runtime/tensorflow/chief_modes.py with real TensorFlow (the tiny model of tiny.py, a
temporary model_dir): validate_only's exit code and ``validate_report.txt`` (0 when the contract
holds, 2 listing each violation), and compile_only's timing of the first and later steps."""
from __future__ import annotations

import pytest

from csrun_runtime.tensorflow import chief_model, chief_modes
from csrun_runtime.tensorflow.steps import TrainSteps
from tests.unit.csrun_runtime.tensorflow import tiny

pytestmark = pytest.mark.tf


def validate(tmp_path, input_fn=tiny.input_fn, model_fn=tiny.model_fn, workers: int = 0) -> tuple[int, str]:
    params = tiny.resolved(tmp_path, "validate_only").params
    code = chief_modes.validate_only(input_fn, model_fn, params, tiny.eval_input_fn, None, workers, tmp_path)
    return code, (tmp_path / "validate_report.txt").read_text()


def test_validate_only_passes_a_good_run_py(tmp_path):
    code, report = validate(tmp_path)
    assert code == 0 and "OK: no violation" in report and "ERROR" not in report


def test_validate_only_lists_each_violation_and_exits_2(tmp_path):
    def unbatched(params):
        return tiny.input_fn(params).unbatch()

    def no_model(params):
        return None

    code, report = validate(tmp_path, unbatched, no_model, workers=2)
    errors = [line for line in report.splitlines() if line.startswith("ERROR: ")]
    assert code == 2 and errors and errors[0].startswith("ERROR: train_input: ")


def test_compile_only_times_the_first_step_and_the_rest_in_calls(tmp_path):
    params = tiny.resolved(tmp_path, "compile_only", compile_only_steps=3, input_bundle=2).params
    spec = tiny.input_fn(params).element_spec
    model = chief_model.build_model(tiny.model_fn, params, spec)
    model.jit_compile = False
    first, times, per_call = chief_modes.time_steps(model, spec, params["runconfig"],
                                                    lambda m: TrainSteps(m, allow_fallback=False))
    assert per_call == 2 and len(times) == 2 and first > 0 and all(t > 0 for t in times)  # calls of 2 and 1
