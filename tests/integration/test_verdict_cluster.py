"""The end-of-run verdict, a clean Ctrl-C and the artifacts' file modes, through the real
``csrun_wse`` on the test cluster (docs/VERDICT.md), and a checkpoint killed mid-save.

* an input-bound run (the digits pipeline paced to 5 ms a batch, tests/fixtures/paced/run.py,
  against a train step ~40x faster) interrupted with SIGINT to csrun_wse mid-training: exit 130,
  the verdict says input-bound and names the slowest input worker and cs_input_analyzer, the
  newest checkpoint is the step the verdict names, complete and readable, performance.json has
  ``stopped_by: SIGINT``, no ``Traceback`` anywhere in the output, and every artifact is 0644
  under umask 022;
* a compute-bound run (each train step sleeps 20 ms, input free) in train_and_eval mode: the
  verdict says compute-bound, ``eval/results.json`` is 0644 too;
* a process saving checkpoints with tf.train.CheckpointManager, SIGKILLed at random points
  of its saves: the checkpoint the ``checkpoint`` file names is always complete.
"""
from __future__ import annotations

import json
import os
import random
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fixtures.runtime import helpers

BIN, PACED = helpers.BIN, helpers.PACED


def _launch(tmp: Path, cli_env: dict, params: Path, md: Path, mode: str,
            max_steps: int) -> tuple[subprocess.Popen, Path]:
    argv = [str(BIN / "csrun_wse"), "--total-nodes", "2", "--tasks-per-node", "1", "--cpus-per-task", "1",
            "python-ws", PACED, "--params", str(params), "--mode", mode, "--max_steps", str(max_steps),
            "--model_dir", str(md)]
    log = tmp / f"csrun_wse.{mode}.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=cli_env, cwd=tmp,
                                preexec_fn=lambda: os.umask(0o022))
    return proc, log


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _verdict_block(text: str) -> list[str]:
    lines = text.splitlines()
    start = max(i for i, line in enumerate(lines) if "verdict (" in line)
    return lines[start:start + 9]


@pytest.mark.cluster
@pytest.mark.tf
@pytest.mark.slow
def test_input_bound_run_stopped_by_ctrl_c_is_clean_and_says_so(cli_env, tmp_path):
    data = helpers.prepare_digits(tmp_path / "data")
    params = helpers.digits_params(tmp_path, data, train_input={"pace_ms": 5}, log_steps=100,
                                   checkpoint_steps=100, eval_frequency=None, jit_compile=False)
    md = tmp_path / "md"
    proc, log = _launch(tmp_path, cli_env, params, md, "train", 100000)
    try:
        helpers.wait_for(lambda: "global_step = 1000," in log.read_text(), 300, "1000 steps of training")
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    out = log.read_text()
    task_logs = "".join(p.read_text() for p in (tmp_path / "csrun_logs").glob("*.log")) \
        if (tmp_path / "csrun_logs").is_dir() else ""
    assert code == 130, out[-3000:]
    assert "Traceback" not in out + task_logs and "KeyboardInterrupt" not in out + task_logs, out[-5000:]

    perf = json.loads((md / "performance" / "performance.json").read_text())
    end = perf["global_step_end"]
    assert perf["stopped_by"] == "SIGINT" and perf["ended"] == "stopped by SIGINT" and end >= 1000
    v = perf["verdict"]
    assert v["bound"] == "input" and perf["input_wait_fraction"] > 0.5, v
    assert v["slowest_input_worker"]["worker"] == "0" and v["slowest_input_worker"]["samples_per_sec"] > 0
    assert perf["steady_samples_per_sec"] == pytest.approx(
        perf["steady_steps"] * perf["batch_size"] / perf["steady_time"], rel=0.01)
    assert perf["fields"]["est_samples_per_sec"].startswith("compute-only rate")

    block = _verdict_block(out)
    assert f"verdict (stopped by SIGINT): {end - perf['global_step_start']} step(s) trained" in block[0]
    assert any("input-bound: training waited for input" in line for line in block), block
    assert any("cs_input_analyzer" in line for line in block), block
    assert "rate over global steps" in out  # the live line
    # the log ends on the verdict, not on a save that never finished
    assert not out.rstrip().splitlines()[-1].endswith(f"Saving checkpoint at global step {end}")

    # the newest checkpoint is the step the run stopped at, complete and readable
    import tensorflow as tf

    latest = tf.train.latest_checkpoint(str(md))
    assert latest == str(md / f"model-ckpt-{end}")
    reader = tf.train.load_checkpoint(latest)
    names = reader.get_variable_to_shape_map()
    step_key = next(k for k in names if k.startswith("global_step"))
    assert int(reader.get_tensor(step_key)) == end
    for k in names:
        reader.get_tensor(k)  # every tensor's bytes are there
    assert not list(md.glob("*_temp*"))

    # every artifact is readable by others under umask 022, as checkpoints are
    for p in (md / "performance" / "performance.json", md / "performance" / "allocations.json",
              md / "train" / "params_train.yaml", md / f"model-ckpt-{end}.index", md / "checkpoint"):
        assert _mode(p) == 0o644, (p, oct(_mode(p)))


