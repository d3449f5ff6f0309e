"""Production Slurm (issue 11) through csrun_wse / csrun_cpu on the real test cluster:

- ``--requeue``: a training run longer than a 1-minute ``--time`` reaches ``max_steps`` across
  several allocations, and ``scontrol requeue`` of a running job resumes the same way; the
  global steps logged by every allocation are 1..max_steps, each once;
- ``--check``: a job that fits, one that cannot (too many nodes; memory Slurm has not);
- ``--dry-run`` with slurmctld stopped (answers within the 5-second query timeout);
- the exit status of an interrupted launch (130 for SIGINT, 143 for SIGTERM);
- site policies (time limit, QOS, account, a verbatim option) as Slurm records them.

The training runs use tests/fixtures/paced/run.py: the digits example with each training step
paced to ~20 ms, so that a run's length in seconds depends little on the host's load.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fixtures.runtime import helpers

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PACED = str(REPO / "tests" / "fixtures" / "paced" / "run.py")
REPORT = str(REPO / "tests" / "fixtures" / "report_task.py")
#: one node: the chief and one input worker (a one-component job: the main scheduler starts
#: it again at once after a requeue, where a het job waits for the backfill scheduler)
SMALL = ["--total-nodes", "1", "--tasks-per-node", "2", "--cpus-per-task", "1"]
#: C++ INFO lines of TensorFlow that the tasks must no longer print (quiet by default), and the
#: two start-up lines no log level hides (csrun_runtime/tensorflow/quiet.py)
TF_INFO = re.compile(r"^I0000 .*(dispatcher_impl|server_lib|cpu_feature_guard|device_compiler|port\.cc:.*oneDNN)"
                     r"|^WARNING: All log messages before absl::InitializeLog\(\)", re.M)


def csrun(cli, args, env, cwd=None, timeout=120):
    return subprocess.run([str(BIN / cli), *args], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def queued(env) -> set[str]:
    out = subprocess.run(["squeue", "--noheader", "--format=%i"], env=env, capture_output=True, text=True).stdout
    return set(out.split())


def wait_gone(job_id: str, env, timeout: float) -> float:
    """Wait until squeue no longer lists the job; returns the seconds waited."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        out = subprocess.run(["squeue", "--noheader", "--format=%i %T %N", f"--jobs={job_id}"], env=env,
                             capture_output=True, text=True).stdout
        if not out.strip():
            return time.monotonic() - t0
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} still in squeue after {timeout} s: {out.strip()}")


@pytest.fixture(scope="module")
def paced(tmp_path_factory):
    """The digits TFRecord shards and a params file: each training step paced to 20 ms (the
    chief's step, not the input: every allocation resumes the input stream at its position, by
    reading, and a paced input would make each resume re-read the run so far at the pace:
    docs/RESILIENCE.md "The input position"), every global step logged, no periodic checkpoint
    (only the stop signal's and the final one)."""
    root = tmp_path_factory.mktemp("paced")
    data = helpers.prepare_digits(root / "data")
    path = helpers.digits_params(root, data, model={"step_pace_ms": 20}, log_steps=1, checkpoint_steps=0,
                                 eval_frequency=None, keep_checkpoint_max=2)
    return {"root": root, "params": path}


def logged_steps(text: str) -> list[int]:
    return [int(m) for m in re.findall(r"global_step = (\d+), loss", text)]


def check_run(model_dir: Path, output: str, max_steps: int) -> list[dict]:
    """Every global step 1..max_steps logged exactly once across the allocations, the
    allocations chained step to step, performance.json saying how many there were."""
    steps = logged_steps(output)
    assert sorted(steps) == list(range(1, max_steps + 1)), \
        f"gaps or repeats: {len(steps)} steps logged, {len(set(steps))} distinct, max {max(steps or [0])}"
    allocs = json.loads((model_dir / "performance" / "allocations.json").read_text())["allocations"]
    assert allocs[0]["start_step"] == 0 and allocs[-1]["end_step"] == max_steps
    assert all(a["end_step"] == b["start_step"] for a, b in zip(allocs, allocs[1:], strict=False))
    assert all(a["stopped_by"] for a in allocs[:-1]) and allocs[-1]["stopped_by"] is None
    perf = json.loads((model_dir / "performance" / "performance.json").read_text())
    assert perf["allocations"] == len(allocs) and sum(perf["steps_per_allocation"]) == max_steps
    assert perf["global_step_end"] == max_steps
    assert f"the run took {len(allocs)} allocation(s) so far" in output
    assert not TF_INFO.search(output), TF_INFO.search(output).group(0)
    return allocs


