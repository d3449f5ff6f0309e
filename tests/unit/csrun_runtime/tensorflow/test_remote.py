"""The chief's DataplaneSource (runconfig.transport: dataplane) with real sender processes.

Each sender is a separate Python process running csrun_runtime.dataplane.Sender (no
TensorFlow): batches of ``(x float32[8, 3], y int32[8])`` stacked 4 per bundle, ``x`` filled
with the batch's sequence number so that order and origin can be checked at the chief.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from csrun_runtime.rendezvous import Rendezvous
from csrun_runtime.streams import InputStalled
from csrun_runtime.tensorflow.remote import STREAM_ERROR, DataplaneSource
from tests.unit.paths import REPO

BUNDLE = 4

SENDER = r"""
import sys, time, numpy as np
from csrun_runtime.dataplane import Sender
endpoint = sys.argv[1]
index, attempt, bundles = map(int, sys.argv[2:5])
pace = float(sys.argv[5])
with Sender(endpoint, index, attempt) as s:
    seq = 0
    for b in range(bundles if bundles >= 0 else 1 << 40):
        x = np.stack([np.full((8, 3), seq + j, np.float32) for j in range(4)])
        y = np.full((4, 8), index * 1000 + attempt, np.int32)
        s.send_bundle((x, y), 4, timeout=60)
        seq += 4
        time.sleep(pace)
