"""Only the job's own tasks get in (issue 45, docs/SECURITY.md), on the test cluster through
csrun_wse, both frameworks.

One job per framework, 1 chief + 2 input workers on 3 nodes, the data on the bulk channel
(``runconfig.dataplane_bulk``; TensorFlow over the data plane, ``runconfig.transport: dataplane``),
a model that logs what each step trains (tests/fixtures/impostor/run_*.py) and steps paced to
last a while. While it trains, an impostor started outside the job (the same Unix user, without
the job's secret: tests/fixtures/impostor/impostor.py) attacks the chief's data plane and every
other port the chief's process listens on (its bulk channel's): (a) a hello as input worker 0
with attempt 7 and a made-up proof, then marker batches all the same; (b) a header declaring a
1 TB leaf; (c) random bytes. The run reaches max_steps with exit 0, no step trains a marker,
worker 0 stays at attempt 0, the chief's RSS stays within 150 MB of what it was before, and
performance.json counts the refused peers. The same jobs check that the secret (read from the
chief's environment) appears in no process' argument list while they run, and afterwards in no
file of the model_dir, the logs, the job's output or, for the batch job (PyTorch, --use-sbatch),
the script Slurm keeps. A plain batch job requeued by ``scontrol requeue`` shows what Slurm does
with the environment of its submission: every allocation gets the same secret.
"""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
import yaml

from csrun_common.env import JOB_SECRET
from tests.fixtures.runtime import helpers

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

BIN, REPO = helpers.BIN, helpers.REPO
FIXTURES = REPO / "tests" / "fixtures" / "impostor"
MAX_STEPS = 800
#: The chief's RSS may grow this much while it is attacked (its usual growth while training).
RSS_BOUND_MB = 150


def _params(tmp: Path, framework: str) -> Path:
    rc = {"max_steps": MAX_STEPS, "log_steps": 100, "checkpoint_steps": 0, "dataplane_bulk": True}
    if framework == "tf":
        rc.update(transport="dataplane", jit_compile=False)
    p = {"train_input": {"batch_size": 8, "shuffle_seed": 1},
         "model": {"trained_log": str(tmp / "trained.log"), "step_pace_ms": 25},
         "optimizer": {"optimizer_type": "sgd", "learning_rate": 0.01}, "runconfig": rc}
    path = tmp / "params.yaml"
    path.write_text(yaml.safe_dump(p))
    return path


def _chief(script: Path, md: Path) -> psutil.Process | None:
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if str(script) in cmd and str(md) in cmd:
            try:
                if p.environ().get("CSRUN_ROLE") == "chief":
                    return p
            except psutil.Error:
                pass
    return None


class Watch(threading.Thread):
    """Every 0.5 s: the chief's RSS (MB) and every process' argument list, looked for ``secret``."""

    def __init__(self, chief: psutil.Process, secret: str):
        super().__init__(daemon=True)
        self.chief, self.secret, self.rss, self.seen, self.stop = chief, secret, [], [], threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.rss.append(self.chief.memory_info().rss / 1e6)
            except psutil.Error:
                pass
            for p in psutil.process_iter(["cmdline"]):
                if any(self.secret in a for a in p.info["cmdline"] or []):
                    self.seen.append(p.info["cmdline"])
            time.sleep(0.5)


def _listening(chief: psutil.Process) -> list[int]:
    conns = chief.net_connections(kind="tcp") if hasattr(chief, "net_connections") else chief.connections("tcp")
    return sorted({c.laddr.port for c in conns if c.status == psutil.CONN_LISTEN})


def _endpoint(md: Path) -> str:
    for f in md.glob(".csrun/*/endpoints.json"):
        return str(json.loads(f.read_text())["endpoints"][0])
    return ""


def _attack(md: Path, script: Path, trained: Path, env: dict) -> tuple[dict, Watch, float]:
    """Wait until training runs, then the impostor: its report, the watch, the chief's RSS before (MB)."""
    helpers.wait_for(lambda: trained.exists() and len(trained.read_text().splitlines()) >= 20 and _endpoint(md),
                     300, "training to start")
    chief = _chief(script, md)
    assert chief is not None
    secret = chief.environ()[JOB_SECRET.name]
    rss_before = chief.memory_info().rss / 1e6
    watch = Watch(chief, secret)
    watch.start()
    endpoint = _endpoint(md)
    ports = [p for p in _listening(chief) if p != int(endpoint.rsplit(":", 1)[1])]
    env = {k: v for k, v in env.items() if k != JOB_SECRET.name}
    proc = subprocess.run([sys.executable, str(FIXTURES / "impostor.py"), endpoint, *map(str, ports)], env=env,
                          capture_output=True, text=True, timeout=120, cwd=str(REPO))
    assert proc.returncode == 0, proc.stderr[-2000:]
    told = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(trained.read_text().splitlines()) < MAX_STEPS, "training ended before the impostor was done"
    return {"told": told, "ports": ports}, watch, rss_before


