"""analyzer/cpu_domains.py: the chief's costs and the in-process layout (the balance of the CPU
domains is tested through analyzer.recommend.predict_layout in test_recommend.py)."""
from __future__ import annotations

import pytest

from analyzer import cpu_domains as C
from analyzer import model as M


def test_the_chiefs_costs_are_its_own_when_measured_else_the_whole_hop():
    assert C.chief_costs({"chief_cpu_seconds_per_sample": 2e-4, "cpu_seconds_per_sample": 5e-4,
                          "worker_hop_cpu_seconds_per_sample": 1e-4}) == (2e-4, 1e-4)
    assert C.chief_costs({"cpu_seconds_per_sample": 5e-4}) == (5e-4, 0.0)  # charged to the chief
    assert C.chief_costs({}) == (0.0, 0.0)


def test_the_in_process_layout_runs_at_the_probed_rate_with_its_spread():
    m = M.NodeModel(node_cpus=8, r1=1000.0, p=0.9, sigma=0.0, k=1e-3)
    out = C.in_process(m, {"nodes": 1}, 8)
    rate = m.node_rate(1, 8)
    assert out["nodes"] == 1 and out["input_workers"] == 0 and out["limited_by"] == "in-process pipeline"
    assert out["predicted_samples_per_sec"] == pytest.approx(rate) and out["per_node"] == [rate]
    lo, hi = out["interval"]
    assert lo <= rate <= hi