@pytest.mark.tf
@pytest.mark.slow
def test_requeue_by_time_limit_reaches_max_steps(cli_env, paced):
    """--time 1 (one minute): Slurm sends SIGUSR2 5 s (to 35 s) before the limit; the chief
    saves and stops, the script requeues the job, the next allocation resumes."""
    max_steps = 2500  # ~55 s of training at ~45 steps/s: more than one allocation holds
    model_dir = paced["root"] / "by_time"
    proc = csrun("csrun_wse", ["--use-sbatch", "--requeue", "--time", "1", "--requeue-signal", "USR2@5",
                               "--max-requeues", "5", *SMALL, "python-ws", PACED, "--params", str(paced["params"]),
                               "--model_dir", str(model_dir), "--mode", "train", "--max_steps", str(max_steps)],
                 cli_env, cwd=paced["root"])
    assert proc.returncode == 0, proc.stderr
    job = proc.stdout.strip()
    wait_gone(job, cli_env, timeout=600)
    output = (paced["root"] / f"csrun_wse-{job}.out").read_text()
    allocs = check_run(model_dir, output, max_steps)
    assert len(allocs) >= 2, output[-3000:]
    assert allocs[0]["stopped_by"] == "SIGUSR2" and [a["requeue"] for a in allocs] == list(range(len(allocs)))
    task_log = (paced["root"] / "csrun_logs" / f"csrun_wse-{job}.log").read_text()  # input workers' lines
    assert "received SIGUSR2: the input worker keeps serving" in task_log


@pytest.mark.tf
@pytest.mark.slow
def test_scontrol_requeue_of_a_running_job_resumes(cli_env, paced):
    """scontrol requeue: the tasks get SIGTERM and, KillWait (5 s) later, SIGKILL; the chief
    saves at its step within that time; Slurm requeues the job, which resumes."""
    max_steps = 600  # requeued at step ~100-150 (~45 steps/s): the second allocation trains ~10 s
    model_dir = paced["root"] / "by_scontrol"
    proc = csrun("csrun_wse", ["--use-sbatch", "--requeue", *SMALL, "python-ws", PACED, "--params",
                               str(paced["params"]), "--model_dir", str(model_dir), "--mode", "train",
                               "--max_steps", str(max_steps)], cli_env, cwd=paced["root"])
    assert proc.returncode == 0, proc.stderr
    job = proc.stdout.strip()
    out = paced["root"] / f"csrun_wse-{job}.out"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and len(logged_steps(out.read_text() if out.exists() else "")) < 100:
        time.sleep(0.5)
    subprocess.run(["scontrol", "requeue", job], env=cli_env, check=True, capture_output=True)
    wait_gone(job, cli_env, timeout=400)
    allocs = check_run(model_dir, out.read_text(), max_steps)
    assert len(allocs) == 2 and allocs[0]["stopped_by"] == "SIGTERM" and allocs[0]["end_step"] >= 100


