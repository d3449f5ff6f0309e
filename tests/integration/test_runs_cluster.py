"""Runs you can hold (issue 42, docs/RUNS.md) on the real test cluster, through csrun_wse and
``csrun``, with a Slurm-call counter on PATH (tests/fixtures/slurm_call_counter.py: wrappers that
count, then exec the real client):

- one sbatch run of two het groups (tests/fixtures/runs/tick.py: no framework, seconds): PENDING
  or RUNNING then SUCCEEDED in ``list`` and ``status``,
  both groups shown, one squeue and at most one sacct per status, ``logs --role worker --task 3
  --follow`` within 2 s of a line's writing and ended within 5 s of the job's end, ``describe``
  showing the script Slurm ran, ``attach(model_dir)`` in another process and a pickled Run;
- two requeues (``scontrol requeue``, as tests/integration/test_prod_cluster.py) after an input
  worker was killed and replaced, then ``cancel --checkpoint``: 3 attempts with nodes and exit
  statuses, attempt 1's log intact, every allocation's lost and replaced workers in
  performance.json and ``describe``, a checkpoint at the step the cancel stopped, the state
  CANCELLED, a second cancel saying so;
- a second cluster without accounting (``cluster up --no-accounting``): a finished run's state
  from its markers, with one warning at most.

The training run uses tests/fixtures/paced/run.py (the digits job, input paced to 20 ms a batch).
"""
from __future__ import annotations

import json
import os
import pickle
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.fixtures.runtime import helpers
from tests.fixtures.slurm_call_counter import SlurmCallCounter

pytestmark = [pytest.mark.cluster]

REPO = Path(__file__).resolve().parents[2]
BIN, PACED = helpers.BIN, helpers.PACED
TICK = REPO / "tests" / "fixtures" / "runs" / "tick.py"
SMALL = ["--total-nodes", "1", "--tasks-per-node", "2", "--cpus-per-task", "1"]


