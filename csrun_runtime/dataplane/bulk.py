"""The data plane's bulk channel (issue 31, "Toward one copy" in docs/DATAPLANE.md): a bundle's
bytes on a plain TCP connection per sender, read by the receiver with ``socket.recv_into``
straight into a buffer its consumer lends, so that a received byte is copied once on the
chief's host (by the kernel) instead of twice (by the kernel into libzmq's allocation, then by a
device feed into its pinned memory).

Opt-in (:class:`~csrun_runtime.dataplane.Receiver` ``bulk=True``; ``runconfig.dataplane_bulk``).
The zmq ROUTER keeps everything but the data: hello, welcome, credits, pause, resume, end. The
receiver's welcome names the bulk channel's port; the sender connects to it and both prove they
know the job's secret (:mod:`.auth`), the listener first::

    sender:   b"CSH1" | routing id length (uint8) | routing id | sender's nonce (16 bytes)
    listener: listener's nonce (16 bytes) | its proof (32 bytes)
    sender:   its proof (32 bytes), once it has checked the listener's

(without a secret, :func:`handshake`: the routing id, length-prefixed). A peer that fails, or
sends anything else, is refused, counted and closed (a few bytes read, nothing allocated). Then
the sender sends every data message there instead of on zmq::

    b"CSB1" | header length (uint32, little-endian) | header (framing.encode_header) | leaf bytes...

each leaf's bytes in order, as many as the header declares. Flow control is unchanged: the
sender keeps at most its window unacknowledged and the receiver acknowledges on zmq when a
bundle is handed out. A connection that ends between messages is a sender that closed; one that
ends inside a message (a worker killed mid-bundle) drops that bundle, as zmq drops a partial
multipart message. A stream that cannot be parsed is closed (there is no resynchronising it).

A header declaring more bytes than the receiver's bound, or a message sent beyond the sender's
credit window (more than a window's bytes read and not yet taken by the receiver), is refused
before its buffer is allocated, and the connection closed.

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

from . import auth, framing
from .auth import Refusals
from .framing import FrameError
from .protocol import MAX_MESSAGE_BYTES, NotAuthenticated

log = logging.getLogger(__name__)

MAGIC = b"CSB1"
#: The first bytes of an authenticating sender's handshake.
HELLO_MAGIC = b"CSH1"
#: Seconds a connection has to complete its handshake.
HANDSHAKE_TIMEOUT_S = 10.0
#: Most connections in their handshake at once; more are closed at once (refused).
MAX_HANDSHAKES = 64
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
    """A sender's first bytes on its bulk connection: its zmq routing id, length-prefixed (uint16, little-endian)."""
    return struct.pack("<H", len(identity)) + identity


def message_prefix(header: bytes) -> bytes:
    """The bytes before a data message's leaves: :data:`MAGIC`, the header's length, the header."""
    return _PREFIX.pack(MAGIC, len(header)) + header


def auth_hello(identity: bytes, nonce: bytes) -> bytes:
    """An authenticating sender's first bytes: :data:`HELLO_MAGIC`, its routing id (uint8 length prefix), its nonce."""
    return HELLO_MAGIC + struct.pack("<B", len(identity)) + identity + nonce


class BulkWriter:
    """A sender's bulk connection to ``(host, port)`` (blocking; one thread), as routing id
    ``identity``, proving it knows ``secret`` once the listener has proved it (None: no
    authentication, :func:`handshake`).

    Raises ``OSError`` when it cannot connect or complete the handshake within ``timeout``
    seconds, :class:`~csrun_runtime.dataplane.protocol.NotAuthenticated` when the listener's
    proof is wrong (nothing sent but the hello); :meth:`send` raises ``OSError``
    (``BrokenPipeError``, ``ConnectionResetError``) when the receiver is gone."""

    def __init__(self, host: str, port: int, identity: bytes, timeout: float = 10.0, secret: bytes | None = None):
        self.port = port
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            if secret is None:
                self.sock.sendall(handshake(identity))
            else:
                self._prove(identity, secret)
        except BaseException:
            self.sock.close()
            raise
        self.sock.settimeout(None)

    def _prove(self, identity: bytes, secret: bytes) -> None:
        ours = auth.nonce()
        self.sock.sendall(auth_hello(identity, ours))
        try:
            reply = _recv_exact(self.sock, auth.NONCE_BYTES + auth.PROOF_BYTES, "the listener's proof")
        except _Cut as e:
            raise NotAuthenticated(f"the bulk channel at port {self.port} closed before its proof ({e})") from None
        theirs, given = reply[:auth.NONCE_BYTES], reply[auth.NONCE_BYTES:]
        if not auth.valid(secret, given, auth.BULK_RECEIVER, identity, ours, theirs):
            raise NotAuthenticated(f"the bulk channel at port {self.port} gave a wrong proof")
        self.sock.sendall(auth.proof(secret, auth.BULK_SENDER, identity, ours, theirs))

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


