"""tf.data service plumbing: rendezvous files, the input-worker task, the chief's batch source.

Design (see csrun_runtime/README.md):

- The chief hosts one tf.data service ``DispatchServer`` per input worker (all bound to port 0,
  in the chief's process) and publishes their addresses in the rendezvous directory
  ``<model_dir>/.csrun/<SLURM_JOB_ID>.<SLURM_STEP_ID>/dispatchers.json`` (shared file system;
  two jobs or two steps never share a directory).
- Input worker ``i`` polls for that file, starts a ``WorkerServer`` (port 0,
  ``worker_address="<host>:%port%"``) attached to dispatcher ``i``, builds *its own* dataset with
  ``input_fn(params_i)`` (its shuffle seed, its shard-plan files), checks it against the contract
  and registers it with ``register_dataset(dataset_id="csrun-train", compression=None)``, then
  writes ``workers/<i>.json``. A dispatcher with a single worker is what lets every worker run a
  different pipeline: a tf.data service job runs its dataset on *every* worker of a dispatcher.
- The chief reads each worker's stream with ``from_dataset_id(processing_mode="parallel_epochs",
  compression=None)`` on one Python thread per worker and merges them first-come-first-served
  through a bounded queue (:class:`ServiceSource`). A worker that dies only silences its own
  stream: training goes on with the others; a watchdog fails the chief naming the workers when no
  batch arrives for ``runconfig.input_timeout_secs``.
- Heartbeats: every task touches ``<name>.alive`` every :data:`HEARTBEAT_SECS`; the chief names
  workers whose heartbeat is older than :data:`STALE_SECS` as stopped; a worker leaves (exit 1)
  when the chief's heartbeat is older than :data:`CHIEF_LOST_SECS`.
- End: the chief writes ``done.json`` (``{"status": "ok"|"failed", ...}``); workers write
  ``workers/<i>.report.json`` (files, elements produced) and exit 0.
"""
from __future__ import annotations

import logging
import os
import queue
import shutil
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from .artifacts import read_json, write_json

__all__ = ["Rendezvous", "Heartbeat", "ServiceSource", "LocalSource", "InputStalled",
           "start_dispatchers", "run_worker", "DATASET_ID", "HEARTBEAT_SECS", "STALE_SECS",
           "CHIEF_LOST_SECS"]

#: dataset id each worker registers with its dispatcher.
DATASET_ID = "csrun-train"
#: seconds between heartbeat touches.
HEARTBEAT_SECS = 2.0
#: a worker heartbeat older than this (seconds) marks the worker as stopped.
STALE_SECS = 10.0
#: a worker exits 1 when the chief's heartbeat is older than this (seconds).
CHIEF_LOST_SECS = 90.0

#: Servers kept referenced until the process leaves with ``os._exit``: destroying a
#: ``WorkerServer`` tears its pipeline down while holding the GIL, which deadlocks a
#: pipeline that uses ``tf.py_function`` (seen here with a GIL-bound input_fn).
_KEEP_ALIVE: List[Any] = []

log = logging.getLogger("csrun.runtime")


class InputStalled(RuntimeError):
    """No batch for too long, or every input worker's stream failed (names the workers)."""


