"""``csrun_wse --autoscale`` on the test cluster (docs/AUTOSCALE.md).

A pipeline bound by latency (tests/fixtures/paced/run.py: each input worker sleeps 40 ms per
batch, so its rate does not depend on how busy the shared host cores are) feeds a training
step that sleeps 10 ms: training takes about 4 input workers' batches. The layout has 6
input-worker slots (3 nodes × 2 tasks, the chief alone on the GRES node). Started with 1
worker, autoscale must grow so that training waits on input for at most 10 % of a window
(i.e. it trains at >= 90 % of the rate it can take) within 2 minutes; started with all 6, it
must shrink. Both runs reach max_steps and exit 0; performance.json records the decisions.
Shrinking on csrun's data plane: tests/unit/csrun_runtime/tensorflow/test_remote.py (pauses at the receiver).
"""
from __future__ import annotations

import json
import subprocess

import pytest

from tests.fixtures.runtime import helpers

pytestmark = [pytest.mark.cluster, pytest.mark.tf, pytest.mark.slow]

BIN, PACED = helpers.BIN, helpers.PACED


@pytest.fixture(scope="module")
def latency_bound(tmp_path_factory):
    root = tmp_path_factory.mktemp("autoscale")
    data = helpers.prepare_digits(root / "data")
    params = {}
    for transport in ("service",):
        (root / transport).mkdir()
        params[transport] = helpers.digits_params(
            root / transport, data, train_input={"pace_ms": 40}, model={"step_pace_ms": 10}, log_steps=500,
            checkpoint_steps=0, eval_frequency=None, jit_compile=False, transport=transport)
    return {"root": root, "params": params}


def _run(cli_env, latency_bound, initial: int, max_steps: int,
         transport: str = "service") -> tuple[subprocess.CompletedProcess, dict]:
    md = latency_bound["root"] / f"md_{initial}_{transport}"
    argv = [str(BIN / "csrun_wse"), "--total-nodes", "4", "--single-task-nodes", "1", "--tasks-per-node", "2",
            "--cpus-per-task", "1", "--autoscale", "--initial-workers", str(initial), "--autoscale-window", "5",
            "python-ws", PACED, "--params", str(latency_bound["params"][transport]), "--mode", "train",
            "--max_steps", str(max_steps), "--model_dir", str(md)]
    res = subprocess.run(argv, env=cli_env, cwd=latency_bound["root"], capture_output=True, text=True, timeout=420)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-5000:]
    perf = json.loads((md / "performance" / "performance.json").read_text())
    return res, perf


def test_autoscale_grows_from_one_worker_to_the_rate_training_takes(cli_env, latency_bound):
    # 3000 steps (~40 s): fed from ~28 s on (about step 2000: 1, 3, then 4 workers), then ~10 s
    # of fed windows
    res, perf = _run(cli_env, latency_bound, 1, 3000)
    auto = perf["autoscale"]
    assert perf["global_step_end"] == 3000
    assert (auto["initial_workers"], auto["min_workers"], auto["max_workers"]) == (1, 1, 6)
    windows = auto["windows"]
    assert windows and windows[0]["workers"] == 1 and windows[0]["input_wait_fraction"] > 0.3, windows[:1]
    adds = [e for e in auto["events"] if e["action"] == "add"]
    assert adds and set(adds[0]) >= {"time", "action", "worker", "reason", "input_wait_fraction",
                                     "samples_per_sec"}
    assert "AutoScaler estimate" in adds[0]["reason"] and adds[0]["input_wait_fraction"] > 0.1
    # >= 90 % of the rate training takes: a window waiting <= 10 %, within 2 minutes of the first
    start = windows[0]["time"] - auto["window_s"]
    fed = [w for w in windows if w["input_wait_fraction"] <= 0.10]
    assert fed, windows
    assert fed[0]["time"] - start <= 120, windows
    assert fed[0]["workers"] >= 3 and fed[0]["samples_per_sec"] >= 0.9 * fed[0]["consumer_samples_per_sec"]
    assert 3 <= auto["final_workers"] <= 6
    assert "autoscale: add input worker 1" in res.stderr


def test_autoscale_shrinks_an_over_provisioned_start(cli_env, latency_bound):
    # one run, on tf.data service, the default (the suite's time): on the data plane, growing runs
    # through csrun_wse in test_chief_input_cluster.py's [dataplane] run and pausing a worker's
    # stream at the receiver (connected, not yet connected, a slot not opened) in
    # tests/unit/csrun_runtime/tensorflow/test_remote.py with real sender processes
    # 2500 steps (~25 s at 100 steps/s): the first removal comes at the first window (5 s), the
    # next ones a pause (10 s) apart
    res, perf = _run(cli_env, latency_bound, 6, 2500, "service")
    auto = perf["autoscale"]
    assert perf["global_step_end"] == 2500
    removes = [e for e in auto["events"] if e["action"] == "remove"]
    assert removes and removes[0]["input_wait_fraction"] < 0.02, auto["events"]
    assert auto["final_workers"] < 6
    assert len(perf["workers_paused"]) == 6 - auto["final_workers"] and not perf["workers_stopped"]
    assert "autoscale: remove input worker" in res.stderr
    assert all(n > 0 for n in perf["batches_per_worker"].values())  # all six streamed at first
