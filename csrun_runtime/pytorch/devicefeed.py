"""The PyTorch chief's device feed (issue 31): batches from the chief's batch source (numpy
nests received over the data plane, or the chief's own DataLoader's tensors) moved to the
training device ahead of the step that uses them.

Each batch goes its way to the device through a :class:`.staging.Stager` (on CUDA: the reused
pinned ring, the copy stream, the copy event; see :mod:`.staging`); the step waits for that
event only (``Stream.wait_event``, no host sync) and each device tensor is
``record_stream``-ed on the compute stream so that the caching allocator keeps it until the
step's use of it is done. ``runconfig.device_prefetch`` batches (default
:data:`DEVICE_PREFETCH`) wait on the device, or in flight to it, ahead of the step.

On CUDA the feed also has its source pin the shared-memory rings of input workers on this node
(``on_shared_memory``: ``cudaHostRegister``), and the stager copies their leaves to the GPU from
the ring itself (docs/DATAPLANE.md "Co-located input workers").

On CUDA with the ring the feed also lends its source a pool of pinned blocks
(:class:`.pinned.PinnedPool`, through the source's ``lend(allocate)`` when it has one: the
data-plane receiver's bulk receive reads each bundle into one of them); the stager copies those
leaves straight from there. ``feed_info()["lent"]`` counts the pool's blocks and the batches
staged so.

Two background threads, one receiving and one staging (host copy, copy issue), so the step
loop never blocks on them; it only waits for the next batch (the queue) and, on CUDA, for that batch's copy event:
that wait is what :meth:`DeviceFeed.next` returns in ``last_wait`` and what the training
loop counts as input wait (docs/VERDICT.md). Without CUDA the same class runs with no
pinning, no streams and (by default) no thread: a batch passes through (``torch.from_numpy``
views, no copy; ``copy=True`` puts it through the reused, unpinned ring instead; neither a
copy nor the thread's hand-off would help a CPU step, and the thread measurably hurt small
batches on the 2-core host: ``bench/bench_gpu_feed.py --quick``, BENCHMARKS.md).

:func:`feed_rate` is the analyzer's probe's measure of this path (bytes per second into the
device). torch is imported inside functions.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Iterable
from typing import Any

from ..handoff import put_unless_stopped
from ..params import DEVICE_PREFETCH  # runconfig.device_prefetch's default (measured there)
from .staging import FeedStats, HostRing, Stager, auto_copy_threads, nest_bytes, nest_leaves

__all__ = ["DeviceFeed", "DEVICE_PREFETCH", "feed_rate"]

log = logging.getLogger("csrun.runtime")

#: Seconds between looks at the stop flag while the feed thread waits for room in the queue.
_PUT_POLL_SECS = 0.1


class DeviceFeed:
    """Batches of ``source`` on ``device``, ``depth`` staged ahead (see the module docstring).

    Args:
        source: ``next() -> (nest | None, who)`` (``None``: the input ended; e.g.
            :class:`.remote.RemoteSource`); its other attributes are reachable through the
            feed (``describe``, the autoscaler's stream API, ...). With ``threaded`` the
            source's ``next`` runs on the feed thread only.
        device: the training device (``torch.device`` or its name).
        depth: batches staged ahead (``runconfig.device_prefetch``, >= 1).
        threaded: receive and stage on a background thread (default: only on CUDA; False: on
            the caller's thread, e.g. under ``--autoscale``, whose autoscaler drives the source
            from the loop). On the 2-core CPU host the thread's hand-off cost more than it
            overlapped (GIL hand-offs per batch: ``bench/bench_gpu_feed.py --quick``).
        copy: copy into the reused host ring (default: only on CUDA, pinned). ``False`` on
            CUDA: each host leaf is copied to the device from where it was received, pinned
            or not (pageable memory is staged by the CUDA driver on the feed's thread; the
            ``device feed, pageable`` rows of ``bench/bench_gpu_feed.py`` measure it beside the
            ring).
        copy_threads: threads of the ring's copy of one large batch (default on CUDA
            :func:`auto_copy_threads`, else 1).
        lend: lend the source a :class:`.pinned.PinnedPool`'s ``allocate`` (its ``lend``, when it
            has one and accepts) to receive into. Default: on CUDA with ``copy``; False: never;
            True: whenever the source accepts (pinned only on CUDA). ``feed_info()["lent"]``.

    :meth:`next` raises what the source raised (``InputStalled``, ``WorkerFailed``, ...).
    """

    def __init__(self, source: Any, device: Any, depth: int = DEVICE_PREFETCH, threaded: bool | None = None,
                 copy: bool | None = None, copy_threads: int | None = None, lend: bool | None = None):
        import torch

        self.source, self.device = source, torch.device(device)
        self.cuda = self.device.type == "cuda" and torch.cuda.is_available()
        if self.cuda and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.depth = max(1, int(depth))
        self.copy = self.cuda if copy is None else bool(copy)
        # slots: depth staged + one being filled + one handed to the step
        if copy_threads is None:
            copy_threads = auto_copy_threads() if self.cuda else 1
        self.ring = HostRing(self.depth + 2, pin=self.cuda, copy_threads=copy_threads) if self.copy else None
        self.stats = FeedStats()
        # before the threads start: the source receives into the pool from its first bundle on
        self.pool = _lend_pool(source, self.cuda, (self.cuda and self.copy) if lend is None else lend)
        self.rings_pinned = _pin_rings(source, self.cuda)
        self.stager = Stager(self.device, self.cuda, self.ring, self.stats, self.pool, shared=self.rings_pinned)
        self.handed: dict[str, int] = {}  # batches handed to the step, per worker
        self.last_wait = 0.0
        self.threaded = self.cuda if threaded is None else bool(threaded)
        self._q: queue.Queue[tuple[str, Any, Any, Any]] = queue.Queue(maxsize=self.depth)
        self._pending: list[tuple[str, Any, Any, Any]] = []  # unthreaded: staged batches
        self._stop = threading.Event()
        self._ended = False
        self._thread: threading.Thread | None = None
        self._receiver: threading.Thread | None = None
        # threaded: received nests, one ahead of the one being staged (the source's credit
        # window bounds the rest); the receive thread alone calls the source's next()
        self._rq: queue.Queue[tuple[str, Any, Any]] = queue.Queue(maxsize=1)
        if self.threaded:
            self._receiver = threading.Thread(target=self._receive_run, name="csrun-device-feed-receive", daemon=True)
            self._thread = threading.Thread(target=self._run, name="csrun-device-feed", daemon=True)
            self._receiver.start()
            self._thread.start()

    def __getattr__(self, name: str) -> Any:
        if name in ("source",):  # not set yet: no recursion
            raise AttributeError(name)
        return getattr(self.source, name)

    # ------------------------------------------------------------------ the producer
    def _receive(self) -> tuple[str, Any, Any]:
        """The source's next nest: ``("batch", nest, who)``, ``("end", None, who)`` or
        ``("error", exc, None)``."""
        try:
            nest, who = self.source.next()
            return ("end", None, who) if nest is None else ("batch", nest, who)
        except BaseException as e:  # noqa: BLE001 - raised again on the step loop's thread
            return "error", e, None

    def _produce(self, received: tuple[str, Any, Any] | None = None) -> tuple[str, Any, Any, Any]:
        """One item: ``("batch", device nest, who, event)``, ``("end", ...)`` or ``("error", exc, ...)``;
        ``received``: what :meth:`_receive` returned (None: receive now, on this thread)."""
        kind, nest, who = received or self._receive()
        if kind != "batch":
            return kind, nest, who, None
        try:
            size = nest_bytes(nest)
            batch, event = self.stager.stage(nest)
            self.stats.bytes += size
            return "batch", batch, who, event
        except BaseException as e:  # noqa: BLE001 - raised again on the step loop's thread
            return "error", e, None, None

    def _put(self, q: queue.Queue[Any], item: Any) -> bool:
        """Put ``item`` into ``q``, looking at the stop flag while it is full; False: stopped."""
        return put_unless_stopped(q, item, self._stop, _PUT_POLL_SECS)

    def _receive_run(self) -> None:
        """The receive thread: the source's nests into the staging queue, so that the next batch is received
        while this one is copied (measured: docs/DESIGN.md, ``pytorch/devicefeed.py``)."""
        while not self._stop.is_set():
            item = self._receive()
            if not self._put(self._rq, item) or item[0] != "batch":
                return

    def _run(self) -> None:
        """The feed thread: stage what the receive thread received, queue it for the step,
        until the input ends, an error, or :meth:`close`."""
        while not self._stop.is_set():
            try:
                received = self._rq.get(timeout=_PUT_POLL_SECS)
            except queue.Empty:
                if self._receiver is not None and not self._receiver.is_alive() and self._rq.empty():
                    return
                continue
            item = self._produce(received)
            if not self._put(self._q, item) or item[0] != "batch":
                return

    # ------------------------------------------------------------------ the consumer
    def _take(self) -> tuple[str, Any, Any, Any]:
        if self._thread is not None:
            while True:
                try:
                    return self._q.get(timeout=_PUT_POLL_SECS)
                except queue.Empty:
                    if not self._thread.is_alive() and self._q.empty():
                        return "end", None, -1, None
        ahead = self.depth if self.cuda else 0  # without CUDA nothing would overlap: no read-ahead
        while len(self._pending) < ahead + 1:  # unthreaded: stage `depth` ahead, on this thread
            item = self._produce()
            self._pending.append(item)
            if item[0] != "batch":
                break
        return self._pending.pop(0)

    def next(self) -> tuple[Any, Any]:
        """The next batch on the device (ready for the current stream: its copy event waited
        for) and its worker; ``(None, who)`` once the input ended. ``last_wait``: the seconds
        this call waited (for the queue, then for the copy event). Raises what the source raised."""
        if self._ended:
            return None, -1
        t0 = time.perf_counter()
        kind, batch, who, event = self._take()
        if kind == "error":
            self._ended = True
            raise batch
        if kind == "end":
            self._ended = True
            self.last_wait = time.perf_counter() - t0
            return None, who
        if event is not None:
            import torch

            te = time.perf_counter()
            event.synchronize()  # the host waits for this batch's copy only, not for the step
            self.stats.event_wait_s += time.perf_counter() - te
            compute = torch.cuda.current_stream(self.device)
            compute.wait_event(event)
            for t in nest_leaves(batch):
                if isinstance(t, torch.Tensor) and t.device.type == "cuda":
                    t.record_stream(compute)  # the allocator keeps it until the step's use is done
        self.last_wait = time.perf_counter() - t0
        self.handed[str(who)] = self.handed.get(str(who), 0) + 1
        self.stats.batches += 1
        self.stats.wait_s += self.last_wait
        return batch, who

    # ------------------------------------------------------------------ the record and the end
    def feed_info(self) -> dict[str, Any]:
        """performance.json's ``device_feed``: device, depth, thread, ring (pinned, slots,
        allocations), lent (None: no pool lent to the source; else the pool's ``allocations``,
        ``reuses``, ``bytes_pinned`` and the ``direct_batches`` staged from lent memory),
        ``rings_pinned`` (the source's shared-memory rings registered with CUDA) and
        ``direct_batches`` (staged from lent or registered memory, no host copy), batches, bytes,
        the step loop's waits and the thread's staging seconds."""
        s, pool = self.stats, None if self.pool is None else self.pool.counters()
        return {"device": str(self.device), "device_prefetch": self.depth, "threaded": self.threaded,
                "ring": None if self.ring is None else {"pinned": self.ring.pin, "slots": self.ring.slots,
                                                        "allocations": self.ring.allocations,
                                                        "copy_threads": self.ring.copy_threads},
                "lent": None if pool is None else {"allocations": pool["allocations"], "reuses": pool["reuses"],
                                                   "bytes_pinned": pool["bytes_pinned"],
                                                   "direct_batches": self.stager.direct_batches},
                "rings_pinned": self.rings_pinned, "direct_batches": self.stager.direct_batches,
                "batches": s.batches, "bytes": s.bytes, "wait_s": round(s.wait_s, 4),
                "copy_event_wait_s": round(s.event_wait_s, 4), "stage_s": round(s.stage_s, 4)}

    def describe(self) -> dict[str, Any]:
        """The source's ``describe()`` (its feed thread stopped first: the source is read from
        one thread at a time) with ``device_feed`` (:meth:`feed_info`); its
        ``batches_per_worker`` counts the batches handed to the step (not those staged ahead)."""
        self.stop()
        desc = {**self.source.describe(), "device_feed": self.feed_info()}
        if isinstance(desc.get("batches_per_worker"), dict):
            per = desc["batches_per_worker"]
            desc["batches_per_worker"] = {**{k: self.handed.get(str(k), 0) for k in per}, **self.handed}
        return desc

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the feed thread (it ends within the source's ``next`` wait: the source's
        ``cancel()`` is called when it has one). Batches staged are dropped."""
        self._stop.set()
        cancel = getattr(self.source, "cancel", None)
        if callable(cancel):
            cancel()
        for t in (self._receiver, self._thread):
            if t is not None and t.is_alive():
                t.join(timeout)
                if t.is_alive():
                    log.warning("the device feed's thread %s did not end within %.0f s", t.name, timeout)
                    return
        self.stager.close()  # the copies from lent blocks waited for, the blocks let go
        if self.ring is not None:
            self.ring.close()

    def close(self) -> None:
        """Stop the thread, then close the source."""
        self.stop()
        close = getattr(self.source, "close", None)
        if callable(close):
            close()


