"""Unit tests of analyzer.model: the fit and the bottleneck class on recorded probe tables."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from analyzer import model as M
from tests.unit.paths import FIXTURES

FIX = FIXTURES / "probes"


def load(name: str) -> pd.DataFrame:
    return pd.read_csv(FIX / name)


def synthetic(n: int, r1: float, p: float, layouts, noise: float = 0.0, seed: int = 0,
              k: float | None = None) -> pd.DataFrame:
    """A probe table from the model itself (optionally with multiplicative noise)."""
    rng = np.random.default_rng(seed)
    rows = []
    k = k if k is not None else 1.0 / r1
    for i, (t, c) in enumerate(layouts):
        rate = M.NodeModel(node_cpus=n, r1=r1, p=p, sigma=0.0, k=k).model_rate(t, c)
        rate *= 1 + noise * rng.standard_normal()
        cores = min(rate * k, min(t * c, n))
        rows.append({"probe_id": i, "kind": "pipeline", "tasks": t, "cpus_per_task": c, "node_cpus": n,
                     "status": "ok", "samples_per_sec": rate, "cpu_cores_used": cores,
                     "cpu_util": cores / min(t * c, n), "cpu_seconds_per_sample": k})
    return pd.DataFrame(rows)


def test_fit_recovers_parameters_of_a_noiseless_table():
    df = synthetic(8, 1000.0, 0.9, [(1, 1), (1, 2), (1, 4), (1, 8), (2, 4), (4, 2), (8, 1)])
    m = M.fit(df, 8)
    assert m.p == pytest.approx(0.9, abs=0.02)
    assert m.r1 == pytest.approx(1000.0, rel=0.02)
    assert m.model_rate(2, 2) == pytest.approx(M.NodeModel(8, 1000.0, 0.9, 0.0, 1e-3).model_rate(2, 2), rel=0.03)
    assert math.isinf(m.io_cap)


def test_measured_layouts_are_predicted_by_their_mean():
    df = synthetic(4, 500.0, 0.5, [(1, 1), (1, 4), (4, 1), (4, 1)], noise=0.05, seed=3)
    m = M.fit(df, 4)
    mean41 = df[(df.tasks == 4) & (df.cpus_per_task == 1)].samples_per_sec.mean()
    assert m.node_rate(4, 1) == pytest.approx(mean41)
    assert m.measured["4x1"]["count"] == 2
    assert m.node_rel_spread(4, 1) >= M.MIN_REL_SPREAD
    # an unmeasured layout gets the model and a wider spread than a measured one
    assert m.node_rel_spread(2, 2) >= m.node_rel_spread(1, 1)


def test_round_trip_to_dict():
    df = synthetic(2, 100.0, 0.5, [(1, 1), (1, 2), (2, 1)])
    m = M.fit(df, 2)
    again = M.NodeModel.from_dict(m.to_dict())
    assert again.model_rate(2, 1) == pytest.approx(m.model_rate(2, 1))
    assert again.to_dict()["io_cap"] is None


def test_failed_and_ingest_rows_are_ignored_and_empty_table_raises():
    df = synthetic(2, 100.0, 0.5, [(1, 1), (2, 1)])
    extra = pd.DataFrame([
        {"kind": "pipeline", "tasks": 1, "cpus_per_task": 2, "node_cpus": 2, "status": "failed",
         "samples_per_sec": float("nan")},
        {"kind": "ingest", "tasks": 1, "cpus_per_task": 2, "node_cpus": 2, "status": "ok",
         "samples_per_sec": 1e6, "cpu_seconds_per_sample": 1e-6},
    ])
    m = M.fit(pd.concat([df, extra], ignore_index=True), 2)
    assert m.n_probes == 2
    with pytest.raises(M.ModelError):
        M.fit(extra.iloc[:1], 2)
    with pytest.raises(M.ModelError):
        M.fit(pd.DataFrame(), 2)


def test_contended_probe_is_dropped_when_a_clean_one_exists():
    df = synthetic(2, 1000.0, 0.9, [(1, 1), (1, 2), (1, 2), (2, 1)])
    df["contended"] = [False, True, False, False]
    df.loc[1, "samples_per_sec"] = 900.0  # disturbed by another process
    m = M.fit(df, 2)
    assert m.measured["1x2"]["count"] == 1
    assert m.node_rate(1, 2) == pytest.approx(df.loc[2, "samples_per_sec"])


def test_recorded_cpu_parallel_table_images():
    df = load("images_cluster_cpu_parallel.csv")
    m = M.fit(df, 2)
    c = M.classify(df, m)
    assert c["class"] == M.CPU_PARALLEL
    assert m.p > 0.6
    assert c["cpu_speedup"] > 1.5
    ing = M.ingest_limits(df)
    assert ing["samples_per_sec"] and ing["samples_per_sec"] > 0
    assert ing["cpu_seconds_per_sample"] and ing["cpu_seconds_per_sample"] > 0


def test_recorded_serial_gil_table():
    """A GIL-bound py_function: more CPUs per task do not help, more tasks do."""
    df = load("gil_serial_local.csv")
    m = M.fit(df, 2)
    c = M.classify(df, m)
    assert c["class"] == M.SERIAL
    assert m.p < 0.3
    assert c["cpu_speedup"] < 1.2 < 1.8 < c["task_speedup"]
    # the model predicts no gain from a second CPU in one task
    assert m.model_rate(1, 2) < 1.15 * m.model_rate(1, 1)
    assert any("GIL" in e for e in c["evidence"])


def test_recorded_latency_bound_table():
    df = load("sleep_latency_local.csv")
    m = M.fit(df, 2)
    c = M.classify(df, m)
    assert c["class"] == M.IO_BOUND
    assert c["oversubscribed_speedup"] > 1.5
    assert c["cpu_util_all_tasks"] < 0.3


def test_aggregate_summarises_per_layout():
    df = load("gil_serial_local.csv")
    agg = M.aggregate(df)
    assert list(agg.columns[:5]) == ["tasks", "cpus_per_task", "mean", "std", "count"]
    assert (agg["count"] >= 1).all()
    assert agg.sort_values(["tasks", "cpus_per_task"]).equals(agg)


def test_io_cap_fitted_for_a_plateau_at_low_cpu():
    n = 4
    rows = []
    for t in (1, 2, 4, 8):
        rate = min(t * 100.0, 250.0)
        rows.append({"kind": "pipeline", "tasks": t, "cpus_per_task": 1, "node_cpus": n, "status": "ok",
                     "samples_per_sec": rate, "cpu_cores_used": 0.05 * t, "cpu_util": 0.05 * t / min(t, n),
                     "cpu_seconds_per_sample": 0.0002})
    rows.append({"kind": "pipeline", "tasks": 1, "cpus_per_task": 4, "node_cpus": n, "status": "ok",
                 "samples_per_sec": 100.0, "cpu_cores_used": 0.05, "cpu_util": 0.0125,
                 "cpu_seconds_per_sample": 0.0005})
    m = M.fit(pd.DataFrame(rows), n)
    assert m.io_cap == pytest.approx(250.0)
    assert m.model_rate(16, 1) == pytest.approx(250.0)


def test_hop_prior_without_ingest_probe():
    df = synthetic(2, 1000.0, 0.9, [(1, 1), (2, 1)])
    df["samples_per_element"] = 32
    df["element_bytes_per_sec"] = df["samples_per_sec"] * 196608  # 128x128x3 float32 per sample
    ing = M.ingest_limits(df)
    assert ing["samples_per_sec"] is None and ing["source"].startswith("prior")
    expected = (M.HOP_ELEMENT_S + M.HOP_BYTE_S * 196608 * 32) / 32
    assert ing["cpu_seconds_per_sample"] == pytest.approx(expected)
    measured = pd.concat([df, pd.DataFrame([{"kind": "ingest", "tasks": 2, "cpus_per_task": 2, "node_cpus": 2,
                                             "status": "ok", "samples_per_sec": 3000.0,
                                             "cpu_seconds_per_sample": 3e-4}])], ignore_index=True)
    assert M.ingest_limits(measured) == {"samples_per_sec": 3000.0, "cpu_seconds_per_sample": 3e-4,
                                         "cpu_bound": False, "chief_cpu_seconds_per_sample": None,
                                         "worker_hop_cpu_seconds_per_sample": None, "served_samples_per_sec": None,
                                         "source": "ingest probe"}
    # PyTorch (prior=False): csrun's data plane, not tf.data service: no prior from the element size
    bare = M.ingest_limits(df, prior=False)
    assert bare["cpu_seconds_per_sample"] is None and bare["source"] == "none"


def test_serving_cost_from_back_to_back_windows():
    pipe = {"kind": "pipeline", "tasks": 1, "cpus_per_task": 1, "node_cpus": 1, "status": "ok",
            "samples_per_sec": 1000.0, "cpu_seconds_per_sample": 1.0e-3}
    ingest = {"kind": "ingest", "tasks": 2, "cpus_per_task": 1, "node_cpus": 1, "status": "ok",
              "samples_per_sec": 3000.0, "cpu_util": 0.99, "cpu_seconds_per_sample": 3e-4,
              "chief_cpu_seconds_per_sample": 1.8e-4}

    def served(worker, local, chief=1.5e-4):
        return {"kind": "served", "tasks": 2, "cpus_per_task": 1, "node_cpus": 1, "status": "ok",
                "samples_per_sec": 700.0, "worker_cpu_seconds_per_sample": worker,
                "worker_local_cpu_seconds_per_sample": local, "chief_cpu_seconds_per_sample": chief}

    # The CPU ran slower during the served probes than during the pipeline probes: each
    # served probe's own in-process window is the baseline, not the pipeline probes'.
    df = pd.DataFrame([pipe, ingest, served(1.5e-3, 1.2e-3), served(1.55e-3, 1.25e-3), served(1.4e-3, 1.2e-3)])
    ing = M.ingest_limits(df)
    assert ing["worker_hop_cpu_seconds_per_sample"] == pytest.approx(3e-4)
    assert ing["chief_cpu_seconds_per_sample"] == pytest.approx(1.5e-4)  # served beats ingest
    assert ing["cpu_bound"] is True and ing["source"] == "ingest probe, served probe"
    # without the in-process window: the pipeline probes' median is the baseline
    old = df.drop(columns=["worker_local_cpu_seconds_per_sample"])
    assert M.ingest_limits(old)["worker_hop_cpu_seconds_per_sample"] == pytest.approx(5e-4)
