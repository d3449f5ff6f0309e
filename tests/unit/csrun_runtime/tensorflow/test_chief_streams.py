"""csrun_runtime/tensorflow/chief_streams.py with real TensorFlow (single-process mode, the tiny
inputs of tiny.py): the training input checked as input worker 0 builds it (its batch size, each
violation refused naming ``train_input``), and the in-process pipeline as the training source with
its bundling and the device prefetch's decision kept for performance.json. The chief with input
workers' streams runs on the test cluster (tests/integration/test_main_job.py)."""
from __future__ import annotations

import pytest

from csrun_runtime.tensorflow.chief_streams import ChiefStreams
from csrun_runtime.tensorflow.contract import Refused
from csrun_runtime.tensorflow.sources import LocalSource
from tests.unit.csrun_runtime.tensorflow import tiny

pytestmark = pytest.mark.tf


def streams(tmp_path, input_fn=tiny.input_fn, **runconfig) -> ChiefStreams:
    return ChiefStreams(tiny.single_role(), tiny.resolved(tmp_path, "train", **runconfig).params, "train", input_fn)


def test_the_training_input_is_checked_as_input_worker_0_builds_it(tmp_path):
    seen = []

    def input_fn(params):
        seen.append((params["train_input"]["worker_index"], params["train_input"]["num_workers"]))
        return tiny.input_fn(params)

    ds, spec, batch = streams(tmp_path, input_fn).check_train_input()
    assert seen == [(0, 1)] and batch == tiny.BATCH and spec == ds.element_spec


@pytest.mark.parametrize("input_fn, says", [
    (lambda: None, "train_input: "),
    (lambda params: 1 / 0, "train_input: the input function raised ZeroDivisionError"),
    (lambda params: tiny.input_fn(params).take(2), "train_input: "),
])
def test_a_training_input_that_breaks_the_contract_is_refused(tmp_path, input_fn, says):
    with pytest.raises(Refused) as e:
        streams(tmp_path, input_fn).check_train_input()
    assert e.value.problems and e.value.problems[0].startswith(says), e.value.problems


def test_the_in_process_source_and_what_performance_json_says_of_it(tmp_path):
    s = streams(tmp_path, input_bundle=3)
    ds, _, _ = s.check_train_input()
    source = s.training_source(ds, [])
    assert isinstance(source, LocalSource) and source.get_chunk(8, 0.0, "x").steps == 3
    bundle = s.ingest_info["input_bundle"]
    assert (bundle["setting"], bundle["batches_per_element"]) == (3, {"in-process": 3})
    assert s.ingest_info["device_prefetch"]["on"] is False  # no GPU here: nothing to prefetch to
    source.close()
    s.close()
