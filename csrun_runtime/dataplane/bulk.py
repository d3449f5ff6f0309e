"""The data plane's bulk channel (issue 31, "Toward one copy" in docs/DATAPLANE.md): a bundle's
bytes on a plain TCP connection per sender, read by the receiver with ``socket.recv_into``
straight into a buffer its consumer lends, so that a received byte is copied once on the
chief's host (by the kernel) instead of twice (by the kernel into libzmq's allocation, then by a
device feed into its pinned memory).

Opt-in (:class:`~csrun_runtime.dataplane.Receiver` ``bulk=True``; ``runconfig.dataplane_bulk``).
The zmq ROUTER keeps everything but the data: hello, welcome, credits, pause, resume, end. The
receiver's welcome names the bulk channel's port; the sender connects to it, says which routing
id it is (:func:`handshake`), then sends every data message there instead of on zmq::

    b"CSB1" | header length (uint32, little-endian) | header (framing.encode_header) | leaf bytes...

each leaf's bytes in order, as many as the header declares. Flow control is unchanged: the
sender keeps at most its window unacknowledged and the receiver acknowledges on zmq when a
bundle is handed out. A connection that ends between messages is a sender that closed; one that
ends inside a message (a worker killed mid-bundle) drops that bundle, as zmq drops a partial
multipart message. A stream that cannot be parsed is closed (there is no resynchronising it).

Pure transport: standard library, numpy. One :class:`BulkListener` per receiver (an accept
thread, a reader thread per connection), one :class:`BulkWriter` per sender.
"""
from __future__ import annotations

import logging
import queue
import socket
import struct
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from . import framing
from .framing import FrameError

log = logging.getLogger(__name__)

MAGIC = b"CSB1"
_PREFIX = struct.Struct("<4sI")
#: Most bytes of a data message's header the receiver accepts (a bound on what a corrupt
#: stream makes it allocate before it is refused).
MAX_HEADER_BYTES = 1 << 22
#: Leaves start at multiples of this many bytes in a lent buffer (cache lines; every dtype's alignment).
LEAF_ALIGN = 64
#: Buffers handed to one ``sendmsg`` (Linux's IOV_MAX is 1024).
_IOV_BATCH = 512

#: ``allocate(nbytes) -> writable buffer``: what a receiver's consumer lends (:meth:`BulkListener.lend`).
Allocate = Callable[[int], Any]


def _default_allocate(nbytes: int) -> np.ndarray:
    return np.empty(nbytes, np.uint8)


