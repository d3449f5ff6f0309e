"""Bare peers of the data plane for its tests: the handshakes written out by hand (the
protocol as docs/DATAPLANE.md states it), so a test can play a sender that says or sends exactly
what it wants, a good one or a bad one."""
from __future__ import annotations

import json
import socket
import time

from csrun_common.jobsecret import job_secret
from csrun_runtime.dataplane import auth
from csrun_runtime.dataplane.bulk import auth_hello


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
