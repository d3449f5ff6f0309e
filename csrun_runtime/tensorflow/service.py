"""tf.data service plumbing (``runconfig.transport: service``) shared by the chief, the input
workers and the analyzer's probes.

Design (see csrun_runtime/README.md):

- The chief hosts one tf.data service ``DispatchServer`` per input worker (all bound to port 0,
  in the chief's process: :func:`start_dispatchers`) and publishes their addresses in the
  rendezvous (:mod:`csrun_runtime.rendezvous`). A dispatcher with a single worker is what lets
  every worker run a different pipeline: a tf.data service job runs its dataset on *every*
  worker of a dispatcher.
- Each input worker (:mod:`csrun_runtime.tensorflow.worker`) registers *its own* dataset as
  :data:`DATASET_ID` with its dispatcher (:func:`register_stream`), in *bundles*
  (:func:`csrun_runtime.tensorflow.bundling.plan_bundle`): ``B`` consecutive batches stacked
  into one service element (``Dataset.batch(B)`` on the worker), because every service element
  costs a fixed round trip (one outstanding ``GetElement`` request per worker stream) that
  dominates small batches.
- The chief reads each worker's stream with ``from_dataset_id(processing_mode="parallel_epochs",
  compression=None)`` on one Python thread per worker and merges them first-come-first-served
  through a bounded queue (:class:`ServiceSource`), handing out chunks of an element's batches
  as every source of the chief does (:mod:`csrun_runtime.tensorflow.sources`).
  A worker that dies only silences its own stream: training goes on with the others
  (:meth:`ServiceSource.add_stream` opens a replacement's or a new worker's stream); a
  watchdog fails the chief naming the workers when no batch arrives for
  ``runconfig.input_timeout_secs``.

TensorFlow is imported inside the functions: importing this module stays light.
"""
from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from .. import workernames
from ..elastic import WorkerWatch
from ..position import InputPositions, untag
from ..rendezvous import HEARTBEAT_SECS, STALE_SECS, Rendezvous
from ..streams import InputStalled, announce_stopped, open_slot, raise_if_stalled, stall_report
from .bundling import BundlePlan, bundle_dataset
from .deviceprefetch import to_device
from .sources import ChunkedSource, map_structure, steps_in

if TYPE_CHECKING:  # annotations only: TensorFlow is imported inside the functions
    import tensorflow as tf

__all__ = ["ServiceSource", "start_dispatchers", "start_worker_server", "register_stream", "count_elements",
           "DATASET_ID"]

#: dataset id each worker registers with its dispatcher.
DATASET_ID = "csrun-train"


def start_dispatchers(n: int) -> tuple[list[Any], list[str]]:
    """Start ``n`` tf.data service dispatchers on port 0 in this process.

    Returns:
        ``(servers, ports)``: keep the servers referenced for the job's life; ``ports[i]`` is
        dispatcher ``i``'s bound port as a string.
    """
    import tensorflow as tf

    svc = tf.data.experimental.service
    servers, ports = [], []
    for _ in range(n):
        server = svc.DispatchServer(svc.DispatcherConfig(port=0, protocol="grpc"))
        servers.append(server)
        ports.append(server.target.rsplit(":", 1)[1])
    return servers, ports


def start_worker_server(dispatcher_address: str, host: str) -> Any:
    """Start a tf.data service ``WorkerServer`` on port 0 attached to the dispatcher at
    ``dispatcher_address`` (``host:port``), advertising ``host`` (the address the chief
    reaches it by), heartbeat every second. The caller keeps it referenced for the process's
    life: destroying it can deadlock a pipeline that uses ``tf.py_function``."""
    import tensorflow as tf

    svc = tf.data.experimental.service
    return svc.WorkerServer(svc.WorkerConfig(
        dispatcher_address=dispatcher_address, worker_address=f"{host}:%port%", port=0,
        protocol="grpc", heartbeat_interval_ms=1000))


def _is_lost_worker_error(e: BaseException) -> bool:
    import tensorflow as tf
    return isinstance(e, (tf.errors.UnavailableError, tf.errors.CancelledError,
                          tf.errors.AbortedError, tf.errors.DeadlineExceededError,
                          tf.errors.OutOfRangeError, StopIteration))


