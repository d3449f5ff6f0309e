"""Unit tests of analyzer.recommend: extending the node model to layouts and choosing one."""
from __future__ import annotations

import pandas as pd
import pytest

from analyzer import model as M
from analyzer import recommend as R
from csrun_common.layout import LayoutSpec
from tests.unit.paths import FIXTURES

FIX = FIXTURES / "probes"


def node_model(n=8, r1=1000.0, p=0.9, k=None, **kw) -> M.NodeModel:
    return M.NodeModel(node_cpus=n, r1=r1, p=p, sigma=0.0, k=k if k is not None else 1.0 / r1, **kw)


def test_in_process_layout_is_the_node_rate():
    m = node_model()
    pr = R.predict_layout(m, LayoutSpec(1, 1, 8))
    assert pr["input_workers"] == 0
    assert pr["limited_by"] == "in-process pipeline"
    assert pr["predicted_samples_per_sec"] == pytest.approx(m.model_rate(1, 8))
    lo, hi = pr["interval"]
    assert lo < pr["predicted_samples_per_sec"] < hi


def test_nodes_add_up_and_the_chief_takes_one_task_slot():
    m = node_model()
    one = m.model_rate(4, 2)
    pr = R.predict_layout(m, LayoutSpec(3, 4, 2))
    assert pr["input_workers"] == 3 + 2 * 4
    assert pr["predicted_samples_per_sec"] == pytest.approx(one * 3 / 4 + 2 * one)
    single = R.predict_layout(m, LayoutSpec(3, 4, 2, single_task_nodes=1))
    assert single["input_workers"] == 2 * 4
    assert single["predicted_samples_per_sec"] == pytest.approx(2 * one)


def test_chief_ingest_caps_the_rate():
    m = node_model()
    pr = R.predict_layout(m, LayoutSpec(5, 8, 1), {"samples_per_sec": 3000.0, "cpu_seconds_per_sample": 1e-4})
    assert pr["predicted_samples_per_sec"] == pytest.approx(3000.0)
    assert pr["limited_by"] == "chief ingest"


def test_shared_host_caps_by_its_cores():
    # 5 nodes on one 2-core host; pipeline 1 ms/sample, service hop 0.25 ms/sample.
    m = node_model(n=2, r1=1000.0, p=0.9, k=1e-3)
    topo = {"node_hosts": ["vm"] * 5, "host_cores": {"vm": 2}}
    ing = {"samples_per_sec": None, "cpu_seconds_per_sample": 2.5e-4}
    pr = R.predict_layout(m, LayoutSpec(5, 2, 1), ing, topo)
    assert pr["limited_by"] == "shared host CPUs"
    assert pr["predicted_samples_per_sec"] == pytest.approx(2 / (1e-3 + 2.5e-4), rel=0.01)
    # independent nodes: no such cap
    free = R.predict_layout(m, LayoutSpec(5, 2, 1), ing)
    assert free["predicted_samples_per_sec"] > 4 * pr["predicted_samples_per_sec"]


def test_serving_cost_slows_a_cpu_bound_worker_node():
    # Pinned test cluster, images: 1 CPU per node, pipeline 0.725 ms/sample on a saturated
    # CPU; serving adds 0.29 ms/sample on the worker, 0.16 ms/sample on the chief.
    m = node_model(n=1, r1=1380.0, p=1.0, k=0.725e-3)
    ing = {"samples_per_sec": 3500.0, "cpu_bound": True, "cpu_seconds_per_sample": 0.28e-3,
           "chief_cpu_seconds_per_sample": 0.16e-3, "worker_hop_cpu_seconds_per_sample": 0.29e-3}
    pr = R.predict_layout(m, LayoutSpec(2, 1, 1), ing)
    assert pr["predicted_samples_per_sec"] == pytest.approx(1 / (0.725e-3 + 0.29e-3), rel=1e-3)
    assert pr["limited_by"] == "node CPUs (pipeline and serving)"
    assert pr["workers_rate"] == pytest.approx(1380.0, rel=1e-3)
    # without a served probe the workers deliver their probed rate
    bare = R.predict_layout(m, LayoutSpec(2, 1, 1), {k: v for k, v in ing.items()
                                                     if k != "worker_hop_cpu_seconds_per_sample"})
    assert bare["predicted_samples_per_sec"] == pytest.approx(1380.0, rel=1e-3)
    # the in-process pipeline (no service) beats one worker node here ...
    inproc = R.predict_layout(m, LayoutSpec(1, 1, 1), ing)["predicted_samples_per_sec"]
    assert inproc > pr["predicted_samples_per_sec"]
    # ... but not one worker node plus input worker 0 on what the chief leaves of its CPU
    # (0.16 ms/sample of it): that is the choice for 2 nodes
    rec = R.recommend(m, 2, ingest=ing)
    assert (rec["nodes"], rec["tasks_per_node"], rec["cpus_per_task"], rec["chief_input_cpus"]) == (2, 1, 1, 1)
    assert rec["predicted_samples_per_sec"] > 1.2 * inproc
    # with one node the in-process pipeline stays the choice
    one = R.recommend(m, 1, ingest=ing)
    assert (one["nodes"], one["chief_input_cpus"], one["limited_by"]) == (1, 0, "in-process pipeline")


