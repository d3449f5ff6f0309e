"""Training through csrun's data plane under csrun_wse on the test cluster
(``runconfig.transport: dataplane``, docs/DATAPLANE.md "The TensorFlow path").

The digits main job with its input paced (tests/fixtures/paced/run.py, 20 ms per batch) runs
as 1 chief + 2 input workers on 3 nodes, its batches carried by the data plane (one zmq
receiver on the chief, no tf.data service); input worker 1's process is killed with SIGKILL
during training. As on the service path (tests/integration/test_elastic_cluster.py): the job
reaches max_steps and csrun_wse exits 0, the chief notices the loss naming the worker, the
replacement (same index, node, files and seed; attempt 1) connects to the receiver and streams
again within 60 s, and performance.json records it, with the data plane's per-worker counts.
The data travels on the bulk channel (``runconfig.dataplane_bulk``, docs/DATAPLANE.md "The bulk
channel"): the killed worker's TCP connection ends, perhaps inside a bundle, and the replacement
opens its own (the zmq data path's kill: test_node_loss_cluster.py, test_chief_input_cluster.py).
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time

import pytest

from tests.fixtures.runtime import helpers

pytestmark = [pytest.mark.cluster, pytest.mark.tf, pytest.mark.slow]

BIN, PACED = helpers.BIN, helpers.PACED
MAX_STEPS = 2000
KILL_AT = 300


def test_dataplane_training_survives_a_killed_input_worker(cli_env, tmp_path):
    data = helpers.prepare_digits(tmp_path / "data")
    params = helpers.digits_params(tmp_path, data, train_input={"pace_ms": 20}, log_steps=50, checkpoint_steps=0,
                                   eval_frequency=None, transport="dataplane", dataplane_bulk=True)
    md = tmp_path / "md"
    argv = [str(BIN / "csrun_wse"), "--total-nodes", "3", "--tasks-per-node", "1", "--cpus-per-task", "1",
            "python-ws", PACED, "--params", str(params), "--mode", "train",
            "--max_steps", str(MAX_STEPS), "--model_dir", str(md)]
    log = tmp_path / "csrun_wse.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=cli_env, cwd=tmp_path)
    try:
        helpers.wait_for(lambda: f"global_step = {KILL_AT}," in log.read_text(), 300, "training to start")
        (reg_file,) = md.glob(".csrun/*/workers/1.json")
        reg = json.loads(reg_file.read_text())
        assert reg["transport"] == "dataplane" and reg["dispatcher"].startswith("tcp://")
        os.kill(reg["pid"], signal.SIGKILL)
        t_kill = time.time()
        code = proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=60)
    output = log.read_text()
    assert code == 0, output[-3000:]
    assert "data plane: one receiver at tcp://" in output and "tf.data service:" not in output
    assert "bulk channel on port" in output
    perf = json.loads((md / "performance" / "performance.json").read_text())
    assert perf["global_step_end"] == MAX_STEPS and perf["transport"] == "dataplane"
    (lost,) = perf["workers_lost"]
    assert lost["index"] == 1 and lost["node"] == reg["node"] and lost["pid"] == reg["pid"]
    assert lost["noticed"] - t_kill < 10.0, f"the chief noticed the loss {lost['noticed'] - t_kill:.1f} s after"
    assert re.search(rf"input worker 1 on {reg['node']} \(pid {reg['pid']}\) lost", output), output[-3000:]
    (rep,) = perf["workers_replaced"]
    assert rep["index"] == 1 and rep["attempt"] == 1 and rep["pid"] != reg["pid"] and rep["stream"] == "reconnected"
    assert rep["seconds_loss_to_stream"] < 60.0, rep
    print(f"noticed {lost['noticed'] - t_kill:.1f} s after the kill; streamed again "
          f"{rep['streaming_again'] - t_kill:.1f} s after it")
    assert perf["workers_given_up"] == []
    # the data plane read both workers, the replacement as attempt 1, and dropped no bad message
    plane = perf["dataplane"]
    assert plane["1"]["attempt"] == 1 and plane["0"]["bundles"] > 0 and plane["1"]["bundles"] > 0
    assert plane["0"]["errors"] == 0 and plane["1"]["errors"] == 0 and perf["dataplane_errors"] == []
    assert perf["dataplane_bulk"] is True
    (report,) = [json.loads(p.read_text()) for p in md.glob(".csrun/*/workers/1.report.json")]
    assert report["attempt"] == 1 and report["elements"] > 0
    assert report["shuffle_seed"] == reg["shuffle_seed"] and report["pipeline_files"] == reg["pipeline_files"]
    assert int(perf["batches_per_worker"]["1"]) > 0
