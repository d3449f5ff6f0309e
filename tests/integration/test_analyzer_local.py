"""cs_input_analyzer --local on both examples and on bad input_fns (real TensorFlow probes).

Time budgets are small (25-30 s); the machine may be shared, so the assertions are about
shape and behaviour, not exact figures.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.runtime import helpers

pytestmark = pytest.mark.tf
pytest.importorskip("tensorflow")

REPO = Path(__file__).resolve().parent.parent.parent
IMAGES = REPO / "examples" / "images"
PIPES = REPO / "tests" / "fixtures" / "probes" / "pipelines"
BIN = Path(sys.executable).parent
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}


def analyzer(args, cwd, timeout=240, env=None):
    return subprocess.run([str(BIN / "cs_input_analyzer"), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=env or ENV)


def snapshot(d: Path) -> dict:
    return {str(p.relative_to(d)): (p.stat().st_size, p.stat().st_mtime_ns) for p in d.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """The images example's data in a temporary directory and a params file reading it."""
    tmp = tmp_path_factory.mktemp("images")
    return helpers.images_params(tmp, env=ENV)


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("digits")
    data = helpers.prepare_digits(tmp / "data")
    params = helpers.digits_params(tmp, data, model_dir=str(tmp / "model_dir"))
    return tmp, params


def check_report(out: Path) -> dict:
    rep = json.loads((out / "report.json").read_text())
    rec = rep["recommendation"]
    for key in ("nodes", "tasks_per_node", "cpus_per_task", "predicted_samples_per_sec", "interval"):
        assert key in rec
    assert rec["interval"][0] <= rec["predicted_samples_per_sec"] <= rec["interval"][1]
    assert rec["tasks_per_node"] * rec["cpus_per_task"] <= rep["node_cpus"]
    assert rep["bottleneck"]["class"] in ("CPU-parallel", "serial", "I/O/latency-bound")
    assert (out / "probes.csv").read_text().startswith("probe_id,kind,tasks,cpus_per_task")
    assert (out / "throughput.png").read_bytes()[:4] == b"\x89PNG"
    text = (out / "report.txt").read_text()
    assert text.rstrip().splitlines()[-1].strip().startswith("csrun_wse --total-nodes")
    assert sum(1 for p in rep["probes"] if p["status"] == "ok") >= 2
    return rep


def test_local_images_runs_the_command_then_probes(images):
    out = images / "analysis"
    data_before = snapshot(images / "data")
    # 40 s: ~3 s a probe at this budget (measured 1.5 s after 0.7 s of warm-up), ~8 probes
    p = analyzer(["--local", "--time-budget", "40", "--available-nodes", "3", "--output", str(out),
                  "python", str(IMAGES / "run.py"), "--params", str(images / "params.yaml"),
                  "--mode", "validate_only"], cwd=images)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "running" in p.stderr and "validate_only" in p.stderr
    assert (images / "model_dir" / "validate_report.txt").exists()  # the user's command ran
    rep = check_report(out)
    assert rep["local"] is True and rep["available_nodes"] == 3
    assert "Recommended Slurm settings" in p.stdout
    assert snapshot(images / "data") == data_before
    # a CPU-heavy JPEG pipeline: the node rate grows with the cores given to it
    m = rep["model"]["measured"]
    one = m.get("1x1", {}).get("mean")
    full = max(v["mean"] for k, v in m.items() if k in ("1x2", "2x1"))
    assert one and full > 1.3 * one


def test_local_digits_writes_only_the_output_dir(digits):
    tmp, params = digits
    (tmp / "model_dir").mkdir(exist_ok=True)
    before = snapshot(tmp)
    out = tmp / "model_dir" / "input_analysis"
    # 30 s: what is checked is the report's shape and the files written (~2.5 s a probe)
    p = analyzer(["--local", "--time-budget", "30", "--no-run-command",
                  "python", str(REPO / "examples" / "digits" / "run.py"), "--params", str(params),
                  "--mode", "validate_only"], cwd=tmp)
    assert p.returncode == 0, p.stdout + p.stderr
    check_report(out)  # the default output directory: <model_dir>/input_analysis
    after = {k: v for k, v in snapshot(tmp).items() if not k.startswith("model_dir/input_analysis/")}
    assert after == before


def test_input_fn_that_raises_is_reported(tmp_path):
    p = analyzer(["--local", "--time-budget", "30", "--no-run-command", "--output", str(tmp_path),
                  "python", str(PIPES / "run.py"), "--params", str(PIPES / "configs" / "raise.yaml"),
                  "--mode", "validate_only"], cwd=tmp_path)
    assert p.returncode == 1, p.stdout + p.stderr
    rep = json.loads((tmp_path / "report.json").read_text())
    assert rep["probes"] and all(r["status"] == "failed" for r in rep["probes"])
    assert "failed on purpose" in rep["probes"][0]["error"]
    assert "No recommendation" in p.stdout
    assert "Traceback" not in p.stdout


def test_contract_violation_gets_the_runtime_message(tmp_path):
    p = analyzer(["--local", "--time-budget", "30", "--no-run-command", "--output", str(tmp_path),
                  "python", str(PIPES / "run.py"), "--params", str(PIPES / "configs" / "notds.yaml")], cwd=tmp_path)
    assert p.returncode == 1
    rep = json.loads((tmp_path / "report.json").read_text())
    assert "Input function must return a Dataset" in rep["probes"][0]["error"]
    p = analyzer(["--local", "--time-budget", "30", "--no-run-command", "--output", str(tmp_path / "f"),
                  "python", str(PIPES / "run.py"), "--params", str(PIPES / "configs" / "finite.yaml")], cwd=tmp_path)
    rep = json.loads((tmp_path / "f" / "report.json").read_text())
    assert "must repeat indefinitely" in rep["probes"][0]["error"]


def test_hanging_input_fn_times_out_and_partial_results_are_saved(tmp_path):
    p = analyzer(["--local", "--time-budget", "20", "--no-run-command", "--output", str(tmp_path),
                  "python", str(PIPES / "run.py"), "--params", str(PIPES / "configs" / "hang.yaml")],
                 cwd=tmp_path, timeout=180)
    assert p.returncode == 1, p.stdout + p.stderr
    rep = json.loads((tmp_path / "report.json").read_text())
    assert rep["probes"][0]["status"] == "timeout"
    assert "hanging input_fn" in rep["probes"][0]["error"]
    assert (tmp_path / "probes.csv").exists()
    # no probe process is left behind
    left = subprocess.run(["pgrep", "-f", f"analyzer.probe_worker.*{tmp_path}"], capture_output=True, text=True)
    assert left.stdout.strip() == ""


def test_gil_bound_pipeline_is_serial(tmp_path):
    p = analyzer(["--local", "--time-budget", "30", "--no-run-command", "--output", str(tmp_path),
                  "python", str(PIPES / "run.py"), "--params", str(PIPES / "configs" / "params.yaml")], cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    rep = check_report(tmp_path)
    brackets = [r for r in rep["probes"] if r["kind"] == "pipeline" and r["status"] == "ok"]
    if all(r.get("contended") for r in brackets if r["tasks"] == 2 and r["cpus_per_task"] == 1):
        pytest.skip("other processes kept this machine's CPUs busy during every 2 x 1 probe")
    assert rep["bottleneck"]["class"] == "serial", rep["bottleneck"]
    assert rep["recommendation"]["cpus_per_task"] == 1
