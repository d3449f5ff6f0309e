"""The chief's training batches over csrun's data plane (``runconfig.transport: dataplane``).

The alternative to tf.data service (:class:`csrun_runtime.service.ServiceSource`) on the
TensorFlow path (docs/DATAPLANE.md "The TensorFlow path"): the chief binds one
:class:`csrun_runtime.dataplane.Receiver` (a zmq ROUTER, one endpoint for every input worker:
:func:`start_receiver`) and publishes it in ``dispatchers.json`` (``transport: dataplane``,
``dispatchers[i]`` the endpoint for worker ``i``); each input worker sends its bundles to it
(:mod:`csrun_runtime.dataplane_serve`). :class:`DataplaneSource` merges them first come, first
served, and hands the training loop the same :class:`csrun_runtime.service.Chunk` s as the
service path: one received bundle (``n`` batches stacked on a leading axis, arrays over the
received frames) is one chunk source, so training runs several steps per call and no Python
runs per batch.

Everything :class:`~csrun_runtime.service.ServiceSource` offers the training loop, the
elastic watch (:mod:`csrun_runtime.elastic`) and the autoscaler
(:mod:`csrun_runtime.autoscale`) is kept: per-worker counts (batches handed out), bounded
buffers (the receiver's credit window per worker), pause/resume, a replaced worker read again
(the replacement connects with a higher ``attempt``: :meth:`DataplaneSource.reopen` only
clears its stopped state), stall detection naming the workers (heartbeats, last bundle), a
worker's pipeline error failing the chief naming it (``workers/<i>.stream_error.json``,
written by the worker).

Imports no TensorFlow: the chief passes ``convert`` (numpy -> tensors) for its train steps.
"""
from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from csrun_common.atomic import read_json

from .elastic import WorkerWatch
from .rendezvous import HEARTBEAT_SECS, STALE_SECS, Rendezvous
from .service import (
    Chunk,
    InputStalled,
    _ChunkedSource,
    _Pending,
    announce_stopped,
    open_slot,
    raise_if_stalled,
    stall_report,
)

__all__ = ["DataplaneSource", "start_receiver", "TRANSPORT", "STREAM_ERROR"]

log = logging.getLogger("csrun.runtime")

#: ``runconfig.transport`` value (and ``dispatchers.json`` ``transport``) of this path.
TRANSPORT = "dataplane"
#: File (under the rendezvous' ``workers/``) where input worker ``<i>`` records the error that
#: ended its pipeline: ``<i>.stream_error.json`` ``{"error", "attempt", "node", "pid"}``.
STREAM_ERROR = "{index}.stream_error.json"


def start_receiver(host: str, window_bytes: int | None = None) -> tuple[Any, str]:
    """Bind the chief's receiver on every interface, on a free port. Returns ``(receiver,
    endpoint)``: the endpoint is ``tcp://<host>:<port>`` with ``host`` the address the input
    workers reach the chief by. Raises ``zmq.ZMQError`` when nothing can be bound."""
    from .dataplane import WINDOW_BYTES, Receiver

    r = Receiver("tcp://*:0", window_bytes=window_bytes or WINDOW_BYTES)
    port = r.endpoint.rsplit(":", 1)[1]
    return r, f"tcp://{host}:{port}"


def _map(fn: Callable[[Any], Any], nest: Any) -> Any:
    """``fn`` on every leaf of a nest of tuples, lists and dicts (``None`` stays ``None``)."""
    if isinstance(nest, tuple):
        return tuple(_map(fn, x) for x in nest)
    if isinstance(nest, list):
        return [_map(fn, x) for x in nest]
    if isinstance(nest, dict):
        return {k: _map(fn, v) for k, v in nest.items()}
    return None if nest is None else fn(nest)


