"""``csrun_wse --autoscale`` on the PyTorch chief (docs/AUTOSCALE.md, docs/PYTORCH.md): the
data-plane source's autoscale interface (:class:`csrun_runtime.pytorch.remote.RemoteSource`)
with real senders, together with the elastic watch (a replaced worker), and a chief with 3
input workers as local processes with the environment csrun_wse gives the tasks (no Slurm),
the framework-neutral autoscaler growing a start of 1 input-bound worker and shrinking a start
of 3 that outrun training."""
from __future__ import annotations

import json
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import yaml

pytest.importorskip("torch")

from csrun_runtime.dataplane import Sender  # noqa: E402
from csrun_runtime.params import ParamsError  # noqa: E402
from csrun_runtime.pytorch.remote import RemoteSource, autoscale_spec  # noqa: E402
from csrun_runtime.rendezvous import Rendezvous  # noqa: E402
from tests.fixtures.runtime.helpers import LocalJob, worker_reports  # noqa: E402
from tests.unit.paths import REPO

PACED = REPO / "tests" / "fixtures" / "pytorch_paced" / "run.py"
RC = {"input_timeout_secs": 10, "worker_start_timeout_secs": 10}


_POOL = ThreadPoolExecutor(4)


def _send(sender: Sender, value: float, n: int = 4, timeout: float = 5) -> Future:
    """Send one bundle of ``n`` batches from a thread (a sender sends no data before the
    receiver's welcome, which the test's thread gives by reading); ``.result()`` re-raises."""
    return _POOL.submit(sender.send_bundle, (np.full((n, 2, 3), value, np.float32),
                                             np.full((n, 2), value, np.int64)), n, timeout=timeout)


def _refused(src: RemoteSource, fut: Future) -> str:
    """Read the receiver (so that a new sender gets its welcome) until ``fut``'s send gave up;
    returns its TimeoutError's message."""
    while not fut.done():
        try:
            src.r.get(timeout=0.1)
        except TimeoutError:
            pass
    with pytest.raises(TimeoutError) as e:
        fut.result()
    return str(e.value)


def _take(src: RemoteSource, k: int) -> list[int]:
    return [src.next()[1] for _ in range(k)]


def _source(tmp_path: Path, key: str, slots: int, streams: int | None = None) -> tuple[RemoteSource, str]:
    role = SimpleNamespace(num_input_workers=slots, host="127.0.0.1", rank=0, world_size=1)
    src = RemoteSource(Rendezvous(tmp_path, key), role, RC, adopt=False, streams=streams)
    return src, src.r.endpoint.replace("0.0.0.0", "127.0.0.1")


def test_the_setting_is_read_from_the_task_environment():
    assert autoscale_spec({}, 3) is None
    spec = autoscale_spec({"CSRUN_AUTOSCALE": "1:1:3:step:5"}, 3)
    assert spec is not None and (spec.initial, spec.max_workers, spec.policy, spec.window_s) == (1, 3, "step", 5.0)
    with pytest.raises(ParamsError, match="CSRUN_AUTOSCALE='1:1:4:rate:10'"):
        autoscale_spec({"CSRUN_AUTOSCALE": "1:1:4:rate:10"}, 3)  # more than the job's slots


def test_the_remote_source_opens_holds_pauses_and_resumes_streams(tmp_path):
    """Streams 1 of 3: the other slots' first bundles are held and those workers paused at the
    receiver; add_stream hands the held batches out first and lets the worker send again;
    pause stops a sender (its next send times out saying so) and resume lets it go on."""
    src, endpoint = _source(tmp_path, "k1", 3, streams=1)
    senders = [Sender(endpoint, i) for i in range(3)]
    try:
        assert src.n == 1 and src.streaming() == {0} and src.addresses == [src.endpoint] * 3
        firsts = [_send(s, float(i)) for i, s in enumerate(senders)]
        assert _take(src, 4) == [0, 0, 0, 0]
        for _ in range(20):  # until the receiver has read the others' first bundles (held)
            sent = _send(senders[0], 0.0)
            assert _take(src, 4) == [0, 0, 0, 0]
            sent.result(timeout=5)
            if all(src.r.counts().get(i, {}).get("paused") for i in (1, 2)):  # held, paused at the receiver
                break
        assert all(src.r.counts().get(i, {}).get("paused") for i in (1, 2)), src.r.counts()
        for f in firsts:
            f.result(timeout=5)
        # the pause reached worker 1 (asynchronously: wait for its message): it sends no more
        assert _POOL.submit(senders[1].paused, 5.0).result(timeout=10)
        assert "paused by the receiver" in _refused(src, _send(senders[1], 1.0, timeout=0.5))
        src.add_stream(1, src.endpoint, {"node": "node3"})
        assert src.n == 2 and src.streaming() == {0, 1} and src.registry[1] == {"node": "node3"}
        batch, worker = src.next()
        assert worker == 1 and float(batch[0][0, 0]) == 1.0  # the held bundle first
        sent = _send(senders[1], 1.0)  # resumed: it sends again
        assert _take(src, 7) == [1] * 7
        sent.result(timeout=5)
        src.pause(1)
        assert src.streaming() == {0} and src.paused == {1}
        assert _POOL.submit(senders[1].paused, 5.0).result(timeout=10)
        assert "paused by the receiver" in _refused(src, _send(senders[1], 1.0, timeout=0.5))
        src.resume(1)
        sent = _send(senders[1], 1.0)
        assert _take(src, 4) == [1] * 4
        sent.result(timeout=5)
        assert src.counts[1] == 12 and 2 not in src.counts and src.buffered_batches() > 0
        desc = src.describe()
        assert desc["batches_per_worker"]["1"] == 12 and desc["workers_paused"] == []
    finally:
        for s in senders:
            s.close(timeout=0.5)
        src.close()


