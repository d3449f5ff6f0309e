"""csrun_runtime/dataplane/protocol.py: the hello's fields and the refusal of a malformed one,
the sender's credit (a byte window, a batch window, a pause), deadlines; and nests of every
shape round-tripping from a :class:`Sender` to a :class:`Receiver` over real zmq sockets on
loopback (data on zmq, on the bulk channel and through shared-memory rings: the ``rx`` fixture)."""
from __future__ import annotations

import json
import os
import threading
import time

import numpy as np
import pytest

from csrun_runtime.dataplane import Sender, protocol
from csrun_runtime.dataplane.protocol import Credits
from tests.unit.csrun_runtime.dataplane.test_framing import assert_same


def test_a_hello_round_trips_and_a_malformed_one_is_refused():
    h = protocol.hello(3, 2, b"\x01\xff")
    assert (h["worker"], h["attempt"], h["pid"], h["nonce"]) == (3, 2, os.getpid(), "01ff")
    index, attempt, back = protocol.parse_hello(protocol.encode(h))
    assert (index, attempt, back) == (3, 2, h)
    for bad in ({**h, "v": protocol.PROTOCOL + 1}, {**h, "worker": -1}, {**h, "attempt": -2}):
        with pytest.raises(ValueError):
            protocol.parse_hello(json.dumps(bad).encode())
    with pytest.raises(KeyError):
        protocol.parse_hello(json.dumps({"v": protocol.PROTOCOL}).encode())


def test_credit_holds_a_byte_window_a_batch_window_and_a_pause():
    c = Credits()
    assert c.blocked(1) and "not welcomed" in c.state()  # nothing goes before the welcome
    c.welcome({"window": 100, "paused": False, "window_batches": None})
    assert not c.blocked(5)  # one message always goes when none is in flight
    c.sent(150, 5)
    assert c.blocked(1) and "150 bytes / 5 batches" in c.state()
    c.ack()
    assert not c.blocked(1) and (c.bytes, c.batches) == (0, 0)
    c.welcome({"window": 10_000, "paused": False, "window_batches": 4})
    c.sent(10, 3)
    assert c.blocked(2) and not c.blocked(1)  # 3 + 2 batches > 4
    assert c.room(0) and not c.room(1)
    c.welcome({"window": 10_000, "paused": True})
    assert c.blocked(1) and c.state() == "paused by the receiver"
    c.reset()
    assert c.window is None and not c.inflight and (c.bytes, c.batches) == (0, 0)


def test_deadlines():
    assert protocol.deadline_in(None) is None and protocol.ms_left(None) is None
    d = protocol.deadline_in(2.0)
    assert d is not None and 1500 < (protocol.ms_left(d) or 0) <= 2000
    assert protocol.ms_left(time.monotonic() - 5) == 0


def test_nests_round_trip_from_a_sender_to_the_receiver(rx):
    batches = [{"img": np.random.default_rng(i).random((2, 3), dtype=np.float32), "meta": (np.int64(i), None),
                "flags": [np.array([True, False]), np.zeros((0, 5), np.float16)], "s": np.array(b"ab")}
               for i in range(7)]
    done = threading.Event()

    def feed():
        with Sender(rx.endpoint, 3, bundle=3) as s:  # bundles of 3, 3, then 1
            for b in batches:
                s.send(b)
            s.send_bundle((np.arange(6).reshape(2, 3),), 2)  # a ready bundle of 2
        done.set()

    threading.Thread(target=feed, daemon=True).start()
    got = [rx.get(timeout=10) for _ in range(9)]
    assert {w for w, _ in got} == {3}
    for want, (_, have) in zip(batches, got, strict=False):
        assert_same(have, {k: (tuple(np.asarray(x) if x is not None else None for x in v) if k == "meta" else v)
                           for k, v in want.items()})
    assert_same(got[7][1], (np.arange(3),))
    assert_same(got[8][1], (np.arange(3, 6),))
    with pytest.raises(TimeoutError):  # reads the end of stream, then nothing more comes
        rx.get_bundle(timeout=0.5)
    assert done.wait(10)
    c = rx.counts()[3]
    assert (c["bundles"], c["batches"], c["done"], c["errors"]) == (4, 9, True, 0)
