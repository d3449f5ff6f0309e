"""The data plane's shared-memory ring (issue 43, item 4; docs/DATAPLANE.md "Co-located input
workers: the shared-memory ring"): an input worker on the chief's own node (the chief's
own input worker, or any worker Slurm placed there) writes each bundle into a ring of shared
memory the receiver made for it, and sends only the header and the bundle's position on zmq. The
chief's arrays are views of the ring: no kernel copy, no copy by the chief. On a CUDA chief the
ring is registered with the driver as pinned memory (``cudaHostRegister``, through the receiver's
:meth:`~csrun_runtime.dataplane.Receiver.on_shared_memory`), so the one copy a batch makes on
the chief's side is the GPU's copy engine reading it.

The ring is a file under ``/dev/shm`` (tmpfs), made by the receiver for one attempt of one
worker: mode 0600, its pages reserved at once (``posix_fallocate``: a full tmpfs fails here,
with a warning and the TCP path, instead of a ``SIGBUS`` in the worker's write later), named
``csrun-dp-<receiver pid>-<16 hex digits>``. Its first :data:`HEADER_BYTES` hold a magic, a
random token and the ring's size, and at byte 64 ``tail`` (uint64): how far the receiver has
freed. The welcome names the file and token (after the handshake: only a sender that proved it
knows the job's secret learns them); the sender opens it, checks the token (the same file, in the
same ``/dev/shm``: not a container of its own) and says whether it attached (``U``), and the
receiver unlinks the name at once: from then on no name is left to leak, whatever is killed.

Positions are byte counts since the ring's start (uint64, only growing); position ``p`` is at
byte ``p % size`` of the data area. A bundle is contiguous: one that would cross the end starts
at the next turn (the bytes skipped count as free). The sender writes a bundle at its head once
``head + nbytes - tail <= size``, then sends ``M | header | position``; the receiver checks the
position (not before the end of the last one, inside the ring, not over bytes still in use) and
hands out leaves that are views of the ring at 64-byte offsets (:func:`.bulk.offsets`). Each
bundle's bytes are a *lease* (a ``ctypes`` array, the base of its arrays, as
:mod:`csrun_runtime.pytorch.pinned`'s): when the last array over it is collected, its bytes are
freed and ``tail`` moves over every freed byte in order. So arrays stay valid as long as they
are referenced, as on the other paths, and a consumer holding bundles holds back the sender.

A sender that finds no room within :data:`ROOM_WAIT_S` (the consumer holds the ring's bytes)
sends that bundle on zmq instead; a bundle larger than the ring always goes on zmq. A worker
killed while writing sent no ``M`` for it: nothing partial is handed out. A replacement attempt
gets a ring of its own; the old one goes when the last array over it does.

Standard library and numpy only.
"""
from __future__ import annotations

import collections
import ctypes
import logging
import mmap
import os
import secrets
import struct
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from . import framing
from .bulk import offsets
from .framing import FrameError

log = logging.getLogger(__name__)

MAGIC = b"CSRING1\0"
#: Bytes before the data area: magic, token, size; ``tail`` at byte :data:`TAIL_AT`.
HEADER_BYTES = 4096
TAIL_AT = 64
_TOKEN_BYTES = 16
_HEAD = struct.Struct("<8s16sQ")
#: Where rings are made (tmpfs).
SHM_DIR = "/dev/shm"
#: Seconds a sender waits for room in its ring before it sends that bundle on zmq instead.
ROOM_WAIT_S = 0.5
#: Prefix of every ring's file name (``<prefix><receiver pid>-<16 hex digits>``).
PREFIX = "csrun-dp-"

#: ``register(address, nbytes) -> undo | None``: pins a ring's memory (e.g. ``cudaHostRegister``);
#: ``undo()`` is called before the ring is unmapped.
Register = Callable[[int, int], Callable[[], Any] | None]

