"""cs_input_analyzer on a PyTorch run.py on the Slurm test cluster (issue 25 item 5): probes in a
submitit job on a CPU node build train_data_fn's DataLoader through the PyTorch input backend at
DataLoader num_workers 0, 1, 2; a GIL-bound pipeline (pure-Python work and a wait per sample:
serial in one process) and a CPU-parallel one (a threaded numpy op with 16 MB batches: one
process uses the task's CPUs, worker processes pay to ship the batches) get different
num_workers, and the report's command launches python-pt; ``verify`` launches the GIL-bound
report's count with one input worker streaming over the data plane through ``csrun_wse
python-pt`` and compares. Small budgets (20 s and 30 s of probing: the parallel one reaches its served
probe, the chief's ingest over the data plane; a 3 s drain window)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PIPES = REPO / "tests" / "fixtures" / "probes" / "pt_pipelines"


def _analyze(kind: str, out: Path, env: dict, budget: int = 20) -> dict:
    p = subprocess.run([str(BIN / "cs_input_analyzer"), "--time-budget", str(budget), "--no-run-command",
                        "--no-progress", "--available-nodes", "1", "--output", str(out),
                        "python", str(PIPES / "run.py"),
                        "--params", str(PIPES / "configs" / f"{kind}.yaml"), "--mode", "validate_only"],
                       cwd=out.parent, capture_output=True, text=True, timeout=240, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    return json.loads((out / "report.json").read_text())


def test_cluster_gil_bound_and_cpu_parallel_dataloaders_get_different_num_workers(tmp_path, cli_env):
    gil = _analyze("gil", tmp_path / "gil", cli_env)
    # 30 s: the sweeps (~6 probes) and then the served probe (the chief's ingest over the data plane)
    par = _analyze("parallel", tmp_path / "parallel", cli_env, budget=30)
    for rep in (gil, par):
        assert rep["framework"] == "pytorch" and rep["local"] is False
        assert rep["probed_on"]["node"] != "node1"  # a CPU node
        assert not any(r["kind"] == "ingest" for r in rep["probes"])  # no tf.data service probe
        n = str(rep["node_cpus"])
        swept = {r["dataloader_workers"] for r in rep["probes"] if r["cpus_per_task"] == int(n)}
        assert swept >= {0, 1}, rep["probes"]
        assert " python-pt " in rep["csrun_wse_command"]
        # each probe's DataLoader worker processes ran on the probe's own CPUs
        out = tmp_path / ("gil" if rep is gil else "parallel")
        res = [json.loads(f.read_text()) for f in out.glob("work/session*/res/*.json")]
        seen = [(c, r["cpus"]) for r in res for c in (r.get("input") or {}).get("dataloader_worker_cpus") or []]
        assert seen and all(set(c) <= set(cpus) for c, cpus in seen), seen
    n = str(gil["node_cpus"])
    # processes scale the pure-Python work; the threaded op is fastest in-process
    assert gil["dataloader_workers"][n] >= 1, gil["probes"]
    assert par["dataloader_workers"][n] == 0, par["probes"]
    assert par["recommendation"]["dataloader_workers"] == 0
    # the chief's ingest over csrun's data plane: a served probe (input worker -> chief) fed the model
    served = [r for r in par["probes"] if r["kind"] == "served"]
    assert served and served[0]["status"] == "ok", par["probes"]
    assert par["ingest"]["chief_cpu_seconds_per_sample"] > 0 and par["ingest"]["source"] == "served probe"

    v = subprocess.run([str(BIN / "cs_input_analyzer"), "verify", "--report", str(tmp_path / "gil"), "--seconds", "3",
                        "--warmup", "1", "--total-nodes", "2", "--tasks-per-node", "1", "--cpus-per-task", n],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300, env=cli_env)
    assert v.returncode == 0, v.stdout + v.stderr
    assert "python-pt -m analyzer.verify_task --framework pytorch --dataloader-workers" in v.stderr
    res = json.loads((tmp_path / "gil" / "verify.json").read_text())
    assert res["drain"]["framework"] == "pytorch" and res["drain"]["num_workers"] == 1
    assert res["drain"]["dataloader_workers"] == gil["dataloader_workers"][n]
    assert res["measured_samples_per_sec"] > 0 and res["error_pct"] is not None
