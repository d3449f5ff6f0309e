"""Unit tests of verify's and the drain's pure parts (no cluster, no TensorFlow)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from analyzer import analyze as A
from analyzer import verify as V
from csrun_common.layout import LayoutSpec


def _report(tmp_path: Path) -> Path:
    d = tmp_path / "ana"
    d.mkdir()
    rep = {"run_py": "/x/run.py", "argv": ["--params", "p.yaml", "--model_dir", "/user/md", "--mode", "validate_only"],
           "cwd": str(tmp_path), "mount_dirs": None,
           "model": {"node_cpus": 2, "r1": 100.0, "p": 0.5, "sigma": 0.0, "k": 0.01, "io_cap": None,
                     "rel_spread": 0.05, "resid_rms": 0.0, "n_probes": 3, "measured": {}},
           "recommendation": {"nodes": 2, "tasks_per_node": 2, "cpus_per_task": 1, "single_task_nodes": 0,
                              "predicted_samples_per_sec": 150.0, "interval": [135.0, 165.0]},
           "ingest": None, "topology": None}
    (d / "report.json").write_text(json.dumps(rep))
    return d


def test_drain_command_keeps_user_args_and_moves_model_dir(tmp_path):
    d = _report(tmp_path)
    rep = V.load_report(V.find_report(str(d)))
    argv = V.drain_command(rep, d / "verify", {"nodes": 2, "tasks_per_node": 2, "cpus_per_task": 1}, 10, 3, None)
    assert argv[1:7] == ["--total-nodes", "2", "--tasks-per-node", "2", "--cpus-per-task", "1"]
    i = argv.index("python-ws")
    assert argv[i:i + 3] == ["python-ws", "-m", "analyzer.verify_task"]
    assert "/user/md" not in argv
    assert argv[-2:] == ["--model_dir", str(d / "verify" / "model_dir")]
    assert "--params" in argv and "p.yaml" in argv


def test_prediction_for_another_layout(tmp_path):
    rep = V.load_report(_report(tmp_path) / "")
    assert V.predicted_for(rep, LayoutSpec(2, 2, 1))["predicted_samples_per_sec"] == 150.0
    other = V.predicted_for(rep, LayoutSpec(1, 1, 2))
    assert other["nodes"] == 1 and other["predicted_samples_per_sec"] > 0


def test_report_without_recommendation_is_refused(tmp_path):
    (tmp_path / "report.json").write_text(json.dumps({"error": "no successful probe"}))
    with pytest.raises(A.CsrunError, match="no recommendation"):
        V.load_report(tmp_path)
    with pytest.raises(A.CsrunError):
        V.find_report(str(tmp_path / "nothing"))


def test_render():
    res = {"layout": {"nodes": 2, "tasks_per_node": 2, "cpus_per_task": 1}, "predicted_samples_per_sec": 1000.0,
           "interval": [900.0, 1100.0], "limited_by": "input workers", "measured_samples_per_sec": 950.0,
           "error_pct": -5.0, "within_interval": True,
           "drain": {"window_s": 10.0, "num_workers": 3, "startup_s": 12.0, "other_cores_busy": 0.1,
                     "job_cpu_cores_on_host": 1.8, "host_cpus": 2}}
    text = V.render(res)
    assert "predicted: 1,000 samples/s" in text and "measured:  950" in text and "error:     -5.0 %" in text


def test_drain_command_for_a_pytorch_report_launches_python_pt_with_the_recommended_dataloader_workers(tmp_path):
    d = _report(tmp_path)
    rep = json.loads((d / "report.json").read_text())
    rep["framework"] = "pytorch"
    rep["recommendation"]["dataloader_workers"] = 3
    rep["probes"] = [{"kind": "pipeline", "tasks": 1, "cpus_per_task": 2, "dataloader_workers": w, "status": "ok",
                      "samples_per_sec": r} for w, r in ((0, 10.0), (1, 12.0), (2, 30.0))]
    (d / "report.json").write_text(json.dumps(rep))
    rep = V.load_report(d)
    argv = V.drain_command(rep, d / "verify", {"nodes": 2, "tasks_per_node": 2, "cpus_per_task": 1}, 10, 3, None)
    i = argv.index("python-pt")
    assert argv[i:i + 7] == ["python-pt", "-m", "analyzer.verify_task", "--framework", "pytorch",
                             "--dataloader-workers", "3"]
    other = V.drain_command(rep, d / "verify", {"nodes": 1, "tasks_per_node": 1, "cpus_per_task": 2}, 10, 3, None)
    j = other.index("--dataloader-workers")
    assert other[j + 1] == "2"  # another C: the best count measured there
