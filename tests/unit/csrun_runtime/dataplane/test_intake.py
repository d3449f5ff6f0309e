"""csrun_runtime/dataplane/intake.py: what arrives turned into bundles. Through a real
:class:`Receiver` (the data on zmq, the bulk channel or rings): the bundles' arrays are views on the
received frames, and bad messages are refused naming the worker while the others are served.
On a bare ROUTER with DEALER peers playing the senders (no authentication: ``Gate(None, ...)``
lets a hello in at once): a hello recorded and welcomed, a data message counted and acknowledged
when asked, the end of stream, a stranger's message and an older attempt's dropped, and a
bundle's batches and its nest rebuilt around a consumer's copies."""
from __future__ import annotations

import json
import time

import numpy as np
import pytest
import zmq

from csrun_runtime.dataplane import FrameError, framing, protocol
from csrun_runtime.dataplane.auth import Gate, Refusals
from csrun_runtime.dataplane.intake import Intake
from csrun_runtime.dataplane.workers import Workers
from tests.unit.csrun_runtime.dataplane.test_framing import assert_same, wire
from tests.unit.dataplane_peers import Feeder, raw_hello, told


def test_bundles_are_views_on_the_received_frames(rx):
    f = Feeder(rx.endpoint, 0, (np.ones((64, 1024), np.float32),), count=8)  # 256 KiB batches: 4 per bundle
    f.start()
    b = rx.get_bundle(timeout=10)
    (x,) = b.nest
    assert b.n == 4 and x.shape == (4, 64, 1024) and b.nbytes == x.nbytes
    assert x.base is not None and not x.flags.owndata and x.flags.aligned and x.flags.writeable
    assert rx.get_bundle(timeout=10).n == 4
    with pytest.raises(TimeoutError):  # reads the end of stream
        rx.get_bundle(timeout=0.3)
    f.join(10)
    assert f.confirmed is True


def test_bad_messages_are_refused_naming_the_worker_while_others_are_served(rx):
    good = Feeder(rx.endpoint, 0, (np.zeros(1000, np.float32),), bundle=1)
    good.start()
    ctx = zmq.Context()
    bad = ctx.socket(zmq.DEALER)
    bad.setsockopt(zmq.ROUTING_ID, b"5.2")
    bad.connect(rx.endpoint)
    header, frames = wire((np.zeros(8, np.int32), np.zeros(4, np.float64)), 0)
    seen = set()
    assert "window" in raw_hello(bad, 5, 2, lambda: seen.add(rx.get_bundle(timeout=5).worker))
    for msg in ([b"D", header, frames[0]],  # truncated: a frame missing
                [b"D", header, frames[0], frames[1][:5]],  # truncated frame
                [b"D", b"{not json", *frames],  # corrupt header
                [b"D"],  # no header
                [b"Z", b"?"]):  # not of this protocol
        bad.send_multipart(msg)
    t_end = time.monotonic() + 10
    while len(rx.errors()) < 5 and time.monotonic() < t_end:
        seen.add(rx.get_bundle(timeout=5).worker)
    errors = rx.errors()
    assert len(errors) == 5 and all(e.startswith("input worker 5 (attempt 2): ") for e in errors), errors
    assert "declares 2" in errors[0] and "truncated" in errors[1] and "not JSON" in errors[2]
    assert seen == {0} and rx.counts()[5]["errors"] == 5 and rx.counts()[5]["bundles"] == 0
    rx.strict = True  # strict: the bad message raises, naming the worker; the next call reads on
    bad.send_multipart([b"D", header, frames[0]])
    with pytest.raises(FrameError, match=r"input worker 5 \(attempt 2\)") as ei:
        for _ in range(1000):
            rx.get_bundle(timeout=5)
    assert ei.value.worker == 5
    assert rx.get_bundle(timeout=5).worker == 0
    ghost = ctx.socket(zmq.DEALER)  # data before any hello: dropped unread, its peer refused (not a bad message)
    ghost.connect(rx.endpoint)
    ghost.send_multipart([b"D", header, *frames])
    t_end = time.monotonic() + 10
    while rx.refused()["messages"] < 1 and time.monotonic() < t_end:
        assert rx.get_bundle(timeout=5).worker == 0
    assert rx.refused()["peers"] == 1 and rx.refused()["reasons"] == {"a message before its handshake": 1}
    assert len(rx.errors()) == 6 and 5 in rx.counts() and len(rx.counts()) == 2
    good.stop.set()
    while good.is_alive():  # read on until its end of stream
        try:
            rx.get_bundle(timeout=0.1)
        except TimeoutError:
            pass
    assert good.confirmed is True
    bad.close(0)
    ghost.close(0)
    ctx.term()


