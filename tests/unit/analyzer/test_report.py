"""Unit tests of the report (text, JSON, CSV, PNG) built from a recorded probe table."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from analyzer import analyze as A
from analyzer import findings as F
from analyzer import report as RP
from tests.unit.paths import FIXTURES

FIX = FIXTURES / "probes"


def test_train_command():
    assert RP.train_command(["python", "run.py", "--params", "p.yaml", "--mode", "validate_only"]) == \
        ["python-ws", "run.py", "--params", "p.yaml", "--mode", "train"]
    assert RP.train_command(["/usr/bin/python3", "run.py", "--mode=compile_only"]) == \
        ["python-ws", "run.py", "--mode=train"]
    assert RP.train_command(["python", "run.py", "--validate_only"]) == ["python-ws", "run.py", "--mode", "train"]


def test_csrun_wse_command_quotes():
    rec = {"nodes": 2, "tasks_per_node": 3, "cpus_per_task": 4}
    line = RP.csrun_wse_command(rec, ["python", "run.py", "--params", "my params.yaml", "--mode", "validate_only"],
                                mount_dirs="/data")
    assert line == ("csrun_wse --total-nodes 2 --tasks-per-node 3 --cpus-per-task 4 --mount-dirs /data "
                    "python-ws run.py --params 'my params.yaml' --mode train")


def _report(tmp_path: Path, table: str, target=None, available=3, topology=None) -> dict:
    rows = pd.read_csv(FIX / table).to_dict("records")
    base = {"command": ["python", "run.py", "--params", "configs/params.yaml", "--mode", "validate_only"],
            "run_py": "/x/run.py", "argv": ["--params", "configs/params.yaml"], "available_nodes": available,
            "node_cpus": 2, "output_dir": str(tmp_path), "probing_s": 30.0, "probed_on": {"node": "node2"},
            "target": {"samples_per_sec": target, "source": "test"}, "notes": []}
    return F.build_report(base, rows, topology)


def test_build_and_write_report(tmp_path):
    rep = _report(tmp_path, "images_cluster_cpu_parallel.csv", target=3000.0,
                  topology={"nodes": ["node1", "node2", "node3"], "node_hosts": ["vm"] * 3,
                            "host_cores": {"vm": 2}, "shared_hosts": ["vm"]})
    rec = rep["recommendation"]
    for key in ("nodes", "tasks_per_node", "cpus_per_task", "predicted_samples_per_sec", "interval"):
        assert key in rec
    assert rep["bottleneck"]["class"] == "CPU-parallel"
    assert rec["input_starved"] is True  # two shared cores cannot deliver 3000/s of JPEGs
    A._finish(tmp_path, rep)
    data = json.loads((tmp_path / RP.REPORT_JSON).read_text())
    assert data["recommendation"]["nodes"] == rec["nodes"]
    assert len(data["probes"]) == len(rep["probes"])
    assert data["model"]["node_cpus"] == 2
    csv = pd.read_csv(tmp_path / RP.PROBES_CSV)
    assert len(csv) == len(rep["probes"])
    png = (tmp_path / RP.PLOT_PNG).read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    text = (tmp_path / RP.REPORT_TXT).read_text()
    assert "nodes:" in text and "tasks_per_node:" in text and "cpus_per_task:" in text
    assert "INPUT-STARVED" in text
    assert text.rstrip().splitlines()[-1].strip().startswith("csrun_wse --total-nodes")


def test_serial_report_evidence(tmp_path):
    rep = _report(tmp_path, "gil_serial_local.csv")
    assert rep["bottleneck"]["class"] == "serial"
    text = RP.render_text(rep)
    assert "serial" in text and "GIL" in text


def test_report_without_successful_probe(tmp_path):
    rows = [{"probe_id": 0, "kind": "pipeline", "tasks": 1, "cpus_per_task": 2, "node_cpus": 2,
             "status": "failed", "error": "ValueError: boom", "samples_per_sec": float("nan")}]
    rep = F.build_report({"available_nodes": 1, "node_cpus": 2, "command": ["python", "run.py"]}, rows, None)
    assert "recommendation" not in rep and "no successful probe" in rep["error"]
    assert A._finish(tmp_path, rep) == 1
    assert "No recommendation" in (tmp_path / RP.REPORT_TXT).read_text()
    assert json.loads((tmp_path / RP.REPORT_JSON).read_text())["probes"][0]["error"] == "ValueError: boom"


def test_clean_json_has_no_nan(tmp_path):
    RP.write_json(tmp_path, {"a": float("nan"), "b": [float("inf"), 1.0], "_private": 1})
    d = json.loads((tmp_path / RP.REPORT_JSON).read_text())
    assert d == {"a": None, "b": [None, 1.0]}