@pytest.mark.cluster
@pytest.mark.tf
@pytest.mark.slow
def test_compute_bound_run_says_so(cli_env, tmp_path):
    data = helpers.prepare_digits(tmp_path / "data")
    params = helpers.digits_params(tmp_path, data, model={"step_pace_ms": 20}, log_steps=50,
                                   checkpoint_steps=0, eval_frequency=None, jit_compile=False, eval_steps=2)
    md = tmp_path / "md"
    proc, log = _launch(tmp_path, cli_env, params, md, "train_and_eval", 200)
    code = proc.wait(timeout=300)
    out = log.read_text()
    assert code == 0, out[-3000:]
    perf = json.loads((md / "performance" / "performance.json").read_text())
    assert perf["verdict"]["bound"] == "compute" and perf["ended"] == "target reached", perf["verdict"]
    assert perf["stopped_by"] is None and perf["input_wait_fraction"] < 0.10
    block = _verdict_block(out)
    assert block[0].startswith("INFO:csrun:verdict (target reached): 200 step(s) trained")
    assert any("compute-bound: input waited" in line for line in block), block
    for p in (md / "performance" / "performance.json", md / "eval" / "results.json",
              md / "eval" / "params_eval.yaml" if (md / "eval" / "params_eval.yaml").exists()
              else md / "train" / "params_train.yaml"):
        assert _mode(p) == 0o644, (p, oct(_mode(p)))


SAVER = r"""
import sys, tensorflow as tf
d = sys.argv[1]
v = tf.Variable(tf.random.normal([4_000_000]))  # 16 MB: a save takes tens of ms
step = tf.Variable(0, dtype=tf.int64)
ckpt = tf.train.Checkpoint(v=v, step=step)
mgr = tf.train.CheckpointManager(ckpt, d, max_to_keep=2, checkpoint_name="model-ckpt")
if mgr.latest_checkpoint:
    ckpt.restore(mgr.latest_checkpoint)
print("ready", flush=True)
while True:
    step.assign_add(1)
    v.assign(tf.fill([4_000_000], float(step.numpy())))
    mgr.save(checkpoint_number=int(step.numpy()))
"""


@pytest.mark.tf
@pytest.mark.slow
def test_a_checkpoint_killed_mid_save_never_becomes_the_latest(tmp_path):
    """SIGKILL lands anywhere in tf.train.CheckpointManager.save (data, index, the
    ``checkpoint`` state file, the sweep of old ones): what ``checkpoint`` names is complete.
    (SIGINT/SIGTERM never land mid-save: the training loop only records them; this is the
    signal nothing can catch.)"""
    import tensorflow as tf

    d = tmp_path / "ckpt"
    rng = random.Random(24)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    for _ in range(3):
        proc = subprocess.Popen([sys.executable, "-c", SAVER, str(d)], stdout=subprocess.PIPE, text=True, env=env)
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
            time.sleep(rng.uniform(0.3, 1.5))
        finally:
            proc.kill()
            proc.wait(timeout=30)
        latest = tf.train.latest_checkpoint(str(d))
        assert latest is not None
        reader = tf.train.load_checkpoint(latest)
        n = int(latest.rsplit("-", 1)[1])
        key = next(k for k in reader.get_variable_to_shape_map() if k.startswith("v/"))
        values = reader.get_tensor(key)
        assert values.shape == (4_000_000,) and float(values.min()) == float(values.max()) == float(n)