@pytest.fixture(scope="module")
def paced(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    data = helpers.prepare_digits(root / "data")
    params = helpers.digits_params(root, data, train_input={"pace_ms": 20}, log_steps=1, checkpoint_steps=0,
                                   eval_frequency=None, keep_checkpoint_max=2)
    return {"root": root, "params": params}


@pytest.fixture()
def env(cli_env, tmp_path):
    """The cluster's environment with a state directory of the test's and the call counter."""
    counter = SlurmCallCounter(tmp_path / "counter", cli_env)
    e = counter.env({**cli_env, "XDG_STATE_HOME": str(tmp_path / "state")})
    e["counter"] = str(counter.log)
    return e


def csrun(env, *args, cwd=None, timeout=120) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in env.items() if k != "counter"}
    return subprocess.run([str(BIN / "csrun"), *args], env=clean, cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def launch(env, args, cwd) -> tuple[str, str]:
    clean = {k: v for k, v in env.items() if k != "counter"}
    proc = subprocess.run([str(BIN / "csrun_wse"), "--use-sbatch", *args], env=clean, cwd=cwd, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    run_id = re.search(r"csrun_wse: run (\S+) \(csrun status", proc.stderr).group(1)
    return run_id, proc.stdout.strip()


def status(env, run) -> dict:
    proc = csrun(env, "status", run, "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def calls(env) -> list[str]:
    return [ln.split()[0] for ln in Path(env["counter"]).read_text().splitlines() if ln]


def wait_status(env, run, pred, timeout, what) -> dict:
    got: dict = {}

    def check() -> bool:
        got.update(status(env, run))
        return pred(got)

    helpers.wait_for(check, timeout, what)
    return got


def train_args(paced, md, max_steps) -> list[str]:
    return ["python-ws", PACED, "--params", str(paced["params"]), "--model_dir", str(md), "--mode", "train",
            "--max_steps", str(max_steps)]


class Follow:
    """``csrun logs RUN ... --follow`` in the background, each line with the time it arrived;
    beside it, the times each line appeared in the task's file (polled every 20 ms)."""

    def __init__(self, env, run, args, watched: Path):
        clean = {k: v for k, v in env.items() if k != "counter"}
        self.proc = subprocess.Popen([str(BIN / "csrun"), "logs", run, *args, "--follow"], env=clean,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.printed: list[tuple[float, str]] = []
        self.written: dict[str, float] = {}
        self.ended: float | None = None
        self.watched = watched
        self._stop = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._watch, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.printed.append((time.time(), line.rstrip("\n")))
        self.proc.wait()
        self.ended = time.time()

    def _watch(self) -> None:
        while not self._stop.is_set():
            try:
                for ln in self.watched.read_text().splitlines():
                    self.written.setdefault(ln, time.time())
            except OSError:
                pass
            time.sleep(0.02)

    def stop(self) -> None:
        self._stop.set()


def test_an_sbatch_run_listed_followed_described_and_attached(env, tmp_path):
    """6 tasks of tests/fixtures/runs/tick.py (no framework: a line every 0.5 s for 8 s) on 3
    nodes: the chief's group (the chief and input worker 0) and the workers' (1 to 4)."""
    md = tmp_path / "md"
    run_id, job = launch(env, ["--total-nodes", "3", "--tasks-per-node", "2", "--cpus-per-task", "1",
                               sys.executable, str(TICK), "--ticks", "16", "--model_dir", str(md)], tmp_path)
    listed = csrun(env, "list").stdout
    assert re.search(rf"^{run_id}\s+(PENDING|RUNNING)\s+{job}\s", listed, re.M), listed
    worker3 = tmp_path / "csrun_logs" / f"csrun_wse-{job}" / "attempt-1" / "task-4.log"  # worker 3 is task 4
    follow = Follow(env, job, ["--role", "worker", "--task", "3"], worker3)
    try:
        st = wait_status(env, run_id, lambda s: s["state"] == "RUNNING", 120, "the run to start")
        assert [(g["het_group"], g["role"], g["state"]) for g in st["groups"]] == [(0, "chief", "RUNNING"),
                                                                                (1, "worker", "RUNNING")]
        Path(env["counter"]).write_text("")
        status(env, run_id)
        assert calls(env) == ["squeue"]  # one squeue, no sacct while squeue knows the job
        code = helpers.batch_job_end(job, env, 120)
        assert code == 0
        helpers.wait_for(lambda: follow.ended is not None, 20, "logs --follow to end")
    finally:
        follow.stop()
        if follow.proc.poll() is None:
            follow.proc.kill()
    end = json.loads((worker3.parent / "end.json").read_text())
    assert follow.ended - end["time"] < 5.0, (follow.ended, end)
    assert follow.printed and all(text.startswith("[worker 3] ") for _, text in follow.printed), follow.printed
    late = [(t - follow.written[text[11:]], text) for t, text in follow.printed if text[11:] in follow.written]
    assert late and max(d for d, _ in late) < 2.0, late
    done = status(env, run_id)
    assert done["state"] == "SUCCEEDED" and done["attempts"][0]["status"] == 0
    assert re.search(rf"^{run_id}\s+SUCCEEDED\s", csrun(env, "list").stdout, re.M)
    Path(env["counter"]).write_text("")
    csrun(env, "list")
    assert calls(env) == []  # a finished run's end is recorded: no Slurm call
    described = csrun(env, "describe", run_id).stdout
    script = [ln[4:] for ln in described.split("the sbatch script that ran:\n", 1)[1].splitlines()]
    ran = subprocess.run(["scontrol", "write", "batch_script", job, "-"], env=env, capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr  # slurmctld keeps the script MinJobAge (60 s) after the end
    assert script == ran.stdout.splitlines()
    code = ("import pickle, sys; from launcher.runs import attach; r = attach(sys.argv[1]); "
            "sys.stdout.buffer.write(pickle.dumps((r, r.state())))")
    clean = {k: v for k, v in env.items() if k != "counter"}
    other = subprocess.run([sys.executable, "-c", code, str(md)], env=clean, cwd="/", capture_output=True, timeout=60)
    attached, state = pickle.loads(other.stdout)
    assert state == "SUCCEEDED" and attached.run_id == run_id
    assert (md / ".csrun-runs" / f"{run_id}.json").exists()  # the copy beside the model_dir
    assert pickle.loads(pickle.dumps(attached)).state() == "SUCCEEDED"  # here, as in the other process


@pytest.mark.tf
@pytest.mark.slow
def test_two_requeues_then_cancel_with_a_checkpoint(env, paced, tmp_path):
    """Input worker 0 killed (SIGKILL) and replaced in the first allocation, ``scontrol requeue``
    twice (the tasks get SIGTERM, the chief saves at its step, Slurm requeues the job), then
    ``csrun cancel --checkpoint`` in the third allocation."""
    md = tmp_path / "md"
    run_id, job = launch(env, ["--requeue", *SMALL, *train_args(paced, md, 100_000)], tmp_path)
    try:
        wait_status(env, run_id, lambda s: (s["live"]["step"] or 0) >= 40, 300, "training")
        (reg,) = [json.loads(p.read_text()) for p in md.glob(".csrun/*/workers/0.json")]
        os.kill(reg["pid"], signal.SIGKILL)
        wait_status(env, run_id, lambda s: s["live"]["workers"]["replaced"] == [0], 120, "the worker replaced")
        for attempt in (1, 2, 3):
            wait_status(env, run_id, lambda s, a=attempt: len(s["attempts"]) == a and s["state"] == "RUNNING"
                        and (s["live"]["step"] or 0) > 0, 300, f"attempt {attempt} training")
            time.sleep(2.0)
            if attempt < 3:
                subprocess.run(["scontrol", "requeue", job], env=env, check=True, capture_output=True)
        cancelled = csrun(env, "cancel", run_id, "--checkpoint", timeout=180)
        assert cancelled.returncode == 0, cancelled.stderr
        assert cancelled.stdout == f"{run_id}: job {job} cancelled after its checkpoint\n"
    finally:
        subprocess.run(["scancel", job], env=env, capture_output=True)
    st = wait_status(env, run_id, lambda s: s["state"] not in ("RUNNING", "PENDING", "REQUEUED"), 60, "the end")
    assert st["state"] == "CANCELLED", st
    attempts = st["attempts"]
    assert [(a["number"], a["job_id"], a["status"]) for a in attempts] == [(1, job, 75), (2, job, 75), (3, job, 130)]
    assert [a["state"] for a in attempts] == ["REQUEUED", "REQUEUED", "CANCELLED"]
    assert all(a["nodes"].get("0", "").startswith("node") for a in attempts), attempts
    # cancel --checkpoint: the checkpoint of the step it stopped at; idempotent
    perf = json.loads((md / "performance" / "performance.json").read_text())
    step = perf["global_step_end"]
    assert perf["stopped_by"] == "SIGINT" and (md / f"model-ckpt-{step}.index").exists()
    again = csrun(env, "cancel", run_id, "--checkpoint")
    assert again.returncode == 0 and again.stdout.startswith(f"{run_id} already ended: CANCELLED"), again.stdout
    # attempt 1's log, intact: its own steps, in order, each once, up to its stop
    first = csrun(env, "logs", run_id, "--attempt", "1", "--role", "chief").stdout.splitlines()
    steps = [int(m) for m in re.findall(r"global_step = (\d+), loss", "\n".join(first))]
    assert steps == list(range(1, steps[-1] + 1)), steps
    assert f"stopped by SIGTERM at global step {steps[-1]}" in "\n".join(first)
    chief1 = Path(attempts[0]["directory"]) / "task-0.log"
    assert [ln[len("[chief] "):] for ln in first] == chief1.read_text().splitlines()
    # every allocation's lost and replaced workers, in performance.json and describe
    history = perf["allocation_history"]
    assert [h["requeue"] for h in history] == [0, 1, 2] and history[0]["end_step"] == steps[-1]
    assert [h["stopped_by"] for h in history] == ["SIGTERM", "SIGTERM", "SIGINT"]
    assert [w["index"] for w in history[0]["workers_lost"]] == [0]
    assert [w["index"] for w in history[0]["workers_replaced"]] == [0]
    assert history[1]["workers_lost"] == [] and perf["workers_lost"] == []  # the last allocation's own
    described = csrun(env, "describe", run_id).stdout
    assert re.search(r"allocation 1 \(job \d+, requeue 0\): steps 0\.\.\d+, stopped by SIGTERM; lost 0; "
                     r"replaced 0\n", described), described


@pytest.fixture(scope="module")
def bare_cluster(tmp_path_factory):
    """A second test cluster without accounting (``cluster up --nodes 2 --no-accounting``) in its
    own directory, on ports beside the pinned cluster's, stopped at the end. Its slurmctld forgets
    a finished job 2 s after its end (``MinJobAge=2``, set and reconfigured here; 60 s on the
    test clusters), so that within seconds nothing but the run's own markers knows how it ended,
    as for a job purged from a production cluster's memory."""
    root = tmp_path_factory.mktemp("bare_cluster")
    port = int(os.environ.get("CSRUN_PINNED_PORT", "16917")) + 50
    env = {**os.environ, "CSRUN_CLUSTER_DIR": str(root), "CSRUN_CLUSTER_PORT": str(port),
           "CSRUN_TEST_ENGINE": "native", "SLURM_CONF": str(root / "etc" / "slurm.conf")}
    script = str(REPO / "slurm-test-cluster" / "cluster")
    up = subprocess.run([script, "up", "--nodes", "2", "--no-accounting"], env=env, capture_output=True, text=True)
    try:
        if up.returncode != 0:
            pytest.fail(f"cluster up --no-accounting: {(up.stderr or up.stdout)[-500:]}")
        conf = root / "etc" / "slurm.conf"
        conf.write_text(re.sub(r"^MinJobAge=\d+$", "MinJobAge=2", conf.read_text(), flags=re.M))
        subprocess.run(["scontrol", "reconfigure"], env=env, check=True, capture_output=True)
        yield env
    finally:
        subprocess.run([script, "down"], env=env, capture_output=True, text=True)


def test_without_accounting_the_markers_end_the_run(bare_cluster, tmp_path):
    counter = SlurmCallCounter(tmp_path / "counter", bare_cluster)
    env = counter.env({**bare_cluster, "XDG_STATE_HOME": str(tmp_path / "state")})
    env["counter"] = str(counter.log)
    run_id, job = launch(env, ["--total-nodes", "1", "--tasks-per-node", "1", "--cpus-per-task", "1",
                               "bash", "-c", "echo started; sleep 2; echo done"], tmp_path)
    end = tmp_path / "csrun_logs" / f"csrun_wse-{job}" / "attempt-1" / "end.json"
    helpers.wait_for(end.exists, 120, "the job's end marker")
    helpers.wait_for(lambda: not subprocess.run(["squeue", "--noheader", "--states=all", f"--jobs={job}"],
                                                env=env, capture_output=True, text=True).stdout.strip(),
                     60, "slurmctld to forget the job")
    Path(env["counter"]).write_text("")
    t0 = time.monotonic()
    proc = csrun(env, "status", run_id, "--json")
    took = time.monotonic() - t0
    got = json.loads(proc.stdout)
    assert got["state"] == "SUCCEEDED" and got["source"] == "markers" and took < 1.0, (got, took)
    assert got["attempts"][0]["status"] == 0 and got["attempts"][0]["nodes"] == {"0": "node1"}
    assert proc.stderr.count("warning") == 1 and calls(env) == ["squeue", "sacct"], proc.stderr
    Path(env["counter"]).write_text("")
    again = csrun(env, "status", run_id)
    assert again.stdout.startswith(f"{run_id}: SUCCEEDED") and again.stderr == "" and calls(env) == []