# id(lease) -> (weakref to the lease, its ring): what leased() looks arrays up in
_LEASES: dict[int, tuple[weakref.ref[Any], SharedRing]] = {}
_MAX_BASE_HOPS = 4


def sweep(directory: str = SHM_DIR) -> int:
    """Remove this user's rings whose receiver process is gone (a chief killed between making a
    ring and its sender attaching; alive: ``psutil.pid_exists``); returns how many. Never raises."""
    import psutil  # here: the data plane imports only the standard library, numpy and pyzmq at start-up

    removed = 0
    try:
        names = [n for n in os.listdir(directory) if n.startswith(PREFIX)]
    except OSError:
        return 0
    for name in names:
        try:
            pid = int(name[len(PREFIX):].split("-", 1)[0])
            path = os.path.join(directory, name)
            if os.stat(path).st_uid != os.getuid() or psutil.pid_exists(pid):
                continue
            os.unlink(path)
            removed += 1
        except (ValueError, OSError):
            continue
    return removed


def lease_under(array: Any) -> ctypes.Array | None:
    """The ``ctypes`` array (a lease: a ring's, or :class:`csrun_runtime.pytorch.pinned.PinnedPool`'s) that
    ``array`` (a numpy array, or anything) is a view of, else None: its ``.base``, or the ``.base`` of its base
    array (numpy collapses a chain of views only down to the last ndarray: the base of a view of
    ``np.frombuffer(lease)`` is that frombuffer array, whose base is the lease)."""
    base = getattr(array, "base", None)
    for _ in range(_MAX_BASE_HOPS):
        if not isinstance(base, np.ndarray):
            break
        base = base.base
    return base if isinstance(base, ctypes.Array) else None


class GiveBack:
    """What leases give back when they die (on any thread, the garbage collector's too), taken by
    ``take(item)`` under ``lock`` without ever waiting for it (the collector may run while this
    thread holds it): an item given while the lock is held waits for the holder's :meth:`drain`."""

    def __init__(self, lock: threading.Lock, take: Callable[[Any], None]):
        self._lock, self._take = lock, take
        self._items: collections.deque[Any] = collections.deque()

    def put(self, item: Any) -> None:
        """Give ``item`` back; taken now unless another section holds the lock."""
        self._items.append(item)
        self.settle()

    def settle(self) -> None:
        """Take what was given back, unless another section holds the lock (call after releasing it)."""
        while self._items and self._lock.acquire(blocking=False):
            try:
                self.drain()
            finally:
                self._lock.release()

    def drain(self) -> None:
        """Take every item given back (the caller holds the lock)."""
        while self._items:
            try:
                item = self._items.popleft()
            except IndexError:
                return
            self._take(item)


def leased(array: Any) -> SharedRing | None:
    """The ring whose lease ``array`` (a numpy array, or anything) is a view of, else None. O(1)."""
    base = lease_under(array)
    entry = None if base is None else _LEASES.get(id(base))
    return entry[1] if entry is not None and entry[0]() is base else None


def pinned(array: Any) -> bool:
    """Whether ``array`` is a view of a ring whose memory a register callback pinned."""
    ring = leased(array)
    return ring is not None and ring.registered


def _tail_of(mm: mmap.mmap) -> np.ndarray:
    """``tail`` as a uint64 array: aligned 8-byte loads and stores, never half of two values."""
    return np.frombuffer(mm, np.uint64, count=1, offset=TAIL_AT)