"""


@pytest.fixture
def plane(tmp_path):
    from csrun_runtime.dataplane import Receiver

    rdv = Rendezvous(tmp_path, "1.0")
    rdv.reset()
    receiver = Receiver("tcp://127.0.0.1:0", window_bytes=16 << 10)
    procs: list[subprocess.Popen] = []

    def sender(index: int, attempt: int = 0, bundles: int = 5, pace: float = 0.0) -> subprocess.Popen:
        env = dict(os.environ, PYTHONPATH=str(REPO))
        p = subprocess.Popen([sys.executable, "-c", SENDER, receiver.endpoint, str(index), str(attempt),
                              str(bundles), str(pace)], env=env, cwd=str(REPO))
        procs.append(p)
        return p

    def register(index: int, attempt: int = 0, pid: int = 0) -> dict:
        reg = {"index": index, "node": f"node{index + 1}", "pid": pid, "attempt": attempt, "status": "ok"}
        rdv.register_worker(index, reg)
        return reg

    yield rdv, receiver, sender, register
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()
    receiver.close()


def _batches(source: DataplaneSource, max_steps: int, timeout: float = 10.0) -> list[tuple[int, float, int]]:
    """Drain the source in chunks until it says every worker stopped: (worker, seq, y) per batch."""
    out = []
    while True:
        try:
            c = source.get_chunk(max_steps, timeout)
        except InputStalled as e:
            assert "every input worker stopped" in str(e), e
            return out
        x, y = c.batches
        assert x.shape == (BUNDLE, 8, 3) and y.shape == (BUNDLE, 8) and x.dtype == np.float32
        assert 1 <= c.steps <= max_steps and c.offset + c.steps <= BUNDLE
        out += [(c.worker, float(x[j, 0, 0]), int(y[j, 0])) for j in range(c.offset, c.offset + c.steps)]


def test_two_workers_merge_in_order_with_counts_and_end(plane):
    rdv, receiver, sender, register = plane
    registry = {i: register(i, pid=sender(i).pid) for i in range(2)}
    source = DataplaneSource(rdv, receiver, registry)
    got = _batches(source, max_steps=3)
    assert len(got) == 2 * 5 * BUNDLE
    for i in range(2):  # each worker's batches in its order, all of them
        assert [s for w, s, _ in got if w == i] == list(range(5 * BUNDLE))
        assert {y for w, _, y in got if w == i} == {i * 1000}
    d = source.describe()
    assert d["batches_per_worker"] == {"0": 20, "1": 20} and d["batches_per_element"] == {"0": 4, "1": 4}
    assert d["transport"] == "dataplane" and d["workers_stopped"] == [0, 1]
    assert d["dataplane"]["0"]["bundles"] == 5 and d["dataplane_errors"] == []
    single = DataplaneSource(rdv, receiver, registry)
    with pytest.raises(InputStalled, match="every input worker stopped"):
        single.get(5.0)


def test_stall_and_pipeline_error_name_the_worker(plane):
    rdv, receiver, sender, register = plane
    registry = {0: register(0, pid=sender(0, bundles=1).pid)}
    source = DataplaneSource(rdv, receiver, {0: {**registry[0]}, 1: register(1, pid=4242)})
    worker, (x, _) = source.get(10.0)
    assert worker == 0 and x.shape == (8, 3)
    for _ in range(BUNDLE - 1):
        source.get(10.0)
    t = time.monotonic()
    with pytest.raises(InputStalled, match=r"no batch from any input worker for \d+ s .*input worker 1 on node2 "
                                           r"\(pid 4242\).*no batch yet"):
        source.get(1.5, "runconfig.input_timeout_secs")
    assert time.monotonic() - t < 6
    (rdv.workers_dir / STREAM_ERROR.format(index=1)).write_text(json.dumps({"error": "InvalidArgumentError: bad"}))
    with pytest.raises(InputStalled, match=r"input worker 1 on node2 \(pid 4242\): its input pipeline failed: "
                                           r"InvalidArgumentError: bad"):
        source.get(30.0)


def test_killed_worker_is_replaced_and_read_again(plane):
    rdv, receiver, sender, register = plane
    p1 = sender(1, pace=0.01, bundles=-1)
    registry = {0: register(0, pid=sender(0, pace=0.01, bundles=-1).pid), 1: register(1, pid=p1.pid)}
    source = DataplaneSource(rdv, receiver, registry)
    while source.counts[1] < 8:
        source.get_chunk(64, 10.0)
    os.kill(p1.pid, signal.SIGKILL)
    p1.wait()
    rdv.mark_lost(1, {"pid": p1.pid, "signal": "SIGKILL", "time": time.time(), "node": "node2"})
    before = source.counts[1]
    t_end = time.monotonic() + 5
    while time.monotonic() < t_end:
        source.get_chunk(64, 10.0)
    assert source.describe()["workers_lost"][0]["index"] == 1
    p2 = sender(1, attempt=1, pace=0.01, bundles=-1)
    register(1, attempt=1, pid=p2.pid)
    t_end = time.monotonic() + 20
    ys = set()
    while time.monotonic() < t_end and (source.counts[1] < before + 16
                                        or not source.describe()["workers_replaced"]):
        c = source.get_chunk(64, 10.0)
        if c.worker == 1:
            ys.add(int(c.batches[1][0, 0]))
    assert source.counts[1] >= before + 16, source.status_text()
    assert 1001 in ys  # the replacement's batches (attempt 1) reached the chief
    (rep,) = source.describe()["workers_replaced"]
    assert rep["index"] == 1 and rep["attempt"] == 1 and rep["stream"] == "reconnected"
    assert 1 in source.streaming()


def test_pause_stops_a_worker_within_its_window_and_resume_reads_it_again(plane):
    rdv, receiver, sender, register = plane
    registry = {0: register(0, pid=sender(0, bundles=-1).pid), 1: register(1, pid=sender(1, bundles=-1).pid)}
    source = DataplaneSource(rdv, receiver, registry)
    while min(source.counts.values()) < 8:
        source.get_chunk(64, 10.0)
    source.pause(1)
    assert source.streaming() == {0}
    t_end = time.monotonic() + 1.0
    while time.monotonic() < t_end:  # what worker 1 had in flight drains
        source.get_chunk(64, 10.0)
    held = source.counts[1]
    t_end = time.monotonic() + 1.5
    while time.monotonic() < t_end:
        source.get_chunk(64, 10.0)
    assert source.counts[1] == held, "a paused worker kept streaming"
    bundle_bytes = BUNDLE * (8 * 3 * 4 + 8 * 4)
    assert source.buffered_batches() <= ((16 << 10) // (bundle_bytes // BUNDLE) + BUNDLE)
    source.resume(1)
    t_end = time.monotonic() + 10
    while source.counts[1] <= held and time.monotonic() < t_end:
        source.get_chunk(64, 10.0)
    assert source.counts[1] > held and source.streaming() == {0, 1}


def test_a_worker_paused_before_it_connected_sends_nothing_until_resumed(plane):
    """autoscale may remove a worker still building its dataset: paused before its sender
    connected, it starts paused (the receiver's welcome says so) and sends no bundle at all
    until it is resumed."""
    rdv, receiver, sender, register = plane
    registry = {0: register(0, pid=sender(0, bundles=-1).pid), 1: register(1, pid=4242)}
    source = DataplaneSource(rdv, receiver, registry)
    source.pause(1)
    assert source.streaming() == {0}
    registry[1] = register(1, pid=sender(1, bundles=-1).pid)  # connects only now
    t_end = time.monotonic() + 10
    while 1 not in receiver.counts() and time.monotonic() < t_end:
        source.get_chunk(64, 10.0)
    t_end = time.monotonic() + 1.5
    while time.monotonic() < t_end:
        assert source.get_chunk(64, 10.0).worker == 0
    assert receiver.counts()[1]["paused"] and receiver.counts()[1]["bundles"] == 0 and source.counts[1] == 0
    source.resume(1)
    t_end = time.monotonic() + 10
    while source.counts[1] == 0 and time.monotonic() < t_end:
        source.get_chunk(64, 10.0)
    assert source.counts[1] > 0 and source.streaming() == {0, 1}


def test_a_slot_not_opened_is_held_paused_until_add_stream(plane):
    """autoscale starts with fewer streams than slots: a slot's bundles wait (its worker paused
    at the receiver, so the chief holds at most one window of it) until add_stream opens it."""
    rdv, receiver, sender, register = plane
    registry = {0: register(0, pid=sender(0, bundles=-1).pid), 1: register(1, pid=sender(1, bundles=-1).pid)}
    source = DataplaneSource(rdv, receiver, registry, streams=1)
    t_end = time.monotonic() + 2.0
    while time.monotonic() < t_end:
        assert source.get_chunk(64, 10.0).worker == 0
    assert source.counts == {0: source.counts[0]} and source.streaming() == {0}
    held = receiver.counts()[1]["batches"]
    assert 0 < held <= (16 << 10) // (8 * 3 * 4 + 8 * 4) + 2 * BUNDLE and receiver.counts()[1]["paused"]
    source.add_stream(1, receiver.endpoint, registry[1])
    seqs = []
    t_end = time.monotonic() + 10
    while len(seqs) < held + 8 and time.monotonic() < t_end:
        c = source.get_chunk(64, 10.0)
        if c.worker == 1:
            seqs += [float(c.batches[0][j, 0, 0]) for j in range(c.offset, c.offset + c.steps)]
    assert seqs[:held + 8] == list(range(held + 8))  # the held ones first, in order, then it streams again
    assert source.streaming() == {0, 1}