# --------------------------------------------------------------------------- rendezvous
class Rendezvous:
    """Files of one job step under ``<model_dir>/.csrun/<job>.<step>/`` (shared file system).

    Files: ``dispatchers.json`` (chief), ``chief.alive``, ``workers/<i>.json`` (registration),
    ``workers/<i>.alive``, ``workers/<i>.report.json``, ``done.json``, ``chief.json`` (the
    chief's summary: batches received per worker).
    """

    def __init__(self, model_dir: str | os.PathLike, key: str):
        self.dir = Path(model_dir) / ".csrun" / key
        self.workers_dir = self.dir / "workers"

    def reset(self) -> None:
        """Chief, at start: move a stale directory of the same key aside, create a fresh one."""
        if self.dir.exists():
            stale = self.dir.with_name(f"{self.dir.name}.stale-{int(time.time() * 1000)}")
            try:
                self.dir.rename(stale)
            except OSError:
                shutil.rmtree(self.dir, ignore_errors=True)
        self.workers_dir.mkdir(parents=True, exist_ok=True)

    def publish_dispatchers(self, addresses: List[str], info: Mapping[str, Any]) -> None:
        """Chief: write ``dispatchers.json`` (``addresses[i]`` serves worker ``i``)."""
        write_json(self.dir / "dispatchers.json",
                   {"dispatchers": list(addresses), "created": time.time(), **dict(info)})

    def dispatchers(self) -> Optional[Dict[str, Any]]:
        """The published dispatchers record, or ``None`` while absent."""
        return read_json(self.dir / "dispatchers.json")

    def register_worker(self, index: int, info: Mapping[str, Any]) -> None:
        """Worker: write ``workers/<index>.json``."""
        write_json(self.workers_dir / f"{index}.json", dict(info))

    def worker(self, index: int) -> Optional[Dict[str, Any]]:
        """A worker's registration, or ``None``."""
        return read_json(self.workers_dir / f"{index}.json")

    def write_report(self, index: int, report: Mapping[str, Any]) -> None:
        """Worker: write ``workers/<index>.report.json`` (files read, elements produced)."""
        write_json(self.workers_dir / f"{index}.report.json", dict(report))

    def reports(self) -> Dict[int, Dict[str, Any]]:
        """Every worker report present, by worker index."""
        out = {}
        for p in sorted(self.workers_dir.glob("*.report.json")):
            rec = read_json(p)
            if rec is not None:
                out[int(p.name.split(".")[0])] = rec
        return out

    def touch(self, name: str) -> None:
        """Touch the heartbeat file ``<name>.alive`` (``name`` like ``chief`` or ``workers/3``)."""
        p = self.dir / f"{name}.alive"
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
            with open(p, "a"):
                pass
            os.utime(p, None)
        except OSError:
            pass

    def age(self, name: str) -> Optional[float]:
        """Seconds since ``<name>.alive`` was touched, ``None`` when it does not exist."""
        try:
            return max(0.0, time.time() - (self.dir / f"{name}.alive").stat().st_mtime)
        except OSError:
            return None

    def mark_done(self, status: str, reason: str = "", **extra: Any) -> None:
        """Chief: write ``done.json``; workers leave when they see it."""
        write_json(self.dir / "done.json",
                   {"status": status, "reason": reason, "time": time.time(), **extra})

    def done(self) -> Optional[Dict[str, Any]]:
        """``done.json`` or ``None``."""
        return read_json(self.dir / "done.json")


class Heartbeat:
    """Background thread touching ``<name>.alive`` every :data:`HEARTBEAT_SECS` (daemon)."""

    def __init__(self, rdv: Rendezvous, name: str):
        self.rdv, self.name = rdv, name
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"heartbeat-{name}", daemon=True)

    def start(self) -> "Heartbeat":
        self.rdv.touch(self.name)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(HEARTBEAT_SECS):
            self.rdv.touch(self.name)

    def stop(self) -> None:
        self._stop.set()


