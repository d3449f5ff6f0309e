"""The data plane's mutual authentication (csrun_runtime.dataplane.auth, issue 45): over real zmq
sockets and TCP on loopback, bare peers play the impostors — a hello as an existing worker with
a higher attempt and a made-up proof, data with no handshake, a replayed handshake, a foreign
listener a worker is pointed at, 1 TB headers and random bytes on the bulk channel — and the
real senders stream on, never displaced, with every refused peer counted."""
from __future__ import annotations

import json
import logging
import os
import socket
import struct
import threading
import time

import numpy as np
import pytest
import zmq

from csrun_common.jobsecret import new_secret
from csrun_runtime.dataplane import NotAuthenticated, Receiver, Sender, auth, framing
from csrun_runtime.dataplane.bulk import MAGIC, auth_hello
from tests.unit.dataplane_peers import bulk_connect, raw_hello

MARKER = -12345.0
SECRET = bytes.fromhex(new_secret())


class Reader:
    """The receiver's reading in a thread (a sender's handshake goes back and forth): the
    workers of every bundle, and the bundles' first values, until stopped."""

    def __init__(self, rx: Receiver):
        self.rx, self.workers, self.values, self.stop = rx, [], [], threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                b = self.rx.get_bundle(timeout=0.05)
            except TimeoutError:
                continue
            self.workers.append(b.worker)
            self.values.append(float(b.arrays[0].flat[0]))

    def join(self) -> None:
        self.stop.set()
        self.thread.join(10)


def _feed(endpoint: str, index: int, stop: threading.Event, secret: bytes = SECRET) -> None:
    with Sender(endpoint, index, bundle=1, secret=secret) as s:
        while not stop.is_set():
            try:
                s.send(np.full((4, 4), index + 1.0, np.float32), timeout=0.2)
            except TimeoutError:
                pass


def _marker_message() -> list[bytes]:
    tree, leaves = framing.flatten(np.full((1, 4, 4), MARKER, np.float32))
    return [b"D", framing.encode_header(tree, leaves, 1), *[a.tobytes() for a in leaves]]


def _replies(dealer: zmq.Socket, seconds: float) -> list[list[bytes]]:
    out, t_end = [], time.monotonic() + seconds
    while time.monotonic() < t_end:
        if dealer.poll(50):
            out.append(dealer.recv_multipart())
    return out


def test_an_impostor_never_displaces_a_worker_nor_reaches_the_consumer(transport, caplog):
    """(a) a hello as worker 0 with attempt 7 and a made-up proof, then marker data all the same,
    and marker data from a peer that never said hello: refused, counted, logged once per address;
    worker 0 (attempt 0) streams on and no marker reaches get_bundle."""
    with Receiver("tcp://127.0.0.1:0", secret=SECRET, **transport) as rx:
        reader, stop = Reader(rx), threading.Event()
        feeder = threading.Thread(target=_feed, args=(rx.endpoint, 0, stop), daemon=True)
        feeder.start()
        ctx = zmq.Context()
        bad = ctx.socket(zmq.DEALER)
        bad.connect(rx.endpoint)
        hello = json.dumps({"v": 2, "worker": 0, "attempt": 7, "nonce": auth.nonce().hex()}).encode()
        with caplog.at_level(logging.WARNING, logger="csrun_runtime.dataplane"):
            bad.send_multipart([b"H", hello])
            (challenge,) = _replies(bad, 2)
            assert challenge[0] == b"C"  # the receiver proves itself first: it gives nothing away
            bad.send_multipart([b"K", json.dumps({"proof": os.urandom(32).hex()}).encode()])
            assert [r[0] for r in _replies(bad, 1)] == [b"X"]
            for _ in range(20):
                bad.send_multipart(_marker_message())
            ghost = ctx.socket(zmq.DEALER)
            ghost.connect(rx.endpoint)
            for _ in range(20):
                ghost.send_multipart(_marker_message())
            time.sleep(1.5)
        stop.set()
        feeder.join(10)
        reader.join()
        refused, counts = rx.refused(), rx.counts()
        for s in (bad, ghost):
            s.close(0)
        ctx.term()
    assert reader.workers and set(reader.workers) == {0} and MARKER not in reader.values
    assert counts[0]["attempt"] == 0 and counts[0]["errors"] == 0 and len(counts) == 1
    assert refused["peers"] == 2 and refused["messages"] == 40, refused
    assert refused["reasons"] == {"a wrong proof": 1, "a message before its handshake": 1}
    assert caplog.text.count("refused a peer at 127.0.0.1") == 1  # once per address


