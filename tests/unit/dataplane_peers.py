"""Peers of the data plane for its tests: bare ones, the handshakes written out by hand (the
protocol as docs/DATAPLANE.md states it), so a test can play a sender that says or sends exactly
what it wants, a good one or a bad one; and real senders, in a thread (:class:`Feeder`) or in a
process of their own (:func:`start_sender`), where a process matters; and a bare ROUTER with
DEALER peers (:class:`Router`) for the receiver's parts alone."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time

import zmq

from csrun_common.jobsecret import job_secret
from csrun_runtime.dataplane import Sender, auth
from csrun_runtime.dataplane.bulk import auth_hello
from tests.unit.paths import REPO


def raw_hello(dealer, index, attempt, drive=lambda: None, secret=None):
    """Say hello on a bare DEALER as worker ``index`` at ``attempt`` and pass the handshake with
    ``secret`` (default: this process' job secret, the receiver's), calling ``drive()`` (the
    receiver's reading) while waiting; returns the welcome, or the first other reply's frames."""
    secret = job_secret() if secret is None else secret
    raw = json.dumps({"v": 2, "worker": index, "attempt": attempt, "nonce": auth.nonce().hex()}).encode()
    dealer.send_multipart([b"H", raw])
    t_end = time.monotonic() + 10
    while time.monotonic() < t_end:
        drive()
        if not dealer.poll(50):
            continue
        frames = dealer.recv_multipart()
        if frames[0] == b"C":
            theirs = bytes.fromhex(json.loads(frames[1])["nonce"])
            dealer.send_multipart([b"K", json.dumps({"proof": auth.proof(secret, auth.SENDER, raw, theirs).hex()})
                                   .encode()])
        elif frames[0] == b"W":
            return json.loads(frames[1])
        else:
            return frames
    raise TimeoutError("no welcome")


def bulk_connect(port: int, identity: bytes, secret: bytes | None = None) -> socket.socket:
    """A bulk-channel connection to ``port`` on loopback, through its handshake as routing id
    ``identity`` with ``secret`` (default: this process' job secret); raises AssertionError when
    the listener's proof is wrong."""
    secret = job_secret() if secret is None else secret
    tcp = socket.create_connection(("127.0.0.1", port), timeout=10)
    ours = auth.nonce()
    tcp.sendall(auth_hello(identity, ours))
    reply = b""
    while len(reply) < auth.NONCE_BYTES + auth.PROOF_BYTES:
        chunk = tcp.recv(auth.NONCE_BYTES + auth.PROOF_BYTES - len(reply))
        assert chunk, "the listener closed during the handshake"
        reply += chunk
    theirs = reply[:auth.NONCE_BYTES]
    assert auth.valid(secret, reply[auth.NONCE_BYTES:], auth.BULK_RECEIVER, identity, ours, theirs)
    tcp.sendall(auth.proof(secret, auth.BULK_SENDER, identity, ours, theirs))
    tcp.settimeout(None)
    return tcp


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
    """A sender process (:data:`SENDER`): ``count`` batches (-1: endless) of ``kib`` KiB and a
    counter, one per bundle; it prints its bytes sent after each send, then ``closed <confirmed>``
    or ``gone <reason>``."""
    return subprocess.Popen([sys.executable, "-c", SENDER, endpoint, str(index), str(attempt), str(count), str(kib)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=str(REPO))


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


class Router:
    """A ROUTER bound on loopback as the receiver binds its own (a send to a gone peer fails),
    and DEALER peers connected to it by routing id (:meth:`peer`)."""

    def __init__(self) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.endpoint = f"tcp://127.0.0.1:{self.sock.bind_to_random_port('tcp://127.0.0.1')}"
        self.peers: list[zmq.Socket] = []

    def peer(self, identity: bytes) -> zmq.Socket:
        """A DEALER with routing id ``identity`` that the ROUTER can reach (its first message, a
        ping, has been read)."""
        d = self.ctx.socket(zmq.DEALER)
        d.setsockopt(zmq.ROUTING_ID, identity)
        d.setsockopt(zmq.LINGER, 0)
        d.connect(self.endpoint)
        self.peers.append(d)
        d.send(b"ping")
        assert self.sock.poll(5000), "the peer never connected"
        assert self.sock.recv_multipart() == [identity, b"ping"]
        return d

    def recv(self, timeout: float = 5.0) -> list[zmq.Frame]:
        """The next message the ROUTER received, as the receiver reads it: ``zmq.Frame`` s,
        the routing id first."""
        assert self.sock.poll(int(timeout * 1000)), "no message"
        return self.sock.recv_multipart(copy=False)

    def close(self) -> None:
        for d in self.peers:
            d.close(0)
        self.sock.close(0)
        self.ctx.term()


def told(dealer: zmq.Socket, timeout: float = 5.0) -> list[bytes] | None:
    """The next message ``dealer`` was told within ``timeout`` seconds, None when none came."""
    t_end = time.monotonic() + timeout
    while time.monotonic() < t_end:
        if dealer.poll(50):
            return dealer.recv_multipart()
    return None
