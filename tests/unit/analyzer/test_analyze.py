"""analyzer/analyze.py: the user's command split into its program, script and arguments; the target
rate found in a model_dir; the cluster's topology."""
from __future__ import annotations

import json

import pytest

from analyzer import analyze as A


def test_split_command(tmp_path):
    (tmp_path / "run.py").write_text("")
    c = A.split_command(["python", "run.py", "--mode", "validate_only"], str(tmp_path))
    assert c.run_py == str((tmp_path / "run.py").resolve()) and c.argv == ["--mode", "validate_only"]
    c = A.split_command(["run.py"], str(tmp_path))
    assert c.python_word is None
    with pytest.raises(A.CsrunError):
        A.split_command([], str(tmp_path))
    with pytest.raises(A.CsrunError):
        A.split_command(["python", "-c", "1"], str(tmp_path))


def test_find_target(tmp_path):
    assert A.find_target(str(tmp_path))[0] is None
    (tmp_path / "performance").mkdir()
    (tmp_path / "performance" / "performance.json").write_text(json.dumps({"est_samples_per_sec": 1234.5}))
    v, src = A.find_target(str(tmp_path))
    assert v == 1234.5 and "previous run" in src
    (tmp_path / "compile_report.txt").write_text("Estimated throughput: 2,500.5 samples/s\n")
    v, src = A.find_target(str(tmp_path))
    assert v == 2500.5 and "compile_report.txt" in src
    (tmp_path / "compile_report.json").write_text(json.dumps({"est_samples_per_sec": 999}))
    assert A.find_target(str(tmp_path))[0] == 999.0


def test_topology_pinned_nodes_are_independent():
    info = {"nodes": ["node1", "node2"], "node_cpus": 1, "node_hosts": ["vm", "vm"], "host_cores": {"vm": 2}}
    hello = [{"host": "vm", "cpu_count": 2}]
    assert A._topology(info, hello) is None  # 1 + 1 declared CPUs on a 2-core host: pinned
    shared = {"nodes": [f"node{i}" for i in range(1, 6)], "node_cpus": 2, "node_hosts": ["vm"] * 5,
              "host_cores": {"vm": 10}}
    topo = A._topology(shared, hello)
    assert topo["host_cores"] == {"vm": 2} and topo["shared_hosts"] == ["vm"]
    assert A._topology({**shared, "node_hosts": [f"h{i}" for i in range(5)],
                        "host_cores": {f"h{i}": 2 for i in range(5)}}, hello) is None  # one node per host
