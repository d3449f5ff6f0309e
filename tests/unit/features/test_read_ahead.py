"""The read-ahead bound in batches (issue 33, item 4; docs/DATAPLANE.md "Read-ahead in batches"):
a real input-worker process streams an endless "DataLoader" with the input worker's own
``send_batches`` (csrun_runtime/pytorch/worker.py) to a :class:`Receiver` with ``window_batches``
(csrun_runtime/dataplane/receiver.py); the chief takes single batches
(as the PyTorch chief's ``RemoteSource`` does: a bundle, then its batches) at a training pace,
and at every step the batches the worker took from its input minus the steps trained stay
within the bound. Without the bound (bytes only) the same worker reads hundreds ahead."""
from __future__ import annotations

import multiprocessing as mp
import time

import numpy as np
import pytest

from csrun_runtime.dataplane import Receiver

STEPS = 40


def _worker(endpoint: str, taken) -> None:  # a spawned process: the input worker
    from csrun_runtime.dataplane import ReceiverGone, Sender
    from csrun_runtime.pytorch.worker import send_batches

    def loader():
        k = 0
        while True:
            yield {"x": np.full((8, 4), k, np.float32), "y": np.arange(8) + k}
            k += 1

    def count(_batch) -> None:
        with taken.get_lock():
            taken.value += 1

    sender = Sender(endpoint, 0)
    try:
        send_batches(sender, loader(), sent=count)
    except ReceiverGone:
        pass
    finally:
        sender.close(timeout=1.0)


def _run(window_batches: int | None) -> tuple[list[int], list[int]]:
    """Train STEPS steps of 10 ms; returns, per step, (worker's batches taken - steps taken) and
    the steps' batch ids (to check the order)."""
    ctx = mp.get_context("spawn")
    taken = ctx.Value("l", 0)
    r = Receiver("tcp://127.0.0.1:0", window_batches=window_batches)
    p = ctx.Process(target=_worker, args=(r.endpoint, taken), daemon=True)
    p.start()
    ahead, ids = [], []
    try:
        for step in range(1, STEPS + 1):
            _, batch = r.get(timeout=60)
            ids.append(int(batch["x"][0, 0]))
            time.sleep(0.01)  # the training step
            ahead.append(taken.value - step)
        time.sleep(0.3)  # what the worker does while the chief stops taking
        ahead.append(taken.value - STEPS)
    finally:
        r.close()
        p.join(10)
        if p.is_alive():
            p.kill()
    return ahead, ids


@pytest.mark.parametrize("bound", [3])
def test_a_worker_reads_at_most_the_bound_ahead_of_the_steps_trained(bound):
    ahead, ids = _run(bound)
    assert ids == list(range(STEPS))  # every batch, in order, none lost to the bound
    assert max(ahead) <= bound, ahead
    assert ahead[-1] >= 1  # and it does read ahead (the next bundle is ready while the chief trains)


def test_without_the_bound_the_byte_window_lets_it_read_far_ahead():
    ahead, _ = _run(None)
    assert ahead[-1] > 100, ahead  # ~200-byte batches: the 4 MiB window holds thousands