class SharedRing:
    """The receiver's side of one sender's ring (see the module docstring).

    Args:
        nbytes: the data area's size, bytes (>= 1 MiB).
        directory: where the file is made (tmpfs).
        register: pins the ring's memory once it is mapped (:data:`Register`), or None.

    Raises ``OSError`` when the file cannot be made or its pages reserved (no ``/dev/shm``, a full
    tmpfs): the caller goes on with TCP. Thread-safety: :meth:`lease` and :meth:`close` on the
    receiver's thread; leases die on any thread (the garbage collector's too).
    """

    def __init__(self, nbytes: int, directory: str = SHM_DIR, register: Register | None = None):
        if nbytes < (1 << 20):
            raise ValueError(f"shared-memory ring of {nbytes} bytes: at least 1 MiB")
        self.size = int(nbytes)
        self.token = secrets.token_bytes(_TOKEN_BYTES)
        self.path = os.path.join(directory, f"{PREFIX}{os.getpid()}-{secrets.token_hex(8)}")
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.posix_fallocate(fd, 0, HEADER_BYTES + self.size)
            self._mm = mmap.mmap(fd, HEADER_BYTES + self.size)
        except BaseException:
            os.unlink(self.path)
            raise
        finally:
            os.close(fd)
        _HEAD.pack_into(self._mm, 0, MAGIC, self.token, self.size)
        self._tail: np.ndarray | None = _tail_of(self._mm)
        anchor = ctypes.c_char.from_buffer(self._mm)
        self.address = ctypes.addressof(anchor)  # of the mapping: valid until it is unmapped
        del anchor
        self.expect = 0  # the end of the last bundle received (positions before it are taken)
        self.tail = 0  # bytes freed, in order
        self.leases = 0
        self.bundles = 0
        self._freed: dict[int, int] = {}  # start -> end of bytes freed out of order
        self._lock = threading.Lock()
        self._returned = GiveBack(self._lock, self._take_back)
        self._linked = True
        self._closed = False
        self._undo: Callable[[], Any] | None = None
        self.registered = False
        if register is not None:
            self.register(register)

    def offer(self) -> dict[str, Any]:
        """The welcome's ``shm``: ``{"path", "token" (hex), "bytes", "start"}``."""
        return {"path": self.path, "token": self.token.hex(), "bytes": self.size, "start": self.expect}

    def register(self, register: Register) -> bool:
        """Pin the ring's memory with ``register`` (once); returns whether it did. Never raises:
        a failure is a warning and the ring stays unpinned."""
        if self.registered or self._closed:
            return self.registered
        try:
            self._undo = register(self.address, HEADER_BYTES + self.size)
        except Exception as e:  # noqa: BLE001 - pinning is an optimisation: warn and go on
            log.warning("data plane: could not pin a shared-memory ring of %d bytes (%s)", self.size, e)
            self._undo = None
        self.registered = self._undo is not None
        return self.registered

    def unlink(self) -> None:
        """Remove the ring's name (once its sender has it mapped, or will not)."""
        if self._linked:
            self._linked = False
            try:
                os.unlink(self.path)
            except OSError:
                pass

    def lease(self, pos: int, nbytes: int) -> Any:
        """The lease over the bundle of ``nbytes`` bytes at position ``pos`` (a writable ``ctypes.c_char`` array,
        at least one byte): its bytes are freed when it is collected. Raises :class:`FrameError` for a
        position before the last bundle's end, across the ring's end, or over bytes still in use."""
        with self._lock:
            self._drain()
            off = pos % self.size
            if (pos < self.expect or nbytes > self.size or off + nbytes > self.size
                    or pos + nbytes - self.tail > self.size):
                raise FrameError(f"shared-memory bundle of {nbytes} bytes at position {pos} is outside the ring "
                                 f"(size {self.size}, next free position {self.expect}, freed up to {self.tail})")
            if pos > self.expect:  # skipped at the ring's end: free
                self._free(self.expect, pos)
            self.expect = pos + nbytes
            n = max(1, nbytes)
            lease = (ctypes.c_char * n).from_address(self.address + HEADER_BYTES + off)
            self.leases += 1
            self.bundles += 1
            _LEASES[id(lease)] = (weakref.ref(lease), self)
        # holds this ring (and so its mapping) until the lease dies; then frees its bytes
        weakref.finalize(lease, self._release, id(lease), pos, pos + nbytes)
        return lease

    def _release(self, key: int, start: int, end: int) -> None:
        """A lease died (any thread, the collector's too): its bytes freed. Never waits for the lock."""
        _LEASES.pop(key, None)
        self._returned.put((start, end))

    def _take_back(self, freed: tuple[int, int]) -> None:
        """A dead lease's bytes freed and ``tail`` moved (the lock held); a closed ring left unused unmapped."""
        self.leases -= 1
        self._free(*freed)
        if self._closed and self.leases == 0:
            self._destroy()

    def _drain(self) -> None:
        """The leases given back taken (the lock held)."""
        self._returned.drain()

    def _free(self, start: int, end: int) -> None:
        self._freed[start] = end
        tail = self.tail
        while tail in self._freed:
            tail = self._freed.pop(tail)
        if tail != self.tail and self._tail is not None:
            self.tail = tail
            self._tail[0] = tail

    def close(self) -> None:
        """No more bundles: the name removed now, the mapping (and its pin) once no array is over it."""
        self.unlink()
        with self._lock:
            self._closed = True
            self._drain()
            if self.leases == 0:
                self._destroy()
        self._returned.settle()  # what leases gave back while the lock was held

    def _destroy(self) -> None:
        if self._mm.closed:
            return
        if self._undo is not None:
            try:
                self._undo()
            except Exception as e:  # noqa: BLE001 - unpinning at the end: warn only
                log.warning("data plane: could not unpin a shared-memory ring (%s)", e)
            self._undo = None
        self._tail = None  # its export released: the mapping can close
        self._mm.close()


