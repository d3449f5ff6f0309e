"""A lost node under ``csrun_wse --survive-node-loss`` on the test cluster (docs/RESILIENCE.md "A lost node").

The digits main job with its input paced (tests/fixtures/paced/run.py, 40 ms per batch) runs
as the chief on node1 and 2 input workers, one on each of two CPU nodes, in the input
workers' own job. During training the node of input worker 1 is powered off: its slurmd,
slurmstepd and task processes are SIGKILLed together (tests/fixtures/cluster_nodes.py) and
the node is marked DOWN, which makes slurmctld act on the failure at once rather than after
SlurmdTimeout (60 s). The run must go on and reach max_steps with exit 0 (csrun_wse's on the
srun path, the batch job's on the sbatch path): the chief notices the loss within 10 s, the
other node's task starts input worker 1 again (same index, files and seed), it streams again
within 60 s, and Slurm shrinks the workers' job to the surviving node instead of ending it.
Native cluster only (the compose cluster's nodes are containers). The srun path runs on both
transports (``runconfig.transport``): on the data plane (docs/DATAPLANE.md) the replacement
connects to the chief's one receiver as attempt 1.
"""
from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time

import pytest

from tests.fixtures import cluster_nodes
from tests.fixtures.runtime import helpers

pytestmark = [pytest.mark.cluster, pytest.mark.tf, pytest.mark.slow]

BIN, PACED = helpers.BIN, helpers.PACED
# killed at step 300: the other worker alone (25 steps/s at 40 ms a batch) trains 1500 more steps
# in the 60 s the replacement may take to stream again (seconds_loss_to_stream < 60 below), so
# it streams before max_steps even at that bound (it takes ~20 s: at about step 800)
MAX_STEPS = 1800
KILL_AT = 300


def _squeue(env, *args: str) -> str:
    return subprocess.run(["squeue", "--noheader", *args], env=env, capture_output=True, text=True).stdout