def _pin_rings(source: Any, cuda: bool) -> bool:
    """On CUDA, have the source pin its shared-memory rings (``on_shared_memory``, when it has one:
    :meth:`.remote.RemoteSource.on_shared_memory`) with ``cudaHostRegister``
    (:func:`.pinned.cuda_host_register`): batches of input workers on this node are then copied to
    the GPU from the ring itself. Returns whether the source took it."""
    offer = getattr(source, "on_shared_memory", None)
    if not cuda or not callable(offer):
        return False
    from .pinned import cuda_host_register

    return bool(offer(cuda_host_register))


def _lend_pool(source: Any, cuda: bool, lend: bool) -> Any:
    """A :class:`.pinned.PinnedPool` (pinned on CUDA) whose ``allocate`` ``source.lend`` accepted,
    or None (``lend`` False, the source has no ``lend``, or it declined)."""
    offer = getattr(source, "lend", None)
    if not lend or not callable(offer):
        return None
    from .pinned import PinnedPool

    pool = PinnedPool(pin=cuda)
    return pool if offer(pool.allocate) else None


class _IterSource:
    """``next()`` over an iterable of batches (:func:`feed_rate`)."""

    def __init__(self, batches: Iterable[Any]):
        self.it = iter(batches)

    def next(self) -> tuple[Any, int]:
        return next(self.it, None), 0

    def describe(self) -> dict[str, Any]:
        return {}


def feed_rate(batches: Iterable[Any], device: Any, depth: int = DEVICE_PREFETCH) -> float:
    """Bytes per second (10^0 B/s) that :class:`DeviceFeed` moves ``batches`` (numpy nests,
    e.g. what a served probe received) onto ``device`` (``"cuda"``, ``"cpu"``, a
    ``torch.device``), from the first request to the last batch resident (on CUDA the device
    is synchronized at the end). Raises ValueError when ``batches`` is empty."""
    import torch

    feed = DeviceFeed(_IterSource(batches), device, depth=depth)
    t0 = time.perf_counter()
    n = 0
    try:
        while True:
            batch, _ = feed.next()
            if batch is None:
                break
            n += 1
        if feed.cuda:
            torch.cuda.synchronize(feed.device)
    finally:
        feed.close()
    dt = time.perf_counter() - t0
    if n == 0:
        raise ValueError("feed_rate: no batch given")
    return feed.stats.bytes / dt if dt > 0 else float("inf")
