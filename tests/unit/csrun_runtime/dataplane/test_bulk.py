"""The data plane's bulk channel (csrun_runtime.dataplane.bulk): what only it can do wrong. A
sender cut inside a bundle (a worker killed mid-send) loses that bundle and nothing else; a
stream that cannot be parsed is closed naming its worker; the end of stream, which travels on
zmq, cannot overtake the bundles still in the connection; bundles land in the buffers a consumer
lends. Raw sockets on loopback play the broken senders, so the cut falls exactly inside a bundle.
(test_protocol.py, test_intake.py, test_receiver.py and test_workers.py run their tests on the bulk channel too.)"""
from __future__ import annotations

import ctypes
import json
import logging
import socket
import threading
import time

import numpy as np
import pytest
import zmq

from csrun_runtime.dataplane import EndOfStream, Receiver, Sender, framing
from csrun_runtime.dataplane.bulk import BulkWriter, handshake, message_prefix, offsets
from tests.unit.dataplane_peers import bulk_connect, raw_hello


class RawSender:
    """A sender by hand: hello on zmq as worker ``index`` (its handshake passed), then the bulk
    connection the welcome offers (its handshake passed)."""

    def __init__(self, r: Receiver, index: int, attempt: int = 0):
        self.identity = f"{index}.{attempt}".encode()
        self.ctx = zmq.Context()
        self.dealer = self.ctx.socket(zmq.DEALER)
        self.dealer.setsockopt(zmq.ROUTING_ID, self.identity)
        self.dealer.connect(r.endpoint)
        self.r = r
        self.welcome = raw_hello(self.dealer, index, attempt, self._drive)
        self.tcp = bulk_connect(self.welcome["bulk_port"], self.identity)

    def _drive(self) -> None:
        try:
            self.r.get_bundle(timeout=0.01)
        except TimeoutError:
            pass

    def _until(self, kind: bytes) -> dict:
        """Read the receiver's messages to this sender (driving the receiver meanwhile) until ``kind``."""
        while True:
            try:
                self.r.get_bundle(timeout=0.05)
            except TimeoutError:
                pass
            if self.dealer.poll(50):
                frames = self.dealer.recv_multipart()
                if frames[0] == kind:
                    return json.loads(frames[1]) if len(frames) > 1 and frames[1][:1] == b"{" else {}

    @staticmethod
    def message(nest, n=0) -> bytes:
        tree, leaves = framing.flatten(nest)
        return message_prefix(framing.encode_header(tree, leaves, n)) + b"".join(a.tobytes() for a in leaves)

    def close(self):
        self.tcp.close()
        self.dealer.close(0)
        self.ctx.term()


def drain(r, n, timeout=10):
    """``n`` bundles from ``r``."""
    return [r.get_bundle(timeout=timeout) for _ in range(n)]