# --------------------------------------------------------------------------- Intake on a bare ROUTER
def intake_on(router, max_bytes=None):
    """An Intake reading ``router``'s messages, as a receiver without authentication and
    without the bulk channel has it: ``(intake, workers, refusals)``."""
    workers = Workers(router.sock, {"window": 1000, "window_batches": None})
    refusals = Refusals()
    return Intake(workers, None, Gate(None, refusals, workers.tell), max_bytes), workers, refusals


def said_hello(router, intake, identity, index, attempt=0):
    """A DEALER peer ``identity`` that said hello as worker ``index`` at ``attempt`` and was welcomed."""
    d = router.peer(identity)
    d.send_multipart([protocol.HELLO, protocol.encode(protocol.hello(index, attempt))])
    assert intake.message(router.recv()) is None
    reply = told(d)
    assert reply is not None and reply[0] == protocol.WELCOME, reply
    assert json.loads(reply[1]) == {"window": 1000, "window_batches": None, "paused": False}
    return d


def test_a_hello_is_recorded_and_data_becomes_a_counted_bundle_acknowledged_when_asked(router):
    intake, workers, _ = intake_on(router)
    d = said_hello(router, intake, b"2.0.x", 2)
    assert workers.of(b"2.0.x").index == 2 and workers.by_index[2].pid is not None
    nest = {"x": np.arange(6, dtype=np.float32).reshape(3, 2), "y": (np.arange(3), None)}
    header, frames = wire(nest, 3)
    d.send_multipart([protocol.DATA, header, *frames])
    b = intake.message(router.recv())
    assert (b.worker, b.attempt, b.n, b.nbytes) == (2, 0, 3, 6 * 4 + 3 * 8)
    assert_same(b.nest, nest)
    assert told(d) == [protocol.ACK]
    d.send_multipart([protocol.DATA, header, *frames])
    assert intake.message(router.recv(), ack=False) is not None and told(d, 0.2) is None  # the caller acks later
    c = workers.counts()[2]
    assert (c["bundles"], c["batches"], c["bytes"], c["done"]) == (2, 6, 2 * b.nbytes, False)
    d.send_multipart([protocol.END, protocol.encode({"bundles": 2, "batches": 6})])
    assert intake.message(router.recv()) is None and told(d) == [protocol.ENDED]
    assert workers.counts()[2]["done"] and workers.ended(3) is False and workers.ended(None) is False


def test_a_strangers_message_and_an_older_attempts_are_dropped_and_a_bad_one_recorded(router):
    intake, workers, refusals = intake_on(router, max_bytes=64)
    stranger = router.peer(b"9.0.s")
    stranger.send_multipart([protocol.DATA, *wire((np.zeros(2),), 1)[:1]])
    assert intake.message(router.recv()) is None
    assert told(stranger) == [protocol.UNKNOWN]  # say hello again
    assert refusals.describe()["reasons"] == {"a message before its handshake": 1}
    old = said_hello(router, intake, b"1.0.a", 1, 0)
    said_hello(router, intake, b"1.1.b", 1, 1)  # a replacement: the older attempt's messages are stale
    header, frames = wire((np.zeros((1, 2)),), 1)
    old.send_multipart([protocol.DATA, header, *frames])
    assert intake.message(router.recv()) is None and workers.counts()[1]["stale"] == 1
    new = router.peers[-1]
    for msg in ([protocol.DATA], [b"Z"], [protocol.DATA, *wire((np.zeros((1, 100)),), 1)[:1]]):
        new.send_multipart(msg)
        assert intake.message(router.recv()) is None
    errors = workers.errors()
    assert len(errors) == 3 and all(e.startswith("input worker 1 (attempt 1): ") for e in errors), errors
    assert "without a header" in errors[0] and "unknown message kind b'Z'" in errors[1]
    assert "more than the receiver's bound of 64" in errors[2] and workers.counts()[1]["errors"] == 3


def test_a_bundle_hands_out_its_batches_and_rebuilds_its_nest_around_copies(router):
    intake, _, _ = intake_on(router)
    d = said_hello(router, intake, b"0.0.z", 0)
    nest = ({"a": np.arange(8).reshape(4, 2)}, np.arange(4, dtype=np.uint8))
    d.send_multipart([protocol.DATA, *wire(nest, 4)[:1], *wire(nest, 4)[1]])
    b = intake.message(router.recv())
    assert [int(batch[1]) for batch in b.batches()] == [0, 1, 2, 3]
    assert [a.shape for a in b.arrays] == [(4, 2), (4,)]
    copies = [a.copy() + 1 for a in b.arrays]
    rebuilt = b.rebuild(copies)
    assert rebuilt[0]["a"] is copies[0] and rebuilt[1] is copies[1]
    with pytest.raises(FrameError):
        b.rebuild(copies[:1])
    assert framing.flatten(rebuilt)[0] == framing.flatten(nest)[0]
