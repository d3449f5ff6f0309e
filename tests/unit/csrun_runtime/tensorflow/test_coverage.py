"""csrun_runtime/tensorflow/coverage.py, contract rule 7 for a TensorFlow ``input_fn``, with real
TensorFlow and real files: the training input built as input workers 0 and 1 of 2 and the files
they read judged — sharded when they split the files, replicated when both read every file, and
nothing to judge with one input worker in the plan."""
from __future__ import annotations

import pytest

from csrun_runtime.tensorflow.coverage import check_file_coverage
from tests.unit.csrun_runtime.tensorflow import tiny

pytestmark = pytest.mark.tf
tf = tiny.tf


@pytest.fixture()
def files(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    for k in range(4):
        (data / f"part-{k}.txt").write_text(f"{k}\n")
    return data


def input_fn_of(data, shard: bool):
    def input_fn(params):
        ti = params["train_input"]
        names = tf.data.Dataset.list_files(str(data / "*.txt"), shuffle=False)
        if shard:
            names = names.shard(ti["num_workers"], ti["worker_index"])
        return names.interleave(tf.data.TextLineDataset).batch(1).repeat()

    return input_fn


def test_files_split_between_the_workers_are_sharded(tmp_path, files):
    cov = check_file_coverage(input_fn_of(files, shard=True), tiny.resolved(tmp_path, "train").params)
    assert cov.verdict == "sharded" and cov.num_input_workers == 2 and not cov.problems
    assert set(cov.files[0]).isdisjoint(cov.files[1]) and len(cov.files[0]) + len(cov.files[1]) == 4


def test_every_file_on_every_worker_is_replicated_and_a_single_worker_is_not_judged(tmp_path, files):
    params = tiny.resolved(tmp_path, "train").params
    cov = check_file_coverage(input_fn_of(files, shard=False), params)
    assert cov.verdict == "replicated" and cov.files[0] == cov.files[1] and len(cov.files[0]) == 4
    one = check_file_coverage(input_fn_of(files, shard=False), params, plan={"num_workers": 1, "workers": []})
    assert (one.verdict, one.note) == ("unknown", "one input worker: nothing to share")