class _Refused(Exception):
    """A connection that failed its handshake (the message: why, a short phrase)."""


def listener_handshake(conn: socket.socket, secret: bytes | None) -> bytes:
    """The listener's side of a connection's handshake (the module docstring): the sender's
    routing id once it has proved it knows ``secret`` (None: the unauthenticated handshake).
    Reads at most 4 + 1 + 255 + 16 + 32 bytes; raises :class:`_Refused` (why) or ``OSError``."""
    try:
        if secret is None:
            (size,) = struct.unpack("<H", _recv_exact(conn, 2, "handshake"))
            return _recv_exact(conn, size, "handshake")
        head = _recv_exact(conn, len(HELLO_MAGIC) + 1, "handshake")
        if head[:len(HELLO_MAGIC)] != HELLO_MAGIC:
            raise _Refused(f"not a handshake (first bytes {head[:len(HELLO_MAGIC)]!r})")
        identity = _recv_exact(conn, head[-1], "handshake")
        theirs = _recv_exact(conn, auth.NONCE_BYTES, "handshake")
        ours = auth.nonce()
        conn.sendall(ours + auth.proof(secret, auth.BULK_RECEIVER, identity, theirs, ours))
        given = _recv_exact(conn, auth.PROOF_BYTES, "the sender's proof")
    except _Cut as e:
        raise _Refused(f"the handshake ended early ({e})") from None
    except TimeoutError:
        raise _Refused(f"no handshake within {HANDSHAKE_TIMEOUT_S:g} s") from None
    if not auth.valid(secret, given, auth.BULK_SENDER, identity, theirs, ours):
        raise _Refused("a wrong proof")
    return identity


class _Conn:
    """One connection's bytes read and posted, not yet taken by the receiver (its credit in use)."""

    __slots__ = ("held",)

    def __init__(self) -> None:
        self.held = 0


