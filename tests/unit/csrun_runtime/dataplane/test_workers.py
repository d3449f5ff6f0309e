"""csrun_runtime/dataplane/workers.py: the receiver's record of its senders. With real sender
processes through a :class:`Receiver` (the data on zmq, the bulk channel or rings): a killed sender
replaced by a higher attempt, whose counts go on, and an older attempt refused. On a bare ROUTER
with DEALER peers: the welcome and the refusal, pause before and after a worker connects, bad
messages recorded naming the worker (raised when strict), the end of every expected stream, the
counts, and the bulk channel's end check."""
from __future__ import annotations

import json
import time

import numpy as np
import pytest

from csrun_runtime.dataplane import FrameError, Receiver, framing, protocol
from csrun_runtime.dataplane.workers import WorkerRecord, Workers, last_bundles
from tests.unit.dataplane_peers import start_sender, told


def test_a_killed_sender_is_replaced_by_a_higher_attempt(transport):
    with Receiver("tcp://127.0.0.1:0", **transport) as r:
        first = start_sender(r.endpoint, 2, attempt=0)
        while r.counts().get(2, {}).get("bundles", 0) < 5:
            r.get_bundle(timeout=30)
        first.kill()
        first.wait()
        second = start_sender(r.endpoint, 2, attempt=1, count=20)
        try:
            t_end = time.monotonic() + 30
            while r.counts()[2]["attempt"] != 1 or not r.counts()[2]["done"]:
                try:
                    b = r.get_bundle(timeout=1)
                except TimeoutError:
                    assert time.monotonic() < t_end, r.counts()
                    continue
                assert b.worker == 2
            assert second.wait(10) == 0 and "closed True" in second.stdout.read()
            stale = start_sender(r.endpoint, 2, attempt=0, count=3)  # an older attempt is refused
            while stale.poll() is None:
                try:
                    r.get_bundle(timeout=0.2)
                except TimeoutError:
                    pass
            out = stale.stdout.read()
            assert "gone input worker 2 (attempt 0)" in out and "read at attempt 1 now" in out, out
            assert r.counts()[2]["attempt"] == 1
        finally:
            for p in (first, second):
                if p.poll() is None:
                    p.kill()
                    p.wait()


# --------------------------------------------------------------------------- Workers on a bare ROUTER
WELCOME = {"window": 4096, "window_batches": 8}


def welcome_of(dealer) -> dict:
    reply = told(dealer)
    assert reply is not None and reply[0] == protocol.WELCOME, reply
    return json.loads(reply[1])


def test_a_newer_attempt_is_welcomed_with_the_counts_going_on_and_an_older_one_refused(router):
    w = Workers(router.sock, WELCOME)
    first = router.peer(b"3.0.a")
    w.hello(b"3.0.a", 3, 0, {"pid": 7, "host": "node2"})
    assert welcome_of(first) == {**WELCOME, "paused": False}
    rec = w.of(b"3.0.a")
    assert (rec.index, rec.attempt, rec.pid, rec.host, len(w)) == (3, 0, 7, "node2", 1)
    rec.received(framing.parse_header(framing.encode_header(0, [np.zeros((2, 5), np.float32)], 2)))
    second = router.peer(b"3.1.b")
    w.hello(b"3.1.b", 3, 1, {"pid": 8})
    assert welcome_of(second)["paused"] is False
    now = w.by_index[3]
    assert now.identity == b"3.1.b" and (now.bundles, now.batches, now.bytes) == (1, 2, 40)
    assert now.attempt_bundles == 0  # the bulk channel's end check counts this attempt's bundles only
    assert w.of(b"3.0.a") is now  # the older routing id maps to its index's current record
    older = router.peer(b"3.0.c")
    w.hello(b"3.0.c", 3, 0, {})
    assert told(older) == [protocol.REFUSED, b"worker 3 is read at attempt 1 now"]
    assert w.of(b"3.0.c") is None and w.of(b"nobody") is None
    w.tell(b"nobody", protocol.ACK)  # a sender that is gone: dropped, not raised


def test_a_worker_paused_before_it_connects_is_welcomed_paused_and_resumed_later(router):
    w = Workers(router.sock, WELCOME)
    w.pause(5, True)
    d = router.peer(b"5.0.p")
    w.hello(b"5.0.p", 5, 0, {})
    assert welcome_of(d)["paused"] is True and w.counts()[5]["paused"]
    w.pause(5, False)
    assert told(d) == [protocol.RESUME] and not w.counts()[5]["paused"] and w.paused == set()
    w.pause(5, True)
    assert told(d) == [protocol.PAUSE]


def test_bad_messages_are_recorded_naming_the_sender_and_raised_when_strict(router):
    w = Workers(router.sock, WELCOME)
    router.peer(b"0.4.e")
    w.hello(b"0.4.e", 0, 4, {})
    w.error(b"0.4.e", "header is not JSON")
    w.error(b"zz", "bulk data from a sender that has not said hello")
    assert w.errors() == ["input worker 0 (attempt 4): header is not JSON",
                          "unknown sender b'zz': bulk data from a sender that has not said hello"]
    assert w.counts()[0]["errors"] == 1
    for k in range(120):
        w.error(b"0.4.e", f"bad {k}")
    assert len(w.errors()) == 100 and w.errors()[-1].endswith("bad 119")
    w.strict = True
    with pytest.raises(FrameError, match=r"input worker 0 \(attempt 4\): truncated") as e:
        w.error(b"0.4.e", "truncated")
    assert e.value.worker == 0


def test_the_end_of_every_expected_stream_the_counts_and_the_last_bundles(router):
    w = Workers(router.sock, WELCOME)
    assert last_bundles(w.by_index) == "none connected" and w.ended(0) is True and w.ended(None) is False
    for i in (0, 1):
        router.peer(f"{i}.0.q".encode())
        w.hello(f"{i}.0.q".encode(), i, 0, {"pid": 10 + i, "host": "h"})
    w.by_index[0].done = True
    assert w.ended(1) and not w.ended(2)
    w.by_index[1].last = time.monotonic() - 2.0
    w.pause(1, True)
    assert last_bundles(w.by_index) == "0: never (ended), 1: 2.0 s ago (paused)"
    c = w.counts()
    assert list(c) == [0, 1] and c[1]["pid"] == 11 and 1.9 < c[1]["last_age_s"] < 5 and c[0]["last_age_s"] is None
    assert set(c[0]) == {"bundles", "batches", "bytes", "attempt", "pid", "host", "errors", "stale", "done", "paused",
                         "last_age_s", "shm", "shm_bundles"}


def test_through_the_bulk_channel_a_worker_is_done_once_its_last_bundles_are_read_or_its_connection_ended(router):
    rec = WorkerRecord(0, 0, b"0.0.k")
    rec.end_bundles = 2  # its end (on zmq) overtook its last bundles
    rec.attempt_bundles = 1
    rec.end_check()
    assert not rec.done
    rec.attempt_bundles = 2
    rec.end_check()
    assert rec.done
    w = Workers(router.sock, WELCOME)
    router.peer(b"1.0.k")
    w.hello(b"1.0.k", 1, 0, {})
    cut = w.by_index[1]
    cut.end_bundles = 5
    w.bulk_end(cut, "connection reset", bad=False)  # cut inside a bundle: that bundle is lost, the worker done
    assert cut.done and cut.bulk_ended and w.errors() == []
    w.bulk_end(cut, "a header declaring 1 TB", bad=True)  # a stream that cannot be parsed: a bad message
    assert w.errors() == ["input worker 1 (attempt 0): a header declaring 1 TB"]