def offsets(layout: framing.Layout) -> tuple[list[int], int]:
    """Where each leaf of ``layout`` starts in a lent buffer (bytes, multiples of
    :data:`LEAF_ALIGN`) and the buffer's total size in bytes."""
    out, pos = [], 0
    for nb in layout.nbytes:
        out.append(pos)
        pos += -(-nb // LEAF_ALIGN) * LEAF_ALIGN
    return out, pos


def handshake(identity: bytes) -> bytes:
    """The first bytes a sender writes on its bulk connection: its zmq routing id,
    length-prefixed (uint16, little-endian)."""
    return struct.pack("<H", len(identity)) + identity


def message_prefix(header: bytes) -> bytes:
    """The bytes before a data message's leaves: :data:`MAGIC`, the header's length, the header."""
    return _PREFIX.pack(MAGIC, len(header)) + header


class BulkWriter:
    """A sender's bulk connection to ``(host, port)`` (blocking; one thread).

    Raises ``OSError`` when it cannot connect within ``timeout`` seconds; :meth:`send`
    raises ``OSError`` (``BrokenPipeError``, ``ConnectionResetError``) when the receiver is
    gone."""

    def __init__(self, host: str, port: int, identity: bytes, timeout: float = 10.0):
        self.port = port
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.settimeout(None)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.sendall(handshake(identity))

    def send(self, header: bytes, leaves: Sequence[np.ndarray]) -> None:
        """Write one data message: the prefix and header, then each leaf's bytes (C-contiguous
        arrays; no copy: ``sendmsg`` reads them where they are)."""
        bufs = [memoryview(message_prefix(header))]
        bufs += [memoryview(a).cast("B") for a in leaves if a.nbytes]  # type: ignore[arg-type]
        for i in range(0, len(bufs), _IOV_BATCH):
            self._sendmsg_all(bufs[i:i + _IOV_BATCH])

    def _sendmsg_all(self, bufs: list[memoryview]) -> None:
        while bufs:
            sent = self.sock.sendmsg(bufs)
            while bufs and sent >= bufs[0].nbytes:
                sent -= bufs[0].nbytes
                bufs.pop(0)
            if bufs and sent:
                bufs[0] = bufs[0][sent:]

    def close(self) -> None:
        """End the stream (what was written is still delivered) and close."""
        try:
            self.sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        self.sock.close()


class _Cut(Exception):
    """The connection ended: ``mid`` says inside a message (how many bytes of it were read)."""

    def __init__(self, mid: str | None = None):
        super().__init__(mid or "closed")
        self.mid = mid


def _recv_into(conn: socket.socket, view: memoryview, what: str) -> None:
    """Fill ``view`` from ``conn``; raises :class:`_Cut` when the connection ends first."""
    got, n = 0, view.nbytes
    while got < n:
        r = conn.recv_into(view[got:], n - got)
        if r == 0:
            raise _Cut(f"{what}: {got} of {n} bytes")
        got += r


def _recv_exact(conn: socket.socket, n: int, what: str, at_boundary: bool = False) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    if at_boundary and n:
        r = conn.recv_into(view, n)
        if r == 0:
            raise _Cut(None)
        if r < n:
            _recv_into(conn, view[r:], what)
    else:
        _recv_into(conn, view, what)
    return bytes(buf)


class BulkListener:
    """The receiver's end of the bulk channel: a TCP socket listening on ``host`` (``""``:
    every interface) and a reader thread per connected sender, which reads each data message
    into a buffer from the lent ``allocate`` (default: a fresh ``numpy`` array) and posts it.

    What the reader threads post is taken on the receiver's thread by :meth:`take`:
    ``("data", identity, layout, leaves)``, ``("end", identity, None, False)`` (the sender
    closed between messages), ``("end", identity, reason, False)`` (cut inside a message, or the
    connection failed) or ``("end", identity, reason, True)`` (a stream that cannot be parsed: the
    receiver closed the connection). Each post also writes a byte to
    :attr:`wakeup`, a socket the receiver polls beside its zmq socket. Raises ``OSError`` when
    it cannot listen.
    """

    def __init__(self, host: str = ""):
        self._server = socket.create_server((host, 0), backlog=1024)
        self.port: int = self._server.getsockname()[1]
        self.wakeup, self._poke = socket.socketpair()
        self.wakeup.setblocking(False)
        self._poke.setblocking(False)  # a full wakeup buffer already wakes the receiver
        self._posted: queue.SimpleQueue[tuple[str, bytes, Any, Any]] = queue.SimpleQueue()
        self._allocate: Allocate = _default_allocate
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False
        self._threads: list[threading.Thread] = []
        t = threading.Thread(target=self._accept, name="csrun-bulk-accept", daemon=True)
        t.start()
        self._threads.append(t)

    def lend(self, allocate: Allocate | None) -> None:
        """Read later messages into ``allocate(nbytes)`` (None: fresh numpy arrays again).
        ``allocate`` runs on the reader threads (it must be thread-safe) and returns a writable
        buffer of at least ``nbytes`` bytes; every received leaf is a view of one uint8 array
        over it (the leaf's ``.base``, whose ``.base`` is that object), so it stays valid while
        an array refers to it."""
        self._allocate = allocate or _default_allocate

    # ----------------------------------------------------------------- threads
    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            with self._lock:
                if self._closed:
                    conn.close()
                    return
                self._conns.add(conn)
                t = threading.Thread(target=self._read, args=(conn,), name="csrun-bulk-read", daemon=True)
                self._threads.append(t)
            t.start()

    def _post(self, item: tuple[str, bytes, Any, Any]) -> None:
        self._posted.put(item)
        try:
            self._poke.send(b"!")
        except OSError:  # closed, or the wakeup socket's buffer is full: the receiver is reading anyway
            pass

    def _read(self, conn: socket.socket) -> None:
        identity = b""
        try:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            (size,) = struct.unpack("<H", _recv_exact(conn, 2, "handshake"))
            identity = _recv_exact(conn, size, "handshake")
            layouts: dict[bytes, framing.Layout] = {}
            while True:
                self._post(("data", identity, *self._message(conn, layouts)))
        except _Cut as e:
            self._post(("end", identity, e.mid, False))
        except FrameError as e:
            self._post(("end", identity, f"bulk channel: {e}; connection closed", True))
        except OSError as e:
            self._post(("end", identity, None if self._closed else f"connection failed: {e}", False))
        except Exception as e:  # noqa: BLE001 - told to the receiver's thread, which names the worker
            self._post(("end", identity, f"bulk channel: receive failed ({type(e).__name__}: {e}); "
                                         "connection closed", True))
        finally:
            with self._lock:
                self._conns.discard(conn)
            conn.close()

    def _message(self, conn: socket.socket, layouts: dict[bytes, framing.Layout]) -> tuple[Any, list[np.ndarray]]:
        """One data message's layout and leaves (views of one lent buffer)."""
        magic, hlen = _PREFIX.unpack(_recv_exact(conn, _PREFIX.size, "message prefix", at_boundary=True))
        if magic != MAGIC or hlen > MAX_HEADER_BYTES:
            raise FrameError(f"stream is not a bulk data message (prefix {magic!r}, header {hlen} bytes)")
        layout = framing.parse_header_cached(layouts, _recv_exact(conn, hlen, "header"))
        starts, total = offsets(layout)
        buf = np.frombuffer(self._lent(max(total, 1)), np.uint8, count=max(total, 1))
        view = memoryview(buf)  # type: ignore[arg-type]
        leaves = []
        for j, (start, nb, dt, shape) in enumerate(zip(starts, layout.nbytes, layout.dtypes, layout.shapes,
                                                       strict=True)):
            if nb:
                _recv_into(conn, view[start:start + nb], f"leaf {j} of a {total}-byte bundle")
            leaves.append(buf[start:start + nb].view(dt).reshape(shape) if nb else np.empty(shape, dt))
        return layout, leaves

    def _lent(self, nbytes: int) -> Any:
        """A buffer of ``nbytes`` from the lent ``allocate``; when that fails (e.g. pinned memory
        exhausted), a warning and fresh numpy arrays from then on."""
        allocate = self._allocate
        try:
            return allocate(nbytes)
        except Exception as e:  # noqa: BLE001 - the stream goes on in ordinary memory
            if allocate is not _default_allocate:
                log.warning("data plane: the consumer's buffers (%s bytes) failed (%s: %s); receiving into "
                            "ordinary memory from now on", nbytes, type(e).__name__, e)
                self._allocate = _default_allocate
                return _default_allocate(nbytes)
            raise

    # ----------------------------------------------------------------- the receiver's side
    def take(self) -> list[tuple[str, bytes, Any, Any]]:
        """What the reader threads posted since the last call, in order (non-blocking)."""
        try:
            while self.wakeup.recv(4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass
        out = []
        while True:
            try:
                out.append(self._posted.get_nowait())
            except queue.Empty:
                return out

    def close(self, timeout: float = 2.0) -> None:
        """Stop listening, cut every connection and wait up to ``timeout`` s for the threads.
        Arrays already posted stay valid."""
        with self._lock:
            self._closed = True
            conns = list(self._conns)
        for s in (self._server, *conns):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._server.close()
        for t in self._threads:
            t.join(timeout)
        self.wakeup.close()
        self._poke.close()
