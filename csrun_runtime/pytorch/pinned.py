"""A pool of pinned host blocks that the data-plane receiver reads bundles into (the lent
receive: ``Receiver.lend(allocate)``, forwarded by :meth:`.remote.RemoteSource.lend`), so that
:class:`.devicefeed.DeviceFeed` copies a received batch to the GPU straight from where it was
received, without its host ring's copy.

:meth:`PinnedPool.allocate` returns a *lease*: a ``ctypes`` char array over a block of a pinned
torch ``uint8`` tensor. The receiver wraps it with ``np.frombuffer`` and makes each leaf a view of
it: every leaf (and every view of a leaf) refers to the lease through its ``.base`` (numpy
collapses a chain of views down to the ``np.frombuffer`` array, whose ``.base`` is the lease), so
the block goes back to the pool when the last array over the lease is garbage collected
(``weakref.finalize`` on the lease). torch is imported inside functions.
"""
from __future__ import annotations

import ctypes
import threading
import weakref
from typing import Any

from ..dataplane.shm import GiveBack, lease_under

__all__ = ["PinnedPool", "MAX_FREE_BYTES", "MIN_BLOCK_BYTES", "size_class", "cuda_host_register"]

#: Bytes of free blocks a pool keeps by default; a block freed beyond that is dropped.
MAX_FREE_BYTES = 2 << 30
#: The smallest block (bytes).
MIN_BLOCK_BYTES = 4 << 10


#: ``cudaHostRegisterPortable``: pinned for every CUDA context, not only the current one.
_HOST_REGISTER_PORTABLE = 1


def cuda_host_register(address: int, nbytes: int) -> Any:
    """Page-lock ``nbytes`` bytes of host memory at ``address`` (e.g. a data-plane shared-memory
    ring) for CUDA's copy engine: ``cudaHostRegister`` through ``torch.cuda.cudart()``. Returns the
    undo (``cudaHostUnregister``), to call before the memory is unmapped. Raises RuntimeError naming
    CUDA's error when the driver refuses (e.g. the locked-memory limit)."""
    import torch

    cudart = torch.cuda.cudart()
    err = cudart.cudaHostRegister(address, nbytes, _HOST_REGISTER_PORTABLE)
    if int(err) != 0:
        raise RuntimeError(f"cudaHostRegister of {nbytes} bytes: CUDA error {int(err)} ({err})")
    return lambda: cudart.cudaHostUnregister(address)


def size_class(nbytes: int) -> int:
    """The block size (bytes) for a request of ``nbytes`` bytes: the power of two at or above it, at least
    :data:`MIN_BLOCK_BYTES`."""
    n = max(int(nbytes), MIN_BLOCK_BYTES)
    return 1 << (n - 1).bit_length()