def test_a_worker_paused_before_it_connected_is_paused_on_its_first_bundle(tmp_path):
    """The autoscaler may remove a slot whose worker has not connected yet (a slow start): the
    receiver keeps the pause, its welcome says so, and the worker sends nothing until resumed."""
    src, endpoint = _source(tmp_path, "k2", 2)
    src.pause(1)
    assert src.streaming() == {0}
    sender = Sender(endpoint, 1)
    try:
        assert "paused by the receiver" in _refused(src, _send(sender, 1.0, timeout=1.0))
        assert src.r.counts()[1]["paused"] and src.r.counts()[1]["batches"] == 0
        assert src.describe()["workers_paused"] == [1]
        src.resume(1)
        sent = _send(sender, 1.0)
        assert _take(src, 4) == [1] * 4
        sent.result(timeout=5)
    finally:
        sender.close(timeout=0.5)
        src.close()


def _replace(src: RemoteSource, rdv: Rendezvous, i: int) -> dict:
    """Worker ``i`` dies (its supervisor's record) and its replacement (attempt 1) registers;
    the source's watch notices both. Returns the watch's replacement record."""
    rdv.register_worker(i, {"status": "ok", "attempt": 0, "node": f"node{i + 2}", "pid": 100 + i})
    src._last_poll = 0.0
    src.poll()
    rdv.mark_lost(i, {"pid": 100 + i, "signal": "SIGKILL", "time": time.time(), "node": f"node{i + 2}"})
    rdv.register_worker(i, {"status": "ok", "attempt": 1, "node": f"node{i + 2}", "pid": 200 + i})
    src._last_poll = 0.0
    src.poll()
    (rec,) = [r for r in src.watch.describe()["workers_replaced"] if r["index"] == i]
    return rec


def test_a_replaced_worker_is_read_again_and_a_paused_one_stays_paused(tmp_path):
    """With the elastic watch (csrun_runtime.elastic.WorkerWatch): the replacement of an opened
    slot's worker is read again; a worker the autoscaler paused stays paused when its
    replacement connects (the receiver keeps the pause) until it is resumed; the replacement
    of a slot never opened is left unread ("not streaming")."""
    src, endpoint = _source(tmp_path, "k3", 3, streams=2)
    rdv = src.rdv
    old = [Sender(endpoint, i) for i in range(2)]
    new: list[Sender] = []
    try:
        firsts = [_send(s, float(i)) for i, s in enumerate(old)]
        assert sorted(_take(src, 8)) == [0] * 4 + [1] * 4
        for f in firsts:
            f.result(timeout=5)
        src.pause(1)
        assert _replace(src, rdv, 0)["stream"] == "reconnected"
        assert _replace(src, rdv, 1)["stream"] == "reconnected"
        assert _replace(src, rdv, 2)["stream"] == "not streaming" and src.streaming() == {0}
        new.append(Sender(endpoint, 0, 1))
        sent = _send(new[0], 10.0)
        batch, worker = src.next()
        assert worker == 0 and float(batch[0][0, 0]) == 10.0  # the replacement's batch
        assert _take(src, 3) == [0] * 3
        sent.result(timeout=5)
        new.append(Sender(endpoint, 1, 1))
        # the paused worker's replacement starts paused: its welcome says so, it sends nothing
        assert "paused by the receiver" in _refused(src, _send(new[1], 11.0, timeout=1.0))
        assert src.r.counts()[1]["paused"]
        src.resume(1)
        assert src.streaming() == {0, 1}
        sent = _send(new[1], 11.0)
        assert _take(src, 4) == [1] * 4 and src.r.counts()[1]["attempt"] == 1
        sent.result(timeout=5)
    finally:
        for s in old + new:
            s.close(timeout=0.5)
        src.close()


