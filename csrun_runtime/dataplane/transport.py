"""Senders (input workers) and the receiver (the chief) over zmq: DEALER sockets connected to
one ROUTER bound once, with credit-based flow control (docs/DATAPLANE.md).

Messages (zmq multipart; the ROUTER sees the sender's routing id first, ``b"<index>.<attempt>"``):

=========  ===================  ===========================================================
from       frames               meaning
=========  ===================  ===========================================================
sender     ``H``, JSON          hello: ``{"v", "worker", "attempt", "pid", "host"}``
sender     ``D``, header, bufs  data: one bundle (:mod:`.framing`)
sender     ``E``, JSON          end of stream: ``{"bundles", "batches"}`` the sender sent
receiver   ``W``, JSON          welcome: ``{"window": bytes, "window_batches": n | null, "paused": bool}``
receiver   ``A``                one data message consumed (the sender may send more)
receiver   ``P`` / ``R``        pause / resume this sender
receiver   ``X``, reason        refused (an older attempt than the worker's current one)
receiver   ``?``                unknown sender (the receiver restarted): say hello again
receiver   ``F``                end of stream received
receiver   ``S``                the receiver is closing
=========  ===================  ===========================================================

Flow control: a sender keeps at most ``window`` bytes of data messages unacknowledged (one
message more when it holds none, so a bundle larger than the window still goes) and sends
no data before the receiver's welcome, which says whether it starts paused; the receiver
acknowledges a message when :meth:`Receiver.get_bundle` hands it out. So the chief buffers at
most about ``window`` bytes per worker (in zmq's pipes and the kernel's socket buffers), and
a consumer that stops reading stops every sender within one window.

With ``window_batches`` (:class:`Receiver`), credit is counted in batches too: a sender keeps at
most that many batches not taken by the chief, where a bundle counts as taken when the chief asks
for the next one (the receiver acknowledges a bundle at the next :meth:`Receiver.get_bundle`
call, when it is consumed, instead of when it is handed out); :meth:`Sender.room` tells an input
worker whether it may take one more batch from its input, so that what it read and the chief
has not taken stays within ``window_batches`` (docs/DATAPLANE.md "Read-ahead in batches").
"""
from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import zmq

from . import framing
from .bulk import BulkListener, BulkWriter
from .framing import FrameError
from .receive import auto_io_threads, keep_receive_memory

log = logging.getLogger(__name__)

#: Default bytes of one bundle when ``bundle="auto"``: batches are stacked until a bundle
#: holds at least this much (1 MiB: per-message costs < 1 % at loopback rates; bench_ingest).
BUNDLE_BYTES = 1 << 20
#: Default flow-control window per sender, bytes (4 bundles of :data:`BUNDLE_BYTES`).
WINDOW_BYTES = 4 << 20
PROTOCOL = 1


class EndOfStream(Exception):
    """Every expected sender has ended its stream (:meth:`Sender.close`) and every message
    before its end has been handed out."""


class ReceiverGone(ConnectionError):
    """The receiver refused this sender (an older attempt than the one it reads now) or closed."""


def _ms(deadline: float | None) -> int | None:
    return None if deadline is None else max(0, int((deadline - time.monotonic()) * 1000))


def _deadline(timeout: float | None) -> float | None:
    return None if timeout is None else time.monotonic() + timeout


