"""cs_input_analyzer on the Slurm test cluster: probes in a submitit job on a CPU node (ended
by the session's exit command, or cancelled when a probe hangs), the report's cluster
topology, and ``verify`` launching a layout with csrun_wse and the drain task.

Small budgets (30-40 s probing: ~2.5 s a probe at these budgets; 5 s drain windows); the
accuracy target (within 15 %) is measured by bench/bench_verify.py, not here.
"""
from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from analyzer import report
from launcher import slurm
from tests.fixtures.runtime import helpers

pytestmark = [pytest.mark.cluster, pytest.mark.tf, pytest.mark.slow]
pytest.importorskip("tensorflow")

REPO = Path(__file__).resolve().parent.parent.parent
IMAGES = REPO / "examples" / "images"
BIN = Path(sys.executable).parent


def analyzer(args, cwd, env, timeout=400):
    return subprocess.run([str(BIN / "cs_input_analyzer"), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=env)


@pytest.fixture(scope="module")
def images_params(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("images_cluster")
    return helpers.images_params(tmp)


def test_cluster_images_analysis_and_verify(images_params, cli_env):
    tmp = images_params
    # 30 s: the probes run in ~2.5 s each at this budget (~4.5 s at 60), so the ingest and served
    # probes (4th and 5th) still fit after the ~5 s load
    p = analyzer(["--time-budget", "30", "--available-nodes", "3", "python", str(IMAGES / "run.py"),
                  "--params", str(tmp / "params.yaml"), "--mode", "validate_only"], cwd=tmp, env=cli_env)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "csrun_cpu" in p.stderr  # the command ran through csrun_cpu first
    out = tmp / "model_dir" / "input_analysis"
    rep = json.loads((out / "report.json").read_text())
    assert rep["local"] is False
    assert rep["probed_on"]["node"] != "node1"  # a CPU node, never the accelerator's
    assert rep["cluster"]["node_cpus"] >= 1 and len(rep["cluster"]["nodes"]) >= 2
    assert rep["recommendation"]["nodes"] <= 3
    assert any(r["kind"] == "ingest" and r["status"] == "ok" for r in rep["probes"]) or rep["stopped"] == "budget"
    # every probe session was a submitit job whose agent returned at the session's end
    submitted = sorted((out / "work").glob("session*/job/*_submitted.pkl"))
    assert submitted and all(Path(str(f).replace("_submitted.pkl", "_0_result.pkl")).exists() for f in submitted)

    v = analyzer(["verify", "--report", str(out), "--seconds", "5", "--warmup", "2"], cwd=tmp, env=cli_env)
    assert v.returncode == 0, v.stdout + v.stderr
    assert "predicted:" in v.stdout and "measured:" in v.stdout and "error:" in v.stdout
    res = json.loads((out / "verify.json").read_text())
    assert res["measured_samples_per_sec"] > 0 and res["error_pct"] is not None
    assert res["drain"]["window_s"] >= 5


def analyze_digits(tmp_path: Path, env: dict, budget: int, *extra: str) -> subprocess.CompletedProcess:
    """The digits example's data in ``tmp_path`` and its analysis (``budget`` s, ``extra`` options)
    in ``tmp_path/ana``."""
    data = helpers.prepare_digits(tmp_path / "data")
    params = helpers.digits_params(tmp_path, data, model_dir=str(tmp_path / "model_dir"))
    return analyzer(["--time-budget", str(budget), "--no-run-command", "--output", str(tmp_path / "ana"), *extra,
                     "python", str(REPO / "examples" / "digits" / "run.py"), "--params", str(params),
                     "--mode", "validate_only"], cwd=tmp_path, env=env)


def test_cluster_digits_verify_with_input_workers(tmp_path, cli_env):
    # issue 44: 2 ranks on a node need gpu:2, the test cluster has one gpu:1: refused before any probe,
    # in one line saying how to run ranks without GRES (seconds, not the 60 s budget)
    helpers.prepare_digits(tmp_path / "data")  # once, before the clock
    t0 = time.monotonic()
    p = analyze_digits(tmp_path, cli_env, 60, "--chief-tasks-per-node", "2")
    refused_s = time.monotonic() - t0
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and 'gres.resource = ""' in p.stderr, p.stderr
    assert not (tmp_path / "ana" / "work").exists() and refused_s < 30, refused_s  # no probe session began
    print(f"analyzer refusal: {refused_s:.1f} s")
    # verify needs a report with a model, not a full one: 30 s (~8 probes of ~2.5 s after the load)
    # several trainer ranks (issue 32): 1 chief node × 2 ranks, each draining its own input worker
    # (a site config without GRES: the test cluster has one gpu:1, and 2 ranks on a node need gpu:2)
    (tmp_path / "site.toml").write_text('[gres]\nresource = ""\n')
    env = dict(cli_env, CSRUN_CONFIG=str(tmp_path / "site.toml"))
    p = analyze_digits(tmp_path, env, 30, "--chief-tasks-per-node", "2")
    assert p.returncode == 0, p.stdout + p.stderr
    # every layout the report recommends passes csrun_wse --check (issue 44: Slurm's --test-only too)
    rep = json.loads((tmp_path / "ana" / "report.json").read_text())
    rec = rep["recommendation"]
    lines = [rep["csrun_wse_command"]] + [report.csrun_wse_command(a, rep["command"]) for a in rec["alternatives"]]
    for line in lines:
        words = shlex.split(line)
        c = subprocess.run([str(BIN / words[0]), "--check", *words[1:]], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=120)
        assert c.returncode == 0 and c.stdout.startswith("csrun_wse --check: the job can run"), (line, c.stderr)
    v = analyzer(["verify", "--report", str(tmp_path / "ana"), "--seconds", "5", "--warmup", "2",
                  "--total-nodes", "2", "--tasks-per-node", "2", "--cpus-per-task", "1",
                  "--chief-tasks-per-node", "2"], cwd=tmp_path, env=env)
    assert v.returncode == 0, v.stdout + v.stderr
    res = json.loads((tmp_path / "ana" / "verify.json").read_text())
    assert res["layout"] == {"nodes": 2, "tasks_per_node": 2, "cpus_per_task": 1, "single_task_nodes": 0,
                             "chief_input_cpus": 0, "chief_nodes": 1, "chief_tasks_per_node": 2}
    assert res["drain"]["num_workers"] == 2
    assert sum(res["drain"]["batches_per_worker"].values()) == res["drain"]["batches"] > 0
    # nothing of the drain outside the analysis directory
    assert not (tmp_path / "model_dir").exists() or not any((tmp_path / "model_dir").rglob(".csrun"))


def test_cluster_verify_py_function_pipeline_leaves_cleanly(tmp_path, cli_env):
    """A GIL-bound tf.py_function pipeline served by input workers: every task of the drain
    leaves by itself once the chief is done (a tf.data service worker stopped while holding
    the GIL would deadlock with the pipeline's py_function calls)."""
    pipes = REPO / "tests" / "fixtures" / "probes" / "pipelines"
    # 30 s: the drain, not the analysis, is under test; any report with a model will do
    p = analyzer(["--time-budget", "30", "--no-run-command", "--output", str(tmp_path / "ana"),
                  "python", str(pipes / "run.py"), "--params", str(pipes / "configs" / "params.yaml")],
                 cwd=tmp_path, env=cli_env)
    assert p.returncode == 0, p.stdout + p.stderr
    v = analyzer(["verify", "--report", str(tmp_path / "ana"), "--seconds", "4", "--warmup", "1",
                  "--total-nodes", "2", "--tasks-per-node", "2", "--cpus-per-task", "1"], cwd=tmp_path, env=cli_env)
    assert v.returncode == 0, v.stdout + v.stderr
    res = json.loads((tmp_path / "ana" / "verify.json").read_text())
    assert res["exit_status"] == 0, res
    assert res["drain"]["num_workers"] == 3


def test_cluster_hanging_input_fn_cancels_the_probe_job(tmp_path, cli_env):
    """A probe whose input_fn hangs times out; its session's submitit job is cancelled
    (submitit's Job.cancel: scancel) and no probe process is left behind."""
    pipes = REPO / "tests" / "fixtures" / "probes" / "pipelines"
    p = analyzer(["--time-budget", "20", "--no-run-command", "--output", str(tmp_path), "python",
                  str(pipes / "run.py"), "--params", str(pipes / "configs" / "hang.yaml")],
                 cwd=tmp_path, env=cli_env, timeout=240)
    assert p.returncode == 1, p.stdout + p.stderr
    rep = json.loads((tmp_path / "report.json").read_text())
    assert rep["probes"][0]["status"] == "timeout"
    jobs = sorted((f.name.split("_")[0] for f in (tmp_path / "work").glob("session*/job/*_submitted.pkl")), key=int)
    states = [slurm.job_state(j, env=cli_env) for j in jobs]
    assert states and states[0] == "CANCELLED", states
    assert not any(s in slurm.ACTIVE_STATES for s in states), states
    left = subprocess.run(["pgrep", "-f", f"analyzer.probe_worker.*{tmp_path}"], capture_output=True, text=True)
    assert left.stdout.strip() == ""


def test_pinned_cluster_serving_cost_and_verify(tmp_path, pinned_cluster):
    """On nodes pinned to their own CPUs the analyzer sees independent nodes, measures what
    serving the stream costs (the served probe: one input worker and a chief, each
    process's CPU apart) and verify launches one input-worker node streaming to the chief."""
    env = pinned_cluster["env"]
    # 40 s: the served probe is the 3rd (after a pipeline and an ingest probe of ~2.5-3 s and a
    # load of ~8 s), so it has room on a loaded host
    p = analyze_digits(tmp_path, env, 40)
    assert p.returncode == 0, p.stdout + p.stderr
    rep = json.loads((tmp_path / "ana" / "report.json").read_text())
    assert rep["topology"] is None  # pinned: no host shared beyond its cores
    assert rep["probed_on"]["node"] == "node2"
    served = [r for r in rep["probes"] if r["kind"] == "served" and r["status"] == "ok"]
    assert served, [(r["kind"], r["status"], r.get("error")) for r in rep["probes"]]
    assert served[0]["worker_cpu_seconds_per_sample"] > 0 and served[0]["chief_cpu_seconds_per_sample"] > 0
    assert rep["ingest"]["worker_hop_cpu_seconds_per_sample"] is not None
    n = rep["model"]["node_cpus"]
    # a 1-CPU node cannot hold the worker and the chief apart: the chief ran on this machine
    assert all(bool(r.get("chief_apart")) == (n < 2) for r in served)
    assert all(r["worker_local_cpu_seconds_per_sample"] > 0 for r in served)
    v = analyzer(["verify", "--report", str(tmp_path / "ana"), "--seconds", "5", "--warmup", "2",
                  "--total-nodes", "2", "--tasks-per-node", "1", "--cpus-per-task", str(n)], cwd=tmp_path, env=env)
    assert v.returncode == 0, v.stdout + v.stderr
    res = json.loads((tmp_path / "ana" / "verify.json").read_text())
    assert res["drain"]["num_workers"] == 1 and res["drain"]["node"] == "node1"
    assert res["measured_samples_per_sec"] > 0 and res["error_pct"] is not None
    assert res["limited_by"] in ("input workers", "node CPUs (pipeline and serving)", "chief ingest")