def register_stream(address: str, ds: Any, plan: BundlePlan, counter: list[int],
                    dataset_id: str = DATASET_ID, compression: str | None = None,
                    positioned: Callable[[Any, int], Any] | None = None) -> Any:
    """Register an input worker's training dataset with its dispatcher (``host:port``), as the runtime's input workers
    do: bundled by ``plan`` (with ``positioned``: ``positioned(ds, bundle)`` makes the bundles from the stream's
    position, :func:`csrun_runtime.tensorflow.resume.positioned`), each element (a bundle) counted in ``counter[0]``
    (:func:`count_elements`), no compression (docs/DESIGN.md). Returns the registered dataset. The WorkerServer
    serving it must already be attached to the dispatcher (or be started later)."""
    import tensorflow as tf

    bundles = bundle_dataset(ds, plan.bundle) if positioned is None else positioned(ds, plan.bundle)
    served = count_elements(bundles, counter)
    tf.data.experimental.service.register_dataset(service=f"grpc://{address}", dataset=served,
                                                  compression=compression, dataset_id=dataset_id)
    return served


def count_elements(ds: tf.data.Dataset, counter: list[int]) -> tf.data.Dataset:
    """Wrap ``ds`` so that every element produced increments ``counter[0]`` (in this process:
    the dataset is executed by the WorkerServer that lives in the same process)."""
    import numpy as np
    import tensorflow as tf

    def tick():
        counter[0] += 1
        return np.int64(counter[0])

    def fn(*element):  # (features, labels), or one nest (a positioned stream's bundle)
        n = tf.py_function(tick, [], tf.int64)
        with tf.control_dependencies([n]):
            head = tf.nest.map_structure(tf.identity, element[0])
        return (head, *element[1:]) if len(element) > 1 else head

    return ds.map(fn)