def test_serving_cost_leaves_an_idle_serial_pipeline_alone():
    # A GIL-bound pipeline keeps 1 of 4 CPUs busy: serving runs on the idle ones.
    m = node_model(n=4, r1=500.0, p=0.0, k=0.5e-3, measured={"1x4": {"mean": 500.0, "std": 0.0, "count": 3,
                                                                       "cores_used": 0.25}})
    ing = {"chief_cpu_seconds_per_sample": 1e-5, "worker_hop_cpu_seconds_per_sample": 1e-4}
    pr = R.predict_layout(m, LayoutSpec(3, 1, 4), ing)
    assert pr["predicted_samples_per_sec"] == pytest.approx(2 * 500.0)
    assert pr["limited_by"] == "input workers"


def test_chief_cpus_cap_many_worker_nodes():
    # Chief alone on its node (S = 1, 2 CPUs), 0.1 ms/sample to take the stream: 20,000/s.
    m = node_model(n=2, r1=5000.0, p=1.0, k=0.2e-3)
    ing = {"samples_per_sec": 12000.0, "cpu_bound": True, "chief_cpu_seconds_per_sample": 1e-4,
           "worker_hop_cpu_seconds_per_sample": 0.0}
    pr = R.predict_layout(m, LayoutSpec(9, 1, 2, single_task_nodes=1), ing)
    assert pr["workers_rate"] == pytest.approx(8 * 10000.0)
    assert pr["predicted_samples_per_sec"] == pytest.approx(2 / 1e-4)
    assert pr["limited_by"] == "chief ingest"
    # an ingest probe that left its CPUs idle is a fixed cap (latency, the GIL)
    capped = R.predict_layout(m, LayoutSpec(9, 1, 2, single_task_nodes=1), dict(ing, cpu_bound=False))
    assert capped["predicted_samples_per_sec"] == pytest.approx(12000.0)


def test_target_fewest_nodes_then_fewest_cores():
    m = node_model(n=4, r1=1000.0, p=1.0)  # perfectly parallel: rate = 1000 x cores
    rec = R.recommend(m, available_nodes=4, target=5000.0)
    # 1 node delivers at most 4000 (in-process, 4 cores); 2 nodes x (T x C = 4) deliver
    # (T-1)/T*4000 + 4000 >= 5000 with T = 4: 3000 + 4000 = 7000; fewer cores first.
    assert rec["nodes"] == 2
    assert rec["predicted_samples_per_sec"] >= 5000.0
    assert rec["interval"][0] >= 5000.0 or "low end does not" in rec["reason"]
    assert rec["input_starved"] in (False, "at risk")
    cores = rec["nodes"] * rec["tasks_per_node"] * rec["cpus_per_task"]
    for alt in R.candidate_layouts(4, 2):
        p = R.predict_layout(m, LayoutSpec(*alt))
        if p["interval"][0] >= 5000.0 and alt[0] == 2:
            assert alt[0] * alt[1] * alt[2] >= cores


def test_target_out_of_reach_is_input_starved():
    m = node_model(n=2, r1=100.0, p=0.5)
    rec = R.recommend(m, available_nodes=2, target=1e6)
    assert rec["input_starved"] is True
    assert rec["meets_target"] is False
    assert "no layout" in rec["reason"]


def test_no_target_best_for_available_nodes():
    m = node_model(n=4, r1=1000.0, p=1.0)
    rec = R.recommend(m, available_nodes=3)
    best = max(R.predict_layout(m, LayoutSpec(*c))["predicted_samples_per_sec"] for c in R.candidate_layouts(4, 3))
    assert rec["predicted_samples_per_sec"] >= 0.95 * best
    assert rec["nodes"] == 3
    assert rec["target"] is None and rec["input_starved"] is None
    assert len(rec["alternatives"]) <= 5


def test_serial_table_recommends_one_cpu_per_task():
    df = pd.read_csv(FIX / "gil_serial_local.csv")
    m = M.fit(df, 2)
    rec = R.recommend(m, available_nodes=3, target=15000.0)
    assert rec["cpus_per_task"] == 1
    assert rec["tasks_per_node"] == 2


def test_bad_layouts_raise():
    m = node_model()
    for args in [(0, 1, 1), (1, 0, 1), (1, 1, 0)]:
        with pytest.raises(ValueError):
            R.predict_layout(m, LayoutSpec(*args))
    with pytest.raises(ValueError):
        R.predict_layout(m, LayoutSpec(2, 1, 1, single_task_nodes=2))
    with pytest.raises(ValueError):
        R.recommend(m, 0)
