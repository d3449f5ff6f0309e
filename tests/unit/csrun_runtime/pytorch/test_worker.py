"""The PyTorch input worker's bundles (``send_batches``): a batch of at least
``BUNDLE_BYTES`` goes as a bundle of one over the batch's own memory (no copy: issue 31's image
senders spent a 38.5 MB copy per batch here, bench/results/gpu_feed_cpu_sender.json), smaller
batches are stacked into one bundle with their values in order. The sender records what it is
given (the transport itself is tested against a real receiver in tests/unit/features/test_read_ahead.py).
csrun_runtime.pytorch.worker against a rewritten rendezvous file (issue 45): a real PyTorch input
worker process (the environment csrun_wse gives it, a chief's heartbeat) whose ``endpoints.json``
points at a foreign listener sends it nothing but its hello, says so in one line and leaves."""
from __future__ import annotations

import subprocess
import threading

import numpy as np
import torch
import yaml
import zmq

from csrun_runtime.dataplane import BUNDLE_BYTES
from csrun_runtime.position import POSITIONS_FILE
from csrun_runtime.pytorch.worker import send_batches
from csrun_runtime.rendezvous import Heartbeat, Rendezvous
from tests.fixtures.runtime.helpers import PY, REPO, task_env


class RecordingSender:
    """What ``send_batches`` needs of a ``Sender``: ``send_bundle`` (recorded) and ``window_batches``."""

    window_batches = None

    def __init__(self) -> None:
        self.bundles: list[tuple[object, int]] = []

    def send_bundle(self, nest: object, n: int, timeout: float | None = None) -> None:
        self.bundles.append((nest, n))


def test_a_batch_as_large_as_a_bundle_is_sent_without_a_copy():
    big = [(torch.arange(BUNDLE_BYTES // 4, dtype=torch.float32) + i, torch.tensor([i])) for i in range(3)]
    s = RecordingSender()
    send_batches(s, iter(big))
    assert [n for _, n in s.bundles] == [1, 1, 1]
    for (nest, _), (x, y) in zip(s.bundles, big, strict=True):
        assert nest[0].shape == (1, *x.shape) and np.shares_memory(nest[0], x.numpy())
        assert np.shares_memory(nest[1], y.numpy())


def test_small_batches_are_stacked_in_order():
    small = [{"x": np.full((2, 3), i, np.float32), "y": np.array([i, i])} for i in range(5)]
    s = RecordingSender()
    send_batches(s, iter(small))
    assert sum(n for _, n in s.bundles) == 5
    nest, n = s.bundles[0]
    assert n == 5 and nest["x"].shape == (5, 2, 3)
    assert [int(v) for v in nest["x"][:, 0, 0]] == [0, 1, 2, 3, 4]
    assert not np.shares_memory(nest["x"], small[0]["x"])


RUN_PT = REPO / "tests" / "fixtures" / "impostor" / "run_pt.py"


def test_a_worker_pointed_at_a_foreign_listener_sends_it_nothing_and_says_so(tmp_path):
    ctx = zmq.Context()
    foreign = ctx.socket(zmq.ROUTER)  # an old-protocol or impostor receiver: it welcomes at once
    port = foreign.bind_to_random_port("tcp://127.0.0.1")
    got: list[bytes] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            if not foreign.poll(100):
                continue
            frames = foreign.recv_multipart()
            got.append(frames[1])
            if frames[1] == b"H":
                foreign.send_multipart([frames[0], b"W", b'{"window": 4194304, "paused": false}'])

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    md = tmp_path / "md"
    rdv = Rendezvous(md, "77.0")
    rdv.reset()
    beat = Heartbeat(rdv, "chief").start()
    rdv.publish_endpoints([f"tcp://127.0.0.1:{port}"], {"num_workers": 1})
    rdv.write(POSITIONS_FILE, {"streams": {"0": 0}, "states": {}})  # the real chief's, the rest of its rendezvous
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({"train_input": {"batch_size": 8}, "model": {"trained_log": "/dev/null"},
                                      "optimizer": {"optimizer_type": "sgd", "learning_rate": 0.1},
                                      "runconfig": {"max_steps": 10}}))
    env = task_env("worker", 1, 1, 0, 1, "node2", 1, "77", {"CSRUN_EXECUTION_MODE": "pytorch"})
    try:
        proc = subprocess.run([PY, str(RUN_PT), "--params", str(params), "--mode", "train", "--model_dir", str(md)],
                              env=env, cwd=str(REPO), capture_output=True, text=True, timeout=180)
    finally:
        beat.stop()
        stop.set()
        t.join(5)
        foreign.close(0)
        ctx.term()
    said = [ln for ln in proc.stderr.splitlines() if "does not know this job's secret" in ln]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(said) == 1 and f"at tcp://127.0.0.1:{port}: the receiver welcomed this sender without a proof" in said[0]
    assert got == [b"H"]  # its hello, and no data
    assert "sent 0 batch(es)" in proc.stderr