def test_a_replayed_handshake_is_refused():
    """A recorded hello and answer of a real sender, replayed to the same receiver: its
    challenge carries a fresh nonce, so the old proof does not answer it."""
    with Receiver("tcp://127.0.0.1:0", secret=SECRET) as rx:
        ctx = zmq.Context()
        real = ctx.socket(zmq.DEALER)
        real.connect(rx.endpoint)
        reader = Reader(rx)
        assert "window" in raw_hello(real, 3, 0, secret=SECRET)
        reader.join()
        hello = json.dumps({"v": 2, "worker": 3, "attempt": 0, "nonce": auth.nonce().hex()}).encode()
        recorded = {"proof": auth.proof(SECRET, auth.SENDER, hello, auth.nonce()).hex()}  # an old session's
        replay = ctx.socket(zmq.DEALER)
        replay.connect(rx.endpoint)
        replay.send_multipart([b"H", hello])
        reader = Reader(rx)
        assert _replies(replay, 1)[0][0] == b"C"
        replay.send_multipart([b"K", json.dumps(recorded).encode()])
        assert [r[0] for r in _replies(replay, 1)] == [b"X"]
        reader.join()
        assert rx.refused()["reasons"] == {"a wrong proof": 1} and rx.counts()[3]["attempt"] == 0
        for s in (real, replay):
            s.close(0)
        ctx.term()


@pytest.mark.parametrize("listener", ["welcomes at once", "proves with another secret"])
def test_a_sender_refuses_a_foreign_listener_and_sends_it_nothing(listener):
    """A worker pointed at an endpoint that cannot prove it knows the secret (a rewritten
    rendezvous file): NotAuthenticated naming the endpoint, and nothing but its hello sent."""
    ctx = zmq.Context()
    foreign = ctx.socket(zmq.ROUTER)
    port = foreign.bind_to_random_port("tcp://127.0.0.1")
    endpoint = f"tcp://127.0.0.1:{port}"
    got: list[bytes] = []

    def serve() -> None:
        while True:
            if not foreign.poll(3000):
                return
            frames = foreign.recv_multipart()
            got.append(frames[1])
            if frames[1] == b"H" and listener == "welcomes at once":
                foreign.send_multipart([frames[0], b"W", b'{"window": 1000000, "paused": false}'])
            elif frames[1] == b"H":
                ours = auth.nonce()
                wrong = auth.proof(bytes(32), auth.RECEIVER, frames[2], ours)
                foreign.send_multipart([frames[0], b"C", json.dumps({"nonce": ours.hex(), "proof": wrong.hex()})
                                        .encode()])

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    s = Sender(endpoint, 0, bundle=1, secret=SECRET)
    with pytest.raises(NotAuthenticated) as ei:
        for _ in range(50):
            s.send(np.zeros(4, np.float32), timeout=0.2)
    s.close(timeout=1)
    t.join(10)
    foreign.close(0)
    ctx.term()
    msg = str(ei.value)
    assert msg.startswith(f"input worker 0 (attempt 0) at {endpoint}: ") and "\n" not in msg
    assert "it does not know this job's secret (CSRUN_JOB_SECRET); nothing was sent to it" in msg
    assert got == [b"H"]


def _tcp(port: int, payload: bytes, handshake: bool = False) -> bytes:
    """Send ``payload`` to the bulk channel (after a made-up handshake); what came back before it closed."""
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    got = b""
    try:
        if handshake:
            s.sendall(auth_hello(b"0.7.x", auth.nonce()))
            got = s.recv(48)
            s.sendall(os.urandom(32))
        s.sendall(payload)
        while chunk := s.recv(4096):
            got += chunk
    except OSError:
        pass
    finally:
        s.close()
    return got


def test_the_bulk_channel_refuses_a_peer_without_the_secret_before_allocating_anything():
    """(b) a header declaring a 1 TB leaf, bare and after a made-up handshake, (c) random bytes:
    each connection refused and closed having allocated nothing for it, the real sender's data
    read on."""
    tb = json.dumps({"v": 1, "n": 1, "tree": 0, "leaves": [["<f4", [1, 1 << 38]]]}).encode()
    with Receiver("tcp://127.0.0.1:0", secret=SECRET, bulk=True) as rx:
        reader, stop = Reader(rx), threading.Event()
        feeder = threading.Thread(target=_feed, args=(rx.endpoint, 0, stop), daemon=True)
        feeder.start()
        port = rx.bulk_port
        assert port is not None
        back = [_tcp(port, MAGIC + struct.pack("<I", len(tb)) + tb),
                _tcp(port, MAGIC + struct.pack("<I", len(tb)) + tb, handshake=True),
                _tcp(port, os.urandom(1 << 20))]
        time.sleep(1.0)
        stop.set()
        feeder.join(10)
        reader.join()
        refused = rx.refused()
    assert back[0] == b"" and len(back[1]) == 48 and back[2] == b""  # only the listener's own proof
    reasons = refused["reasons"]
    assert refused["peers"] == 3 and reasons["not a handshake (first bytes b'CSB1')"] == 1, refused
    assert reasons["a wrong proof"] == 1 and sum(n for r, n in reasons.items() if r.startswith("not a")) == 2
    assert reader.workers and set(reader.workers) == {0}


