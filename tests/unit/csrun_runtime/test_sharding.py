"""The rules that give each input worker its share of the data, for 1-64 workers
(csrun_runtime/sharding.py, and the seeds of csrun_runtime/params.worker_params). No
TensorFlow: the same rules on real pipelines are in tests/integration/test_modelzoo_local.py
and, through csrun_wse, test_modelzoo_cluster.py."""
from __future__ import annotations

import glob
import json
import os

import pytest

from csrun_runtime.params import worker_params
from csrun_runtime.sharding import file_list_seed, make_data_dir_view, plan_files, tf_config, tf_config_for

COUNTS = range(1, 65)
PARAMS = {"train_input": {"data_dir": "d", "batch_size": 8, "shuffle_seed": 100}, "runconfig": {"seed": 7}}


def model_zoo_shard(files: list[str], conf: dict) -> list[str]:
    """What ``dataset.shard(len(cluster.worker), task.index)`` keeps of a file list, the
    Model Zoo's use of TF_CONFIG."""
    n, i = len(conf["cluster"]["worker"]), conf["task"]["index"]
    return files[i::n]


@pytest.mark.parametrize("workers", COUNTS)
def test_tf_config_shards_one_list_into_disjoint_covering_parts(workers):
    files = [f"f{k:03d}" for k in range(97)]
    parts = []
    for i in range(workers):
        conf = tf_config_for(i, workers, has_plan=False)
        assert conf == json.loads(json.dumps(conf))
        assert conf["task"] == {"type": "worker", "index": i}
        assert len(conf["cluster"]["worker"]) == workers
        parts.append(model_zoo_shard(files, conf))
    flat = [f for p in parts for f in p]
    assert sorted(flat) == files and len(flat) == len(set(flat))


@pytest.mark.parametrize("workers", COUNTS)
def test_with_a_plan_tf_config_names_one_worker(workers):
    for i in range(workers):
        conf = tf_config_for(i, workers, has_plan=True)
        assert conf == tf_config(0, 1)
        assert model_zoo_shard(["a", "b", "c"], conf) == ["a", "b", "c"]


def test_tf_config_refuses_an_index_outside_the_job():
    for index, count in ((0, 0), (-1, 3), (3, 3)):
        with pytest.raises(ValueError):
            tf_config(index, count)


@pytest.mark.parametrize("workers", COUNTS)
@pytest.mark.parametrize("base", [100, None])
def test_file_list_seed_is_job_wide_and_shuffle_seeds_are_per_worker(workers, base):
    params = {"train_input": {"batch_size": 8, "shuffle_seed": base}, "runconfig": {}}
    tis = [worker_params(params, i, workers, job_key="4711.0")["train_input"] for i in range(workers)]
    assert len({t["file_list_seed"] for t in tis}) == 1
    if base is None:
        assert all(t["shuffle_seed"] is None for t in tis)  # unseeded: random per process
    else:
        assert tis[0]["file_list_seed"] == base
        assert len({t["shuffle_seed"] for t in tis}) == workers
    assert [t["worker_index"] for t in tis] == list(range(workers))
    assert {t["num_workers"] for t in tis} == {workers}


def test_unseeded_file_list_seed_differs_between_jobs_and_is_an_int64():
    seeds = {file_list_seed(None, f"{job}.0") for job in range(1000, 1100)}
    assert len(seeds) > 95
    assert all(0 <= s < 2 ** 63 for s in seeds)
    assert file_list_seed(5, "1.0") == file_list_seed(5, "2.0") == 5


def test_plan_seeds_stay_per_worker_and_the_file_list_seed_job_wide():
    plan = {"num_workers": 3, "workers": [{"index": i, "files": [f"/x/{i}"], "seed": 50 + i} for i in range(3)]}
    tis = [worker_params(PARAMS, i, 3, plan, job_key="9.0")["train_input"] for i in range(3)]
    assert [t["shuffle_seed"] for t in tis] == [50, 51, 52]
    assert len({t["file_list_seed"] for t in tis}) == 1
    assert [t["data_files"] for t in tis] == [["/x/0"], ["/x/1"], ["/x/2"]]