# =========================================================================== sender
class _Credits:
    """A sender's side of the flow control (:class:`Sender` has it): hello, the receiver's
    control messages, credit, the bulk connection the welcome offers."""

    endpoint: str
    worker_index: int
    attempt: int
    _sock: zmq.Socket
    _bulk: BulkWriter | None
    _window: int | None
    _window_batches: int | None
    _inflight: deque[tuple[int, int]]
    _inflight_bytes: int
    _inflight_batches: int
    _paused: bool
    _refused: str | None
    _ended: bool

    def _hello(self) -> None:
        self._close_bulk()
        self._window, self._window_batches, self._paused = None, None, False
        self._inflight.clear()
        self._inflight_bytes = self._inflight_batches = 0
        self._sock.send_multipart([b"H", json.dumps({
            "v": PROTOCOL, "worker": self.worker_index, "attempt": self.attempt, "pid": os.getpid(),
            "host": socket.gethostname()}).encode()])

    # ----------------------------------------------------------------- control messages
    def _control(self, frames: list[bytes]) -> None:
        kind = frames[0]
        if kind == b"A":
            if self._inflight:
                nbytes, n = self._inflight.popleft()
                self._inflight_bytes -= nbytes
                self._inflight_batches -= n
        elif kind == b"W":
            info = json.loads(frames[1])
            self._window, self._paused = int(info["window"]), bool(info["paused"])
            self._window_batches = int(info.get("window_batches") or 0) or None
            if info.get("bulk_port"):
                self._open_bulk(int(info["bulk_port"]))
        elif kind == b"P":
            self._paused = True
        elif kind == b"R":
            self._paused = False
        elif kind == b"?":
            self._hello()
        elif kind == b"F":
            self._ended = True
        elif kind in (b"X", b"S"):
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

    def _full(self, n: int) -> bool:
        """Whether a message of ``n`` batches must wait for credit (one always goes when none is in flight)."""
        if not self._inflight:
            return False
        assert self._window is not None
        wb = self._window_batches
        return self._inflight_bytes >= self._window or (wb is not None and self._inflight_batches + n > wb)

    def _wait_credit(self, deadline: float | None, n: int = 1) -> None:
        self._drain(0)
        # no data before the welcome: it gives the window and says whether to start paused
        while self._window is None or self._paused or self._full(n):
            self._check()
            if not self._drain(_ms(deadline)) and deadline is not None and time.monotonic() >= deadline:
                state = ("not welcomed (receiver unreachable?)" if self._window is None else
                         "paused by the receiver" if self._paused else
                         f"{self._inflight_bytes} bytes / {self._inflight_batches} batches unacknowledged "
                         f"(window {self._window} bytes / {self._window_batches} batches)")
                raise TimeoutError(f"input worker {self.worker_index} at {self.endpoint}: {state}")
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