def test_check_a_job_that_fits_and_ones_that_cannot(cli_env, tmp_path):
    before = queued(cli_env)
    layout = ["--total-nodes", "4", "--single-task-nodes", "1", "--tasks-per-node", "2"]
    ok = csrun("csrun_wse", ["--check", *layout, "python", REPORT, str(tmp_path)], cli_env, cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith("csrun_wse --check: the job can run\n") and "expected start 20" in ok.stdout
    assert re.search(r"ok +script +.*report_task\.py \(readable\)", ok.stdout)
    too_many = csrun("csrun_wse", ["--check", "--total-nodes", "9", "python", REPORT], cli_env, cwd=tmp_path)
    assert too_many.returncode == 2 and too_many.stdout == ""
    assert too_many.stderr == "csrun_wse: error: --total-nodes 9: the partition has only 5 node(s)\n"
    no_mem = csrun("csrun_wse", ["--check", "--use-sbatch", "--slurm-arg=--mem=500000", *layout, "python", REPORT,
                                 "--params", "missing.yaml"], cli_env, cwd=tmp_path)
    assert no_mem.returncode == 2
    assert re.search(r"FAIL +slurm +sbatch --test-only: cannot run: .*Requested node configuration is not "
                     r"available", no_mem.stdout), no_mem.stdout
    assert re.search(r"FAIL +params +.*missing\.yaml: no such file", no_mem.stdout)
    assert no_mem.stderr.count("\n") == 1 and no_mem.stderr.startswith("csrun_wse: error: --check: the job cannot run")
    # --survive-node-loss: the input workers' own job is asked about too
    two = csrun("csrun_wse", ["--check", "--survive-node-loss", "--use-sbatch", "--total-nodes", "3",
                              "--tasks-per-node", "1", "python", REPORT], cli_env, cwd=tmp_path)
    assert two.returncode == 0, two.stderr
    assert re.search(r"ok +slurm +sbatch --test-only: expected start", two.stdout), two.stdout
    assert re.search(r"ok +worker job +srun --test-only: expected start", two.stdout), two.stdout
    cpu = csrun("csrun_cpu", ["--check", "python", "-c", "pass"], cli_env, cwd=tmp_path)
    assert cpu.returncode == 0 and "srun --test-only: expected start" in cpu.stdout
    assert queued(cli_env) == before  # --test-only submits nothing
    assert not list(tmp_path.glob("task-*.json"))


@pytest.fixture()
def controller_stopped(slurm_cluster):
    """slurmctld of the test cluster stopped for the test (its pid file under the cluster's
    run directory), started again afterwards with ``cluster up``."""
    run_dir = Path(slurm_cluster["conf"]).parent.parent
    pid = int((run_dir / "run" / "slurmctld.pid").read_text())
    os.kill(pid, signal.SIGTERM)
    for _ in range(100):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    try:
        yield
    finally:
        up = subprocess.run([str(REPO / "slurm-test-cluster" / "cluster"), "up"], capture_output=True, text=True)
        assert up.returncode == 0, up.stderr


def test_dry_run_with_the_controller_stopped(cli_env, controller_stopped, tmp_path):
    t0 = time.monotonic()
    proc = csrun("csrun_wse", ["--dry-run", "--total-nodes", "3", "--tasks-per-node", "2", "--cpus-per-task", "1",
                               "--time", "30", "python", REPORT, str(tmp_path)], cli_env, cwd=tmp_path, timeout=60)
    took = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("srun ") and proc.stdout.count("--time=30") == 2 and " : " in proc.stdout
    # scontrol ping first (issue 24: a dry run waited out sinfo's 5 s query timeout, 5.2 s measured)
    assert proc.stderr.startswith("csrun_wse: note: slurmctld does not answer (scontrol ping: "), proc.stderr
    assert took < 3, f"dry run took {took:.1f} s without a controller"
    missing = csrun("csrun_wse", ["--dry-run", "--total-nodes", "3", "python", REPORT], cli_env, cwd=tmp_path)
    assert missing.returncode == 2 and "defaults.node_cpus" in missing.stderr and missing.stderr.count("\n") == 1
    t0 = time.monotonic()
    launch = csrun("csrun_wse", ["--total-nodes", "3", "python", REPORT, str(tmp_path)], cli_env, cwd=tmp_path)
    assert launch.returncode == 2 and time.monotonic() - t0 < 3
    assert launch.stderr.count("\n") == 1 and "slurmctld does not answer" in launch.stderr, launch.stderr
    assert not list(tmp_path.glob("task-*.json"))


@pytest.mark.parametrize("cli,sig,status", [
    ("csrun_wse", signal.SIGINT, 130), ("csrun_wse", signal.SIGTERM, 143), ("csrun_cpu", signal.SIGINT, 130),
])
def test_interrupted_launch_exit_status_and_empty_queue(cli_env, cli, sig, status):
    before = queued(cli_env)
    args = ["--total-nodes", "2"] if cli == "csrun_wse" else []
    proc = subprocess.Popen([str(BIN / cli), *args, "sleep", "300"], env=cli_env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    new: set[str] = set()
    while time.monotonic() < deadline and not new:
        out = subprocess.run(["squeue", "--noheader", "--states=RUNNING", "--format=%i"], env=cli_env,
                             capture_output=True, text=True).stdout.split()
        new = set(out) - before
        time.sleep(0.3)
    assert new, "the job never started"
    proc.send_signal(sig)
    assert proc.wait(timeout=30) == status
    for job in new:
        wait_gone(job, cli_env, timeout=10)


def test_site_policies_as_slurm_records_them(accounting_cluster, tmp_path):
    env = dict(accounting_cluster["env"])
    proc = csrun("csrun_wse", ["--use-sbatch", "--total-nodes", "2", "--time", "3", "--qos", "debug", "--account",
                               "research", "--slurm-arg=--comment=csrun-prod-test", "python", REPORT, str(tmp_path)],
                 env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    job = proc.stdout.strip()
    wait_gone(job, env, timeout=120)
    shown = subprocess.run(["scontrol", "--oneliner", "show", "job", job], env=env, capture_output=True,
                           text=True).stdout.splitlines()
    assert len(shown) == 2  # both het components
    for line in shown:
        for field in ("TimeLimit=00:03:00", "QOS=debug", "Account=research", "Comment=csrun-prod-test"):
            assert field in line, (field, line)
    bad = csrun("csrun_wse", ["--qos", "fast", "python", REPORT], env, cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr == \
        "csrun_wse: error: --qos 'fast': no such QOS in Slurm (QOS: debug, normal)\n"
