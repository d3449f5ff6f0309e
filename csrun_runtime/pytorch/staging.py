"""One batch's way from the host to the PyTorch chief's training device (:class:`Stager`), the
part of the device feed (:mod:`.devicefeed`) that copies.

On CUDA each batch is copied ONCE, from the received frames into a ring of pinned host
buffers allocated at the first batch and reused (:class:`HostRing`: sized from that batch's
nest of shapes and dtypes; reallocated only when a shape or dtype changes), then to the device
with ``non_blocking`` copies on a dedicated CUDA stream with an event recorded after them; a
ring slot is written again only after its previous copy's event completed. The host copy uses
``numpy.copyto`` (the GIL released), not torch's intra-op threads (``pin_memory()`` took all 16
cores of the GPU host), on :func:`auto_copy_threads` threads for a large leaf (4 on 16 cores:
38.5 MB image batches from 8 local senders reached an H200 at 12.3-12.9 GB/s against 4.9-5.7
with one thread, BENCHMARKS.md "GPU feed", third run).

The ring copy is skipped for the leaves of a batch received into pinned memory the feed lent
its source (:class:`.pinned.PinnedPool`): they are copied to the device straight from there, on
the same copy stream, and that memory is held (the stager keeps a reference to the leaves)
until the batch's copy event completes; then its block goes back to the pool for a later
bundle. Without CUDA a leaf becomes a tensor on the device (``torch.from_numpy`` views, or the
reused, unpinned ring's buffers). torch is imported inside functions.
"""
from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

__all__ = ["FeedStats", "HostRing", "Stager", "auto_copy_threads", "nest_bytes", "nest_leaves"]

#: Leaves of at least this many bytes are copied into the pinned ring by several threads
#: (:class:`HostRing`'s ``copy_threads``).
SPLIT_COPY_BYTES = 4 << 20
#: Most threads one batch's host copy uses by default (:func:`auto_copy_threads`).
COPY_THREADS_MAX = 4
#: Usable cores per default copy thread (:func:`auto_copy_threads`): 1 thread on the 2-core host.
CORES_PER_COPY_THREAD = 4


def nest_leaves(nest: Any) -> Iterator[Any]:
    """The leaves of a nest of dicts, tuples and lists, in order."""
    if isinstance(nest, dict):
        for v in nest.values():
            yield from nest_leaves(v)
    elif isinstance(nest, (list, tuple)):
        for v in nest:
            yield from nest_leaves(v)
    else:
        yield nest


def _rebuild(nest: Any, it: Iterator[Any]) -> Any:
    """``nest``'s structure around the leaves ``it`` yields, in :func:`nest_leaves`' order."""
    if isinstance(nest, dict):
        return {k: _rebuild(v, it) for k, v in nest.items()}
    if isinstance(nest, tuple):
        return tuple(_rebuild(v, it) for v in nest)
    if isinstance(nest, list):
        return [_rebuild(v, it) for v in nest]
    return next(it)


def _as_numpy(x: Any) -> Any:
    """A numeric host array of leaf ``x`` (a CPU tensor as its numpy view), else None."""
    import numpy as np
    import torch

    if isinstance(x, torch.Tensor):
        return x.detach().numpy() if x.device.type == "cpu" else None
    if isinstance(x, np.ndarray) and x.dtype.kind in "biufc":
        return x
    return None


def _host_to_device(x: Any, device: Any) -> Any:
    """Leaf ``x`` on CUDA ``device`` without pinning it first: a numeric numpy array or CPU
    tensor copied with ``non_blocking=True`` from where it is (pinned memory: asynchronous;
    pageable memory: the CUDA driver stages it through its own pinned buffers and returns once
    the source is read, so the source may be released after the call); other leaves through
    :func:`.contract.to_torch`."""
    import torch

    from .contract import to_torch

    if _as_numpy(x) is not None:
        t = to_torch(x) if not isinstance(x, torch.Tensor) else x  # a numpy array: its tensor view
        return t.to(device, non_blocking=True)
    return to_torch(x, device)


def nest_bytes(nest: Any) -> int:
    """Bytes of the array and tensor leaves of a batch (what a feed moves to the device)."""
    n = 0
    for x in nest_leaves(nest):
        nb = getattr(x, "nbytes", None)
        if nb is None and hasattr(x, "element_size"):
            nb = x.element_size() * x.numel()
        n += int(nb or 0)
    return n


