"""analyzer/findings.py: the report built from recorded probe tables (pure)."""
from __future__ import annotations

import pandas as pd

from analyzer import findings as F
from tests.unit.paths import FIXTURES


def _base(**kw):
    return {"command": ["python", "run.py", "--mode", "validate_only"], "run_py": "/x/run.py", "argv": [],
            "available_nodes": 3, "node_cpus": 2, "output_dir": "/tmp/x", "probing_s": 20.0,
            "probed_on": {"node": "node2"}, "stopped": "done", "target": {"samples_per_sec": None, "source": "test"},
            "notes": [], **kw}


def test_a_recorded_table_gives_a_model_a_recommendation_and_its_command():
    rows = pd.read_csv(FIXTURES / "probes" / "images_cluster_cpu_parallel.csv").to_dict("records")
    rep = F.build_report(_base(), rows, None)
    assert "error" not in rep and rep["model"]["node_cpus"] == 2
    rec = rep["recommendation"]
    assert rec["predicted_samples_per_sec"] > 0 and rec["nodes"] >= 1
    assert rep["csrun_wse_command"].startswith("csrun_wse ") and "--total-nodes" in rep["csrun_wse_command"]


def test_too_few_probes_say_why_and_recommend_nothing():
    rep = F.build_report(_base(), [], None)
    assert "error" in rep and "recommendation" not in rep
