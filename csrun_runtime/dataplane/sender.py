"""The sending end of the data plane (an input worker): batches stacked into bundles, sent to the
chief's receiver under its credit window (:mod:`.protocol`, docs/DATAPLANE.md)."""
from __future__ import annotations

import json
import secrets
import struct
import time
from typing import Any

import numpy as np
import zmq

from csrun_common.env import JOB_SECRET
from csrun_common.jobsecret import job_secret

from . import auth, framing, protocol
from .bulk import BulkWriter
from .protocol import BUNDLE_BYTES, Credits, NotAuthenticated, ReceiverGone, deadline_in, ms_left
from .receive import keep_receive_memory
from .shm import RingWriter, attach

_POSITION = struct.Struct("<Q")


class Stack:
    """A sender's batches stacked into the next bundle (``bundle`` batches, or ``"auto"``: as
    many as make ``bundle_bytes``), of one structure, dtype and shape (``key``), and the encoded
    headers of the layouts it sent (at most 65 kept: a steady stream encodes nothing)."""

    def __init__(self, bundle: int | str, bundle_bytes: int):
        self.bundle, self.bundle_bytes = bundle, bundle_bytes
        self.batches: list[list[np.ndarray]] = []
        self.key: Any = None
        self.tree: Any = None
        self.n = 1
        self._headers: dict[Any, bytes] = {}

    def add(self, tree: Any, leaves: list[np.ndarray], key: Any) -> bool:
        """Stack one batch (the first of a bundle sets its ``key``); returns whether the bundle is full."""
        if not self.batches:
            self.key, self.tree = key, tree
            batch = sum(a.nbytes for a in leaves)
            self.n = max(1, self.bundle_bytes // max(1, batch)) if self.bundle == "auto" else int(self.bundle)
        self.batches.append(leaves)
        return len(self.batches) >= self.n

    def header(self, tree: Any, leaves: list[np.ndarray], n: int, key: Any) -> bytes:
        """The header of a bundle of ``n`` batches of ``key``'s layout (:func:`.framing.encode_header`)."""
        header = self._headers.get((key, n))
        if header is None:
            if len(self._headers) > 64:
                self._headers.clear()
            header = self._headers[(key, n)] = framing.encode_header(tree, leaves, n)
        return header


class Outlet:
    """How one sender's data messages travel: on its zmq socket ``sock`` (``D``), or on what the
    receiver's welcome offers: the shared-memory ring (:mod:`.shm`, ``M``; ``accept_ring``: take it)
    or else the bulk channel (:mod:`.bulk`), reached at ``endpoint``'s host as routing id
    ``identity``, proving ``secret``. One thread."""

    def __init__(self, sock: zmq.Socket, endpoint: str, identity: bytes, secret: bytes | None, accept_ring: bool):
        self.sock, self.endpoint, self.identity, self.secret = sock, endpoint, identity, secret
        self.accept_ring = accept_ring
        self.bulk: BulkWriter | None = None
        self.ring: RingWriter | None = None
        self.shm_bundles = 0  # bundles sent through a ring

    def welcome(self, info: dict[str, Any]) -> str | None:
        """Open what the welcome ``info`` offers: its ring (mapped or declined, said back with ``U``:
        the receiver then unlinks it), else its bulk channel. Returns why nothing more may be sent
        (the bulk channel cannot be reached), or None. Raises NotAuthenticated: the bulk listener's
        proof is wrong."""
        if info.get("shm"):
            self.close()
            self.ring, error = attach(info["shm"], self.accept_ring)
            self.sock.send_multipart([protocol.ATTACHED, protocol.encode({"ok": self.ring is not None,
                                                                          "error": error})])
        port = int(info.get("bulk_port") or 0)
        if not port or self.ring is not None or (self.bulk is not None and self.bulk.port == port):
            return None
        self.close()
        host = self.endpoint.split("://", 1)[-1].rsplit(":", 1)[0].strip("[]")
        try:
            self.bulk = BulkWriter(host, port, self.identity, secret=self.secret)
        except OSError as e:
            return f"cannot connect to the receiver's bulk channel at {host}:{port}: {e}"
        return None

    def send(self, header: bytes, leaves: list[np.ndarray], batches: list[list[np.ndarray]] | None) -> str | None:
        """Send one data message (``batches``: the ``n`` batches that stack into ``leaves``, whose
        arrays then give only dtypes and shapes): through the ring when it has room, else on the bulk
        channel or zmq. Returns why nothing more may be sent (the bulk channel broke), or None."""
        pos = self.ring.put(header, leaves, batches) if self.ring is not None else None
        if pos is not None:
            self.sock.send_multipart([protocol.SHM_DATA, header, _POSITION.pack(pos)])
            self.shm_bundles += 1
        elif self.bulk is not None and batches is None:
            try:
                self.bulk.send(header, leaves)
            except OSError as e:
                return f"the bulk channel broke: {e}"
        else:  # on zmq (no room in the ring: its batches stacked now)
            frames: list[Any] = [protocol.DATA, header, *(leaves if batches is None else framing.stack(batches))]
            self.sock.send_multipart(frames, copy=False)
        return None

    def close(self) -> None:
        """Close the bulk connection and unmap the ring (a new hello, or the end)."""
        if self.bulk is not None:
            self.bulk.close()
        if self.ring is not None:
            self.ring.close()
        self.bulk = self.ring = None


class Sender:
    """The sending end of one input worker: batches (nests of arrays) stacked into bundles and
    sent to the chief's :class:`~csrun_runtime.dataplane.Receiver` at ``endpoint``.

    Args:
        endpoint: the receiver's address, e.g. ``tcp://chief-host:5555`` (its
            :attr:`Receiver.endpoint`, with a host the worker can reach).
        worker_index: this worker's index (``>= 0``), as the chief counts it.
        attempt: this worker's attempt (``>= 0``); a replaced worker connects with a higher one
            and the receiver drops what the older attempt still had in flight.
        bundle: batches per message, or ``"auto"``: as many as make :data:`BUNDLE_BYTES`
            (``bundle_bytes``), at least 1. Batches of another structure, dtype or shape than the
            pending ones (e.g. a final smaller batch) start a new bundle.
        bundle_bytes: the ``"auto"`` bundle's size, bytes.
        keep_memory: apply :func:`~csrun_runtime.dataplane.receive.keep_receive_memory` to this process.
        secret: the job's secret (default :func:`csrun_common.jobsecret.job_secret`).
        authenticate: False: no handshake proofs (benchmarks and tests only: any receiver is trusted).

    The receiver must prove it knows the secret before this sender answers, and no data goes
    before the welcome: an endpoint that cannot (a foreign listener) gets only the hello, and
    :meth:`send` raises :class:`NotAuthenticated` naming it. Not thread-safe: one Sender, one
    thread. Arrays of a one-batch bundle are sent without a copy: do not modify them after
    :meth:`send`. With the receiver's bulk channel (:class:`Receiver` ``bulk``) data messages go
    on a TCP connection of their own (:mod:`.bulk`), written to the kernel before :meth:`send`
    returns. On the receiver's node (its welcome offers a ring, :class:`Receiver` ``shm_bytes``)
    each bundle is written into shared memory (:mod:`.shm`; on zmq when the ring has no room
    within :data:`.shm.ROOM_WAIT_S`) and only its header goes on zmq; ``shm=False`` declines.
    Raises :class:`ValueError` for a negative index or attempt.
    """

    def __init__(self, endpoint: str, worker_index: int, attempt: int = 0, bundle: int | str = "auto",
                 bundle_bytes: int = BUNDLE_BYTES, keep_memory: bool = True, secret: bytes | None = None,
                 authenticate: bool = True, shm: bool = True):
        if worker_index < 0 or attempt < 0:
            raise ValueError(f"worker_index {worker_index} and attempt {attempt} must be >= 0")
        if bundle != "auto" and (not isinstance(bundle, int) or bundle < 1):
            raise ValueError(f"bundle {bundle!r}: 'auto' or an integer >= 1")
        self.endpoint, self.worker_index, self.attempt = endpoint, worker_index, attempt
        self.bundle, self.bundle_bytes = bundle, bundle_bytes
        self._shake = auth.Handshake((secret if secret is not None else job_secret()) if authenticate else None)
        if keep_memory:
            keep_receive_memory()
        self._ctx = zmq.Context(1)
        self._sock = self._ctx.socket(zmq.DEALER)
        # not guessable: no other peer can take this connection over (the receiver's ROUTER_HANDOVER)
        self._identity = f"{worker_index}.{attempt}.{secrets.token_hex(8)}".encode()
        self._sock.setsockopt(zmq.ROUTING_ID, self._identity)
        # no linger: close() waits for the receiver's confirmation itself, and a context torn
        # down with zero-copy frames still queued and a linger can hang (pyzmq 27, measured)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.connect(endpoint)
        self._credits = Credits()
        self._refused: str | None = None
        self._untrusted = False  # the endpoint failed to prove it knows the secret
        self._ended = False
        self._stack = Stack(bundle, bundle_bytes)
        self._out = Outlet(self._sock, endpoint, self._identity, self._shake.secret, shm)
        self.bundles_sent = self.batches_sent = self.bytes_sent = 0
        self._hello()

    # ----------------------------------------------------------------- control
    @property
    def shm_bundles(self) -> int:
        """Bundles sent through the shared-memory ring."""
        return self._out.shm_bundles

    def _hello(self) -> None:
        self._out.close()
        self._credits.reset()
        self._sock.send_multipart([protocol.HELLO, self._shake.hello(self.worker_index, self.attempt)])

    def _distrust(self, why: str) -> None:
        """The endpoint failed to prove it knows the secret: nothing more goes to it."""
        self._untrusted = True
        self._refused = f"{why}: it does not know this job's secret ({JOB_SECRET.name}); nothing was sent to it"

    def _control(self, frames: list[bytes]) -> None:
        kind = frames[0]
        if self._untrusted:
            return
        try:
            if kind == protocol.CHALLENGE:
                self._sock.send_multipart([protocol.ANSWER, self._shake.answer(frames)])
            elif kind == protocol.WELCOME:
                self._shake.welcomed()
                info = json.loads(frames[1])
                self._credits.welcome(info)
                self._refused = self._out.welcome(info) or self._refused
        except NotAuthenticated as e:
            return self._distrust(str(e))
        if kind == protocol.ACK:
            self._credits.ack()
        elif kind in (protocol.PAUSE, protocol.RESUME):
            self._credits.paused = kind == protocol.PAUSE
        elif kind == protocol.UNKNOWN:
            self._hello()
        elif kind == protocol.ENDED:
            self._ended = True
        elif kind in (protocol.REFUSED, protocol.CLOSING):
            self._refused = frames[1].decode(errors="replace") if len(frames) > 1 else "the receiver closed"

    def _drain(self, timeout_ms: int | None) -> bool:
        """Handle control messages: wait up to ``timeout_ms`` (None: forever) for the first."""
        if not self._sock.poll(timeout_ms):
            return False
        while True:
            try:
                self._control(self._sock.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                return True

    def _check(self) -> None:
        if self._refused is not None:
            raise (NotAuthenticated if self._untrusted else ReceiverGone)(
                f"input worker {self.worker_index} (attempt {self.attempt}) at {self.endpoint}: {self._refused}")

    def _wait_credit(self, deadline: float | None, n: int = 1) -> None:
        self._drain(0)
        # no data before the welcome: it gives the window and says whether to start paused
        while self._credits.blocked(n):
            self._check()
            if not self._drain(ms_left(deadline)) and deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"input worker {self.worker_index} at {self.endpoint}: {self._credits.state()}")
        self._check()

    # ----------------------------------------------------------------- data
    def send(self, nest: Any, timeout: float | None = None) -> None:
        """Add one batch (a nest of arrays, see :mod:`.framing`) to the current bundle, sent when full. Blocks while
        the receiver's window is full or this stream is paused. Raises ``TimeoutError`` (no credit within ``timeout``
        seconds; None: wait forever), :class:`ReceiverGone` (the receiver refused this attempt or closed),
        ``TypeError`` (an object array or a bad dict key in ``nest``)."""
        tree, leaves = framing.flatten(nest)
        key = (json.dumps(tree), tuple((a.dtype.str, a.shape) for a in leaves))
        if self._stack.batches and key != self._stack.key:
            self.flush(timeout)
        if self._stack.add(tree, leaves, key):
            self.flush(timeout)

    def flush(self, timeout: float | None = None) -> None:
        """Send the pending batches now as one bundle (no-op when none). Errors as :meth:`send`."""
        st = self._stack
        if st.batches:
            n = len(st.batches)
            if self._out.ring is not None and n > 1:  # stacked straight into the ring, not into new arrays first
                shapes = [np.broadcast_to(a[np.newaxis], (n, *a.shape)) for a in st.batches[0]]
                self._send_leaves(st.tree, shapes, n, st.key, timeout, st.batches)
            else:
                self._send_leaves(st.tree, framing.stack(st.batches), n, st.key, timeout)
            st.batches = []  # (kept when the send timed out: the next send or flush retries)

    def send_bundle(self, nest: Any, n: int, timeout: float | None = None) -> None:
        """Send ``n`` batches already stacked (every leaf of ``nest`` has leading axis ``n``,
        e.g. tf.data's ``batch(n)`` of batches) as one message, after any pending batches.
        Errors as :meth:`send`; :class:`ValueError` when a leaf lacks the leading axis ``n``."""
        self.flush(timeout)
        tree, leaves = framing.flatten(nest)
        for j, a in enumerate(leaves):
            if a.ndim == 0 or a.shape[0] != n:
                raise ValueError(f"send_bundle: leaf {j} has shape {a.shape}, not a leading axis of {n}")
        key = (json.dumps(tree), tuple((a.dtype.str, a.shape[1:]) for a in leaves))
        self._send_leaves(tree, leaves, n, key, timeout)

    def _send_leaves(self, tree: Any, leaves: list[np.ndarray], n: int, key: Any, timeout: float | None,
                     batches: list[list[np.ndarray]] | None = None) -> None:
        """Send one bundle: ``leaves`` with leading axis ``n``, or (``batches``) ``n`` batches whose leaves stack
        into them (then ``leaves`` give only the dtypes and shapes: the ring is written from ``batches``)."""
        header = self._stack.header(tree, leaves, n, key)
        nbytes = sum(a.nbytes for a in leaves)
        self._wait_credit(deadline_in(timeout), max(1, n))
        broke = self._out.send(header, leaves, batches)
        if broke is not None:
            self._refused = broke
            self._check()
        self._credits.sent(nbytes, max(1, n))
        self.bundles_sent += 1
        self.batches_sent += n
        self.bytes_sent += nbytes

    @property
    def window_batches(self) -> int | None:
        """The receiver's batch window (from its welcome); None before the welcome or when the receiver bounds bytes."""
        return self._credits.window_batches

    def room(self, pending: int = 0, timeout: float = 0.0) -> bool:
        """Whether this worker may take one more batch from its input, with ``pending`` batches
        taken but not sent yet: welcomed, and, under a batch window, the batches sent and not
        taken by the chief plus ``pending`` fewer than ``window_batches``. Handles the control
        messages arriving within ``timeout`` seconds and returns as soon as there is room.
        Raises :class:`ReceiverGone` when the receiver refused this attempt or closed."""
        deadline = time.monotonic() + timeout
        while True:
            self._drain(0)
            self._check()
            if self._credits.room(pending):
                return True
            if time.monotonic() >= deadline:
                return False
            self._drain(ms_left(deadline))

    def paused(self, timeout: float = 0.0) -> bool:
        """Whether the receiver has paused this sender, after handling the control messages of the
        next ``timeout`` s (returns at a pause; a send begun before its message arrived goes out)."""
        deadline = time.monotonic() + timeout
        self._drain(0)
        while not self._credits.paused and time.monotonic() < deadline:
            self._drain(ms_left(deadline))
        return self._credits.paused

    def close(self, timeout: float = 10.0) -> bool:
        """Send the pending batches and the end of stream, wait up to ``timeout`` seconds for
        the receiver to confirm it, and close. Returns whether it confirmed (False: the
        receiver is gone or slow; what it had not read is lost)."""
        deadline = time.monotonic() + timeout
        try:
            while self._credits.window is None and self._refused is None and time.monotonic() < deadline:
                self._drain(ms_left(deadline))  # the end goes after the handshake, as data does
            if self._refused is None and self._credits.window is not None:
                self.flush(timeout)
                self._sock.send_multipart([protocol.END, protocol.encode(
                    {"bundles": self.bundles_sent, "batches": self.batches_sent})])
                while not self._ended and self._refused is None and time.monotonic() < deadline:
                    self._drain(ms_left(deadline))
        except (TimeoutError, ReceiverGone):
            pass
        finally:
            self._out.close()
            self._sock.close(linger=0)
            self._ctx.term()
        return self._ended

    def __enter__(self) -> Sender:
        return self

    def __exit__(self, *exc: object) -> None:
        if not self._sock.closed:
            self.close()
