"""``csrun_wse --survive-node-loss`` for PyTorch (docs/RESILIENCE.md "A lost node"): the PyTorch
chief's :class:`csrun_runtime.pytorch.remote.RemoteSource` with the TensorFlow chief's
:class:`csrun_runtime.elastic.WorkerWatch` (losses, adoption orders, replacements), and a
whole local run: a chief and two input-worker tasks under ``python -m csrun_runtime.supervise``
with the environment of the two jobs csrun_wse starts, worker 1's task SIGKILLed with its
worker (as a node's power loss takes both), worker 0's task adopting worker 1. The cluster test
through csrun_wse is tests/integration/test_pytorch_node_loss_cluster.py."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

from csrun_common.roles import Role  # noqa: E402
from csrun_runtime.elastic import WorkerWatch  # noqa: E402
from csrun_runtime.pytorch.remote import RemoteSource, WorkerFailed  # noqa: E402
from csrun_runtime.rendezvous import Rendezvous  # noqa: E402
from tests.fixtures.runtime.helpers import task_env, worker_reports  # noqa: E402
from tests.unit.paths import REPO

PACED = REPO / "tests" / "fixtures" / "pytorch_paced" / "run.py"
#: killed at step 100: the other worker alone (33 steps/s at 30 ms a batch) trains the 900 steps
#: left in ~27 s, while task 0 starts the replacement (measured: streaming again ~12 s after the kill)
MAX_STEPS = 1000


class _Source:
    counts: dict[int, int] = {}

    def stopped(self):
        return set()

    def reopen(self, index, registration):
        return "reconnected"


def test_the_watch_learns_a_first_registration_that_comes_late(tmp_path):
    """WorkerWatch.known: the PyTorch chief watches before its workers register; a current
    attempt's registration names the worker in later records, a later attempt's does not."""
    rdv = Rendezvous(tmp_path, "k")
    rdv.reset()
    watch = WorkerWatch(rdv, {0: {}, 1: {}}, adopt=False)
    watch.known(1, {"attempt": 0, "node": "node3", "pid": 11})
    watch.known(1, {"attempt": 1, "node": "node2", "pid": 12})  # a replacement: poll's business
    watch.known(5, {"attempt": 0, "node": "node9", "pid": 13})  # not a worker of this job
    assert watch.nodes == {0: None, 1: "node3"} and watch.pids == {0: None, 1: 11}
    rdv.mark_lost(1, {"time": time.time(), "pid": 11, "node": "node3", "signal": "SIGKILL", "deaths": 1})
    watch.poll(_Source())
    (lost,) = watch.describe()["workers_lost"]
    assert lost["index"] == 1 and lost["node"] == "node3" and lost["pid"] == 11 and "SIGKILL" in lost["reason"]


def _source(tmp_path, adopt: bool) -> tuple[Rendezvous, RemoteSource]:
    rdv = Rendezvous(tmp_path, "wse-k")
    rdv.reset()
    role = Role(kind="chief", worker_index=None, num_input_workers=2, component="chief", host="127.0.0.1")
    return rdv, RemoteSource(rdv, role, {"input_timeout_secs": 5, "worker_start_timeout_secs": 5}, adopt=adopt)


def _poll(src: RemoteSource) -> None:
    src._last_poll = 0.0  # no POLL_SECS wait between the test's looks
    src.poll()


def test_a_silent_worker_is_lost_ordered_a_new_home_and_read_again(tmp_path, monkeypatch):
    """Stale heartbeat (its node is gone, no supervisor recorded a death): the source counts it
    as stopped, the watch records the loss with the node of its registration and orders the
    adoption (next attempt); the replacement's registration clears the stopped state and is
    recorded with its own node."""
    rdv, src = _source(tmp_path, adopt=True)
    try:
        assert rdv.endpoints()["num_workers"] == 2
        for i, node in ((0, "node2"), (1, "node3")):
            rdv.register_worker(i, {"index": i, "attempt": 0, "node": node, "pid": 100 + i, "status": "ok"})
            rdv.touch(f"workers/{i}")
        _poll(src)
        assert src.stopped() == set() and rdv.adoption_orders() == {}
        real_age = rdv.age
        monkeypatch.setattr(rdv, "age", lambda name: 9.0 if name == "workers/1" else real_age(name))
        _poll(src)
        assert src.stopped() == {1}
        (order,) = rdv.adoption_orders().values()
        assert order == {"index": 1, "attempt": 1, "lost_node": "node3", "time": order["time"]}
        (lost,) = src.describe()["workers_lost"]
        assert lost["index"] == 1 and lost["node"] == "node3" and lost["pid"] == 101
        assert src.watch.awaiting() == {1}
        monkeypatch.setattr(rdv, "age", real_age)
        rdv.register_worker(1, {"index": 1, "attempt": 1, "node": "node2", "pid": 102, "status": "ok"})
        rdv.touch("workers/1")
        _poll(src)
        desc = src.describe()
        (rep,) = desc["workers_replaced"]
        assert rep["index"] == 1 and rep["node"] == "node2" and rep["attempt"] == 1 and rep["pid"] == 102
        assert rep["stream"] == "reconnected" and desc["workers_given_up"] == []
        assert src.stopped() == set() and src.watch.awaiting() == set() and src.nodes[1] == "node2"
    finally:
        src.close()


def test_without_the_workers_job_no_adoption_is_ordered(tmp_path, monkeypatch):
    rdv, src = _source(tmp_path, adopt=False)
    try:
        rdv.register_worker(1, {"index": 1, "attempt": 0, "node": "node3", "pid": 7, "status": "ok"})
        monkeypatch.setattr(rdv, "age", lambda name: 30.0 if name == "workers/1" else None)
        _poll(src)
        assert src.stopped() == {1} and rdv.adoption_orders() == {}
        assert [r["index"] for r in src.describe()["workers_lost"]] == [1]
    finally:
        src.close()


def test_a_failed_registration_still_ends_the_run(tmp_path):
    rdv, src = _source(tmp_path, adopt=True)
    try:
        rdv.register_worker(0, {"index": 0, "status": "failed", "violations": ["train_input: bad"]})
        with pytest.raises(WorkerFailed, match="input worker 0 failed: train_input: bad"):
            _poll(src)
    finally:
        src.close()


def test_a_replaced_pytorch_worker_that_comes_back_leaves(tmp_path):
    """A worker the chief took for lost (stale heartbeat: a hung node) that lives on finds the
    later attempt's registration at its next look and leaves without a report (docs/RESILIENCE.md
    "A lost node"); its own registration does not make it leave."""
    from types import SimpleNamespace

    from csrun_runtime.pytorch.worker import InputWorker, _Leave

    rdv = Rendezvous(tmp_path, "k")
    rdv.reset()
    rdv.touch("chief")
    old = SimpleNamespace(rdv=rdv, index=1, attempt=0, t0=time.monotonic(), rc={"worker_start_timeout_secs": 60})
    InputWorker._check(old)
    rdv.register_worker(1, {"index": 1, "attempt": 0, "node": "node3", "status": "ok"})
    InputWorker._check(old)
    rdv.register_worker(1, {"index": 1, "attempt": 1, "node": "node2", "status": "ok"})
    with pytest.raises(_Leave) as left:
        InputWorker._check(old)
    assert (left.value.code, left.value.status) == (0, "superseded")
    InputWorker._check(SimpleNamespace(**{**vars(old), "attempt": 1}))  # the replacement stays


def _paced_params(tmp_path: Path, pace_ms: int) -> Path:
    import yaml

    params = yaml.safe_load((REPO / "examples/digits_pt/configs/params.yaml").read_text())
    params["train_input"].update(data_dir=None, pace_ms=pace_ms)
    params["eval_input"]["data_dir"] = None
    params["runconfig"].update(checkpoint_steps=0, eval_frequency=None, log_steps=50)
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    return path


def _wait(pred, timeout: float, what: str, procs) -> None:
    t0 = time.monotonic()
    while not pred():
        assert all(p.poll() is None for p in procs), f"a task ended while waiting for {what}"
        assert time.monotonic() - t0 < timeout, f"no {what} after {timeout:.0f} s"
        time.sleep(0.2)


def test_a_worker_lost_with_its_task_is_adopted_by_the_other_task(tmp_path):
    """The two jobs of ``--survive-node-loss`` as local processes: the chief (CSRUN_WORKER_JOB=1)
    and the workers' job's two tasks (SLURM_PROCID 0 and 1 of their own job, one rendezvous
    key), each under csrun_runtime.supervise. Worker 1's task is SIGKILLed during training (its
    worker dies with it: PR_SET_PDEATHSIG), so no supervisor records the death: the chief
    notices the stale heartbeat, orders the adoption, task 0 starts worker 1 (attempt 1, same
    seed), the run reaches max_steps with exit 0 and performance.json records it."""
    md = tmp_path / "md"
    key = f"wse-{os.getpid()}"
    common = {"PYTHONPATH": str(REPO), "CSRUN_EXECUTION_MODE": "pytorch", "CSRUN_WORKER_JOB": "1",
              "CSRUN_RENDEZVOUS_KEY": key}
    cmd = [sys.executable, "-m", "csrun_runtime.supervise", sys.executable, str(PACED), "--params",
           str(_paced_params(tmp_path, 30)), "--mode", "train", "--max_steps", str(MAX_STEPS), "--model_dir", str(md)]
    envs = [task_env("chief", 0, 0, 0, 2, "node1", 0, "501", common),
            task_env("worker", 0, 0, 0, 2, "node2", 0, "502", common),
            task_env("worker", 1, 0, 0, 2, "node3", 0, "502", common)]
    logs = [tmp_path / f"task{i}.log" for i in range(3)]
    procs = [subprocess.Popen(cmd, env=e, cwd=tmp_path, stdout=open(log, "w"), stderr=subprocess.STDOUT)
             for e, log in zip(envs, logs, strict=True)]
    rdv = Rendezvous(md, key)
    try:
        _wait(lambda: "global_step = 100," in logs[0].read_text(), 240, "step 100", procs)
        reg = rdv.worker(1)
        assert reg is not None and reg["node"] == "node3" and reg["attempt"] == 0
        procs[2].send_signal(signal.SIGKILL)  # the task (its supervisor) and, with it, its worker
        t_kill = time.time()
        codes = [p.wait(timeout=300) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    chief_log, task0_log = logs[0].read_text(), logs[1].read_text()
    assert codes == [0, 0, -signal.SIGKILL], chief_log[-3000:] + task0_log[-3000:]
    assert "input worker 1, lost with node node3, starts again on node2 (task 0, pid " in task0_log
    assert "not wired for PyTorch" not in chief_log
    perf = json.loads((md / "performance" / "performance.json").read_text())
    assert perf["global_step_end"] == MAX_STEPS
    (lost,) = perf["workers_lost"]
    assert lost["index"] == 1 and lost["node"] == "node3" and lost["pid"] == reg["pid"]
    assert lost["noticed"] - t_kill <= 10.0, f"noticed {lost['noticed'] - t_kill:.1f} s after the kill"
    (rep,) = perf["workers_replaced"]
    assert rep["index"] == 1 and rep["node"] == "node2" and rep["attempt"] == 1 and rep["pid"] != reg["pid"]
    assert "streaming_again" in rep and perf["workers_given_up"] == []
    report = worker_reports(md)[1]
    assert report["attempt"] == 1 and report["node"] == "node2" and report["batches"] > 0
    assert report["torch_seed"] == reg["torch_seed"] and report["streaming_rank"] == 1
    assert not list((md / ".csrun" / key / "workers").glob("1.lost.json"))  # no supervisor saw it die
    print(f"noticed {lost['noticed'] - t_kill:.1f} s after the kill; streaming again "
          f"{rep['streaming_again'] - t_kill:.1f} s after it")
