"""A lost node under ``csrun_wse --survive-node-loss python-pt`` on the test cluster
(docs/RESILIENCE.md "A lost node", docs/PYTORCH.md), on the srun path.

The PyTorch digits example with its input paced (tests/fixtures/pytorch_paced/run.py, 40 ms
per batch) runs as the chief on node1 and 2 input workers, one on each of two CPU nodes, in
the input workers' own job. During training the node of input worker 1 is powered off (its
slurmd, slurmstepd and task processes SIGKILLed together: tests/fixtures/cluster_nodes.py) and
marked DOWN. The run must go on and reach max_steps with csrun_wse's exit 0: the chief notices
the loss within 10 s, the other node's task starts input worker 1 again (same index and seed),
it streams again, Slurm shrinks the workers' job to the surviving node, and performance.json
records the loss and the replacement. Native cluster only (the compose cluster's nodes are
containers). The same run as local processes: tests/unit/features/test_pytorch_node_loss.py.
"""
from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

from tests.fixtures import cluster_nodes  # noqa: E402
from tests.fixtures.runtime import helpers  # noqa: E402

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PACED = str(REPO / "tests" / "fixtures" / "pytorch_paced" / "run.py")
MAX_STEPS = 1800
KILL_AT = 200


def _squeue(env, *args: str) -> str:
    return subprocess.run(["squeue", "--noheader", *args], env=env, capture_output=True, text=True).stdout


def _params(root: Path) -> Path:
    import yaml

    data = root / "data"
    subprocess.run([sys.executable, str(REPO / "examples/digits_pt/prepare_data.py"), "--out-dir", str(data)],
                   check=True, capture_output=True)
    params = yaml.safe_load((REPO / "examples/digits_pt/configs/params.yaml").read_text())
    params["train_input"].update(data_dir=str(data), num_workers=0, pace_ms=40)
    params["eval_input"]["data_dir"] = str(data)
    params["runconfig"].update(checkpoint_steps=0, eval_frequency=None, log_steps=50)
    path = root / "paced.yaml"
    path.write_text(yaml.safe_dump(params))
    return path


def test_a_lost_node_does_not_end_a_pytorch_run(slurm_cluster, cli_env, tmp_path):
    if slurm_cluster["engine"] != "native":
        pytest.skip("powers off a node of the native test cluster")
    md = tmp_path / "md"
    argv = [str(BIN / "csrun_wse"), "--survive-node-loss", "--total-nodes", "3", "--tasks-per-node", "1",
            "--cpus-per-task", "1", "python-pt", PACED, "--params", str(_params(tmp_path)), "--mode", "train",
            "--max_steps", str(MAX_STEPS), "--model_dir", str(md)]
    log = tmp_path / "csrun_wse.log"
    lost_node = None
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=cli_env, cwd=tmp_path)
    try:
        helpers.wait_for(lambda: f"global_step = {KILL_AT}," in log.read_text(), 300, "training to start")
        (reg_file,) = md.glob(".csrun/*/workers/1.json")
        reg = json.loads(reg_file.read_text())
        (other,) = [json.loads(p.read_text())["node"] for p in md.glob(".csrun/*/workers/0.json")]
        lost_node = reg["node"]
        assert other != lost_node
        rows = [line.split() for line in _squeue(cli_env, "--format=%i %j %D").splitlines()]
        (workers_job,) = [i for i, name, n in rows if name.startswith("csrun_wse") and n == "2"]
        killed = cluster_nodes.power_off(lost_node, slurm_cluster["conf"])
        t_kill = time.time()
        assert reg["pid"] in killed
        cluster_nodes.mark_down(lost_node, cli_env)
        helpers.wait_for(lambda: _squeue(cli_env, f"--jobs={workers_job}", "--format=%N").strip() == other,
                         60, f"the input workers' job {workers_job} to shrink to {other}")
        assert proc.poll() is None, log.read_text()[-3000:]
        code = proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=60)
        if lost_node is not None:
            cluster_nodes.power_on(cli_env)
    output = log.read_text()
    assert code == 0, output[-4000:]
    assert "not wired for PyTorch" not in output
    perf = json.loads((md / "performance" / "performance.json").read_text())
    assert perf["global_step_end"] == MAX_STEPS and perf["framework"] == "pytorch"
    (lost,) = perf["workers_lost"]  # elastic.WorkerWatch's record (its "reason"), as on the TensorFlow path
    assert lost["index"] == 1 and lost["node"] == lost_node and lost["pid"] == reg["pid"] and lost["reason"]
    # seen by its heartbeat alone: older than STALE_SECS (8 s), looked at every second
    assert lost["noticed"] - t_kill <= 10.0, f"the chief noticed the loss {lost['noticed'] - t_kill:.1f} s after"
    (rep,) = perf["workers_replaced"]
    assert rep["index"] == 1 and rep["node"] == other and rep["attempt"] == 1 and rep["pid"] != reg["pid"]
    assert rep["seconds_loss_to_stream"] < 60.0, rep
    assert perf["workers_given_up"] == []
    print(f"noticed {lost['noticed'] - t_kill:.1f} s after the power-off; streaming again "
          f"{rep['streaming_again'] - t_kill:.1f} s after it")
    assert re.search(rf"input worker 1, lost with node {lost_node}, starts again on {other}", output), output[-4000:]
    (report,) = [json.loads(p.read_text()) for p in md.glob(".csrun/*/workers/1.report.json")]
    assert report["attempt"] == 1 and report["node"] == other and report["batches"] > 0
    assert report["torch_seed"] == reg["torch_seed"] and report["streaming_rank"] == 1
    assert report["chief_status"] == "ok"
    helpers.wait_for(lambda: not _squeue(cli_env).strip(), 60, "the queue to empty")