class HostRing:
    """``slots`` host buffers per array leaf of a batch, allocated at the first batch and
    reused: :meth:`fill` copies a batch's numeric leaves into the next slot (``numpy.copyto``)
    and returns that slot's tensors (None for leaves that are not host arrays).

    Args:
        slots: buffers per leaf (>= 1). ``pin``: page-locked (CUDA's pinned) memory.
        copy_threads: threads that copy one large leaf together (>= 1): a contiguous leaf of
            at least :data:`SPLIT_COPY_BYTES` is copied as ``copy_threads`` contiguous chunks
            on a small thread pool (``numpy.copyto`` releases the GIL), so that one batch's copy
            is not bound by one core's memory bandwidth; smaller or strided leaves are copied
            on the caller's thread.

    ``allocations`` counts ring (re)allocations: the first batch's, then one per change of
    the batch's shapes or dtypes.
    """

    def __init__(self, slots: int, pin: bool, copy_threads: int = 1):
        self.slots, self.pin = max(1, int(slots)), pin
        self.copy_threads = max(1, int(copy_threads))
        self.key: tuple[Any, ...] | None = None
        self.buffers: list[list[Any]] = []  # [slot][leaf] tensor or None
        self.next_slot = 0
        self.allocations = 0
        self._pool: Any = None  # concurrent.futures.ThreadPoolExecutor, made at the first split copy

    @staticmethod
    def key_of(arrays: list[Any]) -> tuple[Any, ...]:
        """The ring's key of a batch's leaves: each one's shape and dtype (None: not copied)."""
        return tuple(None if a is None else (a.shape, a.dtype.str) for a in arrays)

    def _allocate(self, arrays: list[Any]) -> None:
        import numpy as np
        import torch

        def one(a: Any) -> Any:
            if a is None:
                return None
            dtype = torch.from_numpy(np.empty(0, a.dtype)).dtype
            return torch.empty(a.shape, dtype=dtype, pin_memory=self.pin)

        self.buffers = [[one(a) for a in arrays] for _ in range(self.slots)]
        self.allocations += 1
        self.next_slot = 0

    def fill(self, arrays: list[Any]) -> tuple[int, list[Any]]:
        """Copy ``arrays`` (numpy arrays, or None: not copied) into the next slot; returns
        ``(slot, tensors)``. The caller makes sure the slot is no longer read (its copy event).
        Reallocates every slot when a shape or dtype differs from the ring's."""
        import numpy as np

        key = self.key_of(arrays)
        if key != self.key:
            self._allocate(arrays)
            self.key = key
        slot = self.next_slot
        self.next_slot = (slot + 1) % self.slots
        out = self.buffers[slot]
        jobs = []
        for buf, a in zip(out, arrays, strict=True):
            if buf is None:
                continue
            dst = buf.numpy()
            if self.copy_threads > 1 and a.nbytes >= SPLIT_COPY_BYTES and a.flags.c_contiguous:
                jobs.extend(_chunks(dst.reshape(-1), a.reshape(-1), self.copy_threads))
            else:
                np.copyto(dst, a, casting="no")
        if jobs:
            if self._pool is None:
                from concurrent.futures import ThreadPoolExecutor

                self._pool = ThreadPoolExecutor(self.copy_threads - 1, thread_name_prefix="csrun-ring-copy")
            first, rest = jobs[0], jobs[1:]
            futures = [self._pool.submit(np.copyto, d, a, casting="no") for d, a in rest]
            np.copyto(first[0], first[1], casting="no")  # this thread copies one chunk itself
            for f in futures:
                f.result()
        return slot, out

    def close(self) -> None:
        """End the copy threads (the buffers stay usable)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


def _chunks(dst: Any, src: Any, n: int) -> list[tuple[Any, Any]]:
    """``n`` (destination, source) pairs of equal contiguous chunks of two flat arrays."""
    step = -(-dst.shape[0] // n)
    return [(dst[i:i + step], src[i:i + step]) for i in range(0, dst.shape[0], step)]


def auto_copy_threads() -> int:
    """Threads a CUDA feed copies one large batch with (:class:`HostRing`): one per
    :data:`CORES_PER_COPY_THREAD` usable cores, 1 to :data:`COPY_THREADS_MAX`."""
    from csrun_runtime.dataplane.receive import usable_cores

    return max(1, min(COPY_THREADS_MAX, usable_cores() // CORES_PER_COPY_THREAD))


@dataclass
class FeedStats:
    """What a :class:`DeviceFeed` measured (seconds, bytes)."""

    batches: int = 0
    bytes: int = 0
    wait_s: float = 0.0          # the step loop's waits for the next batch (queue + copy event)
    event_wait_s: float = 0.0    # the part of it spent on copy events (CUDA)
    stage_s: float = 0.0         # the feed thread's host copy and copy issue
    waits: list[float] = field(default_factory=list)


class Stager:
    """One batch's way from the host to ``device``: its leaves copied into the reused host
    ``ring`` (when given) and, on CUDA, issued to the device on a copy stream of its own with
    an event recorded after them; a ring slot is written again only after its previous copy's
    event completed. Adds its seconds to ``stats.stage_s``.

    A leaf received into memory lent by ``pool`` (a view of one of its leases), or into a pinned
    shared-memory ring (``shared``), skips the ring:
    on CUDA it is copied to the device from where it is (pinned), and the stager keeps a
    reference to it until its copy's event completed (looked at in each :meth:`stage`; all of
    them waited for in :meth:`close`), so that its block is not reused while the copy reads it.
    ``direct_batches`` counts the batches with such a leaf.

    Args:
        device: the training device (``torch.device``); ``cuda``: whether it is a CUDA device
            torch can use. ``ring``: a :class:`HostRing` or None (no host copy).
        stats: the feed's :class:`FeedStats`.
        pool: the :class:`.pinned.PinnedPool` lent to the source, or None.
        shared: the source's shared-memory rings are pinned (:func:`csrun_runtime.dataplane.shm.pinned`):
            a leaf in one is lent memory too.
    """

    def __init__(self, device: Any, cuda: bool, ring: HostRing | None, stats: FeedStats, pool: Any = None,
                 shared: bool = False):
        import torch

        self.device, self.cuda, self.ring, self.stats, self.pool = device, cuda, ring, stats, pool
        self.shared = shared
        self.stream = torch.cuda.Stream(device=device) if cuda else None
        self.slot_events: dict[int, Any] = {}
        self.held: list[tuple[Any, list[Any]]] = []  # (copy event, lent host leaves it reads)
        self.direct_batches = 0

    def stage(self, nest: Any) -> tuple[Any, Any]:
        """The batch's leaves copied into the ring (when copying) and issued to the device on
        the copy stream; returns ``(device nest, copy event or None)``."""
        import torch

        from .contract import to_torch

        t0 = time.perf_counter()
        leaves = list(nest_leaves(nest))
        lent = [self._lent(x) for x in leaves]
        if any(lent):
            self.direct_batches += 1
        slot, bufs = None, [None] * len(leaves)
        if self.ring is not None and not all(lent):
            arrays = [None if d else _as_numpy(x) for x, d in zip(leaves, lent, strict=True)]
            self._free_slot(arrays)
            slot, bufs = self.ring.fill(arrays)
        event = None
        if self.cuda:
            assert self.stream is not None
            self._release_held()
            with torch.cuda.stream(self.stream):
                # a ring buffer or a lent block is pinned: copied without to_torch's is_pinned()
                # query per leaf; another host leaf goes as it is (pageable: the driver stages it)
                host = leaves
                leaves = [torch.from_numpy(x).to(self.device, non_blocking=True) if d
                          else _host_to_device(x, self.device) if b is None else b.to(self.device, non_blocking=True)
                          for x, b, d in zip(leaves, bufs, lent, strict=True)]
                event = torch.cuda.Event()
                event.record(self.stream)
            if slot is not None:
                self.slot_events[slot] = event
            if any(lent):  # the lent leaves are read until the event: their blocks kept till then
                self.held.append((event, [x for x, d in zip(host, lent, strict=True) if d]))
        else:
            leaves = [to_torch(x if b is None else b, self.device) for x, b in zip(leaves, bufs, strict=True)]
        self.stats.stage_s += time.perf_counter() - t0
        return _rebuild(nest, iter(leaves)), event

    def _lent(self, x: Any) -> bool:
        """Whether leaf ``x`` is a numeric numpy array in memory lent by the pool, or in a pinned shared-memory ring."""
        import numpy as np

        if not isinstance(x, np.ndarray) or x.dtype.kind not in "biufc":
            return False
        if self.pool is not None and self.pool.owns(x):
            return True
        if self.shared:
            from ..dataplane.shm import pinned

            return pinned(x)
        return False

    def _release_held(self) -> None:
        """Drop the references to lent leaves whose copy event completed (their blocks go back
        to the pool once nothing else refers to them)."""
        if self.held:
            self.held = [(e, xs) for e, xs in self.held if not e.query()]

    def close(self) -> None:
        """Wait for the copies still reading lent leaves, then drop the references to them."""
        for e, _ in self.held:
            e.synchronize()
        self.held = []

    def _free_slot(self, arrays: list[Any]) -> None:
        """Wait until the ring slot :meth:`HostRing.fill` writes next is no longer read by a
        copy (every slot's copy when the ring is about to be reallocated)."""
        assert self.ring is not None
        if self.ring.key is not None and HostRing.key_of(arrays) != self.ring.key:
            for e in self.slot_events.values():
                e.synchronize()
            self.slot_events.clear()
        elif self.ring.next_slot in self.slot_events:
            self.slot_events.pop(self.ring.next_slot).synchronize()