# --------------------------------------------------------------------------- chief side
def start_dispatchers(n: int) -> Tuple[List[Any], List[str]]:
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

    def get(self, timeout: float, what: str = "") -> Tuple[int, Any]:
        batch = next(self._it)
        self.counts[0] += 1
        return 0, batch

    def describe(self) -> Dict[str, Any]:
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

    def __init__(self, rdv: Rendezvous, addresses: List[str], registry: Mapping[int, Mapping],
                 queue_size: int = 0):
        import tensorflow as tf

        self.rdv = rdv
        self.registry = dict(registry)
        self.n = len(addresses)
        self._q: "queue.Queue" = queue.Queue(maxsize=queue_size or max(4, 2 * self.n))
        self.counts = {i: 0 for i in range(self.n)}
        self.last = {i: None for i in range(self.n)}  # monotonic time of last batch
        self.failed: Dict[int, str] = {}
        self.announced: set = set()
        self._fatal: Optional[str] = None
        self._next_check = time.monotonic() + HEARTBEAT_SECS
        self._datasets = []
        svc = tf.data.experimental.service
        for i, addr in enumerate(addresses):
            ds = svc.from_dataset_id(processing_mode="parallel_epochs", service=f"grpc://{addr}",
                                     dataset_id=DATASET_ID)
            self._datasets.append(ds)
        self._threads = [threading.Thread(target=self._read, args=(i,), daemon=True,
                                          name=f"stream-{i}") for i in range(self.n)]
        for t in self._threads:
            t.start()

    def _who(self, i: int) -> str:
        reg = self.registry.get(i) or {}
        return f"input worker {i} on {reg.get('node', '?')} (pid {reg.get('pid', '?')})"

    def _read(self, i: int) -> None:
        try:
            for batch in self._datasets[i]:
                self._q.put((i, batch))
            self._q.put((i, StopIteration("the stream ended")))
        except BaseException as e:  # noqa: BLE001 - reported to the consumer
            self._q.put((i, e))

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

    def get(self, timeout: float, what: str = "runconfig.input_timeout_secs") -> Tuple[int, Any]:
        start = time.monotonic()
        while True:
            if self._fatal:
                raise InputStalled(self._fatal)
            if len(self.failed) == self.n:
                raise InputStalled(f"every input worker's stream failed: {self.status_text()}")
            now = time.monotonic()
            if now >= self._next_check:
                self._check_heartbeats()
                self._next_check = now + HEARTBEAT_SECS
            try:
                i, item = self._q.get(timeout=0.5)
            except queue.Empty:
                now = time.monotonic()
                if len(self.announced | set(self.failed)) == self.n and now - start > 1.0:
                    raise InputStalled(f"every input worker stopped and no batch is left: "
                                       f"{self.status_text()}")
                if now - start > timeout:
                    raise InputStalled(f"no batch from any input worker for {now - start:.0f} s "
                                       f"({what} = {timeout:g}): {self.status_text()}")
                continue
            if isinstance(item, BaseException):
                self._handle_error(i, item)
                continue
            self.counts[i] += 1
            self.last[i] = time.monotonic()
            return i, item

    def describe(self) -> Dict[str, Any]:
        """Per-worker batch counts and nodes (for performance.json and the log)."""
        return {
            "num_workers": self.n,
            "batches_per_worker": {str(i): self.counts[i] for i in range(self.n)},
            "worker_nodes": {str(i): (self.registry.get(i) or {}).get("node") for i in range(self.n)},
            "workers_stopped": sorted(set(self.announced) | set(self.failed)),
        }

    def close(self) -> None:
        """Nothing to join: reader threads are daemons; the process leaves with ``os._exit``
        (deleting a tf.data service iterator may block for seconds, ARCHITECTURE.md)."""


# --------------------------------------------------------------------------- worker side
def count_elements(ds: Any, counter: List[int]) -> Any:
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


def limit_threads(ds: Any, cpus_per_task: Optional[int]) -> Any:
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