def test_a_sender_cut_inside_a_bundle_loses_that_bundle_only(caplog):
    with Receiver("tcp://127.0.0.1:0", bulk=True) as r:
        raw = RawSender(r, 4)
        whole = raw.message({"x": np.full((2, 1000), 7, np.float32)}, n=2)
        raw.tcp.sendall(whole)  # one whole bundle
        cut = raw.message({"x": np.full((2, 1000), 8, np.float32)}, n=2)
        raw.tcp.sendall(cut[: len(cut) // 2])  # then half of the next: the worker dies here
        with caplog.at_level(logging.WARNING, logger="csrun_runtime.dataplane"):
            raw.tcp.close()
            (b,) = drain(r, 1)
            assert b.worker == 4 and b.n == 2 and (b.nest["x"] == 7).all()
            with pytest.raises(TimeoutError):  # the half bundle is not handed out
                r.get_bundle(timeout=0.5)
        assert "input worker 4 (attempt 0): bulk connection ended inside a bundle (leaf 0" in caplog.text
        c = r.counts()[4]
        assert (c["bundles"], c["errors"], c["done"]) == (1, 0, False)  # a cut is no end of stream
        t = threading.Thread(target=lambda: _send(r.endpoint, 4, 1, attempt=1), daemon=True)
        t.start()  # its replacement reads on
        (b,) = drain(r, 1)
        assert b.attempt == 1 and (b.nest["x"] == 0).all() and b.nest["x"].shape == (1, 256, 256)
        t.join(10)
        raw.close()


def test_a_stream_that_cannot_be_parsed_is_closed_naming_its_worker(caplog):
    with Receiver("tcp://127.0.0.1:0", bulk=True) as r:
        raw = RawSender(r, 6, attempt=1)
        good = threading.Thread(target=lambda: _send(r.endpoint, 0, 20), daemon=True)
        good.start()
        with caplog.at_level(logging.WARNING, logger="csrun_runtime.dataplane"):
            raw.tcp.sendall(b"NOPE" + bytes(60))
            workers = {b.worker for b in drain(r, 20)}
            t_end = time.monotonic() + 10  # the reader thread's post may come after the good bundles
            while not r.errors() and time.monotonic() < t_end:
                try:
                    r.get_bundle(timeout=0.1)
                except (TimeoutError, EndOfStream):
                    pass
        assert workers == {0}
        (err,) = r.errors()
        assert err.startswith("input worker 6 (attempt 1): bulk channel: stream is not a bulk data message "
                              "(prefix b'NOPE'") and err.endswith("connection closed"), err
        assert err in caplog.text and r.counts()[6]["errors"] == 1
        with pytest.raises(OSError):  # the receiver closed that connection
            for _ in range(100):
                raw.tcp.sendall(bytes(1 << 16))
        good.join(10)
        raw.close()


def _send(endpoint, index, count, shape=(256, 256), attempt=0):
    with Sender(endpoint, index, attempt, bundle=1) as s:
        for i in range(count):
            s.send({"x": np.full(shape, i, np.float32), "i": np.int64(i)})


def test_the_end_of_stream_does_not_overtake_the_bundles_in_the_connection():
    with Receiver("tcp://127.0.0.1:0", bulk=True, expected=1) as r:
        raw = RawSender(r, 0)
        msgs = [raw.message({"i": np.full((1, 3), i, np.int64)}, n=1) for i in range(5)]
        raw.tcp.sendall(msgs[0])
        assert drain(r, 1)[0].nest["i"][0, 0] == 0
        raw.dealer.send_multipart([b"E", json.dumps({"bundles": 5, "batches": 5}).encode()])
        raw._until(b"F")  # the receiver has the end, and 4 bundles are still to come
        assert not r.counts()[0]["done"]
        for m in msgs[1:]:
            raw.tcp.sendall(m)
        got = [int(b.nest["i"][0, 0]) for b in drain(r, 4)]
        with pytest.raises(EndOfStream):
            r.get_bundle(timeout=5)
        assert got == [1, 2, 3, 4] and r.counts()[0]["done"]
        raw.close()


def test_a_sender_that_ends_with_fewer_bundles_read_is_done_when_its_connection_ends():
    """Its end says 3 bundles, one was cut: done once the connection ends (nothing more can come)."""
    with Receiver("tcp://127.0.0.1:0", bulk=True, expected=1) as r:
        raw = RawSender(r, 0)
        m = raw.message({"i": np.zeros((1, 3), np.int64)}, n=1)
        raw.tcp.sendall(m + m)
        drain(r, 2)
        raw.dealer.send_multipart([b"E", json.dumps({"bundles": 3, "batches": 3}).encode()])
        raw._until(b"F")
        assert not r.counts()[0]["done"]
        raw.tcp.close()
        with pytest.raises(EndOfStream):
            r.get_bundle(timeout=5)
        raw.close()


def test_bundles_land_in_the_buffers_the_consumer_lends():
    lent: list[ctypes.Array] = []
    lock = threading.Lock()

    def allocate(nbytes):
        buf = (ctypes.c_char * nbytes)()
        with lock:
            lent.append(buf)
        return buf

    with Receiver("tcp://127.0.0.1:0", bulk=True, expected=1) as r:
        assert r.lend(allocate)
        t = threading.Thread(target=lambda: _send(r.endpoint, 0, 6, shape=(3, 5)), daemon=True)
        t.start()
        seen = []
        with pytest.raises(EndOfStream):
            while True:
                b = r.get_bundle(timeout=10)
                x, i = b.nest["x"], b.nest["i"]
                # one lent buffer per bundle: each leaf is a view of the uint8 array over it
                assert x.base is i.base and any(x.base.base is buf for buf in lent)
                start = ctypes.addressof(x.base.base)
                assert (x.ctypes.data - start) % 64 == 0 and (i.ctypes.data - start) % 64 == 0
                seen += [int(v) for v in i]
                assert all((x[j] == v).all() for j, v in enumerate(i))
        t.join(10)
        assert seen == list(range(6)) and len(lent) >= 1
    assert Receiver("tcp://127.0.0.1:0").lend(allocate) is False  # without the bulk channel: nothing lent


def test_leaf_offsets_are_aligned_and_cover_every_leaf():
    tree, leaves = framing.flatten({"a": np.zeros(3, np.uint8), "b": np.zeros((2, 5), np.float64),
                                    "c": np.zeros(0, np.int32), "d": np.zeros(1, np.int16)})
    layout = framing.parse_header(framing.encode_header(tree, leaves, 0))
    starts, total = offsets(layout)
    assert starts == [0, 64, 192, 192] and total == 256


def test_a_writer_sends_many_leaves_in_order():
    """More leaves than one sendmsg takes (IOV_MAX): every byte arrives, in order."""
    server = socket.create_server(("127.0.0.1", 0))
    leaves = [np.full(7, i % 251, np.uint8) for i in range(1500)]
    got = bytearray()

    def read():
        conn, _ = server.accept()
        while chunk := conn.recv(1 << 16):
            got.extend(chunk)
        conn.close()

    t = threading.Thread(target=read, daemon=True)
    t.start()
    w = BulkWriter("127.0.0.1", server.getsockname()[1], b"0.0")
    w.send(b"{}", leaves)
    w.close()
    t.join(10)
    server.close()
    want = handshake(b"0.0") + message_prefix(b"{}") + b"".join(a.tobytes() for a in leaves)
    assert bytes(got) == want


def test_a_lent_allocator_that_fails_falls_back_to_ordinary_memory(caplog):
    def broken(nbytes):
        raise RuntimeError("pinned memory exhausted")

    with Receiver("tcp://127.0.0.1:0", bulk=True, expected=1) as r:
        r.lend(broken)
        t = threading.Thread(target=lambda: _send(r.endpoint, 0, 3, shape=(4, 4)), daemon=True)
        t.start()
        got = []
        with caplog.at_level(logging.WARNING, logger="csrun_runtime.dataplane"), pytest.raises(EndOfStream):
            while True:
                got += [int(v) for v in r.get_bundle(timeout=10).nest["i"]]
        t.join(10)
    assert got == [0, 1, 2]
    assert "the consumer's buffers" in caplog.text and "RuntimeError: pinned memory exhausted" in caplog.text
