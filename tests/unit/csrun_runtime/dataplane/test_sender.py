"""csrun_runtime/dataplane/sender.py: batches stacked into bundles (``"auto"`` by bytes, or a
number; a batch of another layout starts a new bundle; the headers a steady stream sends encoded
once), the sender's own arguments refused, and, talking to a real :class:`Receiver` on loopback,
its credit: nothing goes before the welcome, ``room`` under a batch window, a pause seen, and a
close that no receiver confirms. Nests round-tripping through sender and receiver:
tests/unit/features/test_dataplane_round_trip.py."""
from __future__ import annotations

import contextlib
import socket
import threading
import time

import numpy as np
import pytest

from csrun_runtime.dataplane import Receiver, Sender
from csrun_runtime.dataplane.sender import Stack


def leaves(*shapes, dtype=np.float32):
    return [np.zeros(s, dtype) for s in shapes]


def test_a_stack_holds_auto_by_bytes_or_a_number_of_batches_and_encodes_each_header_once():
    auto = Stack("auto", bundle_bytes=1000)
    batch = leaves((10, 10))  # 400 bytes: 2 per bundle
    assert auto.add(0, batch, "k") is False and auto.n == 2
    assert auto.add(0, batch, "k") is True
    tiny = Stack("auto", bundle_bytes=100)
    assert tiny.add(0, leaves((100,)), "k") is True and tiny.n == 1  # larger than the bundle: one per bundle
    fixed = Stack(3, bundle_bytes=1)
    assert [fixed.add(0, batch, "k") for _ in range(3)] == [False, False, True]
    h = fixed.header(0, batch, 3, "k")
    assert fixed.header(0, batch, 3, "k") is h  # cached by (layout, n)
    for k in range(70):
        fixed.header(0, batch, k + 1, "k")
    assert len(fixed._headers) <= 65


def test_the_senders_arguments_are_refused_naming_them():
    for kw, match in (({"worker_index": -1}, "worker_index -1 and attempt 0 must be >= 0"),
                      ({"attempt": -2}, "worker_index 0 and attempt -2 must be >= 0"),
                      ({"bundle": 0}, "bundle 0: 'auto' or an integer >= 1"),
                      ({"bundle": "big"}, "bundle 'big': 'auto' or an integer >= 1")):
        with pytest.raises(ValueError, match=match):
            Sender("tcp://127.0.0.1:9", **{"worker_index": 0, **kw})


def unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_without_a_receiver_nothing_is_sent_and_close_says_it_was_not_confirmed():
    s = Sender(f"tcp://127.0.0.1:{unused_port()}", 0, bundle=1)
    with pytest.raises(TimeoutError, match=r"input worker 0 at tcp://127\.0\.0\.1:\d+: not welcomed "
                                           r"\(receiver unreachable\?\)"):
        s.send(np.zeros(3), timeout=0.3)
    assert (s.bundles_sent, s.window_batches, s.room()) == (0, None, False)
    t = time.monotonic()
    assert s.close(timeout=0.5) is False and time.monotonic() - t < 5


def pump(rx: Receiver, until, seconds: float = 10.0) -> None:
    """Let the receiver read (the handshake, acknowledgements) until ``until()`` holds."""
    t_end = time.monotonic() + seconds
    while not until():
        assert time.monotonic() < t_end, "timed out"
        with contextlib.suppress(TimeoutError):
            rx.get_bundle(timeout=0.02)


def test_room_under_a_batch_window_a_pause_and_a_new_bundle_for_a_new_layout():
    with Receiver("tcp://127.0.0.1:0", window_batches=2) as rx, Sender(rx.endpoint, 1, bundle=2) as s:
        pump(rx, lambda: s.room(timeout=0.02))
        assert s.window_batches == 2 and s.room(1) and not s.room(2)
        s.send(np.arange(3))
        s.send(np.arange(3, 6))  # a full bundle of 2: sent
        s.send(np.arange(4))  # another shape: pending, a bundle of its own
        assert (s.bundles_sent, s.batches_sent) == (1, 2) and not s.room(0)
        b = rx.get_bundle(timeout=10)  # handed out, acknowledged when the next one is asked for
        assert (b.n, b.nest.shape) == (2, (2, 3)) and not s.room(0, timeout=0.2)
        with pytest.raises(TimeoutError, match="unacknowledged"):  # no credit: 2 batches in flight
            s.flush(timeout=0.2)
        flushing = threading.Thread(target=s.flush, kwargs={"timeout": 10})  # the pending batch kept: retried
        flushing.start()
        b = rx.get_bundle(timeout=10)  # the first one consumed now: credit again
        flushing.join(10)
        assert not flushing.is_alive()
        assert (b.n, b.nest.shape) == (1, (1, 4)) and s.room(0, timeout=5)
        rx.pause(1)
        pump(rx, lambda: s.paused(timeout=0.02))
        with pytest.raises(TimeoutError, match="paused by the receiver"):
            s.send_bundle(np.zeros((2, 3)), 2, timeout=0.3)
        with pytest.raises(ValueError, match=r"send_bundle: leaf 0 has shape \(3,\), not a leading axis of 2"):
            s.send_bundle(np.zeros(3), 2)