class Sender(_Credits):
    """The sending end of one input worker: batches (nests of arrays) stacked into bundles and
    sent to the chief's :class:`Receiver` at ``endpoint``.

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
        self._window: int | None = None  # None until welcomed
        self._window_batches: int | None = None  # the welcome's batch window (None: bytes only)
        self._inflight: deque[tuple[int, int]] = deque()  # (bytes, batches) of each unacknowledged data message
        self._inflight_bytes = self._inflight_batches = 0
        self._paused = False
        self._refused: str | None = None
        self._ended = False
        self._pending: list[list[np.ndarray]] = []
        self._pending_key: Any = None
        self._pending_tree: Any = None
        self._pending_n = 1
        self._headers: dict[Any, bytes] = {}
        self._bulk = None  # the bulk channel's connection, when the receiver's welcome offers one
        self.bundles_sent = self.batches_sent = self.bytes_sent = 0
        self._hello()

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
        self._wait_credit(_deadline(timeout), max(1, n))
        if self._bulk is not None:
            try:
                self._bulk.send(header, leaves)
            except OSError as e:
                self._refused = f"the bulk channel broke: {e}"
                self._check()
        else:
            frames: list[Any] = [b"D", header, *leaves]
            self._sock.send_multipart(frames, copy=False)
        self._inflight.append((nbytes, max(1, n)))
        self._inflight_bytes += nbytes
        self._inflight_batches += max(1, n)
        self.bundles_sent += 1
        self.batches_sent += n
        self.bytes_sent += nbytes

    @property
    def window_batches(self) -> int | None:
        """The receiver's batch window (its welcome's ``window_batches``); None before the welcome
        or when the receiver bounds bytes only."""
        return self._window_batches

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
            wb = self._window_batches
            if self._window is not None and (wb is None or self._inflight_batches + pending < wb):
                return True
            if time.monotonic() >= deadline:
                return False
            self._drain(_ms(deadline))

    def paused(self, timeout: float = 0.0) -> bool:
        """Whether the receiver has paused this sender, after handling the control messages that
        arrive within ``timeout`` seconds (it returns as soon as a pause is seen). A pause is
        asynchronous: a send that began before its message arrived goes out."""
        deadline = time.monotonic() + timeout
        self._drain(0)
        while not self._paused and time.monotonic() < deadline:
            self._drain(_ms(deadline))
        return self._paused

    def close(self, timeout: float = 10.0) -> bool:
        """Send the pending batches and the end of stream, wait up to ``timeout`` seconds for
        the receiver to confirm it, and close. Returns whether it confirmed (False: the
        receiver is gone or slow; what it had not read is lost)."""
        deadline = time.monotonic() + timeout
        try:
            if self._refused is None:
                self.flush(timeout)
                self._sock.send_multipart([b"E", json.dumps({"bundles": self.bundles_sent,
                                                             "batches": self.batches_sent}).encode()])
                while not self._ended and self._refused is None and time.monotonic() < deadline:
                    self._drain(_ms(deadline))
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


# =========================================================================== receiver
@dataclass
class Bundle:
    """One received message: ``n`` batches from input worker ``worker`` (attempt ``attempt``).

    ``nest``: the structure the sender sent, each leaf an array over the received frame (no
    copy) with leading axis ``n`` (the batches stacked); ``nbytes``: the leaves' bytes.

    Lifetime: each array keeps its zmq frame alive (numpy's base chain holds the frame's
    buffer), so the arrays, and views of them, stay valid as long as they are referenced, also
    after the receiver closed; the frame's memory is freed with the last of them. Through the
    bulk channel the arrays are views of one buffer per bundle, which the consumer lent
    (:meth:`Receiver.lend`) or a fresh numpy array; the same rule holds. A consumer
    that copies into its own buffers (a pinned ring for a device) takes :attr:`arrays`, copies
    each once, drops the bundle and rebuilds the nest around its copies (:meth:`rebuild`)."""

    worker: int
    attempt: int
    n: int
    nbytes: int
    nest: Any
    _tree: Any = field(repr=False, default=None)
    _leaves: list = field(repr=False, default_factory=list)
    _identity: bytes = field(repr=False, default=b"")

    @property
    def arrays(self) -> list[np.ndarray]:
        """The leaves in the nest's flattened order (:func:`.framing.flatten`): C-contiguous
        arrays over the received frames, each of shape ``(n, *batch_shape)`` (``n == 0``: as
        sent)."""
        return list(self._leaves)

    def rebuild(self, arrays: list[Any]) -> Any:
        """The bundle's nest with ``arrays`` (one per leaf of :attr:`arrays`, in its order,
        of any type: e.g. a consumer's copies in pinned memory) in place of the received ones.
        Raises :class:`FrameError` when their count differs."""
        return framing.unflatten(self._tree, arrays)

    def batches(self) -> Iterator[Any]:
        """Each batch of the bundle in order: the nest with every leaf's ``[j]`` (views)."""
        for j in range(self.n):
            yield framing.unflatten(self._tree, [a[j, ...] for a in self._leaves])


@dataclass
class _Worker:
    index: int
    attempt: int
    identity: bytes
    pid: int | None = None
    host: str | None = None
    bundles: int = 0
    batches: int = 0
    bytes: int = 0
    errors: int = 0
    stale: int = 0
    done: bool = False
    paused: bool = False
    last: float | None = None
    connected_at: float = 0.0
    attempt_bundles: int = 0  # bundles of this attempt received (the bulk channel's end check)
    end_bundles: int | None = None  # bundles its end of stream says it sent (bulk: not yet done)
    bulk_ended: bool = False  # its bulk connection ended (everything it wrote was read)

    def carry_counts(self, cur: _Worker) -> None:
        """Go on with ``cur``'s counts and pause (a replacement attempt of the same index, or
        the same attempt reconnecting)."""
        self.bundles, self.batches, self.bytes, self.errors, self.stale, self.paused = (
            cur.bundles, cur.batches, cur.bytes, cur.errors, cur.stale, cur.paused)

    def count(self, now: float) -> dict[str, Any]:
        """:meth:`Receiver.counts`' record of this worker at ``now`` (monotonic s)."""
        return {"bundles": self.bundles, "batches": self.batches, "bytes": self.bytes, "attempt": self.attempt,
                "pid": self.pid, "host": self.host, "errors": self.errors, "stale": self.stale, "done": self.done,
                "paused": self.paused, "last_age_s": None if self.last is None else now - self.last}


