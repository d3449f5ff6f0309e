"""csrun_runtime/dataplane/receiver.py over real zmq sockets on loopback, with real senders (in a
thread, or in a process of their own where a process matters), the data on zmq, through rings and on the bulk
channel: flow control bounding what the chief buffers (also while it waits for every sender),
pause and resume of one worker's stream, the end of stream and the receiver's close, a message
that is not a bundle handed out as sent, and the receiver's own arguments."""
from __future__ import annotations

import contextlib
import time

import numpy as np
import pytest
import zmq

from csrun_runtime.dataplane import EndOfStream, Receiver, ReceiverGone
from tests.unit.csrun_runtime.dataplane.test_framing import assert_same, wire
from tests.unit.dataplane_peers import Feeder, follow_bytes_sent, raw_hello, start_sender


def test_a_slow_consumer_bounds_the_buffered_bytes(transport):
    """A sender process streams 256 KiB batches; the chief stops reading for a second: what the
    sender got out stays within one window (plus one bundle) of what the chief took."""
    window = 1 << 20
    with Receiver("tcp://127.0.0.1:0", window_bytes=window, **transport) as r:
        p = start_sender(r.endpoint, 0, kib=256)
        try:
            last = follow_bytes_sent(p)
            received = sum(r.get_bundle(timeout=30).nbytes for _ in range(10))
            time.sleep(1.0)  # not reading: the sender must stop
            sent = last[0]
            assert sent >= received
            assert sent - received <= window + (256 << 10), (sent, received)
            assert sum(r.get_bundle(timeout=10).nbytes for _ in range(10)) == 10 * ((256 << 10) + 8)
        finally:
            p.kill()
            p.wait()


def test_waiting_for_the_other_senders_keeps_the_first_ones_credit_bounded(transport):
    """While the chief waits for every sender's hello (wait_workers), what an early sender gets
    out stays within its window: the bundles kept meanwhile are acknowledged only when handed
    out. (They were acknowledged on receipt: with 256 senders connecting over seconds, the
    chief kept everything the first ones sent, 21.5 GB, and was killed for memory.)"""
    window = 1 << 20
    with Receiver("tcp://127.0.0.1:0", window_bytes=window, **transport) as r:
        p = start_sender(r.endpoint, 0, kib=256)
        try:
            last = follow_bytes_sent(p)
            with pytest.raises(TimeoutError, match="1 of 2 input workers connected"):
                r.wait_workers(2, timeout=2.0)  # worker 1 never comes: worker 0 streams meanwhile
            assert 0 < last[0] <= window + (256 << 10), last[0]
            kept = sum(r.get_bundle(timeout=10).nbytes for _ in range(3))  # handed out: credit again
            assert kept == 3 * ((256 << 10) + 8)
            t_end = time.monotonic() + 10
            while last[0] <= window + (256 << 10) and time.monotonic() < t_end:
                r.get_bundle(timeout=10)
            assert last[0] > window + (256 << 10)
        finally:
            p.kill()
            p.wait()


def test_pause_and_resume_one_workers_stream(rx):
    feeders = [Feeder(rx.endpoint, i, (np.full(4096, i, np.float32),), bundle=1) for i in (0, 1)]
    for f in feeders:
        f.start()
    rx.wait_workers(2, 10)
    rx.pause(0)
    t_end = time.monotonic() + 0.3  # what worker 0 had in flight still comes
    while time.monotonic() < t_end:
        rx.get_bundle(timeout=5)
    before = rx.counts()[0]["bundles"]
    seen = {rx.get_bundle(timeout=5).worker for _ in range(200)}
    assert seen == {1} and rx.counts()[0]["bundles"] == before and rx.counts()[0]["paused"]
    rx.resume(0)
    seen = {rx.get_bundle(timeout=5).worker for _ in range(400)}
    assert seen == {0, 1}
    for f in feeders:
        f.stop.set()
    while any(f.is_alive() for f in feeders):
        try:
            rx.get_bundle(timeout=0.1)
        except TimeoutError:
            pass
    assert all(f.error is None for f in feeders)


def test_end_of_stream_and_close(transport):
    with Receiver("tcp://127.0.0.1:0", expected=2, **transport) as r:
        feeders = [Feeder(r.endpoint, i, {"x": np.arange(3)}, count=10, bundle=4) for i in (0, 1)]
        for f in feeders:
            f.start()
        got = []
        with pytest.raises(EndOfStream):
            while True:
                got.append(r.get(timeout=10)[0])
        assert sorted(got) == [0] * 10 + [1] * 10
        for f in feeders:
            f.join(10)
            assert f.confirmed is True and f.error is None
        assert all(c["done"] and c["batches"] == 10 for c in r.counts().values())
    # a sender blocked on credit learns of the close
    with Receiver("tcp://127.0.0.1:0", window_bytes=1, **transport) as r:
        f = Feeder(r.endpoint, 0, np.zeros(10), bundle=1, count=None)
        f.start()
        r.get_bundle(timeout=10)
        r.pause(0)
        with pytest.raises(TimeoutError, match=r"last bundle per worker: 0: [0-9.]+ s ago \(paused\)"):
            while True:  # what was in flight, then nothing
                r.get_bundle(timeout=0.3)
    f.join(10)
    assert isinstance(f.error, ReceiverGone), f.error


def test_a_message_that_is_not_a_bundle_is_handed_out_as_sent_by_get(rx):
    """``n == 0`` in the header: the leaves as given, no leading batch axis; ``get`` returns the
    nest itself, then reads on."""
    ctx = zmq.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(rx.endpoint)

    def drive():  # the receiver reads the handshake while get_bundle waits
        with contextlib.suppress(TimeoutError):
            rx.get_bundle(timeout=0.05)

    assert "window" in raw_hello(dealer, 4, 0, drive)
    nest = {"img": np.arange(6, dtype=np.int16).reshape(2, 3), "none": None}
    header, frames = wire(nest, 0)
    dealer.send_multipart([b"D", header, *frames])
    header, frames = wire((np.arange(4).reshape(2, 2),), 2)
    dealer.send_multipart([b"D", header, *frames])
    worker, got = rx.get(timeout=10)
    assert worker == 4
    assert_same(got, nest)
    assert [int(rx.get(timeout=10)[1][0][0]) for _ in range(2)] == [0, 2]  # a bundle of 2, batch by batch
    assert rx.counts()[4]["batches"] == 3  # a message that is not a bundle counts as one batch
    dealer.close(0)
    ctx.term()


def test_the_receivers_arguments(transport):
    with pytest.raises(ValueError, match="window_batches 0: None or an integer >= 1"):
        Receiver("tcp://127.0.0.1:0", window_batches=0)
    with Receiver("tcp://127.0.0.1:0", **transport) as r:
        assert r.endpoint.startswith("tcp://127.0.0.1:") and not r.endpoint.endswith(":0")
        bulk = transport.get("bulk", False)
        assert (r.bulk_port is not None) == bulk and r.lend(None) == bulk
        assert r.counts() == {} and r.errors() == [] and r.refused()["peers"] == 0
        with pytest.raises(TimeoutError, match=r"no batch from any input worker for 0.1 s \(last bundle per worker: "
                                               r"none connected\)"):
            r.get_bundle(timeout=0.1)
        r.strict = True
        assert r.strict
    r.close()  # a second close does nothing