class RingWriter:
    """The sender's side of its ring, from the welcome's ``shm`` (:meth:`SharedRing.offer`).

    Raises ``OSError`` when the file cannot be opened or mapped, ``ValueError`` when it is not the
    ring the welcome names (magic, token or size differ: another ``/dev/shm``). One thread."""

    def __init__(self, offer: dict[str, Any]):
        path, token, self.size = str(offer["path"]), bytes.fromhex(str(offer["token"])), int(offer["bytes"])
        fd = os.open(path, os.O_RDWR)
        try:
            have = os.fstat(fd).st_size
            if have != HEADER_BYTES + self.size:
                raise ValueError(f"{path}: {have} bytes, not the offered ring's {HEADER_BYTES + self.size}")
            self._mm = mmap.mmap(fd, HEADER_BYTES + self.size)
        finally:
            os.close(fd)
        magic, theirs, size = _HEAD.unpack_from(self._mm, 0)
        if magic != MAGIC or theirs != token or size != self.size:
            self._mm.close()
            raise ValueError(f"{path} is not the ring the receiver offered (another /dev/shm?)")
        self.head = int(offer["start"])
        self.data = np.frombuffer(self._mm, np.uint8, count=self.size, offset=HEADER_BYTES)
        self._tail = _tail_of(self._mm)
        self._offsets: dict[bytes, tuple[list[int], int]] = {}  # header -> its leaves' offsets, bytes

    def tail(self) -> int:
        """How far the receiver has freed (a position)."""
        return int(self._tail[0])

    def reserve(self, nbytes: int, wait: float | None = None) -> int | None:
        """The position where a bundle of ``nbytes`` bytes goes, once the receiver freed room for it
        (polled for up to ``wait`` s, default :data:`ROOM_WAIT_S`); None: larger than the ring, or no
        room in time (send it on zmq)."""
        wait = ROOM_WAIT_S if wait is None else wait
        if nbytes > self.size:
            return None
        pos = self.head
        if pos % self.size + nbytes > self.size:
            pos += self.size - pos % self.size  # a bundle is contiguous: start the next turn
        deadline, nap = time.monotonic() + wait, 1e-5
        while pos + nbytes - self.tail() > self.size:
            if time.monotonic() >= deadline:
                return None
            time.sleep(nap)
            nap = min(nap * 2, 2e-3)
        return pos

    def view(self, pos: int, nbytes: int) -> np.ndarray:
        """The ring's ``nbytes`` bytes at ``pos`` (uint8), to write a bundle into."""
        off = pos % self.size
        return self.data[off:off + nbytes]

    def put(self, header: bytes, leaves: list[np.ndarray], batches: list[list[np.ndarray]] | None = None) -> int | None:
        """Write one bundle of ``header`` (:func:`.framing.encode_header`) into the ring, its leaves at
        :func:`.bulk.offsets`: ``leaves`` themselves, or (``batches``) the batches whose leaves stack into
        them (``leaves`` then give only dtypes and shapes). Returns its position, or None when the ring
        has no room for it (:meth:`reserve`)."""
        where = self._offsets.get(header)
        if where is None:
            if len(self._offsets) > 64:
                self._offsets.clear()
            where = self._offsets[header] = offsets(framing.parse_header(header))
        starts, total = where
        pos = self.reserve(total)
        if pos is None:
            return None
        room = self.view(pos, total)
        for j, (start, a) in enumerate(zip(starts, leaves, strict=True)):
            dst = room[start:start + a.nbytes].view(a.dtype).reshape(a.shape)
            if batches is None:
                np.copyto(dst, a, casting="no")
            else:
                for i, batch in enumerate(batches):
                    np.copyto(dst[i, ...], batch[j], casting="no")
        self.commit(pos, total)
        return pos

    def commit(self, pos: int, nbytes: int) -> None:
        """The bundle at ``pos`` is written and goes out: the head moves past it."""
        self.head = pos + nbytes

    def close(self) -> None:
        """Unmap (the data view dropped first)."""
        self.data = self._tail = np.empty(0, np.uint8)
        try:
            self._mm.close()
        except BufferError:  # a view still exported: the mapping goes with it
            pass


