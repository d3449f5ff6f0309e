"""The sending end of the data plane (an input worker): batches stacked into bundles, sent to the
chief's receiver under its credit window (:mod:`.protocol`, docs/DATAPLANE.md)."""
from __future__ import annotations

import json
import time
from typing import Any

import numpy as np
import zmq

from . import framing, protocol
from .bulk import BulkWriter
from .protocol import BUNDLE_BYTES, Credits, ReceiverGone, deadline_in, ms_left
from .receive import keep_receive_memory


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
        keep_memory: apply :func:`~csrun_runtime.dataplane.receive.keep_receive_memory` to this
            process (bundles stacked into memory already mapped, not fresh pages).

    Not thread-safe: use one Sender from one thread. Arrays of a one-batch bundle are sent
    without a copy: do not modify them after :meth:`send` (several batches are stacked into a
    new array first). When the receiver's welcome offers its bulk channel (:class:`Receiver`
    ``bulk``), data messages go on a TCP connection of their own (:mod:`.bulk`), written to the
    kernel before :meth:`send` returns. Raises :class:`ValueError` for a negative index or attempt.
    """

    def __init__(self, endpoint: str, worker_index: int, attempt: int = 0, bundle: int | str = "auto",
                 bundle_bytes: int = BUNDLE_BYTES, keep_memory: bool = True):
        if worker_index < 0 or attempt < 0:
            raise ValueError(f"worker_index {worker_index} and attempt {attempt} must be >= 0")
        if bundle != "auto" and (not isinstance(bundle, int) or bundle < 1):
            raise ValueError(f"bundle {bundle!r}: 'auto' or an integer >= 1")
        self.endpoint, self.worker_index, self.attempt = endpoint, worker_index, attempt
        self.bundle, self.bundle_bytes = bundle, bundle_bytes
        if keep_memory:
            keep_receive_memory()
        self._ctx = zmq.Context(1)
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.ROUTING_ID, f"{worker_index}.{attempt}".encode())
        # no linger: close() waits for the receiver's confirmation itself, and a context torn
        # down with zero-copy frames still queued and a linger can hang (pyzmq 27, measured)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.connect(endpoint)
        self._credits = Credits()
        self._refused: str | None = None
        self._ended = False
        self._pending: list[list[np.ndarray]] = []
        self._pending_key: Any = None
        self._pending_tree: Any = None
        self._pending_n = 1
        self._headers: dict[Any, bytes] = {}
        self._bulk: BulkWriter | None = None  # the bulk channel's connection, when the welcome offers one
        self.bundles_sent = self.batches_sent = self.bytes_sent = 0
        self._hello()

    # ----------------------------------------------------------------- control
    def _hello(self) -> None:
        self._close_bulk()
        self._credits.reset()
        self._sock.send_multipart([protocol.HELLO, protocol.encode(protocol.hello(self.worker_index, self.attempt))])

    def _control(self, frames: list[bytes]) -> None:
        kind = frames[0]
        if kind == protocol.ACK:
            self._credits.ack()
        elif kind == protocol.WELCOME:
            info = json.loads(frames[1])
            self._credits.welcome(info)
            if info.get("bulk_port"):
                self._open_bulk(int(info["bulk_port"]))
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
            raise ReceiverGone(f"input worker {self.worker_index} (attempt {self.attempt}) at {self.endpoint}: "
                               f"{self._refused}")

    def _wait_credit(self, deadline: float | None, n: int = 1) -> None:
        self._drain(0)
        # no data before the welcome: it gives the window and says whether to start paused
        while self._credits.blocked(n):
            self._check()
            if not self._drain(ms_left(deadline)) and deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"input worker {self.worker_index} at {self.endpoint}: {self._credits.state()}")
        self._check()

    def _open_bulk(self, port: int) -> None:
        """Connect to the receiver's bulk channel (its welcome's ``bulk_port``) on the
        endpoint's host; a failure refuses further sends (:class:`ReceiverGone`)."""
        if self._bulk is not None and self._bulk.port == port:
            return
        self._close_bulk()
        host = self.endpoint.split("://", 1)[-1].rsplit(":", 1)[0].strip("[]")
        try:
            self._bulk = BulkWriter(host, port, f"{self.worker_index}.{self.attempt}".encode())
        except OSError as e:
            self._refused = f"cannot connect to the receiver's bulk channel at {host}:{port}: {e}"

    def _close_bulk(self) -> None:
        if self._bulk is not None:
            self._bulk.close()
            self._bulk = None

    # ----------------------------------------------------------------- data
    def send(self, nest: Any, timeout: float | None = None) -> None:
        """Add one batch (a nest of arrays, see :mod:`.framing`) to the current bundle; send the
        bundle when it is full. Blocks while the receiver's window is full or this stream is
        paused.

        Raises:
            TimeoutError: no credit within ``timeout`` seconds (None: wait forever).
            ReceiverGone: the receiver refused this attempt or closed.
            TypeError: an object array or a bad dict key in ``nest``.
        """
        tree, leaves = framing.flatten(nest)
        key = (json.dumps(tree), tuple((a.dtype.str, a.shape) for a in leaves))
        if self._pending and key != self._pending_key:
            self.flush(timeout)
        if not self._pending:
            self._pending_key, self._pending_tree = key, tree
            if self.bundle == "auto":
                batch = sum(a.nbytes for a in leaves)
                self._pending_n = max(1, self.bundle_bytes // max(1, batch))
            else:
                self._pending_n = int(self.bundle)
        self._pending.append(leaves)
        if len(self._pending) >= self._pending_n:
            self.flush(timeout)

    def flush(self, timeout: float | None = None) -> None:
        """Send the pending batches now as one bundle (no-op when none). Errors as :meth:`send`."""
        if not self._pending:
            return
        batches = self._pending
        self._send_leaves(self._pending_tree, framing.stack(batches), len(batches), self._pending_key, timeout)
        self._pending = []  # (kept when the send timed out: the next send or flush retries)

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

    def _send_leaves(self, tree: Any, leaves: list[np.ndarray], n: int, key: Any, timeout: float | None) -> None:
        hkey = (key, n)
        header = self._headers.get(hkey)
        if header is None:
            if len(self._headers) > 64:
                self._headers.clear()
            header = self._headers[hkey] = framing.encode_header(tree, leaves, n)
        nbytes = sum(a.nbytes for a in leaves)
        self._wait_credit(deadline_in(timeout), max(1, n))
        if self._bulk is not None:
            try:
                self._bulk.send(header, leaves)
            except OSError as e:
                self._refused = f"the bulk channel broke: {e}"
                self._check()
        else:
            frames: list[Any] = [protocol.DATA, header, *leaves]
            self._sock.send_multipart(frames, copy=False)
        self._credits.sent(nbytes, max(1, n))
        self.bundles_sent += 1
        self.batches_sent += n
        self.bytes_sent += nbytes

    @property
    def window_batches(self) -> int | None:
        """The receiver's batch window (its welcome's ``window_batches``); None before the welcome
        or when the receiver bounds bytes only."""
        return self._credits.window_batches

    def room(self, pending: int = 0, timeout: float = 0.0) -> bool:
        """Whether this worker may take one more batch from its input, with ``pending`` batches
        taken but not sent yet: welcomed, and, under a batch window, the batches sent and not
        taken by the chief plus ``pending`` fewer than ``window_batches``. Handles the control
        messages arriving within ``timeout`` seconds and returns as soon as there is room.

        Raises:
            ReceiverGone: the receiver refused this attempt or closed.
        """
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
        """Whether the receiver has paused this sender, after handling the control messages that
        arrive within ``timeout`` seconds (it returns as soon as a pause is seen). A pause is
        asynchronous: a send that began before its message arrived goes out."""
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
            if self._refused is None:
                self.flush(timeout)
                self._sock.send_multipart([protocol.END, protocol.encode(
                    {"bundles": self.bundles_sent, "batches": self.batches_sent})])
                while not self._ended and self._refused is None and time.monotonic() < deadline:
                    self._drain(ms_left(deadline))
        except (TimeoutError, ReceiverGone):
            pass
        finally:
            self._close_bulk()
            self._sock.close(linger=0)
            self._ctx.term()
        return self._ended

    def __enter__(self) -> Sender:
        return self

    def __exit__(self, *exc: object) -> None:
        if not self._sock.closed:
            self.close()