def test_a_header_over_the_bound_is_refused_before_its_buffer_on_both_channels():
    """An authenticated sender's header declaring more than the receiver's bound: a bad
    message on zmq (dropped, named), and on the bulk channel its connection closed before the
    buffer is allocated; the bound is the site's CSRUN_DATAPLANE_MAX_MESSAGE_BYTES."""
    tree, leaves = framing.flatten(np.zeros((1, 1024), np.float32))
    header = framing.encode_header(tree, leaves, 1)
    with Receiver("tcp://127.0.0.1:0", secret=SECRET, bulk=True, max_message_bytes=1000) as rx:
        ctx = zmq.Context()
        d = ctx.socket(zmq.DEALER)
        d.setsockopt(zmq.ROUTING_ID, b"2.0.x")
        d.connect(rx.endpoint)
        reader = Reader(rx)
        welcome = raw_hello(d, 2, 0, secret=SECRET)
        tcp = bulk_connect(welcome["bulk_port"], b"2.0.x", SECRET)
        tcp.sendall(struct.pack("<4sI", MAGIC, len(header)) + header)
        assert tcp.recv(1) == b""  # closed: nothing read beyond the header
        d.send_multipart([b"D", header, bytes(16)])  # the header alone declares too much
        d.send_multipart([b"D", header, leaves[0].tobytes()])  # a 4096-byte frame: zmq cuts the peer (MAXMSGSIZE)
        time.sleep(1.0)
        reader.join()
        errors = rx.errors()
        tcp.close()
        d.close(0)
        ctx.term()
    assert sum("header declares 4096 bytes, more than the receiver's bound of 1000" in e for e in errors) == 2, errors
    assert not reader.workers


def test_refusals_are_logged_once_per_address_and_counted(caplog):
    r = auth.Refusals()
    with caplog.at_level(logging.WARNING, logger="csrun_runtime.dataplane"):
        for _ in range(5):
            r.refuse("10.0.0.1", "a wrong proof")
        r.refuse("10.0.0.2", "a malformed hello (x)", "bulk channel")
        r.dropped()
    assert caplog.text.count("refused a peer at 10.0.0.1") == 1
    assert "bulk channel: refused a peer at 10.0.0.2" in caplog.text
    assert r.describe() == {"peers": 6, "messages": 1, "reasons": {"a wrong proof": 5, "a malformed hello (x)": 1},
                            "addresses": ["10.0.0.1", "10.0.0.2"]}


def test_proofs_differ_by_label_and_transcript():
    a = auth.proof(SECRET, auth.RECEIVER, b"hello", b"n")
    assert auth.valid(SECRET, a, auth.RECEIVER, b"hello", b"n")
    assert not auth.valid(SECRET, a, auth.SENDER, b"hello", b"n")  # not reflected
    assert not auth.valid(SECRET, a, auth.RECEIVER, b"hell", b"on")  # length-prefixed parts
    assert not auth.valid(bytes(32), a, auth.RECEIVER, b"hello", b"n")


def test_without_authentication_both_ends_speak_the_plain_protocol():
    with Receiver("tcp://127.0.0.1:0", authenticate=False) as rx:
        reader = Reader(rx)
        with Sender(rx.endpoint, 1, bundle=1, authenticate=False) as s:
            s.send(np.ones(4, np.float32), timeout=10)
        time.sleep(0.3)
        reader.join()
    assert reader.workers == [1]
    with Receiver("tcp://127.0.0.1:0", authenticate=False) as rx:  # an authenticating sender refuses it
        reader = Reader(rx)
        s = Sender(rx.endpoint, 1, bundle=1, secret=SECRET)
        with pytest.raises(NotAuthenticated, match="welcomed this sender without a proof"):
            s.send(np.ones(4, np.float32), timeout=10)
        s.close(timeout=0.5)
        reader.join()
