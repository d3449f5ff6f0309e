"""A lost input worker under csrun_wse on the test cluster (docs/RESILIENCE.md "Lost input workers").

The digits main job with its input paced (tests/fixtures/paced/run.py, 20 ms per batch) runs
as 1 chief + 2 input workers on 3 nodes; input worker 1's process is killed with SIGKILL
during training (its pid from the rendezvous, as a user would find it). The job must reach
max_steps and csrun_wse exit 0; the chief must notice the loss within 10 s naming the worker,
the replacement (same index, same node, same files and seed) must stream again within 60 s,
and performance.json must record both. Killing the chief instead still ends the whole job.
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
# killed at step 300: the other worker alone (50 steps/s at 20 ms a batch) trains 1500 more steps,
# 30 s, while the replacement on the same node starts (it streams again ~10 s after the kill)
MAX_STEPS = 1800
KILL_AT = 300


@pytest.fixture(scope="module")
def paced(tmp_path_factory):
    root = tmp_path_factory.mktemp("elastic")
    data = helpers.prepare_digits(root / "data")
    path = helpers.digits_params(root, data, train_input={"pace_ms": 20}, log_steps=50, checkpoint_steps=0,
                                 eval_frequency=None)
    return {"root": root, "params": path}


@pytest.mark.parametrize("path", ["srun", "sbatch"])
def test_killed_input_worker_is_replaced_and_the_job_finishes(cli_env, paced, path):
    md = paced["root"] / f"md_{path}"
    argv = [str(BIN / "csrun_wse"), *(["--use-sbatch"] if path == "sbatch" else []),
            "--total-nodes", "3", "--tasks-per-node", "1", "--cpus-per-task", "1",
            "python-ws", PACED, "--params", str(paced["params"]), "--mode", "train",
            "--max_steps", str(MAX_STEPS), "--model_dir", str(md)]
    job = None
    if path == "srun":
        log = paced["root"] / "csrun_wse.log"
        with open(log, "w") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=cli_env, cwd=paced["root"])
    else:
        sub = subprocess.run(argv, env=cli_env, cwd=paced["root"], capture_output=True, text=True, timeout=60)
        assert sub.returncode == 0, sub.stderr
        job = sub.stdout.split()[-1]
        log = paced["root"] / f"csrun_wse-{job}.out"
    try:
        helpers.wait_for(lambda: log.exists() and f"global_step = {KILL_AT}," in log.read_text(), 300,
                  "training to start")
        (reg_file,) = md.glob(".csrun/*/workers/1.json")
        reg = json.loads(reg_file.read_text())
        os.kill(reg["pid"], signal.SIGKILL)
        t_kill = time.time()
        code = proc.wait(timeout=300) if job is None else helpers.batch_job_end(job, cli_env, 300)
    finally:
        if job is None and proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=60)
        elif job is not None:
            subprocess.run(["scancel", job], env=cli_env)
    output = log.read_text()
    assert code == 0, output[-3000:]
    perf = json.loads((md / "performance" / "performance.json").read_text())
    assert perf["global_step_end"] == MAX_STEPS
    (lost,) = perf["workers_lost"]
    assert lost["index"] == 1 and lost["node"] == reg["node"] and lost["pid"] == reg["pid"]
    assert abs(lost["time"] - t_kill) < 2.0, (lost, t_kill)
    assert lost["noticed"] - t_kill < 10.0, f"the chief noticed the loss {lost['noticed'] - t_kill:.1f} s after"
    assert re.search(rf"input worker 1 on {reg['node']} \(pid {reg['pid']}\) lost", output), output[-3000:]
    (rep,) = perf["workers_replaced"]
    assert rep["index"] == 1 and rep["node"] == reg["node"] and rep["attempt"] == 1 and rep["pid"] != reg["pid"]
    assert rep["seconds_loss_to_stream"] < 60.0, rep
    print(f"noticed {lost['noticed'] - t_kill:.1f} s after the kill; the replacement registered "
          f"{rep['time'] - t_kill:.1f} s and streamed again {rep['streaming_again'] - t_kill:.1f} s after it")
    assert perf["workers_given_up"] == []
    # the replacement read the same files with the same seed, and served batches after the loss
    (report,) = [r for r in map(json.loads, (p.read_text() for p in md.glob(".csrun/*/workers/1.report.json")))]
    assert report["attempt"] == 1 and report["elements"] > 0
    assert report["shuffle_seed"] == reg["shuffle_seed"] and report["pipeline_files"] == reg["pipeline_files"]
    assert int(perf["batches_per_worker"]["1"]) > 0


def test_killed_chief_ends_the_job_at_once(cli_env, paced):
    """The chief's death is still the job's (``--kill-on-bad-exit=1``; the chief's task execs
    the command, so the chief's process is the task): csrun_wse fails within 20 s and no task
    of the job is left in the queue."""
    md = paced["root"] / "md_chief"
    log = paced["root"] / "csrun_wse_chief.log"
    argv = [str(BIN / "csrun_wse"), "--total-nodes", "3", "--tasks-per-node", "1", "--cpus-per-task", "1",
            "python-ws", PACED, "--params", str(paced["params"]), "--mode", "train",
            "--max_steps", str(MAX_STEPS), "--model_dir", str(md)]
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=cli_env, cwd=paced["root"])
    try:
        helpers.wait_for(lambda: "global_step = 100," in log.read_text(), 300, "training to start")
        (disp,) = md.glob(".csrun/*/endpoints.json")
        chief = json.loads(disp.read_text())["chief"]
        os.kill(chief["pid"], signal.SIGKILL)
        t_kill = time.monotonic()
        code = proc.wait(timeout=60)
        elapsed = time.monotonic() - t_kill
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=60)
    output = log.read_text()
    assert code != 0, output[-3000:]
    assert elapsed < 20, f"csrun_wse took {elapsed:.0f} s to end after the chief's death"
    assert re.search(rf"srun: error: {chief['node']}: task 0: Killed", output), output[-3000:]
    assert "replacement" not in output  # nothing restarts the chief
    helpers.wait_for(lambda: not subprocess.run(["squeue", "--noheader", "--name=csrun_wse"], env=cli_env,
                                         capture_output=True, text=True).stdout.strip(), 30, "the queue to empty")


def test_a_failing_chief_gives_csrun_wse_its_own_exit_status(cli_env, paced):
    """The chief fails (exit 2: ``--checkpoint_path`` names no checkpoint) after publishing its
    dispatchers, while its input workers start and serve: it marks the job done and exits after
    them, so that srun, and csrun_wse, exit with the chief's status and not the 143 of workers
    srun would otherwise kill (docs/RESILIENCE.md "Lost input workers")."""
    md = paced["root"] / "md_failing_chief"
    argv = [str(BIN / "csrun_wse"), "--total-nodes", "3", "--tasks-per-node", "1", "--cpus-per-task", "1",
            "python-ws", PACED, "--params", str(paced["params"]), "--mode", "train",
            "--max_steps", str(MAX_STEPS), "--model_dir", str(md),
            "--checkpoint_path", str(paced["root"] / "no_such_checkpoint")]
    res = subprocess.run(argv, env=cli_env, cwd=paced["root"], capture_output=True, text=True, timeout=300)
    assert res.returncode == 2, (res.returncode, res.stderr[-3000:])
    assert "runconfig.checkpoint_path: no checkpoint at" in res.stderr
    # both workers left by themselves after the chief's done marker, each with its report
    reports = [json.loads(p.read_text()) for p in md.glob(".csrun/*/workers/*.report.json")]
    assert sorted(r["index"] for r in reports) == [0, 1] and {r["chief_status"] for r in reports} == {"failed"}