def _last_bundles(workers: dict[int, _Worker]) -> str:
    """For a timeout's message: each worker's seconds since its last bundle, paused, ended."""
    now = time.monotonic()
    return ", ".join(f"{i}: {'never' if w.last is None else f'{now - w.last:.1f} s ago'}"
                     f"{' (paused)' if w.paused else ''}{' (ended)' if w.done else ''}"
                     for i, w in sorted(workers.items())) or "none connected"


class _Streams:
    """The receiver's per-worker control and record (:class:`Receiver` has it): hello and
    welcome, pause, resume, counts and the bad messages."""

    _workers: dict[int, _Worker]
    _paused: set[int]
    _errors: list[str]
    _ids: dict[bytes, tuple[int, int]]
    _bulk: BulkListener | None
    window_bytes: int
    window_batches: int | None
    strict: bool

    def _tell(self, identity: bytes, *frames: bytes) -> None:
        raise NotImplementedError

    def _error(self, identity: bytes, err: str) -> None:
        w = self._ids.get(identity)
        msg = f"{f'input worker {w[0]} (attempt {w[1]})' if w else f'unknown sender {identity[:40]!r}'}: {err}"
        log.warning("data plane: %s; message dropped", msg)
        self._errors.append(msg)
        del self._errors[:-100]
        if w and w[0] in self._workers:
            self._workers[w[0]].errors += 1
        if self.strict:
            raise FrameError(msg, w[0] if w else None)

    def _hello(self, identity: bytes, frames: list) -> None:
        try:
            h = json.loads(frames[2].bytes)
            index, attempt = int(h["worker"]), int(h["attempt"])
            if h.get("v") != PROTOCOL or index < 0 or attempt < 0:
                raise ValueError(f"protocol {h.get('v')}, worker {index}, attempt {attempt}")
        except (IndexError, ValueError, KeyError, TypeError) as e:
            self._error(identity, f"bad hello: {e}")
            return
        cur = self._workers.get(index)
        if cur is not None and attempt < cur.attempt:
            self._tell(identity, b"X", f"worker {index} is read at attempt {cur.attempt} now".encode())
            return
        self._ids[identity] = (index, attempt)
        w = _Worker(index, attempt, identity, h.get("pid"), h.get("host"), connected_at=time.monotonic())
        if cur is not None:  # a replacement (or the same attempt reconnecting): counts go on
            w.carry_counts(cur)
        w.paused = index in self._paused  # also when paused before it ever connected
        self._workers[index] = w
        welcome = {"window": self.window_bytes, "window_batches": self.window_batches, "paused": w.paused}
        if self._bulk is not None:
            welcome["bulk_port"] = self._bulk.port
        self._tell(identity, b"W", json.dumps(welcome).encode())

    def pause(self, i: int) -> None:
        """Stop worker ``i``'s stream until :meth:`resume` (what it has in flight, at most its window, is still
        handed out); an attempt connecting meanwhile (a replacement, or its first) starts paused."""
        self._pause(i, True)

    def resume(self, i: int) -> None:
        """Let paused worker ``i`` send again."""
        self._pause(i, False)

    def _pause(self, i: int, paused: bool) -> None:
        (self._paused.add if paused else self._paused.discard)(i)
        if (w := self._workers.get(i)) is not None:
            w.paused = paused
            self._tell(w.identity, b"P" if paused else b"R")

    def counts(self) -> dict[int, dict[str, Any]]:
        """Per worker index: ``bundles``, ``batches``, ``bytes`` received (all attempts),
        ``attempt`` (current), ``pid``, ``host``, ``errors`` (bad messages dropped), ``stale``
        (older attempts' messages dropped), ``done`` (ended its stream), ``paused``,
        ``last_age_s`` (seconds since its last bundle; None: none yet)."""
        now = time.monotonic()
        return {i: w.count(now) for i, w in sorted(self._workers.items())}

    def errors(self) -> list[str]:
        """The last (up to 100) bad messages dropped, each naming its sender and the fault."""
        return list(self._errors)