def _dataset(root) -> list[str]:
    """A Model Zoo-like data directory: 70 record files, metadata, eval files and a UNet-style
    train/ subdirectory."""
    (root / "train").mkdir(parents=True)
    paths = []
    for k in range(70):
        p = root / f"part-{k:03d}.tfrecord"
        p.write_bytes(b"")
        paths.append(str(p))
    (root / "meta.json").write_text("{}")
    (root / "eval-000.tfrecord.eval").write_bytes(b"")
    for k in range(5):
        (root / "train" / f"train-{k}.tfrecords").write_bytes(b"")
    return paths


@pytest.mark.parametrize("workers", [1, 2, 3, 6, 7, 13, 64])
def test_data_dir_views_show_each_worker_only_its_plan_files(tmp_path, workers):
    data = tmp_path / "data"
    files = _dataset(data)
    plan = {"num_workers": workers, "workers": [
        {"index": i, "files": files[i::workers], "seed": i} for i in range(workers)]}
    seen = []
    for i in range(workers):
        own, others = plan_files(plan, i)
        view = make_data_dir_view(str(data), own, others, tmp_path / "views" / str(i))
        assert isinstance(view.data_dir, str) and view.outside == []
        listed = {os.path.realpath(p) for p in glob.glob(os.path.join(view.data_dir, "*.tfrecord*"))}
        records = {p for p in listed if os.path.basename(p).startswith("part-")}
        assert records == own
        assert view.hidden == len(others)
        # what the plan does not mention stays visible, nested layouts too
        assert os.path.exists(os.path.join(view.data_dir, "meta.json"))
        assert len(glob.glob(os.path.join(view.data_dir, "train", "train-*.tfrecords"))) == 5
        seen += records
    assert sorted(seen) == sorted(os.path.realpath(f) for f in files) and len(seen) == len(set(seen))


def test_a_replacement_rebuilds_its_view_in_place(tmp_path):
    """A replacement worker (same index, after its process died) builds its view where its
    predecessor's is: it must not fail on the links already there, and shows the same files."""
    data = tmp_path / "data"
    files = _dataset(data)
    plan = {"num_workers": 2, "workers": [{"index": i, "files": files[i::2], "seed": i} for i in range(2)]}
    own, others = plan_files(plan, 0)
    first = make_data_dir_view(str(data), own, others, tmp_path / "views" / "0")
    again = make_data_dir_view(str(data), own, others, tmp_path / "views" / "0")
    assert again.data_dir == first.data_dir and again.hidden == first.hidden == len(others)
    listed = {os.path.realpath(p) for p in glob.glob(os.path.join(again.data_dir, "part-*"))}
    assert listed == own


def test_data_dir_view_keeps_a_list_a_list_and_reports_files_outside(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    fa, fb = _dataset(a), _dataset(b)
    elsewhere = tmp_path / "elsewhere.tfrecord"
    elsewhere.write_bytes(b"")
    plan = {"num_workers": 2, "workers": [{"index": 0, "files": fa[:3] + [str(elsewhere)], "seed": 0},
                                          {"index": 1, "files": fa[3:] + fb, "seed": 1}]}
    own, others = plan_files(plan, 0)
    view = make_data_dir_view([str(a), str(b), str(tmp_path / "missing")], own, others, tmp_path / "v")
    assert isinstance(view.data_dir, list) and len(view.data_dir) == 3
    assert view.data_dir[2] == str(tmp_path / "missing") and view.notes
    assert view.outside == [os.path.realpath(elsewhere)]
    shown = {os.path.realpath(p) for d in view.data_dir[:2] for p in glob.glob(os.path.join(d, "part-*"))}
    assert shown == {os.path.realpath(f) for f in fa[:3]}


def test_no_data_dir_no_view(tmp_path):
    assert make_data_dir_view(None, set(), set(), tmp_path / "v").data_dir is None
