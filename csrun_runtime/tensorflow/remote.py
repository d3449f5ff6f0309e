"""The TensorFlow chief's sources of the input workers' batches (the backend entry module
``remote``), by transport (``runconfig.transport``): the tf.data service
merge (:class:`csrun_runtime.tensorflow.service.ServiceSource`, the default) and the data plane's
(:class:`DataplaneSource`, ``runconfig.transport: dataplane``), both with the stream interface the
core's autoscaler and training loop drive (:class:`csrun_runtime.backend.StreamSource`).

The data plane is the alternative to tf.data service on the TensorFlow path (docs/DATAPLANE.md
"The TensorFlow path"): the chief binds one
:class:`csrun_runtime.dataplane.Receiver` (a zmq ROUTER, one endpoint for every input worker:
:func:`start_receiver`) and publishes it in ``endpoints.json`` (``transport: dataplane``,
``endpoints[i]`` the endpoint for worker ``i``); each input worker sends its bundles to it
(:mod:`csrun_runtime.tensorflow.dataplane_serve`). The merge of those streams is the framework-neutral
core's :class:`csrun_runtime.streams.StreamMerge` (per-worker counts, credit windows,
pause/resume/add_stream/reopen for the autoscaler and the elastic watch, stall detection
naming the workers, a worker's pipeline error failing the chief naming it:
``workers/<i>.stream_error.json``, written by the worker). :class:`DataplaneSource` is its
TensorFlow adapter: it hands the training loop the same :class:`csrun_runtime.tensorflow.service.Chunk` s
as the service path: one received bundle (``n`` batches stacked on a leading axis, arrays over
the received frames) is one chunk source, so training runs several steps per call and no
Python runs per batch.

Imports no TensorFlow at import: the chief passes ``convert`` (numpy -> tensors) for its train
steps (:func:`chief_source`).
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from ..bundles import map_nest
from ..position import InputPositions
from ..rendezvous import Rendezvous
from ..streams import STREAM_ERROR, StreamMerge, plane_note, raise_if_stalled, start_receiver
from .deviceprefetch import to_device
from .service import ServiceSource
from .sources import Chunk, ChunkedSource, Pending

__all__ = ["DataplaneSource", "ServiceSource", "start_receiver", "start_for_chief", "chief_source",
           "TRANSPORT", "STREAM_ERROR"]

log = logging.getLogger("csrun.runtime")

#: ``runconfig.transport`` value (and ``endpoints.json`` ``transport``) of this path.
TRANSPORT = "dataplane"



class DataplaneSource(StreamMerge, ChunkedSource):
    """The TensorFlow chief's adapter over :class:`csrun_runtime.streams.StreamMerge`: the
    bundles every input worker sends to the chief's receiver, as chunks.

    Args:
        rdv: the rendezvous (to name workers, read heartbeats and stream errors).
        receiver: the bound :class:`csrun_runtime.dataplane.Receiver` the workers send to.
        registry: the workers' registrations by index (node, host, pid, attempt, ``bundle``).
        streams: how many slots are read from the start (``0 .. streams-1``; autoscale opens
            the others with :meth:`add_stream`), default every registered worker. A slot not
            opened yet is paused at the receiver on its first bundle; what it sent until then
            (at most one credit window) is kept for when it is opened.
        convert: applied to every leaf of a received bundle before it is handed out (the
            chief passes ``tf.convert_to_tensor``); ``None``: numpy arrays over the frames.
        positions: every slot's stream position (:class:`csrun_runtime.streams.StreamMerge`'s).

    ``get_chunk(max_steps, timeout)`` returns a :class:`~csrun_runtime.tensorflow.service.Chunk` (its
    ``batches`` a bundle: every leaf ``[n, ...]``) and ``get(timeout)`` one batch ``(worker,
    (features, labels))``; both raise :class:`~csrun_runtime.streams.InputStalled` naming the
    workers (node, heartbeat age, batches, last bundle) when no batch arrived for ``timeout``
    seconds or every worker stopped, and naming the worker when its pipeline failed. Call every
    method from one thread (the receiver is not thread-safe); after :meth:`start_prefetch`
    (the chief on a GPU) the prefetch thread alone receives, until :meth:`describe` or
    :meth:`close` stops it.
    """

    def __init__(self, rdv: Rendezvous, receiver: Any, registry: Mapping[int, Mapping],
                 streams: int | None = None, convert: Callable[[Any], Any] | None = None,
                 positions: InputPositions | None = None):
        ChunkedSource.__init__(self)
        StreamMerge.__init__(self, rdv, receiver, registry, len(registry) if streams is None else int(streams),
                             positions=positions)
        self.convert = convert
        self._bundles = self.slots.bundle_n  # batches per bundle, by worker (the chunks' sizes)
        self._last_poll = time.monotonic()  # the first look at the workers after POLL_SECS
        # held while receiving (the watch's state changes there) and while the watchdog reads that
        # state: with the device prefetch the two run on different threads; the watchdog, set
        # waiting, goes first (the receiving thread would take the lock again at once)
        self._watch_lock = threading.Lock()
        self._watchdog_waiting = threading.Event()

    # ------------------------------------------------------------------ bundles
    def _next_element(self, timeout: float, what: str) -> tuple[int, Any, int]:
        """The next bundle of an opened slot (:meth:`~csrun_runtime.streams.StreamMerge.next_bundle`),
        its leaves converted; InputStalled after ``timeout`` s without one, or at once when
        every worker stopped (:func:`csrun_runtime.streams.raise_if_stalled`)."""
        start = time.monotonic()
        while True:
            try:
                return self._next_item(0.5)
            except (TimeoutError, queue.Empty):
                self._watchdog_waiting.set()
                try:
                    with self._watch_lock:
                        raise_if_stalled(self, start, timeout, what)
                finally:
                    self._watchdog_waiting.clear()

    def _pull(self, wait: float) -> tuple[int, Any, int]:
        """The next bundle as ``(worker, nest, batches)``, its leaves converted; raises ``TimeoutError``
        after ``wait`` seconds (:meth:`~csrun_runtime.streams.StreamMerge.next_bundle`). With the
        device prefetch only its thread calls it."""
        while self._watchdog_waiting.is_set():  # the loop's watchdog reads the workers' state first
            time.sleep(0.001)
        with self._watch_lock:
            b = self.next_bundle(wait)
        nest = b.nest
        if b.n == 0:  # an unstacked message (not from csrun's input workers): one batch
            nest = map_nest(lambda a: a[None], nest)
        if self.convert is not None:
            nest = map_nest(self.convert, nest)
        return b.worker, nest, max(1, b.n)

    def _stage(self, item: tuple[int, Any, int], device: str) -> tuple[int, Any, int]:
        worker, nest, n = item
        return worker, to_device(nest, device), n

    def _fill(self, timeout: float, what: str) -> Pending:
        if self._pending is None:
            i, el, n = self._next_element(timeout, what)
            self._pending = Pending(i, el, True, n)
        return self._pending

    def get_chunk(self, max_steps: int, timeout: float, what: str = "runconfig.input_timeout_secs") -> Chunk:
        """Up to ``max_steps`` consecutive batches of one worker: the rest of the bundle being
        handed out, else of the next bundle to arrive (passed whole, see
        :class:`~csrun_runtime.tensorflow.service.Chunk`). Raises :class:`~csrun_runtime.streams.InputStalled`."""
        p = self._fill(timeout, what)
        m = min(max(1, int(max_steps)), p.size - p.offset)
        chunk = Chunk(p.worker, p.element, p.offset, m)
        self._took(p, m)
        return chunk

    def get(self, timeout: float, what: str = "runconfig.input_timeout_secs") -> tuple[int, Any]:
        """One batch: ``(worker_index, (features, labels))``. Raises
        :class:`~csrun_runtime.streams.InputStalled`."""
        p = self._fill(timeout, what)
        a = p.offset
        batch = map_nest(lambda t: t[a], p.element)
        self._took(p, 1)
        return p.worker, batch

    # ------------------------------------------------------------------ the record
    def describe(self) -> dict[str, Any]:
        """Per-worker batch counts (handed to training), nodes, batches per bundle, the receiver's view and the
        elastic records; with the device prefetch its figures (its thread stopped first)."""
        stats = self.stop_prefetch()  # first: the receiver is read from one thread at a time
        return {"transport": TRANSPORT, "num_workers": self.n, **super().describe(), **stats}

    def close(self) -> None:
        """Stop the device prefetch's thread, if any, then close the receiver
        (:meth:`~csrun_runtime.streams.StreamMerge.close`)."""
        self.stop_prefetch()
        super().close()

    def _describe_plane(self) -> dict[str, Any]:
        rc = self.receiver.counts()
        return {
            "workers_stopped": sorted(self.stopped()),
            "batches_per_element": {str(i): self._bundles.get(i, 1) for i in range(self.n)},
            "dataplane": {str(i): {k: c.get(k) for k in ("bundles", "batches", "bytes", "attempt", "errors",
                                                         "stale", "paused")} for i, c in rc.items()},
            "dataplane_errors": self.receiver.errors()[-10:],
            "dataplane_bulk": self.receiver.bulk_port is not None,
        }


def start_for_chief(rdv: Rendezvous, host: str, num_input_workers: int,
                    info: Mapping[str, Any], options: Mapping[str, Any] | None = None) -> tuple[Any, list[str]]:
    """The chief with ``runconfig.transport: dataplane``: bind the receiver
    (:func:`start_receiver`) and publish it in ``endpoints.json`` for every input worker
    (``transport: dataplane``, ``endpoints[i]`` the endpoint, ``info`` added). Returns
    ``(receiver, addresses)``: keep the receiver for :func:`chief_source`. ``options``: the
    receiver's keywords from runconfig (:func:`csrun_runtime.streams.dataplane_options`: the bulk
    channel, the shared-memory rings)."""
    receiver, endpoint = start_receiver(host, **dict(options or {}))
    addresses = [endpoint] * num_input_workers
    rdv.publish_endpoints(addresses, {**dict(info), "transport": TRANSPORT})
    log.info("data plane: one receiver at %s for %d input worker(s) (runconfig.transport = dataplane)%s",
             endpoint, num_input_workers, plane_note(receiver))
    return receiver, addresses


def chief_source(rdv: Rendezvous, receiver: Any, registry: Mapping[int, Mapping],
                 streams: int | None = None, positions: InputPositions | None = None) -> DataplaneSource:
    """The chief's :class:`DataplaneSource`, its bundles converted to tensors for the train
    steps (``tf.convert_to_tensor``: one copy per bundle; no Python per batch)."""
    import tensorflow as tf

    return DataplaneSource(rdv, receiver, registry, streams=streams, convert=tf.convert_to_tensor,
                           positions=positions)