class _BulkSide:
    """The receiver's reading of what is there (:class:`Receiver` has it): its zmq messages and
    its bulk channel's posts (:mod:`.bulk`). Data read by the channel's threads becomes a
    :class:`Bundle` here, on the receiver's thread, under the same checks as a zmq data message."""

    _bulk: BulkListener | None
    _posts: deque[tuple[str, bytes, Any, Any]]
    _poller: zmq.Poller | None
    _sock: zmq.Socket
    _ids: dict[bytes, tuple[int, int]]
    _workers: dict[int, _Worker]

    def _handle(self, frames: list, ack: bool = True) -> Bundle | None:
        raise NotImplementedError

    def _tell(self, identity: bytes, *frames: bytes) -> None:
        raise NotImplementedError

    def _error(self, identity: bytes, err: str) -> None:
        raise NotImplementedError

    def _accept(self, w: _Worker, layout: framing.Layout, leaves: list[np.ndarray]) -> Bundle:
        raise NotImplementedError

    def _wait(self, deadline: float | None) -> bool:
        """Wait until a message or a bulk post is there to read, or ``deadline`` passes (False)."""
        if self._poller is None:
            return bool(self._sock.poll(_ms(deadline)))
        return bool(self._posts) or bool(self._poller.poll(_ms(deadline)))

    def _read_ready(self, ack: bool) -> Bundle | None:
        """Handle what is there to read now until it is a bundle (returned), else None."""
        while True:
            try:
                frames = self._sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            b = self._handle(frames, ack=ack)
            if b is not None:
                return b
        return self._post(ack) if self._bulk is not None else None

    @property
    def bulk_port(self) -> int | None:
        """The bulk channel's TCP port (on the bind address' interface); None without ``bulk``."""
        return None if self._bulk is None else self._bulk.port

    def lend(self, allocate: Any) -> bool:
        """Receive later bundles of the bulk channel into ``allocate(nbytes) -> writable
        buffer`` (called on the channel's reader threads: thread-safe; None: fresh numpy arrays
        again), e.g. a device feed's pinned memory, so that each received byte is copied once,
        by the kernel. Every leaf of such a bundle is a view of one uint8 array over the buffer
        (the leaf's ``.base``, whose ``.base`` is the object ``allocate`` returned). Returns
        False (nothing lent) without ``bulk``."""
        if self._bulk is None:
            return False
        self._bulk.lend(allocate)
        return True

    def _post(self, ack: bool) -> Bundle | None:
        """Handle the bulk channel's posts until one is a bundle (returned; acknowledged with
        ``ack``) or none is left (None)."""
        assert self._bulk is not None
        if not self._posts:
            self._posts.extend(self._bulk.take())
        while self._posts:
            # ("data", identity, layout, leaves) or ("end", identity, reason | None, bad stream)
            kind, identity, first, second = self._posts.popleft()
            who = self._ids.get(identity)
            w = self._workers.get(who[0]) if who else None
            if w is None or w.identity != identity:
                if w is not None:
                    w.stale += kind == "data"  # an older attempt's bundle still in its connection
                elif kind == "data":
                    self._error(identity, "bulk data from a sender that has not said hello")
                continue
            if kind == "end":
                self._bulk_end(w, first, bool(second))
                continue
            b = self._accept(w, first, second)
            self._end_check(w)
            if ack:
                self._tell(identity, b"A")
            return b
        return None

    def _bulk_end(self, w: _Worker, why: str | None, bad: bool) -> None:
        """Worker ``w``'s bulk connection ended: between messages (``why`` None), inside one (that
        bundle is lost: a warning), or closed for a stream that cannot be parsed (``bad``: a bad
        message, :meth:`_error`: recorded, raised under ``strict``)."""
        w.bulk_ended = True
        self._end_check(w)
        if bad:
            self._error(w.identity, str(why))
        elif why:
            log.warning("data plane: input worker %d (attempt %d): bulk connection ended inside a bundle "
                        "(%s); that bundle is dropped", w.index, w.attempt, why)

    def _end_check(self, w: _Worker) -> None:
        """Through the bulk channel a sender's end (on zmq) can overtake its last bundles: it
        is done once they are all read, or its connection ended (nothing more can come)."""
        if w.end_bundles is not None and (w.attempt_bundles >= w.end_bundles or w.bulk_ended):
            w.done = True