class BulkListener:
    """The receiver's end of the bulk channel: a TCP socket listening on ``host`` (``""``:
    every interface) and a reader thread per connected sender, which completes the handshake
    (``secret``: the job's, None: without authentication; a failure is counted in
    ``refusals``), then reads each data message into a buffer from the lent ``allocate``
    (default: a fresh ``numpy`` array) and posts it. A message whose header declares more than
    ``max_bytes``, or that starts while the connection holds ``window_bytes`` or more not taken
    yet, closes the connection before its buffer is allocated.

    What the reader threads post is taken on the receiver's thread by :meth:`take`:
    ``("data", identity, layout, leaves)``, ``("end", identity, None, False)`` (the sender
    closed between messages), ``("end", identity, reason, False)`` (cut inside a message, or the
    connection failed) or ``("end", identity, reason, True)`` (a stream that cannot be parsed: the
    receiver closed the connection). Each post also writes a byte to
    :attr:`wakeup`, a socket the receiver polls beside its zmq socket. Raises ``OSError`` when
    it cannot listen.
    """

    def __init__(self, host: str = "", secret: bytes | None = None, refusals: Refusals | None = None,
                 max_bytes: int = MAX_MESSAGE_BYTES, window_bytes: int | None = None):
        self.secret, self.max_bytes, self.window_bytes = secret, max_bytes, window_bytes
        self.refusals = refusals if refusals is not None else Refusals()
        self._server = socket.create_server((host, 0), backlog=1024)
        self.port: int = self._server.getsockname()[1]
        self.wakeup, self._poke = socket.socketpair()
        self.wakeup.setblocking(False)
        self._poke.setblocking(False)  # a full wakeup buffer already wakes the receiver
        self._posted: queue.SimpleQueue[tuple[tuple[str, bytes, Any, Any], _Conn | None, int]] = queue.SimpleQueue()
        self._allocate: Allocate = _default_allocate
        self._conns: set[socket.socket] = set()
        self._handshaking = 0
        self._lock = threading.Lock()
        self._closed = False
        self._threads: list[threading.Thread] = []
        t = threading.Thread(target=self._accept, name="csrun-bulk-accept", daemon=True)
        t.start()
        self._threads.append(t)

    def lend(self, allocate: Allocate | None) -> None:
        """Read later messages into ``allocate(nbytes)`` (thread-safe; None: numpy arrays): see Receiver.lend."""
        self._allocate = allocate or _default_allocate

    # ----------------------------------------------------------------- threads
    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, address = self._server.accept()
            except OSError:
                return
            with self._lock:
                if self._closed:
                    conn.close()
                    return
                busy = self._handshaking >= MAX_HANDSHAKES
                if not busy:
                    self._handshaking += 1
                    self._conns.add(conn)
                    self._threads = [t for t in self._threads if t.is_alive()]
                    t = threading.Thread(target=self._read, args=(conn, address), name="csrun-bulk-read",
                                         daemon=True)
                    self._threads.append(t)
            if busy:
                self.refusals.refuse(_address(address), f"more than {MAX_HANDSHAKES} handshakes at once",
                                     "bulk channel")
                conn.close()
            else:
                t.start()

    def _post(self, item: tuple[str, bytes, Any, Any], conn: _Conn | None = None, nbytes: int = 0) -> None:
        if conn is not None:
            with self._lock:
                conn.held += nbytes
        self._posted.put((item, conn, nbytes))
        try:
            self._poke.send(b"!")
        except OSError:  # closed, or the wakeup socket's buffer is full: the receiver is reading anyway
            pass

    def _greet(self, conn: socket.socket, address: Any) -> bytes | None:
        """The handshake of a new connection: the sender's routing id, or None (refused)."""
        try:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.settimeout(HANDSHAKE_TIMEOUT_S)
            identity = listener_handshake(conn, self.secret)
            conn.settimeout(None)
            return identity
        except _Refused as e:
            self.refusals.refuse(_address(address), str(e), "bulk channel")
        except OSError as e:
            if not self._closed:
                self.refusals.refuse(_address(address), f"the handshake failed ({e})", "bulk channel")
        finally:
            with self._lock:
                self._handshaking -= 1
        return None

    def _read(self, conn: socket.socket, address: Any) -> None:
        identity = b""
        try:
            got = self._greet(conn, address)
            if got is None:
                return
            identity, state = got, _Conn()
            layouts: dict[bytes, framing.Layout] = {}
            while True:
                layout, leaves = self._message(conn, layouts, state)
                self._post(("data", identity, layout, leaves), state, sum(layout.nbytes))
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

    def _message(self, conn: socket.socket, layouts: dict[bytes, framing.Layout],
                 state: _Conn) -> tuple[Any, list[np.ndarray]]:
        """One data message's layout and leaves (views of one lent buffer). Raises
        :class:`FrameError` for a bad prefix or header, one over the bounds, or one sent beyond
        the connection's credit window, before the leaves' buffer is allocated."""
        magic, hlen = _PREFIX.unpack(_recv_exact(conn, _PREFIX.size, "message prefix", at_boundary=True))
        if magic != MAGIC or hlen > MAX_HEADER_BYTES:
            raise FrameError(f"stream is not a bulk data message (prefix {magic!r}, header {hlen} bytes)")
        layout = framing.parse_header_cached(layouts, _recv_exact(conn, hlen, "header"), self.max_bytes)
        with self._lock:
            held = state.held
        if self.window_bytes is not None and held and held >= self.window_bytes:
            raise FrameError(f"a message sent beyond the credit window ({held} bytes not taken yet, window "
                             f"{self.window_bytes})")
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
        """What the reader threads posted since the last call, in order (non-blocking); what
        is taken no longer counts against its connection's window."""
        try:
            while self.wakeup.recv(4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass
        out: list[tuple[str, bytes, Any, Any]] = []
        while True:
            try:
                item, conn, nbytes = self._posted.get_nowait()
            except queue.Empty:
                return out
            if conn is not None:
                with self._lock:
                    conn.held -= nbytes
            out.append(item)

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


def _address(address: Any) -> str:
    """``host:port`` of an accepted connection's peer."""
    return f"{address[0]}:{address[1]}" if isinstance(address, tuple) and len(address) >= 2 else str(address)
