"""tf.data service plumbing shared by the chief, the input workers and the analyzer's probes.

Design (see csrun_runtime/README.md):

- The chief hosts one tf.data service ``DispatchServer`` per input worker (all bound to port 0,
  in the chief's process: :func:`start_dispatchers`) and publishes their addresses in the
  rendezvous (:mod:`csrun_runtime.rendezvous`). A dispatcher with a single worker is what lets
  every worker run a different pipeline: a tf.data service job runs its dataset on *every*
  worker of a dispatcher.
- Each input worker (:mod:`csrun_runtime.tensorflow.worker`) registers *its own* dataset as
  :data:`DATASET_ID` with its dispatcher (:func:`register_stream`). Small batches travel in
  *bundles* (:func:`plan_bundle`): ``B`` consecutive batches stacked into one service element
  (``Dataset.batch(B)`` on the worker), because every service element costs a fixed
  round trip (one outstanding ``GetElement`` request per worker stream) that dominates
  small batches.
- The chief reads each worker's stream with ``from_dataset_id(processing_mode="parallel_epochs",
  compression=None)`` on one Python thread per worker and merges them first-come-first-served
  through a bounded queue (:class:`ServiceSource`). The training loop takes *chunks*
  (:class:`Chunk`: up to all the batches of one element, in the worker's order) and trains
  several steps per call on them; :meth:`ServiceSource.get` still hands out single batches.
  A worker that dies only silences its own stream: training goes on with the others
  (:meth:`ServiceSource.add_stream` opens a replacement's or a new worker's stream); a
  watchdog fails the chief naming the workers when no batch arrives for
  ``runconfig.input_timeout_secs``. Without input workers the chief iterates the pipeline
  itself (:class:`LocalSource`), bundled the same way.

TensorFlow is imported inside the functions: importing this module stays light.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from .. import workernames
from ..bundles import BUNDLE_TARGET_BYTES, MAX_BUNDLE
from ..elastic import WorkerWatch
from ..position import InputPositions, untag
from ..rendezvous import HEARTBEAT_SECS, STALE_SECS, Rendezvous
from ..streams import InputStalled, announce_stopped, open_slot, raise_if_stalled, stall_report
from .deviceprefetch import DevicePrefetch, PrefetchPlan, prefetch_in_process, to_device

if TYPE_CHECKING:  # annotations only: TensorFlow is imported inside the functions
    import tensorflow as tf

__all__ = ["BatchSource", "ServiceSource", "LocalSource", "ChunkedSource", "Pending", "InputStalled", "Chunk",
           "BundlePlan", "map_structure",
           "start_dispatchers", "start_worker_server", "plan_bundle", "batch_nbytes", "bundle_dataset",
           "register_stream", "limit_threads", "count_elements", "DATASET_ID", "BUNDLE_TARGET_BYTES",
           "MAX_BUNDLE"]

#: dataset id each worker registers with its dispatcher.
DATASET_ID = "csrun-train"

log = logging.getLogger("csrun.runtime")


@dataclass(frozen=True)
class Chunk:
    """Consecutive training batches of one input worker, for one training call: batches
    ``offset .. offset + steps - 1`` of ``batches``.

    Attributes:
        worker: the input worker's index (0 for the in-process pipeline).
        batches: the service element they come from: the structure of one batch
            (``(features, labels)``, ``labels`` may be ``None``) whose every tensor has a
            leading dimension of the element's batches (1 for an unbundled element). Passed
            whole, never sliced: a training call reads its batches in place, and its
            compiled loop sees one shape per element size.
        offset: index of the chunk's first batch in ``batches``.
        steps: how many batches (training steps) the chunk holds, ``>= 1``.
    """

    worker: int
    batches: Any
    offset: int
    steps: int


@dataclass(frozen=True)
class BundlePlan:
    """How many batches one service element carries (see :func:`plan_bundle`).

    Attributes:
        bundle: batches per element (``1``: each element is one batch, no bundling).
        batch_bytes: bytes of one batch (every tensor's static size), ``None`` when a shape
            or dtype has no static size.
        setting: the ``runconfig.input_bundle`` value that chose it (``"auto"`` or an int).
        reason: one line saying why (for the logs and performance.json).
    """

    bundle: int
    batch_bytes: int | None
    setting: str | int
    reason: str

    def describe(self) -> dict[str, Any]:
        """The plan as a JSON-ready dict."""
        return {"batches_per_element": self.bundle, "batch_bytes": self.batch_bytes,
                "element_bytes": None if self.batch_bytes is None else self.batch_bytes * self.bundle,
                "setting": self.setting, "reason": self.reason}


class BatchSource(Protocol):
    """Where the chief's training batches come from (:class:`ServiceSource`, :class:`LocalSource`).

    ``get_chunk(max_steps, timeout, what)`` returns a :class:`Chunk` of ``1..max_steps``
    batches of one worker, in that worker's order; ``get(timeout, what)`` returns one batch as
    ``(worker_index, (features, labels))``. Both raise :class:`InputStalled` after ``timeout``
    seconds without a batch (``what`` names the setting in the message). ``describe()`` gives
    the per-worker batch counts for performance.json (batches handed out, in batches).
    """

    def get_chunk(self, max_steps: int, timeout: float, what: str = ...) -> Chunk: ...

    def get(self, timeout: float, what: str = ...) -> tuple[int, Any]: ...

    def describe(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


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


# --------------------------------------------------------------------------- bundling
def batch_nbytes(element_spec: Any) -> int | None:
    """Bytes of one element of ``element_spec`` (a batch): the sum over its dense tensors of
    elements × dtype size. ``None`` when a shape is not fully static, a dtype has no fixed
    size (string, variant) or a component is not a dense tensor (sparse, ragged): such
    elements cannot be stacked by ``Dataset.batch``. ``None`` labels count 0 bytes."""
    import tensorflow as tf

    total = 0
    for spec in tf.nest.flatten(element_spec):
        if spec is None or type(spec).__name__ == "NoneTensorSpec":
            continue
        if not isinstance(spec, tf.TensorSpec) or not spec.shape.is_fully_defined():
            return None
        if spec.dtype in (tf.string, tf.variant, tf.resource):
            return None
        total += int(spec.shape.num_elements()) * int(spec.dtype.size)
    return total


def plan_bundle(element_spec: Any, setting: str | int = "auto", max_batches: int | None = None) -> BundlePlan:
    """How many batches an input worker stacks into one tf.data service element.

    Every service element costs a round trip on its worker's stream (the tf.data service
    client keeps one ``GetElement`` request outstanding per worker), so small batches are
    sent ``B`` at a time (``Dataset.batch(B)``) and unstacked by the chief.

    Args:
        element_spec: ``element_spec`` of the training dataset (one batch per element).
        setting: ``runconfig.input_bundle``: ``"auto"`` — ``B = min(MAX_BUNDLE,
            max(1, BUNDLE_TARGET_BYTES // batch_bytes))``; an int ``N >= 1`` — exactly ``N``
            (``1`` turns bundling off).
        max_batches: with ``"auto"``, at most this many batches per element (an input
            worker passes the run's steps ÷ (4 × input workers), so that a short run still
            takes batches from every worker: the merge is first come, first served by
            element). ``None``: no such cap.

    Returns:
        the :class:`BundlePlan`. Bundling needs every tensor's shape and size to be static
        (``Dataset.batch`` stacks equal shapes only): otherwise ``bundle == 1`` whatever the
        setting, and ``reason`` says so.
    """
    nbytes = batch_nbytes(element_spec)
    if nbytes is None:
        return BundlePlan(1, None, setting, "off: the batch has a tensor without a static shape "
                                            "and size, which Dataset.batch cannot stack")
    if setting != "auto":
        n = int(setting)
        why = "off (runconfig.input_bundle = 1)" if n == 1 else f"runconfig.input_bundle = {n}"
        return BundlePlan(n, nbytes, setting, why)
    n = max(1, min(MAX_BUNDLE, BUNDLE_TARGET_BYTES // max(1, nbytes)))
    capped = max_batches is not None and n > max(1, max_batches)
    n = max(1, min(n, max_batches)) if max_batches is not None else n
    if capped:
        why = (f"auto: {n} batches of {_mb(nbytes)} per element, capped by the run's length "
               f"(at most a quarter of each input worker's share of the steps)")
    elif n == 1:
        why = (f"off: a batch ({_mb(nbytes)}) is already at least half of the "
               f"{_mb(BUNDLE_TARGET_BYTES)} element size bundling aims at")
    else:
        why = (f"auto: {n} batches of {_mb(nbytes)} per element ({_mb(n * nbytes)}, aiming at "
               f"{_mb(BUNDLE_TARGET_BYTES)})")
    return BundlePlan(n, nbytes, setting, why)


def _mb(nbytes: int) -> str:
    if nbytes >= 1 << 20:
        return f"{nbytes / (1 << 20):.2f} MiB"
    return f"{nbytes / 1024:.1f} KiB"


def bundle_dataset(ds: Any, bundle: int) -> Any:
    """``ds`` with ``bundle`` consecutive batches stacked into each element (a new leading
    dimension of size ``bundle``; the dataset is infinite, so nothing is dropped); ``ds``
    itself when ``bundle == 1``."""
    if bundle <= 1:
        return ds
    return ds.batch(int(bundle), drop_remainder=True)


def register_stream(address: str, ds: Any, plan: BundlePlan, counter: list[int],
                    dataset_id: str = DATASET_ID, compression: str | None = None,
                    positioned: Callable[[Any, int], Any] | None = None) -> Any:
    """Register an input worker's training dataset with its dispatcher (``host:port``), the
    way the runtime's input workers do: bundled by ``plan`` (with ``positioned``:
    ``positioned(ds, bundle)`` makes the bundles, from the stream's position:
    :func:`csrun_runtime.tensorflow.resume.positioned`), each element counted in ``counter[0]``
    (:func:`count_elements`; service elements, i.e. bundles), no compression (measured:
    compression costs the chief CPU and gained nothing on loopback). Returns the registered
    dataset. The WorkerServer serving it must already be attached to the dispatcher (or be
    started later)."""
    import tensorflow as tf

    bundles = bundle_dataset(ds, plan.bundle) if positioned is None else positioned(ds, plan.bundle)
    served = count_elements(bundles, counter)
    tf.data.experimental.service.register_dataset(service=f"grpc://{address}", dataset=served,
                                                  compression=compression, dataset_id=dataset_id)
    return served


# --------------------------------------------------------------------------- the chief's sources
def _steps_in(element: Any) -> int:
    import tensorflow as tf

    for t in tf.nest.flatten(element):
        if t is not None:
            return int(t.shape[0])
    raise ValueError("an element without tensors")


def map_structure(fn: Any, element: Any) -> Any:
    """``fn`` on every tensor of ``element`` (a nest of tensors; ``None`` leaves stay ``None``),
    with ``tf.nest.map_structure``: e.g. batch ``a`` of a bundle is ``map_structure(lambda t: t[a], el)``."""
    import tensorflow as tf

    return tf.nest.map_structure(lambda t: None if t is None else fn(t), element)


@dataclass
class Pending:
    """The element the chief is handing out, and how much of it is left."""

    worker: int
    element: Any
    bundled: bool
    size: int
    offset: int = 0


class ChunkedSource:
    """Hands out the elements of input streams as chunks or single batches (the bundling's
    other end). Subclasses give ``_next_element(timeout, what) -> (worker, element)`` and
    ``_bundles`` (batches per element, by worker). Counts are batches handed out.

    A streamed subclass also gives ``_pull(wait) -> item`` (its next raw item within ``wait``
    seconds, raising ``queue.Empty`` or ``TimeoutError`` when none came) and ``_stage(item,
    device) -> item`` (the item's tensors on ``device``), and reads its items through
    :meth:`_next_item`: :meth:`start_prefetch` then puts a
    :class:`~csrun_runtime.tensorflow.deviceprefetch.DevicePrefetch` thread between the two
    (on a GPU; without one nothing changes)."""

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}
        self._bundles: dict[int, int] = {}
        self._pending: Pending | None = None
        #: the device prefetch thread (:meth:`start_prefetch`), None when off
        self.prefetch: DevicePrefetch | None = None

    def _next_element(self, timeout: float, what: str) -> tuple[Any, ...]:
        raise NotImplementedError

    def _pull(self, wait: float) -> Any:
        raise NotImplementedError

    def _stage(self, item: Any, device: str) -> Any:
        raise NotImplementedError

    def _next_item(self, wait: float) -> Any:
        """The next raw item (:meth:`_pull`'s), on the device when prefetching. Raises
        ``queue.Empty`` / ``TimeoutError`` when none came within ``wait`` seconds, and what the
        source raised."""
        return self._pull(wait) if self.prefetch is None else self.prefetch.get(wait)

    def start_prefetch(self, plan: PrefetchPlan) -> None:
        """With ``plan.on``: from now on a thread pulls this source's items, copies them to
        ``plan.device`` and keeps ``plan.depth`` of them ahead
        (:class:`~csrun_runtime.tensorflow.deviceprefetch.DevicePrefetch`; the source's own
        reading then happens on that thread only). Off: nothing changes."""
        if plan.on and self.prefetch is None:
            device = str(plan.device)
            self.prefetch = DevicePrefetch(self._pull, lambda item: self._stage(item, device), plan.depth)

    def stop_prefetch(self) -> dict[str, Any]:
        """Stop the prefetch thread (staged items dropped); returns ``{"device_prefetch_stats":
        {...}}`` for :meth:`describe` (elements, bytes, the loop's waits, the copies' seconds),
        ``{}`` when there was none."""
        if self.prefetch is None:
            return {}
        self.prefetch.stop()
        return {"device_prefetch_stats": self.prefetch.stats.describe()}

    def _fill(self, timeout: float, what: str) -> Pending:
        if self._pending is None:
            i, el = self._next_element(timeout, what)
            bundled = self._bundles.get(i, 1) > 1
            self._pending = Pending(i, el, bundled, _steps_in(el) if bundled else 1)
        return self._pending

    def _took(self, p: Pending, m: int) -> None:
        p.offset += m
        if p.offset >= p.size:
            self._pending = None
        self.counts[p.worker] = self.counts.get(p.worker, 0) + m

    def available(self, timeout: float, what: str = "runconfig.input_timeout_secs") -> int:
        """Batches the next :meth:`get_chunk` can hand out at once (the rest of the element
        being handed out, else of the next one, waited for): a trainer rank of several agrees on
        a chunk's steps with the others before it takes it (:mod:`csrun_runtime.tensorflow.ranks`).
        Raises :class:`InputStalled` (see the subclass)."""
        p = self._fill(timeout, what)
        return p.size - p.offset

    def get_chunk(self, max_steps: int, timeout: float,
                  what: str = "runconfig.input_timeout_secs") -> Chunk:
        """Up to ``max_steps`` consecutive batches of one worker (see :class:`Chunk`): the rest
        of the element being handed out, else of the next element to arrive. Raises
        :class:`InputStalled` (see the subclass)."""
        import tensorflow as tf

        p = self._fill(timeout, what)
        m = min(max(1, int(max_steps)), p.size - p.offset)
        batches = p.element if p.bundled else map_structure(lambda t: tf.expand_dims(t, 0), p.element)
        chunk = Chunk(p.worker, batches, p.offset, m)
        self._took(p, m)
        return chunk

    def get(self, timeout: float, what: str = "runconfig.input_timeout_secs") -> tuple[int, Any]:
        """One batch: ``(worker_index, (features, labels))``. Raises :class:`InputStalled`."""
        p = self._fill(timeout, what)
        if p.bundled:
            a = p.offset
            batch = map_structure(lambda t: t[a], p.element)
        else:
            batch = p.element
        self._took(p, 1)
        return p.worker, batch


class LocalSource(ChunkedSource):
    """Batches from a dataset iterated in-process (single-process mode, zero workers).

    Args:
        ds: the training dataset (one batch per element).
        plan: bundling of the in-process pipeline (``Dataset.batch(plan.bundle)``), so that the
            training loop gets chunks of several steps as from input workers; ``None``: none.
        prefetch: the chief's device prefetch: when on, ``prefetch_to_device`` ends the dataset,
            or, for a dataset TensorFlow's ``prefetch_to_device`` refuses, a
            :class:`~csrun_runtime.tensorflow.deviceprefetch.DevicePrefetch` thread iterates it
            (:func:`csrun_runtime.tensorflow.deviceprefetch.prefetch_in_process`); ``None`` or off:
            none. ``prefetch_plan`` is the plan as applied.

    ``get_chunk`` / ``get`` return worker index 0; they block without a timeout (the pipeline
    runs in this process, so there is nothing remote to wait for).
    """

    def __init__(self, ds: Any, plan: BundlePlan | None = None, prefetch: PrefetchPlan | None = None):
        super().__init__()
        self.plan = plan
        bundle = plan.bundle if plan is not None else 1
        self._bundles = {0: bundle}
        ds = bundle_dataset(ds, bundle)
        self.prefetch_plan = prefetch
        if prefetch is not None:
            ds, self.prefetch_plan = prefetch_in_process(ds, prefetch)
        self._it = iter(ds)
        self.counts = {0: 0}
        if self.prefetch_plan is not None and self.prefetch_plan.how == "thread":
            self.start_prefetch(self.prefetch_plan)

    def _next_element(self, timeout: float, what: str) -> tuple[int, Any]:
        if self.prefetch is None:
            return 0, next(self._it)
        while True:  # no timeout, as without the thread; the input's end comes as StopIteration
            try:
                return 0, self.prefetch.get(0.5)
            except queue.Empty:
                continue

    def _pull(self, wait: float) -> Any:
        return next(self._it)  # the in-process pipeline: no wait of its own

    def _stage(self, item: Any, device: str) -> Any:
        return to_device(item, device)

    def describe(self) -> dict[str, Any]:
        """Batches handed out and batches per element (performance.json); with a device prefetch
        thread its figures (the thread stopped)."""
        return {"num_workers": 0, "batches_per_worker": {"in-process": self.counts[0]},
                "batches_per_element": {"in-process": self._bundles[0]}, **self.stop_prefetch()}

    def close(self) -> None:
        """Stop the device prefetch thread, if any."""
        self.stop_prefetch()


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

    ``get_chunk(max_steps, timeout)`` returns a :class:`Chunk` and ``get(timeout)`` one batch
    ``(worker_index, (features, labels))``; both raise :class:`InputStalled` naming the workers
    (node, heartbeat age, last batch) when no batch arrived for ``timeout`` seconds or every
    stream has failed. Each worker's batches come in that worker's order; across workers,
    elements are merged first come, first served. A stream that fails with a worker-loss error
    (Unavailable, Cancelled, ...) or whose worker's heartbeat goes stale is reported once as a
    warning and training continues with the others; any other error from a worker's pipeline
    (e.g. InvalidArgument from input_fn's ops) fails the chief naming it.
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
        """Open (or reopen) input worker ``index``'s stream while training: the dataset
        :data:`DATASET_ID` of the dispatcher at ``address`` (``host:port``), read
        by a new reader thread into the shared merge queue. ``registration`` is the worker's
        ``workers/<index>.json`` (node, pid, ``bundle``: its batches per service element);
        it replaces the old one. ``index`` may be new (``>= n``: the source grows to
        ``index + 1`` streams; indices in between, never opened, count as stopped) or a
        worker reported lost (its failure and stop are forgotten; its batch count goes on).
        A reader still running on the old stream of ``index`` is not stopped: it ends when
        that stream fails. Call it from the training loop's thread (between chunks)."""
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
        """Stop reading worker ``i``'s stream (autoscale's *remove*): its reader thread takes
        no element after the one it holds, so the worker stops when its buffers are full; the
        worker is not reported as stopped. :meth:`resume` reads it again."""
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
        """One clause per worker: node, heartbeat age, batches delivered, last element age
        (:func:`csrun_runtime.streams.stall_report`)."""
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
            size = _steps_in(item) if self._bundles.get(i, 1) > 1 else 1
            drop = self.positions.accept(i, first, size) if self.positions is not None else 0
            if drop >= size:  # its batches were handed out already
                continue
            self.last[i] = time.monotonic()
            return i, (item if not drop else map_structure(lambda t, d=drop: t[d:], item))

    def _pull(self, wait: float) -> tuple[int, int, Any, int | None]:
        """The merge queue's next ``(worker, stream generation, element or error, stream index of
        its first batch)``; raises ``queue.Empty`` after ``wait`` seconds."""
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
        """Stop the reader threads after their current element (they are daemons; nothing is
        joined: the process leaves with ``os._exit``, and deleting a tf.data service iterator
        may block for seconds, ARCHITECTURE.md); the device prefetch's thread is stopped."""
        self._stop.set()
        self.stop_prefetch()


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


def limit_threads(ds: tf.data.Dataset, cpus_per_task: int | None) -> tf.data.Dataset:
    """Hold a dataset to ``cpus_per_task`` cores: a tf.data private threadpool of that size
    and ``max_intra_op_parallelism = 1`` (each op single-threaded; the threadpool gives the
    parallelism), each unless the input_fn set it itself. Unchanged when ``cpus_per_task``
    is None. The analyzer's probes build their datasets with this same function, so a
    probe measures the pipeline the input workers run."""
    if not cpus_per_task:
        return ds
    import tensorflow as tf

    cur = ds.options().threading
    opts = tf.data.Options()
    changed = False
    if cur.private_threadpool_size in (None, 0):
        opts.threading.private_threadpool_size = int(cpus_per_task)
        changed = True
    if cur.max_intra_op_parallelism is None:
        opts.threading.max_intra_op_parallelism = 1
        changed = True
    return ds.with_options(opts) if changed else ds