class Receiver(_Streams, _BulkSide):
    """The chief's end: one ROUTER socket bound once, read by the calling thread.

    Args:
        bind: where to bind, e.g. ``tcp://*:5555`` or ``tcp://127.0.0.1:0`` (port 0: any free
            port; :attr:`endpoint` says which). Senders connect to it.
        window_bytes: bytes each sender may have unacknowledged (flow control); the chief
            buffers at most about this per sender (plus one bundle).
        window_batches: batches each sender may have sent and the chief not taken (None: bytes
            only). With it a bundle is acknowledged when the next one is asked for (consumed),
            not when it is handed out, so that an input worker that checks :meth:`Sender.room`
            reads at most this many batches ahead of the chief.
        expected: how many workers (indices ``0..expected-1``) end the stream: once all have
            sent their end, :meth:`get_bundle` raises :class:`EndOfStream`. None: never.
        strict: raise :class:`FrameError` from :meth:`get_bundle` for a bad message (after
            dropping it; the next call reads on) instead of only recording it.
        io_threads: zmq I/O threads (None: :func:`.receive.auto_io_threads`, by cores).
        keep_memory: apply :func:`.receive.keep_receive_memory` to this process.
        bulk: also listen for the bulk channel (:mod:`.bulk`; ``runconfig.dataplane_bulk``) on
            the bind address' interface, a free port: the welcome offers it and senders send
            their data there, read on a thread per sender straight into buffers the consumer
            may lend (:meth:`lend`). Control stays on the ROUTER.

    Received arrays are views on zmq's frames, each holding its frame (:class:`Bundle`). A
    truncated or corrupt message is dropped, recorded (:meth:`errors`, ``counts()[i]
    ["errors"]``, a logged warning naming the worker) and acknowledged; reading goes on with
    the other messages. A sender with a higher attempt than its index's current one replaces
    it: what the older attempt still had in flight is dropped (``stale``). Not thread-safe:
    call every method from one thread. Raises ``zmq.ZMQError`` when ``bind`` cannot be bound.
    """

    def __init__(self, bind: str = "tcp://127.0.0.1:0", window_bytes: int = WINDOW_BYTES,
                 expected: int | None = None, strict: bool = False, io_threads: int | None = None,
                 window_batches: int | None = None, keep_memory: bool = True, bulk: bool = False):
        if window_batches is not None and window_batches < 1:
            raise ValueError(f"window_batches {window_batches}: None or an integer >= 1")
        self.window_bytes, self.expected, self.strict = window_bytes, expected, strict
        self.window_batches = window_batches
        self._taken: bytes | None = None  # window_batches: the bundle handed out last, acknowledged at the next call
        if keep_memory:
            keep_receive_memory()
        self._ctx = zmq.Context(io_threads or auto_io_threads())
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.ROUTER_HANDOVER, 1)  # the same id reconnecting takes over
        self._sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a send to a gone sender fails, not drops
        self._sock.setsockopt(zmq.LINGER, 100)
        if bind.endswith(":0"):
            bind = bind[:-2] + ":*"
        self._sock.bind(bind)
        #: The bound address (``tcp://host:port``; ``0.0.0.0`` when bound to every interface).
        self.endpoint: str = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._bulk: BulkListener | None = None
        self._posts: deque[tuple[str, bytes, Any, Any]] = deque()
        self._poller: zmq.Poller | None = None
        if bulk:
            host = bind.split("://", 1)[-1].rsplit(":", 1)[0].strip("[]")
            self._bulk = BulkListener("" if host in ("*", "0.0.0.0") else host)
            self._poller = zmq.Poller()
            self._poller.register(self._sock, zmq.POLLIN)
            self._poller.register(self._bulk.wakeup, zmq.POLLIN)
        self._workers: dict[int, _Worker] = {}
        self._ids: dict[bytes, tuple[int, int]] = {}  # routing id -> (index, attempt)
        self._layouts: dict[bytes, framing.Layout] = {}
        self._ready: deque[tuple[Bundle, bytes]] = deque()  # wait_workers' reads: acked when handed out
        self._current: Bundle | None = None
        self._next_batch = 0
        self._errors: list[str] = []
        self._paused: set[int] = set()  # indices paused (connected or not yet)
        self.t0 = time.monotonic()

    # ----------------------------------------------------------------- control
    def _tell(self, identity: bytes, *frames: bytes) -> None:
        try:
            self._sock.send_multipart([identity, *frames], zmq.NOBLOCK)
        except zmq.ZMQError:  # the sender is gone (ROUTER_MANDATORY) or not reading
            pass

    def _handle(self, frames: list, ack: bool = True) -> Bundle | None:
        identity = frames[0].bytes
        kind = frames[1].bytes if len(frames) > 1 else b""
        if kind == b"H":
            self._hello(identity, frames)
            return None
        who = self._ids.get(identity)
        if who is None:
            self._error(identity, f"message {kind[:8]!r} before its hello; asked to say hello again")
            self._tell(identity, b"?")
            return None
        w = self._workers[who[0]]
        if w.identity != identity:  # an older attempt's message still in flight
            w.stale += 1
            return None
        if kind == b"D":
            b = self._data(w, frames)
            if ack or b is None:  # handed out now (or dropped): the sender may send again
                self._tell(identity, b"A")
            return b
        if kind == b"E":
            if self._bulk is None:
                w.done = True
            else:  # its last bundles may still be in its bulk connection
                try:
                    w.end_bundles = int(json.loads(frames[2].bytes)["bundles"])
                except (IndexError, ValueError, KeyError, TypeError):
                    w.end_bundles = 0
                self._end_check(w)
            self._tell(identity, b"F")
            return None
        self._error(identity, f"unknown message kind {kind[:8]!r} ({len(frames) - 1} frames)")
        return None

    def _data(self, w: _Worker, frames: list) -> Bundle | None:
        try:
            if len(frames) < 3:
                raise FrameError("data message without a header (truncated?)")
            layout = framing.parse_header_cached(self._layouts, frames[2].bytes)
            leaves = framing.decode_leaves(layout, [f.buffer for f in frames[3:]])
            nest = framing.unflatten(layout.tree, leaves)
        except FrameError as e:
            self._error(w.identity, str(e))
            return None
        return self._accept(w, layout, leaves, nest)

    def _accept(self, w: _Worker, layout: framing.Layout, leaves: list[np.ndarray], nest: Any = None) -> Bundle:
        """Count one received bundle of worker ``w`` and make it (``nest``: the leaves rebuilt,
        when the caller has it)."""
        nbytes = sum(layout.nbytes)
        n = max(layout.n, 1)
        w.bundles += 1
        w.attempt_bundles += 1
        w.batches += n
        w.bytes += nbytes
        w.last = time.monotonic()
        if nest is None:
            nest = framing.unflatten(layout.tree, leaves)  # (checked against the layout when it was parsed)
        return Bundle(w.index, w.attempt, layout.n, nbytes, nest, layout.tree, leaves, w.identity)

    def _ended(self) -> bool:
        return self.expected is not None and all(
            (w := self._workers.get(i)) is not None and w.done for i in range(self.expected))

    def _read(self, deadline: float | None) -> Bundle | None:
        """Handle messages until a bundle arrives (returned) or ``deadline`` passes (None)."""
        while True:
            b = self._read_ready(ack=self.window_batches is None)
            if b is not None:
                return b
            if deadline is not None and time.monotonic() >= deadline:
                return None
            if not self._wait(deadline):
                return None

    # ----------------------------------------------------------------- public
    def get_bundle(self, timeout: float | None = None) -> Bundle:
        """The next bundle from any sender (first come, first served; each sender's in its
        order).

        Raises:
            TimeoutError: none arrived within ``timeout`` seconds (None: wait forever); the
                message names the workers and the seconds since each one's last bundle.
            EndOfStream: every expected sender has ended (see ``expected``).
            FrameError: only with ``strict``: a bad message, naming its worker.
        """
        if self._taken is not None:  # window_batches: the last bundle is consumed now
            self._tell(self._taken, b"A")
            self._taken = None
        if self._ready:
            b, _ = self._ready.popleft()
            return self._hand(b)
        deadline = _deadline(timeout)
        while True:
            if self._ended():
                raise EndOfStream(f"all {self.expected} input workers ended their streams")
            # with ``expected``, look at the ends at least every 0.5 s
            step = None if self.expected is None else time.monotonic() + 0.5
            got = self._read(step if deadline is None else deadline if step is None else min(step, deadline))
            if got is not None:
                return got if self.window_batches is None else self._hand(got)
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"no batch from any input worker for {timeout} s "
                                   f"(last bundle per worker: {_last_bundles(self._workers)})")

    def _hand(self, b: Bundle) -> Bundle:
        """Hand ``b`` out: acknowledged now, or with ``window_batches`` at the next call."""
        if self.window_batches is None:
            self._tell(b._identity, b"A")  # handed out: the sender may send again
        else:
            self._taken = b._identity
        return b

    def get(self, timeout: float | None = None) -> tuple[int, Any]:
        """The next single batch: ``(worker_index, nest)``, a batch of the current bundle (views
        into the received frames), or the bundle's nest as sent when it is not stacked
        (``n == 0``). Errors as :meth:`get_bundle`."""
        if self._current is None or self._next_batch >= self._current.n:
            self._current, self._next_batch = self.get_bundle(timeout), 0
            if self._current.n == 0:
                b, self._current = self._current, None
                return b.worker, b.nest
        b = self._current
        j = self._next_batch
        self._next_batch += 1
        return b.worker, framing.unflatten(b._tree, [a[j, ...] for a in b._leaves])

    def wait_workers(self, n: int, timeout: float) -> float:
        """Read until ``n`` distinct worker indices have said hello (data read meanwhile is kept
        for :meth:`get_bundle`); returns the seconds it took. Raises :class:`TimeoutError`
        naming how many connected."""
        t0 = time.monotonic()
        deadline = t0 + timeout
        while len(self._workers) < n:
            b = self._read_ready(ack=False)
            if b is not None:
                self._ready.append((b, b._identity))
            elif len(self._workers) < n and not self._wait(deadline):
                raise TimeoutError(f"{len(self._workers)} of {n} input workers connected within {timeout} s")
        return time.monotonic() - t0

    def close(self) -> None:
        """Tell every sender the receiver is closing (their next send raises
        :class:`ReceiverGone`) and close the socket. Arrays already handed out stay valid."""
        if self._sock.closed:
            return
        for w in self._workers.values():
            self._tell(w.identity, b"S", b"the receiver closed")
        if self._bulk is not None:
            self._bulk.close()
        self._sock.close(linger=100)
        self._ctx.term()

    def __enter__(self) -> Receiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
