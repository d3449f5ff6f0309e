"""tf.data service plumbing shared by the chief, the input workers and the analyzer's probes.

Design (see csrun_runtime/README.md):

- The chief hosts one tf.data service ``DispatchServer`` per input worker (all bound to port 0,
  in the chief's process: :func:`start_dispatchers`) and publishes their addresses in the
  rendezvous (:mod:`csrun_runtime.rendezvous`). A dispatcher with a single worker is what lets
  every worker run a different pipeline: a tf.data service job runs its dataset on *every*
  worker of a dispatcher.
- Each input worker (:mod:`csrun_runtime.worker`) registers *its own* dataset as
  :data:`DATASET_ID` with its dispatcher.
- The chief reads each worker's stream with ``from_dataset_id(processing_mode="parallel_epochs",
  compression=None)`` on one Python thread per worker and merges them first-come-first-served
  through a bounded queue (:class:`ServiceSource`). A worker that dies only silences its own
  stream: training goes on with the others; a watchdog fails the chief naming the workers when no
  batch arrives for ``runconfig.input_timeout_secs``. Without input workers the chief iterates
  the pipeline itself (:class:`LocalSource`).

TensorFlow is imported inside the functions: importing this module stays light.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from .elastic import WorkerWatch
from .rendezvous import HEARTBEAT_SECS, STALE_SECS, Rendezvous

if TYPE_CHECKING:  # annotations only: TensorFlow is imported inside the functions
    import tensorflow as tf

__all__ = ["BatchSource", "ServiceSource", "LocalSource", "InputStalled", "start_dispatchers",
           "limit_threads", "count_elements", "DATASET_ID"]

#: dataset id each worker registers with its dispatcher.
DATASET_ID = "csrun-train"

log = logging.getLogger("csrun.runtime")


class InputStalled(RuntimeError):
    """No batch for too long, or every input worker's stream failed (names the workers)."""


class BatchSource(Protocol):
    """Where the chief's training batches come from (:class:`ServiceSource`, :class:`LocalSource`).

    ``get(timeout, what)`` returns ``(worker_index, (features, labels))`` or raises
    :class:`InputStalled` after ``timeout`` seconds without a batch (``what`` names the
    setting in the message); ``describe()`` gives the per-worker counts for performance.json.
    """

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


def _is_lost_worker_error(e: BaseException) -> bool:
    import tensorflow as tf
    return isinstance(e, (tf.errors.UnavailableError, tf.errors.CancelledError,
                          tf.errors.AbortedError, tf.errors.DeadlineExceededError,
                          tf.errors.OutOfRangeError, StopIteration))


class LocalSource:
    """Batches from a dataset iterated in-process (single-process mode, zero workers).

    ``get()`` returns ``(0, (features, labels))``; it blocks without a timeout (the pipeline
    runs in this process, so there is nothing remote to wait for).
    """

    def __init__(self, ds: Any):
        self._it = iter(ds)
        self.counts = {0: 0}

    def get(self, timeout: float, what: str = "") -> tuple[int, Any]:
        batch = next(self._it)
        self.counts[0] += 1
        return 0, batch

    def describe(self) -> dict[str, Any]:
        return {"num_workers": 0, "batches_per_worker": {"in-process": self.counts[0]}}

    def close(self) -> None:
        pass