class ServiceSource(ChunkedSource):
    """Merge the streams of every input worker (one reader thread per worker's dispatcher).

    Args:
        rdv: the rendezvous (to name workers and read heartbeats).
        addresses: ``host:port`` of dispatcher ``i`` for worker ``i``.
        registry: the workers' registrations by index (node, host, pid, and ``bundle``: the
            batches per service element of that worker's stream, 1 when absent).
        queue_size: bound of the merge queue in service elements (default ``max(4, 2 n)``).
        dataset_id: the dataset id the workers registered (:data:`DATASET_ID`).
        positions: every slot's stream position (published at once): each stream's elements
            handed out in stream order, duplicates dropped (:mod:`csrun_runtime.position`).

    ``get_chunk(max_steps, timeout)`` returns a :class:`~csrun_runtime.tensorflow.sources.Chunk`
    and ``get(timeout)`` one batch ``(worker_index, (features, labels))``; both raise
    :class:`InputStalled` naming the workers (node, heartbeat age, last batch) when no batch
    arrived for ``timeout`` seconds or every stream has failed. Each worker's batches come in
    that worker's order; across workers, elements are merged first come, first served. A stream
    that fails with a worker-loss error (Unavailable, Cancelled, ...) or whose worker's
    heartbeat goes stale is reported once as a warning and training continues with the others;
    any other error from a worker's pipeline (e.g. InvalidArgument from input_fn's ops) fails
    the chief naming it.
    """

    def __init__(self, rdv: Rendezvous, addresses: list[str], registry: Mapping[int, Mapping],
                 queue_size: int = 0, dataset_id: str = DATASET_ID, positions: InputPositions | None = None):
        super().__init__()
        self.rdv, self.positions = rdv, positions
        if positions is not None:  # before any stream is read: its worker's dataset reads it
            positions.publish(rdv)
        self.registry = dict(registry)
        self.n = len(addresses)
        self.dataset_id = dataset_id
        self._q: queue.Queue = queue.Queue(maxsize=queue_size or max(4, 2 * self.n))
        self._stop = threading.Event()
        self.counts = {i: 0 for i in range(self.n)}
        self.last: dict[int, float | None] = {i: None for i in range(self.n)}  # monotonic time of last element
        self.failed: dict[int, str] = {}
        self.announced: set = set()
        self._fatal: str | None = None
        self._next_check = time.monotonic() + HEARTBEAT_SECS
        self._datasets: dict[int, Any] = {}
        self._threads: dict[int, threading.Thread] = {}
        self._generation: dict[int, int] = {}  # streams opened per worker index (add_stream)
        self._flowing: dict[int, threading.Event] = {}  # cleared: the stream is paused (autoscale)
        self.paused: set[int] = set()
        self.addresses = list(addresses)
        self.watch = WorkerWatch(rdv, self.registry)  # lost and replaced workers (elastic.py)
        for i, addr in enumerate(addresses):
            self._start_stream(i, addr)

    def add_stream(self, index: int, address: str, registration: Mapping | None = None) -> None:
        """Open (or reopen) worker ``index``'s stream: a new reader thread reads :data:`DATASET_ID` of the dispatcher
        at ``address`` (``host:port``) into the merge queue; ``registration`` (``workers/<index>.json``) replaces the
        old. A new ``index >= n`` grows the source (indices between count as stopped); a lost one's failure and stop
        are forgotten, its batch count kept. Call it between chunks; an old reader of ``index`` ends with its stream."""
        open_slot(self, index, registration)
        self.addresses += [""] * (self.n - len(self.addresses))
        self.addresses[index] = address
        self._start_stream(index, address)

    def _start_stream(self, i: int, address: str) -> None:
        """Open worker ``i``'s stream and start its reader thread (the merge queue is shared
        and counts are by worker index)."""
        import tensorflow as tf

        self._bundles[i] = int((self.registry.get(i) or {}).get("bundle") or 1)
        self._datasets[i] = tf.data.experimental.service.from_dataset_id(
            processing_mode="parallel_epochs", service=f"grpc://{address}", dataset_id=self.dataset_id)
        self._generation[i] = gen = self._generation.get(i, 0) + 1
        self._flowing.setdefault(i, threading.Event())
        if i not in self.paused:
            self._flowing[i].set()
        self._threads[i] = threading.Thread(target=self._read, args=(i, gen), daemon=True,
                                            name=f"stream-{i}.{gen}")
        self._threads[i].start()

    def _who(self, i: int) -> str:
        reg = self.registry.get(i) or {}
        return f"{workernames.name(i)} on {reg.get('node', '?')} (pid {reg.get('pid', '?')})"

    def _put(self, item: tuple[int, int, Any, int | None]) -> bool:
        while not self._stop.is_set():
            try:
                self._q.put(item, timeout=0.5)
                return True
            except queue.Full:
                continue
        return False

    def _read(self, i: int, gen: int) -> None:
        try:
            for tagged in self._datasets[i]:
                first, element = untag(tagged)  # the stream index of its first batch (position.py)
                if not self._put((i, gen, element, first)):
                    return
                while not self._flowing[i].wait(0.5):  # paused: read nothing more
                    if self._stop.is_set():
                        return
            self._put((i, gen, StopIteration("the stream ended"), None))
        except BaseException as e:  # noqa: BLE001 - reported to the consumer
            self._put((i, gen, e, None))

    def pause(self, i: int) -> None:
        """Stop reading worker ``i``'s stream (autoscale's *remove*; not reported stopped): its reader takes no element
        after the one it holds, so the worker stops once its buffers are full. :meth:`resume` reads it again."""
        self.paused.add(i)
        self._flowing[i].clear()

    def resume(self, i: int) -> None:
        """Read worker ``i``'s paused stream again."""
        self.paused.discard(i)
        self._flowing[i].set()

    def buffered_batches(self) -> int:
        """At most how many batches the chief holds ahead of training: the merge queue's
        elements and one per streaming reader thread, each of the largest bundle."""
        streams = self.streaming()
        return (self._q.maxsize + len(streams)) * max([self._bundles.get(i, 1) for i in streams] or [1])

    def streaming(self) -> set[int]:
        """Indices of the workers whose stream is open, not paused and not stopped."""
        return set(self._threads) - self.paused - self.stopped()

    def stopped(self) -> set[int]:
        """Indices of the workers whose stream failed or whose heartbeat went stale."""
        return set(self.announced) | set(self.failed)

    def reopen(self, i: int, registration: Mapping) -> str:
        """Read worker ``i``'s stream again after its replacement registered with dispatcher
        ``i`` (:mod:`csrun_runtime.elastic`). When the reader thread still waits in the stream
        (the tf.data service client retries a lost worker and takes up the dispatcher's new
        worker by itself), only the worker's stopped state is cleared; when it ended with an
        error, :meth:`add_stream` opens a new stream of the dataset on a new reader thread.
        Returns ``"resumed"`` or ``"reopened"`` (``"not streaming"`` for a slot whose stream
        autoscale never opened: only its registration is kept)."""
        if self.positions is not None:
            self.positions.answer(self.rdv, i, int(registration.get("attempt") or 0))
        if i not in self._threads:
            self.registry[i] = dict(registration)
            return "not streaming"
        if self._threads[i].is_alive():
            self.registry[i] = dict(registration)
            self.failed.pop(i, None)
            self.announced.discard(i)
            return "resumed"
        self.add_stream(i, self.addresses[i], registration)
        return "reopened"

    def _handle_error(self, i: int, e: BaseException) -> None:
        if _is_lost_worker_error(e):
            self.failed[i] = f"{type(e).__name__}: {str(e).strip()[:200]}"
            if i not in self.announced:
                announce_stopped(self, i, f"streaming ({self.failed[i]})")
        else:
            self._fatal = (f"{self._who(i)}: its input pipeline failed: {type(e).__name__}: "
                           f"{str(e).strip()[:500]}")

    def _check_heartbeats(self) -> None:
        for i in range(self.n):
            if i in self.announced:
                continue
            age = self.rdv.age(f"workers/{i}")
            if age is not None and age > STALE_SECS:
                announce_stopped(self, i, f": no heartbeat for {age:.0f} s")

    def status_text(self) -> str:
        """One clause per worker: node, heartbeat age, batches delivered, last element age (streams.stall_report)."""
        return stall_report(self, set(self.failed), failed_prefix="error ")

    def _next_element(self, timeout: float, what: str) -> tuple[int, Any]:
        """The next service element of any stream (first come, first served), with the
        watchdog: heartbeats checked every HEARTBEAT_SECS, InputStalled after ``timeout``."""
        start = time.monotonic()
        while True:
            if self._fatal:
                raise InputStalled(self._fatal)
            if len(set(self.failed) - self.watch.awaiting()) == self.n:
                raise InputStalled(f"every input worker's stream failed: {self.status_text()}")
            now = time.monotonic()
            if now >= self._next_check:
                # stale heartbeats first, so that this poll records them (it reads a supervisor's
                # death record, exact in time and cause, before any stopped stream)
                self._check_heartbeats()
                self.watch.poll(self)
                if self.positions is not None:
                    self.positions.poll_resumed(self.rdv, range(self.n))
                self._next_check = now + HEARTBEAT_SECS
            try:
                i, gen, item, first = self._next_item(0.5)
            except queue.Empty:
                raise_if_stalled(self, start, timeout, what)
                continue
            if isinstance(item, BaseException):
                if gen == self._generation[i]:  # an error of a stream add_stream replaced is old news
                    self._handle_error(i, item)
                continue
            size = steps_in(item) if self._bundles.get(i, 1) > 1 else 1
            drop = self.positions.accept(i, first, size) if self.positions is not None else 0
            if drop >= size:  # its batches were handed out already
                continue
            self.last[i] = time.monotonic()
            return i, (item if not drop else map_structure(lambda t, d=drop: t[d:], item))

    def _pull(self, wait: float) -> tuple[int, int, Any, int | None]:
        """Next ``(worker, stream generation, element or error, first batch's stream index)``; Empty after wait s."""
        return self._q.get(timeout=wait)

    def _stage(self, item: tuple[int, int, Any, int | None], device: str) -> tuple[int, int, Any, int | None]:
        i, gen, element, first = item
        return item if isinstance(element, BaseException) else (i, gen, to_device(element, device), first)

    def describe(self) -> dict[str, Any]:
        """Per-worker batch counts (batches handed to training), nodes and batches per
        element (for performance.json and the log); with the device prefetch its figures
        (its thread stopped)."""
        return {
            "num_workers": self.n,
            "batches_per_worker": {str(i): self.counts[i] for i in range(self.n)},
            "worker_nodes": {str(i): (self.registry.get(i) or {}).get("node") for i in range(self.n)},
            "workers_stopped": sorted(set(self.announced) | set(self.failed)),
            "workers_paused": sorted(self.paused),
            "batches_per_element": {str(i): self._bundles.get(i, 1) for i in range(self.n)},
            **self.watch.describe(),
            **self.stop_prefetch(),
        }

    def close(self) -> None:
        """Stop the reader threads after their current element, joining none (daemons: deleting a tf.data service
        iterator may block for seconds; the process leaves with ``os._exit``), and the device prefetch's thread."""
        self._stop.set()
        self.stop_prefetch()