class DataplaneSource(_ChunkedSource):
    """Merge the bundles every input worker sends to the chief's receiver.

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

    ``get_chunk(max_steps, timeout)`` returns a :class:`~csrun_runtime.service.Chunk` (its
    ``batches`` a bundle: every leaf ``[n, ...]``) and ``get(timeout)`` one batch ``(worker,
    (features, labels))``; both raise :class:`~csrun_runtime.service.InputStalled` naming the
    workers (node, heartbeat age, batches, last bundle) when no batch arrived for ``timeout``
    seconds or every worker stopped, and naming the worker when its pipeline failed. Call every
    method from one thread (the receiver is not thread-safe).
    """

    def __init__(self, rdv: Rendezvous, receiver: Any, registry: Mapping[int, Mapping],
                 streams: int | None = None, convert: Callable[[Any], Any] | None = None):
        super().__init__()
        self.rdv, self.receiver, self.convert = rdv, receiver, convert
        self.registry = {i: dict(r) for i, r in registry.items()}
        self.n = len(self.registry) if streams is None else int(streams)
        self.counts = {i: 0 for i in range(self.n)}
        self.last: dict[int, float | None] = {i: None for i in range(self.n)}
        self.failed: dict[int, str] = {}
        self.announced: set[int] = set()
        self.paused: set[int] = set()
        self.opened: set[int] = set(range(self.n))
        self.addresses: list[str] = []
        self._held: dict[int, deque] = {}  # bundles of slots not opened yet
        self._held_paused: set[int] = set()  # slots not opened yet, paused at the receiver
        self._fatal: str | None = None
        self._next_check = time.monotonic() + HEARTBEAT_SECS
        self._batch_bytes: dict[int, int] = {}
        self.watch = WorkerWatch(rdv, self.registry)

    # ------------------------------------------------------------------ streams
    def add_stream(self, index: int, address: str = "", registration: Mapping | None = None) -> None:
        """Read slot ``index`` from now on (autoscale's *add* of a slot never read; a new index
        grows the source, indices in between count as stopped); its held bundles come first.
        ``address`` is the receiver's endpoint (kept for :meth:`describe`)."""
        open_slot(self, index, registration)
        self.opened.add(index)
        if index in self.paused or index in self._held_paused:
            self._held_paused.discard(index)
            self.resume(index)

    def pause(self, i: int) -> None:
        """Stop worker ``i``'s stream (autoscale's *remove*): the receiver tells it to send
        nothing more; what it had in flight (at most one credit window) is still handed out. A
        worker not connected yet (still building its dataset) starts paused when it connects."""
        self.paused.add(i)
        self.receiver.pause(i)  # one not connected yet starts paused when it connects

    def resume(self, i: int) -> None:
        """Let paused worker ``i`` send again."""
        self.paused.discard(i)
        self.receiver.resume(i)

    def reopen(self, i: int, registration: Mapping) -> str:
        """Worker ``i``'s replacement registered (:mod:`csrun_runtime.elastic`): it connects to
        the receiver by itself with its higher attempt, which drops what the old attempt still
        had in flight; only its stopped state is cleared here. Returns ``"reconnected"``
        (``"not streaming"`` for a slot autoscale never opened)."""
        self.registry[i] = dict(registration)
        if i not in self.opened:
            return "not streaming"
        self.failed.pop(i, None)
        self.announced.discard(i)
        return "reconnected"

    def streaming(self) -> set[int]:
        """Indices of the workers read now: opened, not paused, not stopped."""
        return self.opened - self.paused - self.stopped()

    def stopped(self) -> set[int]:
        """Indices of the workers whose stream ended or failed, or whose heartbeat went stale."""
        return set(self.announced) | set(self.failed)

    def buffered_batches(self) -> int:
        """At most how many batches the chief holds ahead of training: one credit window per
        streaming worker (in batches of that worker's size) and one bundle."""
        window = int(getattr(self.receiver, "window_bytes", 0))
        total = 0
        for i in self.streaming():
            b = self._batch_bytes.get(i)
            bundle = max(1, self._bundles.get(i, 1))
            total += (window // b if b else bundle) + bundle
        return total

    # ------------------------------------------------------------------ watchdog
    def _who(self, i: int) -> str:
        reg = self.registry.get(i) or {}
        return f"input worker {i} on {reg.get('node', '?')} (pid {reg.get('pid', '?')})"

    def _check_workers(self) -> None:
        """Stale heartbeats, ended streams and pipeline errors the workers recorded."""
        counts = self.receiver.counts()
        for i in range(self.n):
            if i in self.announced:
                continue
            err = read_json(self.rdv.workers_dir / STREAM_ERROR.format(index=i))
            reg = self.registry.get(i) or {}
            if err and int(err.get("attempt") or 0) >= int(reg.get("attempt") or 0):
                self._fatal = f"{self._who(i)}: its input pipeline failed: {str(err.get('error'))[:500]}"
                return
            c = counts.get(i) or {}
            if c.get("done") and int(c.get("attempt") or 0) >= int(reg.get("attempt") or 0):
                self.failed[i] = "the stream ended (the input_fn's dataset is finite)"
            age = self.rdv.age(f"workers/{i}")
            why = (f"no heartbeat for {age:.0f} s" if age is not None and age > STALE_SECS
                   else self.failed.get(i))
            if why:
                announce_stopped(self, i, f": {why}")

    def status_text(self) -> str:
        """One clause per worker: node, heartbeat age, batches handed out, last bundle age
        (:func:`csrun_runtime.service.stall_report`)."""
        return stall_report(self, self.stopped())

    # ------------------------------------------------------------------ bundles
    def _next_element(self, timeout: float, what: str) -> tuple[int, Any]:
        """The next bundle of an opened slot (first come, first served), with the watchdog:
        workers checked every HEARTBEAT_SECS, InputStalled after ``timeout`` s without one."""
        for i in sorted(self.opened & set(self._held)):
            if self._held[i]:
                return self._accept(self._held[i].popleft())
        start = time.monotonic()
        while True:
            if self._fatal:
                raise InputStalled(self._fatal)
            now = time.monotonic()
            if now >= self._next_check:
                self._check_workers()
                self.watch.poll(self)
                self._next_check = now + HEARTBEAT_SECS
                if self._fatal:
                    raise InputStalled(self._fatal)
            try:
                b = self.receiver.get_bundle(timeout=0.5)
            except TimeoutError:
                raise_if_stalled(self, start, timeout, what)
                continue
            if b.worker not in self.opened:  # held, and the worker paused, until add_stream opens it
                self._held.setdefault(b.worker, deque()).append(b)
                if b.worker not in self._held_paused:
                    self._held_paused.add(b.worker)
                    self.receiver.pause(b.worker)
                continue
            return self._accept(b)

    def _accept(self, b: Any) -> tuple[int, Any]:
        self.last[b.worker] = time.monotonic()
        self.counts.setdefault(b.worker, 0)
        n = max(1, b.n)
        self._bundles[b.worker] = n
        self._batch_bytes[b.worker] = max(1, b.nbytes // n)
        nest = b.nest
        if b.n == 0:  # an unstacked message (not from csrun's input workers): one batch
            nest = _map(lambda a: a[None], nest)
        if self.convert is not None:
            nest = _map(self.convert, nest)
        return b.worker, nest

    def _fill(self, timeout: float, what: str) -> _Pending:
        if self._pending is None:
            i, el = self._next_element(timeout, what)
            self._pending = _Pending(i, el, True, self._bundles[i])
        return self._pending

    def get_chunk(self, max_steps: int, timeout: float, what: str = "runconfig.input_timeout_secs") -> Chunk:
        """Up to ``max_steps`` consecutive batches of one worker: the rest of the bundle being
        handed out, else of the next bundle to arrive (passed whole, see
        :class:`~csrun_runtime.service.Chunk`). Raises :class:`InputStalled`."""
        p = self._fill(timeout, what)
        m = min(max(1, int(max_steps)), p.size - p.offset)
        chunk = Chunk(p.worker, p.element, p.offset, m)
        self._took(p, m)
        return chunk

    def get(self, timeout: float, what: str = "runconfig.input_timeout_secs") -> tuple[int, Any]:
        """One batch: ``(worker_index, (features, labels))``. Raises :class:`InputStalled`."""
        p = self._fill(timeout, what)
        a = p.offset
        batch = _map(lambda t: t[a], p.element)
        self._took(p, 1)
        return p.worker, batch

    def describe(self) -> dict[str, Any]:
        """Per-worker batch counts (handed to training), nodes, batches per bundle, the
        receiver's view (bundles, bytes, attempts, bad messages) and the elastic records."""
        rc = self.receiver.counts()
        return {
            "transport": TRANSPORT,
            "num_workers": self.n,
            "batches_per_worker": {str(i): self.counts.get(i, 0) for i in range(self.n)},
            "worker_nodes": {str(i): (self.registry.get(i) or {}).get("node") for i in range(self.n)},
            "workers_stopped": sorted(self.stopped()),
            "workers_paused": sorted(self.paused),
            "batches_per_element": {str(i): self._bundles.get(i, 1) for i in range(self.n)},
            "dataplane": {str(i): {k: c.get(k) for k in ("bundles", "batches", "bytes", "attempt", "errors",
                                                         "stale", "paused")} for i, c in rc.items()},
            "dataplane_errors": self.receiver.errors()[-10:],
            **self.watch.describe(),
        }

    def close(self) -> None:
        """Close the receiver (the workers' next send fails with ReceiverGone and they wait
        for ``done.json``); arrays already handed out stay valid."""
        self.receiver.close()



def start_for_chief(rdv: Rendezvous, host: str, num_workers: int, info: Mapping[str, Any]) -> tuple[Any, list[str]]:
    """The chief with ``runconfig.transport: dataplane``: bind the receiver
    (:func:`start_receiver`) and publish it in ``dispatchers.json`` for every input worker
    (``transport: dataplane``, ``dispatchers[i]`` the endpoint, ``info`` added). Returns
    ``(receiver, addresses)``: keep the receiver for :func:`chief_source`."""
    receiver, endpoint = start_receiver(host)
    addresses = [endpoint] * num_workers
    rdv.publish_dispatchers(addresses, {**dict(info), "transport": TRANSPORT})
    log.info("data plane: one receiver at %s for %d input worker(s) (runconfig.transport = dataplane)",
             endpoint, num_workers)
    return receiver, addresses


def chief_source(rdv: Rendezvous, receiver: Any, registry: Mapping[int, Mapping],
                 streams: int | None = None) -> DataplaneSource:
    """The chief's :class:`DataplaneSource`, its bundles converted to tensors for the train
    steps (``tf.convert_to_tensor``: one copy per bundle; no Python per batch)."""
    import tensorflow as tf

    return DataplaneSource(rdv, receiver, registry, streams=streams, convert=tf.convert_to_tensor)