# both launch paths and both transports in two runs (each run ~60 s): the launcher path decides the
# supervisors and the adoption, the transport how the chief reads the adopted worker again
@pytest.mark.parametrize("path,transport", [("srun", "service"), ("sbatch", "dataplane")])
def test_a_lost_node_does_not_end_the_run(slurm_cluster, cli_env, tmp_path, path, transport):
    if slurm_cluster["engine"] != "native":
        pytest.skip("powers off a node of the native test cluster")
    data = helpers.prepare_digits(tmp_path / "data")
    params = helpers.digits_params(tmp_path, data, train_input={"pace_ms": 40}, log_steps=50,
                                   checkpoint_steps=0, eval_frequency=None, transport=transport)
    md = tmp_path / "md"
    argv = [str(BIN / "csrun_wse"), "--survive-node-loss", *(["--use-sbatch"] if path == "sbatch" else []),
            "--total-nodes", "3", "--tasks-per-node", "1", "--cpus-per-task", "1", "python-ws", PACED,
            "--params", str(params), "--mode", "train", "--max_steps", str(MAX_STEPS), "--model_dir", str(md)]
    lost_node = job = proc = None
    if path == "srun":
        log = tmp_path / "csrun_wse.log"
        with open(log, "w") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=cli_env, cwd=tmp_path)
    else:  # the batch script starts the workers' job itself
        sub = subprocess.run(argv, env=cli_env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert sub.returncode == 0, sub.stderr
        job = sub.stdout.split()[-1]
        log = tmp_path / f"csrun_wse-{job}.out"
    try:
        helpers.wait_for(lambda: log.exists() and f"global_step = {KILL_AT}," in log.read_text(), 300,
                         "training to start")
        (reg_file,) = md.glob(".csrun/*/workers/1.json")
        reg = json.loads(reg_file.read_text())
        (other,) = [json.loads(p.read_text())["node"] for p in md.glob(".csrun/*/workers/0.json")]
        lost_node = reg["node"]
        assert other != lost_node
        (disp,) = md.glob(".csrun/*/endpoints.json")
        chief_node = json.loads(disp.read_text())["chief"]["node"]
        rows = [line.split() for line in _squeue(cli_env, "--format=%i %j %N").splitlines()]
        (workers_job,) = [i for i, name, nodes in rows if name.startswith("csrun_wse") and nodes != chief_node]
        if job is not None:  # named after the chief's batch job and its allocation
            assert (workers_job, f"csrun_wse-workers.{job}.0") in [(i, name) for i, name, _ in rows], rows
        killed = cluster_nodes.power_off(lost_node, slurm_cluster["conf"])
        t_kill = time.time()
        assert reg["pid"] in killed
        cluster_nodes.mark_down(lost_node, cli_env)
        # Slurm keeps the workers' job on its surviving node (scontrol: "Removing failed node")
        helpers.wait_for(lambda: _squeue(cli_env, f"--jobs={workers_job}", "--format=%N").strip() == other,
                         60, f"the input workers' job {workers_job} to shrink to {other}")
        if proc is not None:
            assert proc.poll() is None, log.read_text()[-3000:]
            code = proc.wait(timeout=400)
        else:
            code = helpers.batch_job_end(job, cli_env, 400)
    finally:
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=60)
        elif job is not None:
            subprocess.run(["scancel", job], env=cli_env)
        if lost_node is not None:
            cluster_nodes.power_on(cli_env)
    output = log.read_text()
    assert code == 0, output[-4000:]
    perf = json.loads((md / "performance" / "performance.json").read_text())
    assert perf["global_step_end"] == MAX_STEPS
    (lost,) = perf["workers_lost"]
    assert lost["index"] == 1 and lost["node"] == lost_node
    # a silent node is seen by its heartbeat alone: older than STALE_SECS, looked at every
    # HEARTBEAT_SECS, last touched up to HEARTBEAT_SECS before the power-off: 7 to 9.5 s
    # (csrun_runtime/rendezvous.py STALE_SECS)
    assert lost["noticed"] - t_kill <= 10.0, f"the chief noticed the loss {lost['noticed'] - t_kill:.1f} s after"
    (rep,) = perf["workers_replaced"]
    assert rep["index"] == 1 and rep["node"] == other and rep["attempt"] == 1 and rep["pid"] != reg["pid"]
    assert rep["seconds_loss_to_stream"] < 60.0, rep
    print(f"noticed {lost['noticed'] - t_kill:.1f} s after the power-off; streaming again "
          f"{rep['streaming_again'] - t_kill:.1f} s after it")
    assert perf["workers_given_up"] == []
    assert re.search(rf"input worker 1, lost with node {lost_node}, starts again on {other}", output), output[-4000:]
    # the replacement read the same files with the same seed, and served batches after the loss
    (report,) = [json.loads(p.read_text()) for p in md.glob(".csrun/*/workers/1.report.json")]
    assert report["attempt"] == 1 and report["elements"] > 0
    assert report["shuffle_seed"] == reg["shuffle_seed"] and report["pipeline_files"] == reg["pipeline_files"]
    if transport == "dataplane":  # the replacement reached the one receiver as attempt 1, both read
        assert perf["transport"] == "dataplane" and "tf.data service:" not in output
        assert "data plane: one receiver at tcp://" in output
        plane = perf["dataplane"]
        assert plane["1"]["attempt"] == 1 and plane["0"]["bundles"] > 0 and plane["1"]["bundles"] > 0, plane
        assert plane["0"]["errors"] == 0 and plane["1"]["errors"] == 0 and perf["dataplane_errors"] == []
    helpers.wait_for(lambda: not _squeue(cli_env).strip(), 60, "the queue to empty")


def test_cancelling_the_batch_job_cancels_the_workers_job(slurm_cluster, cli_env, tmp_path):
    """sbatch path: the workers' job the batch script started (named after the chief's job) goes
    with the chief's job when that is cancelled (its srun is signalled with the batch job, and
    the script's EXIT trap cancels it by name), leaving nothing queued."""
    argv = [str(BIN / "csrun_wse"), "--use-sbatch", "--survive-node-loss", "--total-nodes", "3",
            "--tasks-per-node", "1", "--cpus-per-task", "1", sys.executable, "-c", "import time; time.sleep(300)"]
    sub = subprocess.run(argv, env=cli_env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert sub.returncode == 0, sub.stderr
    job = sub.stdout.split()[-1]
    name = f"csrun_wse-workers.{job}.0"
    try:
        helpers.wait_for(lambda: "RUNNING" in _squeue(cli_env, f"--name={name}", "--format=%T"), 60,
                         f"the workers' job {name} to run")
        assert _squeue(cli_env, f"--jobs={job}", "--format=%T").split() == ["RUNNING"]
    finally:
        subprocess.run(["scancel", job], env=cli_env, check=True)
    helpers.wait_for(lambda: not _squeue(cli_env).strip(), 60, "the queue to empty")