def _params(tmp_path: Path, pace_ms: float, step_pace_ms: float) -> Path:
    p = yaml.safe_load((REPO / "examples/digits_pt/configs/params.yaml").read_text())
    p["train_input"].update(pace_ms=pace_ms, data_dir=str(tmp_path / "no data: computed in memory"))
    p["model"]["step_pace_ms"] = step_pace_ms
    p["runconfig"].update(checkpoint_steps=0, eval_frequency=None, log_steps=100)
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(p))
    return path


def _run(tmp_path: Path, setting: str, pace_ms: float, step_pace_ms: float, steps: int) -> tuple[str, dict]:
    md = tmp_path / "md"
    argv = ["--params", str(_params(tmp_path, pace_ms, step_pace_ms)), "--mode", "train", "--max_steps", str(steps),
            "--model_dir", str(md)]
    env = {"PYTHONPATH": str(REPO), "CSRUN_EXECUTION_MODE": "pytorch", "CSRUN_AUTOSCALE": setting}
    job = LocalJob(argv, 3, tmp_path / "logs", env, script=PACED)
    try:
        codes = job.wait(timeout=240)
    finally:
        job.cleanup()
    log = job.log(0)
    assert codes == [0, 0, 0, 0], log[-4000:] + job.log(1)[-2000:]
    reports = worker_reports(md)
    assert sorted(reports) == [0, 1, 2] and all(r["chief_status"] == "ok" for r in reports.values())
    perf = json.loads((md / "performance" / "performance.json").read_text())
    assert perf["global_step_end"] == steps and "not wired for PyTorch" not in log
    return log, perf


def test_autoscale_grows_an_input_bound_pytorch_start(tmp_path):
    """1 of 3 slots streaming, each input worker paced at 50 ms a batch, training far faster:
    once what worker 0 sent while the chief started is trained on, a 2 s window waits on input
    and the autoscaler adds workers (the rate policy's AutoScaler estimate), which then stream;
    performance.json records it as the TensorFlow chief's."""
    log, perf = _run(tmp_path, "1:1:3:rate:2", pace_ms=50, step_pace_ms=0, steps=600)
    auto = perf["autoscale"]
    assert (auto["initial_workers"], auto["min_workers"], auto["max_workers"], auto["policy"]) == (1, 1, 3, "rate")
    assert auto["windows"][0]["workers"] == 1, auto["windows"]
    adds = [e for e in auto["events"] if e["action"] == "add"]
    assert adds and adds[0]["worker"] == 1 and adds[0]["input_wait_fraction"] > 0.1, auto["events"]
    assert "AutoScaler estimate" in adds[0]["reason"] and adds[0]["tf_autoscaler_estimate"] >= 2
    assert adds[0]["workers"] >= 2 and auto["worker_seconds"] > 0, auto["events"]
    assert perf["batches_per_worker"]["0"] > 0 and perf["batches_per_worker"]["1"] > 0, perf["batches_per_worker"]
    assert sum(perf["batches_per_worker"].values()) == 600
    last = {e["worker"]: e["action"] for e in auto["events"]}  # a loaded host may remove one again
    assert perf["workers_paused"] == sorted(i for i, a in last.items() if a == "remove"), auto["events"]
    assert auto["final_workers"] == 1 + sum(1 if a == "add" else 0 for a in last.values()), auto["events"]
    assert "autoscale (rate policy, 2 s windows): reading input workers 0..0 of 3 slot(s), between 1 and 3" in log
    assert "autoscale: add input worker 1 on node3 (now " in log


def test_autoscale_shrinks_a_pytorch_start_that_outruns_training(tmp_path):
    """3 of 3 slots streaming unpaced, each step sleeping 20 ms: training never waits, so the
    autoscaler removes the last-added worker (slot 2): paused at the receiver, it stops."""
    log, perf = _run(tmp_path, "3:1:3:step:2", pace_ms=0, step_pace_ms=20, steps=350)
    auto = perf["autoscale"]
    removes = [e for e in auto["events"] if e["action"] == "remove"]
    assert removes and removes[0]["worker"] == 2 and removes[0]["input_wait_fraction"] < 0.02, auto["events"]
    assert auto["final_workers"] < 3 and 2 in perf["workers_paused"]
    assert len(perf["workers_paused"]) == 3 - auto["final_workers"]
    assert perf["batches_per_worker"]["0"] > 0 and perf["batches_per_worker"]["1"] > 0
    assert "autoscale: remove input worker 2 on node4 (now 2 streaming)" in log