def run_worker(role: Any, resolved: Any, input_fn: Callable[..., Any]) -> int:
    """The whole life of an input-worker task; returns its exit code.

    0: the chief finished (``done.json``), or the mode needs no streaming (eval, validate_only,
    compile_only: the worker waits for the chief's done marker). 1: no rendezvous within
    ``worker_start_timeout_secs``, or the chief's heartbeat went stale. 2: the shard plan or the
    input_fn violates the contract (registered as ``status: failed`` so the chief names it).
    """
    from .contract import call_input_fn, check_dataset
    from .params import TRAIN_MODES, ParamsError, load_shard_plan, worker_params

    params = resolved.params
    rc = params["runconfig"]
    index = role.worker_index
    rdv = Rendezvous(rc["model_dir"], role.rendezvous_key)
    start_timeout = float(rc["worker_start_timeout_secs"])
    me = {"index": index, "node": role.node, "host": role.host, "pid": os.getpid()}
    t0 = time.monotonic()

    # Wait for the chief (its heartbeat file or dispatchers) before anything heavy.
    hb = Heartbeat(rdv, f"workers/{index}")

    def chief_gone() -> Optional[str]:
        age = rdv.age("chief")
        if age is not None and age > CHIEF_LOST_SECS:
            return f"the chief's heartbeat is {age:.0f} s old"
        return None

    if resolved.mode not in TRAIN_MODES:
        hb.start()
        log.info("mode %s streams no training input; waiting for the chief", resolved.mode)
        while True:
            d = rdv.done()
            if d is not None:
                log.info("chief done (%s); leaving", d.get("status"))
                return 0
            gone = chief_gone()
            if gone:
                log.error("leaving: %s", gone)
                return 1
            if rdv.age("chief") is None and time.monotonic() - t0 > start_timeout:
                log.error("no chief heartbeat in %s after %.0f s", rdv.dir, start_timeout)
                return 1
            time.sleep(0.5)

    plan = None
    try:
        if role.shard_plan:
            plan = load_shard_plan(role.shard_plan, role.num_workers)
    except ParamsError as e:
        rdv.register_worker(index, {**me, "status": "failed", "violations": e.problems})
        log.error("%s", e)
        return 2
    wp = worker_params(params, index, role.num_workers, plan)
    ti = wp["train_input"]

    import tensorflow as tf

    svc = tf.data.experimental.service
    if ti.get("shuffle_seed") is not None:
        tf.random.set_seed(int(ti["shuffle_seed"]))

    disp = None
    while disp is None:
        if rdv.done() is not None:
            log.info("chief already done; leaving")
            return 0
        disp = rdv.dispatchers()
        if disp is None:
            if time.monotonic() - t0 > start_timeout:
                log.error("no dispatchers.json in %s after %.0f s (is the chief running?)",
                          rdv.dir, start_timeout)
                return 1
            time.sleep(0.25)
    hb.start()
    addresses = disp["dispatchers"]
    if len(addresses) != role.num_workers:
        log.error("the chief published %d dispatchers for %d workers", len(addresses),
                  role.num_workers)
        return 1
    address = addresses[index]
    server = svc.WorkerServer(svc.WorkerConfig(
        dispatcher_address=address, worker_address=f"{role.host}:%port%", port=0,
        protocol="grpc", heartbeat_interval_ms=1000))
    _KEEP_ALIVE.append(server)

    try:
        ds = call_input_fn(input_fn, wp, "train")
        rep = check_dataset(ds, "train", batch_size=ti.get("batch_size"))
    except Exception as e:  # noqa: BLE001
        rep = None
        violations = [f"train_input: input_fn raised {type(e).__name__}: {e}"]
    else:
        violations = rep.violations
    if violations:
        rdv.register_worker(index, {**me, "status": "failed", "violations": violations})
        for v in violations:
            log.error("%s", v)
        return 2
    batch_size = rep.info["train_input"]["batch_size"]
    ds = limit_threads(ds, role.cpus_per_task)
    counter = [0]
    ds = count_elements(ds, counter)
    svc.register_dataset(service=f"grpc://{address}", dataset=ds, compression=None,
                         dataset_id=DATASET_ID)
    # The address the dispatcher hands to the chief: our host, the port the server bound
    # (WorkerServer._address is TF's local view, always "localhost:<port>").
    bound = getattr(server, "_address", None)
    worker_address = f"{role.host}:{bound.rsplit(':', 1)[1]}" if bound else None
    files = ti.get("data_files")
    rdv.register_worker(index, {**me, "status": "ok", "dispatcher": address,
                                "worker_address": worker_address, "batch_size": batch_size,
                                "shuffle_seed": ti.get("shuffle_seed"), "data_files": files,
                                "registered": time.time()})
    log.info("serving input_fn to the chief (dispatcher %s, batch_size %s, shuffle_seed %s, %s)",
             address, batch_size, ti.get("shuffle_seed"),
             f"{len(files)} shard-plan file(s)" if files is not None else "files chosen by input_fn")

    code = 0
    status = None
    while True:
        d = rdv.done()
        if d is not None:
            status = d.get("status")
            break
        gone = chief_gone()
        if gone:
            log.error("leaving: %s", gone)
            code = 1
            break
        time.sleep(0.5)
    report = {**me, "files": files, "files_source": "shard_plan" if files is not None else
              "input_fn", "shuffle_seed": ti.get("shuffle_seed"), "elements": counter[0],
              "samples": counter[0] * (batch_size or 0), "batch_size": batch_size,
              "chief_status": status, "seconds": round(time.monotonic() - t0, 3)}
    rdv.write_report(index, report)
    log.info("produced %d batch(es) (%d samples); chief status %s; leaving", counter[0],
             report["samples"], status)
    hb.stop()
    return code