class PinnedPool:
    """Pinned host blocks lent out as leases and reused by size (see the module docstring).

    Args:
        pin: page-locked (CUDA's pinned) memory, via ``torch.empty(..., pin_memory=True)``;
            False: ordinary memory (CPU tests).
        max_free_bytes: most bytes of free blocks kept for reuse (bytes, >= 0); a block returned
            beyond that is dropped (back to torch: its pinned-memory cache keeps it).

    The pool grows on demand: a request that no free block of its size class serves pins a
    new block (what bounds the blocks outstanding is the receiver's credit window, not the
    pool). Counters: ``allocations`` (new blocks pinned), ``reuses`` (requests served by a free
    block), ``outstanding`` (leases alive), ``bytes_pinned`` (bytes of the blocks the pool holds,
    outstanding and free), ``free_bytes`` (bytes of the free blocks).

    Thread-safety: every method may be called from any thread (``allocate`` runs on the
    receiver's reader threads); a lease may die on any thread, in the garbage collector too.

    Lifetime: a lease (and every array over it) stays valid for as long as it is referenced,
    whatever happens to the pool; its block is reused only after the lease was collected.
    Whoever hands an array over a lease to an asynchronous copy keeps a reference to the array
    until that copy completed (:class:`.staging.Stager` keeps it until the copy's event).
    """

    def __init__(self, pin: bool = True, max_free_bytes: int = MAX_FREE_BYTES):
        self.pin = bool(pin)
        self.max_free_bytes = max(0, int(max_free_bytes))
        self._lock = threading.Lock()
        self._free: dict[int, list[Any]] = {}  # size class -> free blocks (uint8 tensors)
        # id(lease) -> (block, weakref to the lease): the leases alive (owns(); outstanding)
        self._live: dict[int, tuple[Any, weakref.ref[Any]]] = {}
        # (size class, block) returned by leases that died, taken back under the lock without
        # waiting for it (another thread's, or the collector running inside a locked section)
        self._returned = GiveBack(self._lock, self._take_back)
        self.allocations = 0
        self.reuses = 0
        self.bytes_pinned = 0
        self._free_bytes = 0

    # ------------------------------------------------------------------ leases
    def allocate(self, nbytes: int) -> Any:
        """A lease of ``nbytes`` bytes (a writable ``ctypes.c_char`` array, exactly ``nbytes``
        long, over a block of :func:`size_class` bytes): a free block of that size class when
        there is one, else a new one (pinned outside the pool's lock: pinning takes
        milliseconds). Raises ValueError for a negative ``nbytes``; RuntimeError (torch's) when
        the block cannot be allocated or pinned (no CUDA driver, pinned memory exhausted)."""
        n = int(nbytes)
        if n < 0:
            raise ValueError(f"PinnedPool.allocate: nbytes must be >= 0, got {nbytes}")
        cls = size_class(n)
        block = None
        with self._lock:
            self._drain()
            free = self._free.get(cls)
            if free:
                block = free.pop()
                self._free_bytes -= cls
                self.reuses += 1
        if block is None:
            block = self._new_block(cls)
            with self._lock:
                self.allocations += 1
                self.bytes_pinned += cls
        lease = (ctypes.c_char * n).from_address(block.data_ptr())
        key = id(lease)
        with self._lock:
            self._live[key] = (block, weakref.ref(lease))
        # holds the block (and this pool) until the lease dies; then gives the block back
        weakref.finalize(lease, self._release, key, cls, block)
        return lease

    def owns(self, array: Any) -> bool:
        """Whether ``array`` (a numpy array, or anything) is a view of a live lease of this pool
        (:func:`csrun_runtime.dataplane.shm.lease_under`). O(1)."""
        base = lease_under(array)
        entry = None if base is None else self._live.get(id(base))
        return entry is not None and entry[1]() is base

    @property
    def outstanding(self) -> int:
        """Leases alive."""
        return len(self._live)

    @property
    def free_bytes(self) -> int:
        """Bytes of the free blocks kept for reuse."""
        with self._lock:
            self._drain()
            return self._free_bytes

    def counters(self) -> dict[str, int]:
        """``allocations``, ``reuses``, ``outstanding``, ``bytes_pinned``, ``free_bytes``."""
        with self._lock:
            self._drain()
            return {"allocations": self.allocations, "reuses": self.reuses, "outstanding": len(self._live),
                    "bytes_pinned": self.bytes_pinned, "free_bytes": self._free_bytes}

    # ------------------------------------------------------------------ inside
    def _new_block(self, nbytes: int) -> Any:
        import torch

        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=self.pin)

    def _release(self, key: int, cls: int, block: Any) -> None:
        """A lease died (any thread, the collector's too): its block given back (:class:`GiveBack`)."""
        self._live.pop(key, None)  # before the lease's memory (and so its id) is freed
        self._returned.put((cls, block))

    def _drain(self) -> None:
        """Returned blocks into the free lists (the lock held)."""
        self._returned.drain()

    def _take_back(self, returned: tuple[int, Any]) -> None:
        """One returned block into its free list, up to ``max_free_bytes`` (the lock held)."""
        cls, block = returned
        if self._free_bytes + cls <= self.max_free_bytes:
            self._free.setdefault(cls, []).append(block)
            self._free_bytes += cls
        else:
            self.bytes_pinned -= cls  # dropped: torch frees it when the last reference goes
