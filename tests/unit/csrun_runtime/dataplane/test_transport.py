"""The data plane's transport (csrun_runtime/dataplane/transport.py): nests through the
transport, bad messages refused naming the worker while the others are served, flow control
bounding what the chief buffers, a killed sender replaced by a higher attempt, pause/resume and
the end of stream — over real zmq sockets on loopback, with real sender processes where a
process matters; the tests run with the data on zmq and on the bulk channel (test_bulk.py has
its own cases)."""
from __future__ import annotations

import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import zmq

from csrun_runtime.dataplane import EndOfStream, FrameError, Receiver, ReceiverGone, Sender
from tests.unit.csrun_runtime.dataplane.test_framing import assert_same, wire
from tests.unit.dataplane_peers import raw_hello
from tests.unit.paths import REPO


class Feeder(threading.Thread):
    """A sender in a thread: ``count`` batches (None: until stopped) of ``nest`` to ``endpoint``."""

    def __init__(self, endpoint, index, nest, count=None, attempt=0, **kw):
        super().__init__(daemon=True)
        self.endpoint, self.index, self.nest, self.count, self.attempt, self.kw = \
            endpoint, index, nest, count, attempt, kw
        self.stop, self.error, self.confirmed = threading.Event(), None, None

    def run(self):
        try:
            with Sender(self.endpoint, self.index, self.attempt, **self.kw) as s:
                i = 0
                while not self.stop.is_set() and (self.count is None or i < self.count):
                    try:
                        s.send(self.nest, timeout=0.2)
                        i += 1
                    except TimeoutError:  # paused or no credit: look at stop again
                        pass
                self.confirmed = s.close(timeout=5)
        except BaseException as e:  # noqa: BLE001 - read by the test
            self.error = e


SENDER = r"""
import sys, time, numpy as np
from csrun_runtime.dataplane import Sender, ReceiverGone
endpoint, (index, attempt, count, kib) = sys.argv[1], map(int, sys.argv[2:6])
s = Sender(endpoint, index, attempt, bundle=1)
x = np.full((kib * 256,), index, np.float32)
i = 0
try:
    while count < 0 or i < count:
        s.send({"x": x, "i": np.int64(i)}, timeout=30)
        i += 1
        print(s.bytes_sent, flush=True)
    print("closed", s.close(timeout=10), flush=True)
except ReceiverGone as e:
    print("gone", e, flush=True)
"""


def start_sender(endpoint, index, attempt=0, count=-1, kib=64):
    return subprocess.Popen([sys.executable, "-c", SENDER, endpoint, str(index), str(attempt), str(count), str(kib)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=str(REPO))


@pytest.fixture(params=[False, True], ids=["zmq", "bulk"])
def bulk(request):
    """Data on zmq, or on the bulk channel (csrun_runtime.dataplane.bulk): the same tests hold."""
    return request.param


@pytest.fixture
def rx(bulk):
    r = Receiver("tcp://127.0.0.1:0", bulk=bulk)
    yield r
    r.close()


# --------------------------------------------------------------------------- transport
def test_nests_round_trip_through_the_transport(rx):
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


def follow_bytes_sent(p: subprocess.Popen) -> list[int]:
    """``[bytes]`` the sender process ``p`` reports having sent (it prints the total after each
    send), kept up to date by a thread."""
    last = [0]

    def follow():
        for line in p.stdout:
            if line.strip().isdigit():
                last[0] = int(line)

    threading.Thread(target=follow, daemon=True).start()
    return last


def test_a_slow_consumer_bounds_the_buffered_bytes(bulk):
    """A sender process streams 256 KiB batches; the chief stops reading for a second: what the
    sender got out stays within one window (plus one bundle) of what the chief took."""
    window = 1 << 20
    with Receiver("tcp://127.0.0.1:0", window_bytes=window, bulk=bulk) as r:
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


def test_waiting_for_the_other_senders_keeps_the_first_ones_credit_bounded(bulk):
    """While the chief waits for every sender's hello (wait_workers), what an early sender gets
    out stays within its window: the bundles kept meanwhile are acknowledged only when handed
    out. (They were acknowledged on receipt: with 256 senders connecting over seconds, the
    chief kept everything the first ones sent, 21.5 GB, and was killed for memory.)"""
    window = 1 << 20
    with Receiver("tcp://127.0.0.1:0", window_bytes=window, bulk=bulk) as r:
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


def test_a_killed_sender_is_replaced_by_a_higher_attempt(bulk):
    with Receiver("tcp://127.0.0.1:0", bulk=bulk) as r:
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


def test_end_of_stream_and_close(bulk):
    with Receiver("tcp://127.0.0.1:0", expected=2, bulk=bulk) as r:
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
    with Receiver("tcp://127.0.0.1:0", window_bytes=1, bulk=bulk) as r:
        f = Feeder(r.endpoint, 0, np.zeros(10), bundle=1, count=None)
        f.start()
        r.get_bundle(timeout=10)
        r.pause(0)
        with pytest.raises(TimeoutError, match=r"last bundle per worker: 0: [0-9.]+ s ago \(paused\)"):
            while True:  # what was in flight, then nothing
                r.get_bundle(timeout=0.3)
    f.join(10)
    assert isinstance(f.error, ReceiverGone), f.error