class ServiceSource:
    """Merge the streams of every input worker (one reader thread per worker's dispatcher).

    Args:
        rdv: the rendezvous (to name workers and read heartbeats).
        addresses: ``host:port`` of dispatcher ``i`` for worker ``i``.
        registry: the workers' registrations by index (node, host, pid, ...).
        queue_size: bound of the merge queue in batches.

    ``get(timeout)`` returns ``(worker_index, (features, labels))`` and raises
    :class:`InputStalled` naming the workers (node, heartbeat age, last batch) when no batch
    arrived for ``timeout`` seconds or every stream has failed. A stream that fails with a
    worker-loss error (Unavailable, Cancelled, ...) or whose worker's heartbeat goes stale is
    reported once as a warning and training continues with the others; any other error from a
    worker's pipeline (e.g. InvalidArgument from input_fn's ops) fails the chief naming it.
    """

    def __init__(self, rdv: Rendezvous, addresses: list[str], registry: Mapping[int, Mapping],
                 queue_size: int = 0):
        import tensorflow as tf

        self.rdv = rdv
        self.registry = dict(registry)
        self.n = len(addresses)
        self._q: queue.Queue = queue.Queue(maxsize=queue_size or max(4, 2 * self.n))
        self.counts = {i: 0 for i in range(self.n)}
        self.last: dict[int, float | None] = {i: None for i in range(self.n)}  # monotonic time of last batch
        self.failed: dict[int, str] = {}
        self.announced: set = set()
        self._fatal: str | None = None
        self._next_check = time.monotonic() + HEARTBEAT_SECS
        self._datasets = []
        svc = tf.data.experimental.service
        for addr in addresses:
            ds = svc.from_dataset_id(processing_mode="parallel_epochs", service=f"grpc://{addr}",
                                     dataset_id=DATASET_ID)
            self._datasets.append(ds)
        self.addresses = list(addresses)
        self._gen = [0] * self.n  # reopen() count per stream: a superseded reader's error is dropped
        self.watch = WorkerWatch(rdv, self.registry)  # lost and replaced workers (elastic.py)
        self._threads = [threading.Thread(target=self._read, args=(i, 0), daemon=True,
                                          name=f"stream-{i}") for i in range(self.n)]
        for t in self._threads:
            t.start()

    def _who(self, i: int) -> str:
        reg = self.registry.get(i) or {}
        return f"input worker {i} on {reg.get('node', '?')} (pid {reg.get('pid', '?')})"

    def _read(self, i: int, gen: int) -> None:
        try:
            for batch in self._datasets[i]:
                self._q.put((i, batch))
            err: BaseException = StopIteration("the stream ended")
        except BaseException as e:  # noqa: BLE001 - reported to the consumer
            err = e
        if self._gen[i] == gen:  # not superseded by reopen()
            self._q.put((i, err))

    def stopped(self) -> set[int]:
        """Indices of the workers whose stream failed or whose heartbeat went stale."""
        return set(self.announced) | set(self.failed)

    def reopen(self, i: int, registration: Mapping) -> str:
        """Read worker ``i``'s stream again after its replacement registered with dispatcher
        ``i`` (:mod:`csrun_runtime.elastic`). When the reader thread still waits in the stream
        (the tf.data service client retries a lost worker and takes up the dispatcher's new
        worker by itself), only the worker's stopped state is cleared; when it ended with an
        error, a new stream of the dataset and a new reader thread replace it. Returns
        ``"resumed"`` or ``"reopened"``."""
        import tensorflow as tf

        self.registry[i] = dict(registration)
        self.failed.pop(i, None)
        self.announced.discard(i)
        if self._threads[i].is_alive():
            return "resumed"
        self._gen[i] += 1
        self._datasets[i] = tf.data.experimental.service.from_dataset_id(
            processing_mode="parallel_epochs", service=f"grpc://{self.addresses[i]}",
            dataset_id=DATASET_ID)
        self._threads[i] = threading.Thread(target=self._read, args=(i, self._gen[i]), daemon=True,
                                            name=f"stream-{i}.{self._gen[i]}")
        self._threads[i].start()
        return "reopened"

    def _handle_error(self, i: int, e: BaseException) -> None:
        if _is_lost_worker_error(e):
            self.failed[i] = f"{type(e).__name__}: {str(e).strip()[:200]}"
            if i not in self.announced:
                self.announced.add(i)
                left = self.n - len(self.announced | set(self.failed))
                log.warning("%s stopped streaming (%s); %s", self._who(i), self.failed[i],
                            f"training continues with the other {left} worker(s)" if left
                            else "no input worker left")
        else:
            self._fatal = (f"{self._who(i)}: its input pipeline failed: {type(e).__name__}: "
                           f"{str(e).strip()[:500]}")

    def _check_heartbeats(self) -> None:
        for i in range(self.n):
            if i in self.announced:
                continue
            age = self.rdv.age(f"workers/{i}")
            if age is not None and age > STALE_SECS:
                self.announced.add(i)
                left = self.n - len(self.announced | set(self.failed))
                log.warning("%s stopped: no heartbeat for %.0f s; %s", self._who(i), age,
                            f"training continues with the other {left} worker(s)" if left
                            else "no input worker left")

    def status_text(self) -> str:
        """One clause per worker: node, heartbeat age, batches delivered, last batch age."""
        now = time.monotonic()
        parts = []
        for i in range(self.n):
            age = self.rdv.age(f"workers/{i}")
            hb = "no heartbeat file" if age is None else f"heartbeat {age:.0f} s ago"
            dead = " (stopped)" if age is None or age > STALE_SECS or i in self.failed else ""
            last = self.last[i]
            lb = "no batch yet" if last is None else f"last batch {now - last:.0f} s ago"
            parts.append(f"{self._who(i)}{dead}: {hb}, {self.counts[i]} batches, {lb}"
                         + (f", error {self.failed[i]}" if i in self.failed else ""))
        return "; ".join(parts)

    def get(self, timeout: float, what: str = "runconfig.input_timeout_secs") -> tuple[int, Any]:
        start = time.monotonic()
        while True:
            if self._fatal:
                raise InputStalled(self._fatal)
            if len(set(self.failed) - self.watch.awaiting()) == self.n:
                raise InputStalled(f"every input worker's stream failed: {self.status_text()}")
            now = time.monotonic()
            if now >= self._next_check:
                self.watch.poll(self)  # records supervisor-seen deaths before stale heartbeats
                self._check_heartbeats()
                self._next_check = now + HEARTBEAT_SECS
            try:
                i, item = self._q.get(timeout=0.5)
            except queue.Empty:
                now = time.monotonic()
                if len(self.stopped() - self.watch.awaiting()) == self.n and now - start > 1.0:
                    raise InputStalled(f"every input worker stopped and no batch is left: "
                                       f"{self.status_text()}") from None
                if now - start > timeout:
                    raise InputStalled(f"no batch from any input worker for {now - start:.0f} s "
                                       f"({what} = {timeout:g}): {self.status_text()}") from None
                continue
            if isinstance(item, BaseException):
                self._handle_error(i, item)
                continue
            self.counts[i] += 1
            self.last[i] = time.monotonic()
            return i, item

    def describe(self) -> dict[str, Any]:
        """Per-worker batch counts and nodes (for performance.json and the log)."""
        return {
            "num_workers": self.n,
            "batches_per_worker": {str(i): self.counts[i] for i in range(self.n)},
            "worker_nodes": {str(i): (self.registry.get(i) or {}).get("node") for i in range(self.n)},
            "workers_stopped": sorted(set(self.announced) | set(self.failed)),
            **self.watch.describe(),
        }

    def close(self) -> None:
        """Nothing to join: reader threads are daemons; the process leaves with ``os._exit``
        (deleting a tf.data service iterator may block for seconds, ARCHITECTURE.md)."""


def count_elements(ds: tf.data.Dataset, counter: list[int]) -> tf.data.Dataset:
    """Wrap ``ds`` so that every element produced increments ``counter[0]`` (in this process:
    the dataset is executed by the WorkerServer that lives in the same process)."""
    import numpy as np
    import tensorflow as tf

    def tick():
        counter[0] += 1
        return np.int64(counter[0])

    def fn(features, labels):
        n = tf.py_function(tick, [], tf.int64)
        with tf.control_dependencies([n]):
            features = tf.nest.map_structure(tf.identity, features)
        return features, labels

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