def _check(md: Path, tmp: Path, attack: dict, watch: Watch, rss_before: float, output: str) -> None:
    watch.stop.set()
    watch.join(10)
    told = attack["told"]
    assert told["zmq"]["hello"] == ["C"] and told["zmq"]["answer"][0].startswith("X:not authenticated"), told
    # the bulk channel: the only port that answers a handshake (with its own proof, 48 bytes) and
    # then, like every port, closes on the impostor having read nothing more
    bulk = [p for p in attack["ports"] if "after 48 bytes" in told[str(p)]["1 TB header after a made-up handshake"]]
    assert len(bulk) == 1, told
    assert all(told[str(bulk[0])][k].startswith(("closed by the peer after 0 bytes", "ConnectionResetError",
                                                  "BrokenPipeError")) for k in ("1 TB header", "random bytes")), told
    perf = json.loads((md / "performance" / "performance.json").read_text())
    assert perf["global_step_end"] == MAX_STEPS
    refused = perf["dataplane_refused"]
    reasons = refused["reasons"]
    assert refused["peers"] >= 4 and refused["messages"] >= 70, refused
    # (random bytes on the zmq port may read as a ZMTP 1.0 peer's messages: refused the same way)
    assert reasons.get("a wrong proof", 0) >= 2 and reasons.get("a message before its handshake", 0) >= 1, refused
    assert perf["workers_replaced"] == [] and perf["workers_lost"] == []  # worker 0 was never displaced
    if "dataplane" in perf:  # TensorFlow's record: worker 0 read at attempt 0 throughout
        assert perf["dataplane"]["0"]["attempt"] == 0 and perf["dataplane"]["0"]["errors"] == 0
    lines = (tmp / "trained.log").read_text().splitlines()
    assert len(lines) >= MAX_STEPS and all(ln.split()[0] == "0" for ln in lines), "the model trained a marker"
    assert max(watch.rss) - rss_before < RSS_BOUND_MB, (rss_before, max(watch.rss))
    assert "refused a peer at" in output
    print(f"refused: {refused}; the chief's RSS {rss_before:.0f} MB before, at most {max(watch.rss):.0f} MB after")
    secret = watch.secret
    assert not watch.seen, watch.seen
    leaks = [str(p) for p in tmp.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]
    assert not leaks and secret not in output


def test_an_impostor_gets_nowhere_pytorch_batch_job(cli_env, tmp_path):
    script = FIXTURES / "run_pt.py"
    md = tmp_path / "md"
    argv = [str(BIN / "csrun_wse"), "--use-sbatch", "--total-nodes", "3", "--tasks-per-node", "1",
            "--cpus-per-task", "1", "python-pt", str(script), "--params", str(_params(tmp_path, "pt")),
            "--mode", "train", "--max_steps", str(MAX_STEPS), "--model_dir", str(md)]
    sub = subprocess.run(argv, env=cli_env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert sub.returncode == 0, sub.stderr
    job = sub.stdout.strip()
    batch = subprocess.run(["scontrol", "write", "batch_script", job, "-"], env=cli_env, capture_output=True,
                           text=True, timeout=30).stdout
    assert "srun" in batch
    attack, watch, rss_before = _attack(md, script, tmp_path / "trained.log", cli_env)
    assert helpers.batch_job_end(job, cli_env, 300) == 0
    files = [*tmp_path.glob("*.out"), *tmp_path.glob("csrun_logs/**/*")]
    output = "\n".join(p.read_text(errors="replace") for p in files if p.is_file())
    _check(md, tmp_path, attack, watch, rss_before, output + sub.stderr)
    assert watch.secret not in batch and JOB_SECRET.name not in batch


def test_an_impostor_gets_nowhere_tensorflow_srun(cli_env, tmp_path):
    script = FIXTURES / "run_tf.py"
    md = tmp_path / "md"
    argv = [str(BIN / "csrun_wse"), "--total-nodes", "3", "--tasks-per-node", "1", "--cpus-per-task", "1",
            "python-ws", str(script), "--params", str(_params(tmp_path, "tf")), "--mode", "train",
            "--max_steps", str(MAX_STEPS), "--model_dir", str(md)]
    log = tmp_path / "csrun_wse.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=cli_env, cwd=tmp_path)
    try:
        attack, watch, rss_before = _attack(md, script, tmp_path / "trained.log", cli_env)
        code = proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    output = log.read_text()
    assert code == 0, output[-3000:]
    assert "Launching: srun " in output
    logs = "\n".join(p.read_text(errors="replace") for p in tmp_path.glob("csrun_logs/**/*") if p.is_file())
    _check(md, tmp_path, attack, watch, rss_before, output + logs)


REQUEUED = """#!/bin/bash
#SBATCH --requeue
#SBATCH --output={out}/requeued-%j.out
hash=$(printf %s "$CSRUN_JOB_SECRET" | sha256sum | cut -c1-16)
printf '%s %s\\n' "${{SLURM_RESTART_COUNT:-0}}" "$hash" >> {out}/seen
if [ "${{SLURM_RESTART_COUNT:-0}}" = 0 ]; then scontrol requeue "$SLURM_JOB_ID"; sleep 30; fi
"""


def test_a_requeued_batch_job_keeps_the_environment_of_its_submission(cli_env, tmp_path):
    """What csrun_wse --use-sbatch --requeue relies on: sbatch (--export=ALL, its default) stores
    the submitting environment with the job, and slurmctld gives it to every allocation, so a
    requeued run's tasks have the same secret; the script's text does not hold it."""
    secret = "cd" * 32
    script = REQUEUED.format(out=tmp_path)
    sub = subprocess.run(["sbatch", "--parsable"], input=script, env={**cli_env, JOB_SECRET.name: secret},
                         capture_output=True, text=True, timeout=60)
    assert sub.returncode == 0, sub.stderr
    job = sub.stdout.strip().split(";")[0]
    seen = tmp_path / "seen"
    helpers.wait_for(lambda: seen.exists() and len(seen.read_text().splitlines()) >= 2, 120, "the requeued allocation")
    stored = subprocess.run(["scontrol", "write", "batch_script", job, "-"], env=cli_env, capture_output=True,
                            text=True, timeout=30).stdout
    subprocess.run(["scancel", job], env=cli_env, timeout=30)
    want = hashlib.sha256(secret.encode()).hexdigest()[:16]
    assert seen.read_text().splitlines()[:2] == [f"0 {want}", f"1 {want}"]
    assert secret not in stored and "#SBATCH --requeue" in stored