def attach(offer: dict[str, Any], accept: bool = True) -> tuple[RingWriter | None, str]:
    """A sender's answer to a welcome's ring: ``(writer, "")``, or ``(None, why)`` when it is
    declined (``accept`` False) or cannot be mapped (logged: the sender goes on over TCP)."""
    if not accept:
        return None, "declined (shm=False)"
    try:
        return RingWriter(offer), ""
    except (OSError, ValueError, KeyError, TypeError) as e:
        log.info("data plane: the receiver's shared-memory ring cannot be used (%s); sending over TCP", e)
        return None, str(e)


class Rings:
    """A receiver's rings: one of ``nbytes`` bytes in ``directory`` for each sender whose hello
    names ``node`` (:func:`.protocol.local_node` by default), pinned by the callback given to
    :meth:`pin`. A ring that cannot be made is one warning, and those senders use TCP. Removes
    the rings of gone receivers first (:func:`sweep`). The receiver's thread only."""

    def __init__(self, nbytes: int, directory: str = SHM_DIR, node: str | None = None):
        from .protocol import local_node

        self.nbytes, self.directory, self.node = int(nbytes), directory, node or local_node()
        self.register: Register | None = None
        self.failed = False
        self.made: weakref.WeakSet[SharedRing] = weakref.WeakSet()
        sweep(directory)

    def offer(self, hello: dict[str, Any]) -> SharedRing | None:
        """A ring for the sender of ``hello`` when it runs on :attr:`node`, else None."""
        if hello.get("node") != self.node:
            return None
        try:
            ring = SharedRing(self.nbytes, self.directory, self.register)
        except (OSError, ValueError) as e:
            if not self.failed:
                self.failed = True
                log.warning("data plane: no shared-memory ring of %d bytes in %s (%s): input workers on this node "
                            "send over TCP", self.nbytes, self.directory, e)
            return None
        self.made.add(ring)
        return ring

    def pin(self, register: Register | None) -> bool:
        """Pin every ring made now or later with ``register`` (None: later ones unpinned); True."""
        self.register = register
        if register is not None:
            for ring in list(self.made):
                ring.register(register)
        return True
