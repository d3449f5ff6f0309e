"""csrun_runtime/tensorflow/pipeline.py with real TensorFlow and real files: the training input
built as input worker ``i`` of ``W`` builds it — its params, ``TF_CONFIG`` and seeds while
``input_fn`` runs, put back afterwards; a pipeline that shards its files by the worker count seen
as such, its shuffled file list given the job-wide seed — and the files a built pipeline reads,
read back without opening them: workers 0 and 1 of 2 read disjoint halves."""
from __future__ import annotations

import json
import os

import pytest

from csrun_runtime.params import worker_params
from csrun_runtime.tensorflow.pipeline import build_worker_input, pipeline_files
from tests.unit.csrun_runtime.tensorflow import tiny

pytestmark = pytest.mark.tf
tf = tiny.tf


@pytest.fixture()
def files(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    for k in range(6):
        (data / f"part-{k}.txt").write_text(f"{k}\n")
    return data


def sharded(data):
    seen: dict[str, object] = {}

    def input_fn(params):
        seen["tf_config"] = json.loads(os.environ["TF_CONFIG"])
        seen["params"] = params["train_input"]
        conf = seen["tf_config"]
        names = tf.data.Dataset.list_files(str(data / "*.txt"), shuffle=True)
        names = names.shard(len(conf["cluster"]["worker"]), conf["task"]["index"])
        return names.interleave(tf.data.TextLineDataset).batch(1).repeat()

    return input_fn, seen


def test_worker_i_of_w_gets_its_params_and_tf_config_put_back_after(tmp_path, files):
    params = tiny.resolved(tmp_path, "train").params
    before = os.environ.get("TF_CONFIG")
    input_fn, seen = sharded(files)
    built = build_worker_input(input_fn, params, 1, 3)
    assert os.environ.get("TF_CONFIG") == before
    conf = seen["tf_config"]
    assert conf["task"] == {"type": "worker", "index": 1} and len(conf["cluster"]["worker"]) == 3
    assert (seen["params"]["worker_index"], seen["params"]["num_workers"]) == (1, 3)
    assert built.params["train_input"] == worker_params(params, 1, 3, None)["train_input"]
    assert built.shards_by_worker_count and built.file_list_job_wide and built.worker_index == 1


def test_workers_0_and_1_of_2_read_disjoint_halves_of_the_files(tmp_path, files):
    params = tiny.resolved(tmp_path, "train").params
    input_fn, _ = sharded(files)
    halves = [set(pipeline_files(build_worker_input(input_fn, params, i, 2).dataset)) for i in (0, 1)]
    every = {str(p.resolve()) for p in files.iterdir()}
    assert halves[0] | halves[1] == every and not halves[0] & halves[1] and len(halves[0]) == 3
    assert pipeline_files(tiny.input_fn(params)) is None  # tensors in memory: no file to name
