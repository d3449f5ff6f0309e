"""Mutual authentication of the data plane's connections with the job's secret
(:mod:`csrun_common.jobsecret`; docs/SECURITY.md, docs/DATAPLANE.md "Authentication").

Each end proves it knows the secret with HMAC-SHA256 (:mod:`hmac`) over the other end's fresh
nonce (:mod:`secrets`), with a label per direction, so that no proof can be replayed or reflected:

- zmq: the sender's hello carries its nonce; the receiver answers with its own nonce and its
  proof over the hello (``C``, :data:`~csrun_runtime.dataplane.protocol.CHALLENGE`); the sender
  checks it before anything else and answers with its proof (``K``); only then does the receiver
  record the worker and welcome it (:class:`Gate`).
- the bulk channel (TCP): the sender opens with its routing id and nonce, the listener answers
  with its nonce and proof, the sender checks it and sends its proof before any data
  (:mod:`.bulk`).

A peer that fails is refused, counted and logged once per address (:class:`Refusals`).
Standard library only.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import logging
import secrets
import struct
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from typing import Any

from . import protocol

log = logging.getLogger(__name__)

#: Bytes of each end's nonce.
NONCE_BYTES = 16
#: Bytes of a proof (HMAC-SHA256).
PROOF_BYTES = 32
#: Labels of the four proofs: a proof made for one direction or channel is no proof for another.
RECEIVER, SENDER, BULK_RECEIVER, BULK_SENDER = b"receiver", b"sender", b"bulk receiver", b"bulk sender"
#: Seconds between two log lines about refused peers of one address.
LOG_EVERY_S = 60.0
#: Most addresses whose last log line a receiver remembers; most handshakes it keeps open.
MAX_TRACKED = 1024
#: Most bytes of a hello or an answer a receiver reads.
MAX_HANDSHAKE_BYTES = 4096


def nonce() -> bytes:
    """A fresh nonce (:data:`NONCE_BYTES` random bytes)."""
    return secrets.token_bytes(NONCE_BYTES)


def proof(secret: bytes, label: bytes, *parts: bytes) -> bytes:
    """HMAC-SHA256 under ``secret`` of ``label`` and ``parts``, each length-prefixed (no two
    different transcripts read alike)."""
    msg = b"csrun-auth-1" + b"".join(struct.pack("<I", len(p)) + p for p in (label, *parts))
    return hmac.new(secret, msg, hashlib.sha256).digest()


def valid(secret: bytes, given: bytes, label: bytes, *parts: bytes) -> bool:
    """Whether ``given`` is :func:`proof` of the same arguments (compared in constant time)."""
    return hmac.compare_digest(given, proof(secret, label, *parts))


class Refusals:
    """The peers a receiver refused (on its thread and its bulk channel's: thread-safe): each
    counted, and logged once per address every :data:`LOG_EVERY_S` seconds."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.peers = 0  # connections or handshakes refused
        self.messages = 0  # messages of peers that never authenticated, dropped unread
        self.reasons: Counter[str] = Counter()
        self._logged: OrderedDict[str, float] = OrderedDict()  # address -> monotonic s of its last line

    def refuse(self, address: str, why: str, channel: str = "data plane") -> None:
        """Count one peer at ``address`` refused for ``why`` (a short phrase) and log it, unless
        a line about that address was logged within :data:`LOG_EVERY_S` seconds."""
        with self._lock:
            self.peers += 1
            self.reasons[why] += 1
            now = time.monotonic()
            last = self._logged.get(address)
            if last is not None and now - last < LOG_EVERY_S:
                return
            self._logged[address] = now
            self._logged.move_to_end(address)
            while len(self._logged) > MAX_TRACKED:
                self._logged.popitem(last=False)
        log.warning("%s: refused a peer at %s: %s (it does not know this job's secret; logged once per "
                    "address every %.0f s)", channel, address, why, LOG_EVERY_S)

    def dropped(self) -> None:
        """Count one message of a peer that never authenticated, dropped unread."""
        with self._lock:
            self.messages += 1

    def describe(self) -> dict[str, Any]:
        """For performance.json: ``peers`` refused, ``messages`` dropped unread, ``reasons``
        (each phrase's count) and ``addresses`` (up to 20 of those logged, newest last)."""
        with self._lock:
            return {"peers": self.peers, "messages": self.messages, "reasons": dict(self.reasons),
                    "addresses": list(self._logged)[-20:]}


class Handshake:
    """A sender's side of the zmq handshake with ``secret`` (None: without proofs): its hello
    with a fresh nonce, the receiver's proof checked and the sender's answer, and whether the
    receiver proved itself before its welcome."""

    def __init__(self, secret: bytes | None):
        self.secret, self.raw, self.proved = secret, b"", False

    def hello(self, worker: int, attempt: int) -> bytes:
        """A new hello's JSON frame (a fresh nonce; the receiver's proof is awaited again)."""
        self.raw = protocol.encode(protocol.hello(worker, attempt, nonce() if self.secret is not None else b""))
        self.proved = False
        return self.raw

    def answer(self, frames: list[bytes]) -> bytes:
        """The answer's JSON frame to the challenge ``frames`` (kind, JSON). Raises
        :class:`~.protocol.NotAuthenticated` (why) when the receiver's proof is wrong."""
        if self.secret is None:
            raise protocol.NotAuthenticated("the receiver asked for a proof (this sender has authenticate=False)")
        try:
            c = json.loads(frames[1][:MAX_HANDSHAKE_BYTES])
            theirs, given = bytes.fromhex(c["nonce"]), bytes.fromhex(c["proof"])
        except (IndexError, ValueError, KeyError, TypeError):
            theirs, given = b"", b""
        if not valid(self.secret, given, RECEIVER, self.raw, theirs):
            raise protocol.NotAuthenticated("the receiver's proof is wrong")
        self.proved = True
        return protocol.encode({"proof": proof(self.secret, SENDER, self.raw, theirs).hex()})

    def welcomed(self) -> None:
        """A welcome came: raises :class:`~.protocol.NotAuthenticated` unless the receiver proved itself."""
        if self.secret is not None and not self.proved:
            raise protocol.NotAuthenticated("the receiver welcomed this sender without a proof")


def peer_address(frame: Any) -> str:
    """The address of the peer a received zmq frame came from (zmq's ``Peer-Address``), or ``?``."""
    try:
        return str(frame.get("Peer-Address"))
    except Exception:  # noqa: BLE001 - a frame without the property: the address is only for the log
        return "?"


class Gate:
    """The receiver's side of the zmq handshake: a hello is answered with a challenge, and
    the sender is let in (its hello returned, to be recorded and welcomed) once its answer
    proves it knows ``secret``; ``secret`` None lets every well-formed hello in at once (no
    authentication: benchmarks and tests of the protocol without it).

    Args:
        secret: the job's secret (:func:`csrun_common.jobsecret.job_secret`), or None.
        refusals: where refused peers are counted.
        tell: sends a control message to one sender (``tell(identity, *frames)``).
    """

    def __init__(self, secret: bytes | None, refusals: Refusals, tell: Callable[..., None]):
        self.secret, self.refusals, self._tell = secret, refusals, tell
        self._pending: OrderedDict[bytes, tuple[bytes, tuple[int, int, dict[str, Any]], bytes]] = OrderedDict()
        self._strangers: OrderedDict[bytes, None] = OrderedDict()  # routing ids refused for a message

    def hello(self, identity: bytes, frames: list) -> tuple[int, int, dict[str, Any]] | None:
        """A hello: ``(worker, attempt, hello)`` to let in now (no secret), else None (a
        challenge was sent, or the hello was refused)."""
        raw = frames[2].bytes if len(frames) > 2 else b""
        try:
            if len(raw) > MAX_HANDSHAKE_BYTES:
                raise ValueError(f"{len(raw)} bytes")
            parsed = protocol.parse_hello(raw)
            theirs = bytes.fromhex(parsed[2]["nonce"]) if self.secret is not None else b""
            if self.secret is not None and len(theirs) != NONCE_BYTES:
                raise ValueError("no nonce")
        except (ValueError, KeyError, TypeError) as e:
            self.refusals.refuse(peer_address(frames[0]), f"a malformed hello ({str(e)[:80]})")
            return None
        if self.secret is None:
            return parsed
        ours = nonce()
        self._pending[identity] = (raw, parsed, ours)
        self._pending.move_to_end(identity)
        while len(self._pending) > MAX_TRACKED:  # a flood of hellos: the oldest handshakes are dropped
            self._pending.popitem(last=False)
        self._tell(identity, protocol.CHALLENGE, json.dumps(
            {"nonce": ours.hex(), "proof": proof(self.secret, RECEIVER, raw, ours).hex()}).encode())
        return None

    def answer(self, identity: bytes, frames: list) -> tuple[int, int, dict[str, Any]] | None:
        """A sender's answer to its challenge: its hello when the proof holds, else None (the
        peer refused and told so)."""
        pending = self._pending.pop(identity, None)
        try:
            raw = frames[2].bytes if len(frames) > 2 else b""
            given = bytes.fromhex(json.loads(raw[:MAX_HANDSHAKE_BYTES])["proof"])
        except (ValueError, KeyError, TypeError):
            given = b""
        if pending is None or self.secret is None or not valid(self.secret, given, SENDER, pending[0], pending[2]):
            why = "an answer without a hello" if pending is None else "a wrong proof"
            self._remember(identity)  # its later messages are dropped, the peer not refused again
            self.refusals.refuse(peer_address(frames[0]), why)
            self._tell(identity, protocol.REFUSED, b"not authenticated: this receiver's job has another secret")
            return None
        return pending[1]

    def stranger(self, frames: list) -> None:
        """A message from a routing id that is not let in: dropped unread and counted; its peer
        is refused once (a message before any handshake)."""
        self.refusals.dropped()
        identity = frames[0].bytes
        if identity in self._pending or identity in self._strangers:
            return
        self._remember(identity)
        self.refusals.refuse(peer_address(frames[0]), "a message before its handshake")

    def _remember(self, identity: bytes) -> None:
        self._strangers[identity] = None
        while len(self._strangers) > MAX_TRACKED:
            self._strangers.popitem(last=False)
