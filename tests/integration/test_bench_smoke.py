"""Smoke test of the benchmark harness on the Slurm test cluster (no timing assertions).

Runs ``bench/run.py --quick --only launch,startup,shardplan,ingest`` into a temporary results
directory and checks that every JSON file exists with the common metadata and its
benchmark's figures, and that the Markdown table was generated from them.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.cluster

REQUIRED = {
    "launch": ["csrun_wse_s", "srun_s", "compare", "layout", "pairs"],
    "startup": ["commands", "ratios", "paired"],
    "shardplan": ["plan_s", "imbalance", "files", "workers"],
    "ingest": ["ceiling", "loop", "many", "targets"],
}
META = ["date", "quick", "host_cores", "pinned", "versions", "cluster", "elapsed_s"]


def test_bench_quick_smoke(cli_env, tmp_path):
    results = tmp_path / "results"
    md = tmp_path / "BENCHMARKS.md"
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "run.py"), "--quick", "--only", ",".join(REQUIRED),
         "--results", str(results), "--markdown", str(md)],
        cwd=str(REPO), env=cli_env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name, keys in REQUIRED.items():
        path = results / f"{name}.json"
        assert path.is_file(), f"{path} missing; stderr: {proc.stderr[-2000:]}"
        data = json.loads(path.read_text())
        assert "error" not in data, data.get("error")
        assert data["benchmark"] == name
        for key in keys:
            assert key in data, f"{name}.json lacks {key}"
        for key in META:
            assert key in data["meta"], f"{name}.json meta lacks {key}"
        assert data["meta"]["quick"] is True
        assert data["meta"]["versions"]["python"]
        assert data["meta"]["versions"]["slurm"]
    launch = json.loads((results / "launch.json").read_text())
    assert launch["compare"]["pairs"] == launch["pairs"]
    assert launch["srun_argv"][0] == "srun" and ":" in launch["srun_argv"]  # a het launch
    ingest = json.loads((results / "ingest.json").read_text())
    assert "error" not in ingest["ceiling"]["k=1"], ingest["ceiling"]["k=1"]
    paths = ingest["ceiling"]["k=1"]["sizes"]["256 KiB"]
    for path in ("service", "service, unbundled", "raw TCP", "in-process"):
        assert paths[path]["mb_per_sec"] > 0, path
    assert "error" not in ingest["loop"] and ingest["loop"]["floor_us_per_step"] > 0
    assert ingest["many"]["chief_exit"] == 0 and ingest["many"]["worker_exits"] == [0, 0]
    startup = json.loads((results / "startup.json").read_text())
    assert "python -c pass" in startup["commands"]
    assert startup["commands"]["csrun_wse --dry-run"]["n"] >= 2
    text = md.read_text()
    assert "<!-- bench:table:start -->" in text and "<!-- bench:table:end -->" in text
    for name in REQUIRED:
        assert f"| {name} |" in text


def test_bench_gpu_feed_quick(tmp_path):
    """bench/bench_gpu_feed.py --quick (issue 31): every feed row of both batch kinds is measured
    into this host's device (CUDA when present, else CPU) and the device is named; ~30 s."""
    import os

    out = tmp_path / "gpu_feed.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "bench_gpu_feed.py"), "--quick", "--ks", "1",
                           "--out", str(out)], cwd=str(REPO), env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["meta"]["quick"] is True and data["meta"]["device"]
    for kind in ("images", "small"):
        rows = data["kinds"][kind]
        for row in ("data plane, receive only", "data plane, device feed", "data plane, to_torch", "DataLoader",
                    "DataLoader, fresh", "one copy, receive only", "one copy, to device",
                    "bulk channel, receive only", "bulk channel, device feed", "shared memory, receive only",
                    "shared memory, device feed"):
            assert rows["k=1"][row]["gb_per_sec"] > 0, (kind, row)
            assert rows["k=1"][row]["chief_cores"] >= 0
        assert rows["to_torch alone"]["gb_per_sec"] > 0 and rows["pageable H2D"]["gb_per_sec"] > 0
        assert rows["k=1"]["data plane, device feed"]["feed"]["batches"] > 0
        assert rows["k=1"]["bulk channel, device feed"]["feed"]["batches"] > 0
        assert rows["k=1"]["shared memory, device feed"]["feed"]["batches"] > 0
    assert "skipped" in data["step"] or data["step"]["step_ms_fed"] > 0
