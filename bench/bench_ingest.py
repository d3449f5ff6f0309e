"""Benchmark: how fast the chief can take input, what the tf.data service hop costs, what the
training loop costs per step, and a chief with 16 input workers.

Four parts, each in its own child processes (``python bench/bench_ingest.py --ROLE SPEC``):

1. **Ingest ceiling** (``ceiling``). ``k`` = 1, 2, 4, 8, 16 input-worker processes each
   serve a *cached* batch (``take(1).cache().repeat()`` of one batch of 64 samples: nearly
   free to produce) of 16 KiB, 256 KiB and 4 MiB through csrun's runtime path — one
   dispatcher per worker (:func:`csrun_runtime.tensorflow.service.start_dispatchers`), each worker's
   ``WorkerServer`` (:func:`csrun_runtime.tensorflow.service.start_worker_server`) serving the dataset
   registered by :func:`csrun_runtime.tensorflow.service.register_stream` (the input worker's
   registration step, bundling included), the chief draining
   :class:`csrun_runtime.tensorflow.service.ServiceSource` with ``get_chunk`` as its training loop does.
   Side by side, in rotating order within each repetition and in the same chief process:

   * ``service``: the runtime's default (``input_bundle: auto``);
   * ``service, unbundled``: ``input_bundle: 1`` (one batch per service element: the
     runtime before bundling);
   * ``raw TCP``: ``k`` sender processes writing the same number of bytes per batch over
     loopback TCP to ``k`` receiver threads of the chief (``recv_into`` a preallocated
     buffer): this host's transport limit;
   * ``in-process``: the chief iterating the same cached batch itself (the tf.data iterator's
     per-element cost, no transport).

   Figures: batches/s (× 64 = samples/s), MB/s (10^6 bytes), the chief's CPU-seconds per MB
   and the workers' (all ``k`` together).
2. **The rest of the hop** (``hop``; ``k`` = 1 and 2, every size): variants of the service
   path against ``service`` in the same repetition — ``max_outstanding_requests=8``, two
   consumers per worker sharing a job (``job_name``: two requests in flight per worker),
   ``compression="AUTO"``, ``prefetch(2)`` after bundling on the worker, and the merge inside
   tf.data (``interleave(deterministic=False)`` over the per-worker datasets, iterated by
   one Python loop) instead of the Python-thread merge.
3. **Training loop** (``loop``): the digits model (``examples/digits``), XLA as the runtime's
   ``jit_compile: auto`` gives it: microseconds per step of ``train_on_batch`` (the loop
   before), of :class:`csrun_runtime.tensorflow.steps.TrainSteps` on chunks of one bundle, of the floor
   (one call of 256 steps), and of the whole :class:`csrun_runtime.loop.TrainingDriver`
   (digits' runconfig cadence: logs every 50 steps) on a free in-process source. Per-step
   overhead = loop − floor, as a fraction of the loop's own step and of the step time at the
   rate one input worker delivers the digits pipeline (its in-process rate on 1 CPU).
4. **Many workers** (``many``): ``examples/digits/run.py`` as a chief and 16 input workers
   (local processes with the environment csrun_wse gives its tasks, docs/CONTRACT.md):
   exit statuses, the seconds until all registered, samples/s, batches per worker, and each
   worker process's RSS / PSS / USS (psutil) while streaming.

Statistics: medians and IQRs over the repetitions; ratios are medians of per-repetition
ratios (rotating order, so drift of the shared host hits all sides alike).
"""
from __future__ import annotations

import json
import os
import queue
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import common  # bench/ is on sys.path: these modules run as scripts from it
import psutil

from csrun_common import atomic
from csrun_common.env import ADVERTISE_HOST, TaskEnv
from csrun_common.roles import resolve_role
from csrun_runtime import rendezvous
from csrun_runtime.capture import load_entry
from csrun_runtime.params import resolve_params
from csrun_runtime.tensorflow import chief as chief_mod
from csrun_runtime.tensorflow import service, training
from launcher.slurm import stop_process_group

REPO = common.REPO
#: Batch sizes of the ceiling (bytes of one batch: features + labels).
SIZES = {"16 KiB": 16 << 10, "256 KiB": 256 << 10, "4 MiB": 4 << 20}
#: Samples per batch of the synthetic batches.
ROWS = 64
#: Dataset variants each ceiling worker registers: name -> (input_bundle, compression, prefetch).
WORKER_VARIANTS: dict[str, tuple[str | int, str | None, bool]] = {
    "auto": ("auto", None, False), "unbundled": (1, None, False),
    "compressed": ("auto", "AUTO", False), "prefetch": ("auto", None, True),
}
#: Ceiling paths, and the hop variants (path name -> worker dataset variant, chief reader).
PATHS = {"service": ("auto", "threads"), "service, unbundled": ("unbundled", "threads")}
HOP_VARIANTS = {
    "max_outstanding_requests=8": ("auto", "mor8"),
    "2 consumers per worker (job_name)": ("auto", "two_consumers"),
    "compression AUTO": ("compressed", "threads"),
    "prefetch(2) after bundling": ("prefetch", "threads"),
    "merge in tf.data (interleave)": ("auto", "tfdata"),
}
#: A transport that is not tf.data service, measured beside it (hop study): each worker
#: iterates the same bundled dataset in Python and writes its tensors' bytes over TCP; the
#: chief reads them into numpy arrays wrapped as tensors. Not the runtime's path.
LEAN = "lean TCP transport (numpy, not tf.data service)"
#: The framework-neutral data plane (csrun_runtime.dataplane): ``k`` light sender processes
#: (numpy + pyzmq, no TensorFlow, like the raw TCP senders) each ``Sender.send`` the same batch
#: (stacked into ~1 MiB bundles), the chief ``Receiver.get_bundle`` on one endpoint.
DATAPLANE = "data plane (zmq)"


# =========================================================================== child helpers
def _write(path: str | Path, obj: Any) -> None:
    atomic.write_json(Path(path), obj, indent=None)


def _cpu(pids: list[int]) -> float:
    """Summed user+system CPU seconds of ``pids`` (0 for a pid that is gone)."""

    total = 0.0
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def synthetic_dataset(nbytes: int) -> Any:
    """A ``take(1).cache().repeat()`` dataset of one batch of :data:`ROWS` samples and
    ``nbytes`` bytes: float32 features ``[ROWS, (nbytes - 4 ROWS) / (4 ROWS)]`` and int32
    labels ``[ROWS]``."""
    import tensorflow as tf  # only in the child processes: the harness never loads it

    cols = max(1, (nbytes - 4 * ROWS) // (4 * ROWS))
    x = tf.random.uniform([ROWS, cols])
    y = tf.zeros([ROWS], tf.int32)
    return tf.data.Dataset.from_tensors((x, y)).take(1).cache().repeat()


def _window(step: Callable[[], int], warmup_s: float, window_s: float, pids: list[int]
            ) -> dict[str, float]:
    """Call ``step`` (returns batches taken) for ``warmup_s`` then ``window_s`` seconds;
    returns batches/s and the CPU seconds per second of this process and of ``pids``."""
    import resource

    me = [os.getpid()]
    t_end = time.monotonic() + warmup_s
    while time.monotonic() < t_end:
        step()
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    c0, w0, t0, n = _cpu(me), _cpu(pids), time.monotonic(), 0
    while time.monotonic() - t0 < window_s:
        n += step()
    dt = time.monotonic() - t0
    return {"batches_per_sec": n / dt, "chief_cpu": (_cpu(me) - c0) / dt,
            "workers_cpu": (_cpu(pids) - w0) / dt, "window_s": dt,
            "chief_page_faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0}


# =========================================================================== ceiling: workers
def child_worker(spec: dict) -> None:
    """An input worker of the ceiling: a WorkerServer on its dispatcher serving, for every
    size and worker variant, the cached batch registered by the runtime's registration step
    (:func:`csrun_runtime.tensorflow.service.register_stream`), then idle until ``done.json``."""

    rdv = rendezvous.Rendezvous(spec["rdv_dir"], spec["key"])
    i = spec["index"]
    deadline = time.monotonic() + 300
    while (disp := rdv.endpoints()) is None:
        if time.monotonic() > deadline:
            raise TimeoutError("no endpoints.json")
        time.sleep(0.1)
    address = disp["endpoints"][i]
    keep = [service.start_worker_server(address, "localhost")]
    bundles, counters = {}, []
    for size, nbytes in SIZES.items():
        if size not in spec["sizes"]:
            continue
        for name, (setting, compression, prefetch) in WORKER_VARIANTS.items():
            if name not in spec["variants"]:
                continue
            ds = service.limit_threads(synthetic_dataset(nbytes), 1)
            plan = service.plan_bundle(ds.element_spec, setting)
            counter = [0]
            counters.append(counter)
            ds_id = f"{size}/{name}"
            bundles[ds_id] = plan.bundle
            if prefetch:  # bundle here, prefetch, and register it as it is
                ds = service.bundle_dataset(ds, plan.bundle).prefetch(2)
                plan = service.BundlePlan(1, plan.batch_bytes, setting, "bundled before the prefetch")
            keep.append(service.register_stream(address, ds, plan, counter, dataset_id=ds_id,
                                                compression=compression))
    rdv.register_worker(i, {"status": "ok", "pid": os.getpid(), "node": "localhost", "bundles": bundles})
    seen: set[str] = set()
    while rdv.done() is None:
        for req in sorted((rdv.dir / "lean").glob("*.json")):
            if req.name not in seen:
                seen.add(req.name)
                threading.Thread(target=_lean_send, args=(json.loads(req.read_text()),), daemon=True).start()
        time.sleep(0.1)


def _lean_send(req: dict) -> None:
    """The lean transport's sender (a hop variant, not the runtime's path): iterate the same
    bundled cached dataset in Python and write each element's tensors as raw bytes (numpy
    views) over TCP, after a header of shapes and dtypes."""
    import numpy as np
    import tensorflow as tf  # only in the child processes: the harness never loads it


    ds = service.limit_threads(synthetic_dataset(req["nbytes"]), 1)
    ds = service.bundle_dataset(ds, service.plan_bundle(ds.element_spec, "auto").bundle)
    s = socket.create_connection(("127.0.0.1", req["port"]))
    try:
        for el in ds:
            arrays = [np.ascontiguousarray(t.numpy()) for t in tf.nest.flatten(el)]
            head = struct.pack("!I", len(arrays))
            for a in arrays:
                head += struct.pack("!4sB", a.dtype.str.encode().ljust(4), a.ndim)
                head += struct.pack(f"!{a.ndim}Q", *a.shape)
            s.sendall(head)
            for a in arrays:
                s.sendall(memoryview(a).cast("B"))
    except OSError:
        pass
    finally:
        s.close()


# =========================================================================== ceiling: raw TCP
def child_sender(spec: dict) -> None:
    """A raw TCP sender: the same bytes as one batch, framed by an 8-byte length, written
    over loopback to the chief until the connection closes."""
    s = socket.create_connection(("127.0.0.1", spec["port"]))
    payload = os.urandom(spec["nbytes"])
    head = struct.pack("!Q", len(payload))
    try:
        while True:
            s.sendall(head)
            s.sendall(payload)
    except OSError:
        pass


def _recv_frames(conn: socket.socket, counts: list[int], i: int) -> None:
    head = bytearray(8)
    buf = bytearray(0)
    try:
        while True:
            got = 0
            while got < 8:
                r = conn.recv_into(memoryview(head)[got:])
                if not r:
                    return
                got += r
            n = struct.unpack("!Q", head)[0]
            if len(buf) != n:
                buf = bytearray(n)
            view, got = memoryview(buf), 0
            while got < n:
                r = conn.recv_into(view[got:])
                if not r:
                    return
                got += r
            counts[i] += 1
    except OSError:
        return


def measure_raw(k: int, nbytes: int, warmup_s: float, window_s: float, start: Callable[[dict], Any]
                ) -> dict[str, float]:
    """Batches/s of ``k`` raw TCP senders to ``k`` receiver threads of this process, and the
    CPU of both sides (see :func:`child_sender`)."""
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(k)
    port = ls.getsockname()[1]
    senders = [start({"port": port, "nbytes": nbytes}) for _ in range(k)]
    conns, counts = [], [0] * k
    try:
        ls.settimeout(60)
        for i in range(k):
            conn, _ = ls.accept()
            conns.append(conn)
            threading.Thread(target=_recv_frames, args=(conn, counts, i), daemon=True).start()
        pids = [p.pid for p in senders]

        def step() -> int:
            before = sum(counts)
            time.sleep(0.05)
            return sum(counts) - before

        return _window(step, warmup_s, window_s, pids)
    finally:
        for c in conns:
            c.close()
        ls.close()
        for p in senders:
            p.kill()
            p.wait()


def _recv_exact(conn: socket.socket, view: memoryview) -> bool:
    got = 0
    while got < len(view):
        r = conn.recv_into(view[got:])
        if not r:
            return False
        got += r
    return True


def _lean_recv(conn: socket.socket, q: Any, i: int) -> None:
    """The lean transport's receiver: each element's tensors read straight into fresh numpy
    arrays and wrapped as tensors (no copy when aligned), then put on the merge queue."""
    import numpy as np
    import tensorflow as tf  # only in the child processes: the harness never loads it

    try:
        while True:
            head = bytearray(4)
            if not _recv_exact(conn, memoryview(head)):
                return
            arrays = []
            for _ in range(struct.unpack("!I", head)[0]):
                meta = bytearray(5)
                if not _recv_exact(conn, memoryview(meta)):
                    return
                dt, ndim = struct.unpack("!4sB", meta)
                dims = bytearray(8 * ndim)
                if not _recv_exact(conn, memoryview(dims)):
                    return
                arrays.append(np.empty(struct.unpack(f"!{ndim}Q", dims), np.dtype(dt.decode().strip())))
            for a in arrays:
                if not _recv_exact(conn, memoryview(a).cast("B")):
                    return
            q.put((i, [tf.convert_to_tensor(a) for a in arrays]))
    except OSError:
        return


# =========================================================================== ceiling: data plane
def child_dp_sender(spec: dict) -> None:
    """A data-plane sender (:data:`DATAPLANE`): the batch of :func:`synthetic_dataset`'s shapes
    as numpy arrays, ``Sender.send`` in a loop (bundled ``spec["bundle"]``, default ``auto``)
    until the receiver closes."""
    import numpy as np

    from csrun_runtime.dataplane import ReceiverGone, Sender

    cols = max(1, (spec["nbytes"] - 4 * ROWS) // (4 * ROWS))
    batch = (np.random.default_rng(spec["index"]).random((ROWS, cols), dtype=np.float32), np.zeros(ROWS, np.int32))
    s = Sender(spec["endpoint"], spec["index"], bundle=spec.get("bundle", "auto"),
               keep_memory=spec.get("keep_memory", True))
    try:
        while True:
            s.send(batch, timeout=60)
    except (ReceiverGone, TimeoutError):
        pass
    finally:
        s.close(timeout=1.0)


def measure_dataplane(k: int, nbytes: int, warmup_s: float, window_s: float, start: Callable[[dict], Any],
                      window_bytes: int | None = None, consume: Callable[[Any], None] | None = None,
                      lend: Callable[[int], Any] | None = None, **receiver: Any) -> dict[str, float]:
    """Batches/s of ``k`` data-plane senders into one :class:`~csrun_runtime.dataplane.Receiver`
    of this process (``get_bundle``: bundles handed out as arrays on the received frames), and
    the CPU of both sides. ``window_bytes``: the receiver's credit window (None: its default);
    ``consume(bundle)``: what the chief does with each bundle before the next (None: nothing);
    ``lend``: what the receiver reads bundles into (:meth:`Receiver.lend`, with ``bulk=True``);
    ``receiver``: its other arguments (``io_threads``, ``keep_memory``, ``bulk``)."""
    from csrun_runtime.dataplane import WINDOW_BYTES, Receiver

    rx = Receiver("tcp://127.0.0.1:0", window_bytes=window_bytes or WINDOW_BYTES, expected=k, **receiver)
    if lend is not None and not rx.lend(lend):
        raise ValueError("measure_dataplane: lend needs bulk=True")
    senders = [start({"endpoint": rx.endpoint, "index": i, "nbytes": nbytes}) for i in range(k)]

    def step() -> int:
        b = rx.get_bundle(60)
        if consume is not None:
            consume(b)
        return b.n

    try:
        rx.wait_workers(k, 120)
        return _window(step, warmup_s, window_s, [p.pid for p in senders])
    finally:
        rx.close()
        reap(senders, 5.0)


def reap(procs: list[subprocess.Popen], timeout: float) -> None:
    """Wait up to ``timeout`` s for each sender to leave by itself (its receiver closed), then
    kill it."""
    for p in procs:
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


# =========================================================================== ceiling: the chief
def _variant_source(reader: str) -> type:
    """A :class:`csrun_runtime.tensorflow.service.ServiceSource` whose streams are opened another way
    (the hop study's chief-side variants); the merge, counts and watchdog are the runtime's."""

    class VariantSource(service.ServiceSource):
        def _start_stream(self, i: int, address: str) -> None:
            import tensorflow as tf  # only in the child processes: the harness never loads it

            svc = tf.data.experimental.service
            self._bundles[i] = int((self.registry.get(i) or {}).get("bundle") or 1)
            kw: dict[str, Any] = {"max_outstanding_requests": 8} if reader == "mor8" else {}
            self._generation[i] = gen = self._generation.get(i, 0) + 1
            consumers = 2 if reader == "two_consumers" else 1
            if consumers > 1:
                kw["job_name"] = f"bench-{os.getpid()}-{time.time_ns()}-{i}"
            for _ in range(consumers):
                ds = svc.from_dataset_id(processing_mode="parallel_epochs", service=f"grpc://{address}",
                                         dataset_id=self.dataset_id, **kw)
                threading.Thread(target=self._read_one, args=(i, gen, ds), daemon=True).start()

        def _read_one(self, i: int, gen: int, ds: Any) -> None:
            try:
                for element in ds:
                    if not self._put((i, gen, element)):
                        return
            except BaseException as e:  # noqa: BLE001 - reported to the consumer
                self._put((i, gen, e))

    return VariantSource


def _tfdata_merge(addresses: list[str], ds_id: str) -> Any:
    """The merge inside tf.data: ``interleave(deterministic=False)`` over the per-worker
    ``from_dataset_id`` datasets (elements in the order they become available), prefetched."""
    import tensorflow as tf  # only in the child processes: the harness never loads it

    svc = tf.data.experimental.service
    streams = [svc.from_dataset_id(processing_mode="parallel_epochs", service=f"grpc://{a}", dataset_id=ds_id)
               for a in addresses]
    of = tf.data.Dataset.from_tensors(streams[0])
    for s in streams[1:]:
        of = of.concatenate(tf.data.Dataset.from_tensors(s))
    merged = of.interleave(lambda d: d, cycle_length=len(streams), num_parallel_calls=len(streams),
                           deterministic=False)
    return merged.prefetch(2)


class Ceiling:
    """The chief side of the ceiling and hop measurements (one process per ``k``)."""

    def __init__(self, spec: dict, rdv: Any, addresses: list[str], regs: dict[int, dict]):
        self.spec, self.rdv, self.addresses, self.regs = spec, rdv, addresses, regs
        self.k = len(addresses)
        self.pids = [int(r["pid"]) for r in regs.values()]
        self._keep: list[Any] = []  # sources and iterators are never deleted (can block)

    def measure(self, path: str, size: str) -> dict[str, float]:
        """One measurement of ``path`` (ceiling path or hop variant) at batch size ``size``."""
        nbytes = SIZES[size]
        w, m = self.spec["warmup_s"], self.spec["window_s"]
        if path == "raw TCP":
            rec = measure_raw(self.k, nbytes, w, m, self._start_sender)
        elif path == LEAN:
            rec = self._lean(nbytes, w, m)
        elif path == DATAPLANE:
            rec = measure_dataplane(self.k, nbytes, w, m, lambda spec: self._start_sender(spec, "--dp-sender"))
        elif path == "in-process":
            it = iter(synthetic_dataset(nbytes))
            self._keep.append(it)
            rec = _window(lambda: (next(it), 1)[1], w, m, [])
        else:
            variant, reader = {**PATHS, **HOP_VARIANTS}[path]
            rec = self._service(f"{size}/{variant}", reader, w, m)
        mb = rec["batches_per_sec"] * nbytes / 1e6
        rec.update({"mb_per_sec": mb, "samples_per_sec": rec["batches_per_sec"] * ROWS,
                    "chief_cpu_s_per_mb": rec["chief_cpu"] / mb if mb else None,
                    "workers_cpu_s_per_mb": rec["workers_cpu"] / mb if mb else None})
        return rec

    def _service(self, ds_id: str, reader: str, warmup_s: float, window_s: float) -> dict[str, float]:

        regs = {i: {**r, "bundle": r["bundles"][ds_id]} for i, r in self.regs.items()}
        if reader == "tfdata":
            it = iter(_tfdata_merge(self.addresses, ds_id))
            self._keep.append(it)
            bundle = regs[0]["bundle"]

            def step() -> int:
                next(it)
                return bundle
            return _window(step, warmup_s, window_s, self.pids)
        cls = service.ServiceSource if reader == "threads" else _variant_source(reader)
        src = cls(self.rdv, self.addresses, regs, dataset_id=ds_id)
        self._keep.append(src)
        try:
            return _window(lambda: src.get_chunk(1 << 30, 60).steps, warmup_s, window_s, self.pids)
        finally:
            src.close()

    def _lean(self, nbytes: int, warmup_s: float, window_s: float) -> dict[str, float]:
        """The lean transport from every worker (see :func:`_lean_send`), merged through a
        bounded queue as the runtime's merge does."""

        ls = socket.socket()
        ls.bind(("127.0.0.1", 0))
        ls.listen(self.k)
        ls.settimeout(60)
        port = ls.getsockname()[1]
        (self.rdv.dir / "lean").mkdir(exist_ok=True)
        _write(self.rdv.dir / "lean" / f"{time.time_ns()}.json", {"port": port, "nbytes": nbytes})
        q: queue.Queue = queue.Queue(maxsize=max(4, 2 * self.k))
        conns = []
        try:
            for i in range(self.k):
                conn, _ = ls.accept()
                conns.append(conn)
                threading.Thread(target=_lean_recv, args=(conn, q, i), daemon=True).start()

            def step() -> int:
                _, arrays = q.get(timeout=60)
                return int(arrays[0].shape[0])

            return _window(step, warmup_s, window_s, self.pids)
        finally:
            for c in conns:
                c.close()
            ls.close()
            while not q.empty():
                q.get_nowait()

    def _start_sender(self, spec: dict, role: str = "--sender") -> subprocess.Popen:
        path = Path(self.spec["workdir"]) / f"sender{time.time_ns()}.json"
        path.write_text(json.dumps(spec))
        return subprocess.Popen([sys.executable, str(Path(__file__).resolve()), role, str(path)],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def child_chief(spec: dict) -> None:
    """The ceiling's chief: one dispatcher per worker, the workers' registrations, then every
    size × path (× hop variant) measured ``repeats`` times in rotating order."""

    k = spec["k"]
    rdv = rendezvous.Rendezvous(spec["rdv_dir"], spec["key"])
    rdv.reset()
    servers, ports = service.start_dispatchers(k)
    addresses = [f"localhost:{p}" for p in ports]
    t0 = time.monotonic()
    rdv.publish_endpoints(addresses, {"bench": "ingest"})
    regs: dict[int, dict] = {}
    while len(regs) < k:
        regs = {i: r for i in range(k) if (r := rdv.worker(i)) and r.get("status") == "ok"}
        if time.monotonic() - t0 > spec["start_timeout_s"]:
            raise TimeoutError(f"{len(regs)} of {k} workers registered")
        time.sleep(0.1)
    out: dict[str, Any] = {"registered_s": time.monotonic() - t0, "k": k, "runs": {}}
    ceiling = Ceiling(spec, rdv, addresses, regs)
    paths = list(spec["paths"]) + ([*HOP_VARIANTS, LEAN] if spec["hop"] else [])
    for r in range(spec["repeats"]):
        for size in spec["sizes"]:
            order = paths[r % len(paths):] + paths[:r % len(paths)]
            for path in order:
                rec = ceiling.measure(path, size)
                out["runs"].setdefault(size, {}).setdefault(path, []).append(rec)
    out["workers_rss_mb"] = _rss_mb(ceiling.pids)
    rdv.mark_done("ok")
    _write(spec["out"], out)
    del servers


def _rss_mb(pids: list[int]) -> list[float]:

    out = []
    for pid in pids:
        try:
            out.append(round(psutil.Process(pid).memory_info().rss / 1e6, 1))
        except psutil.Error:
            pass
    return out


# =========================================================================== training loop
def _per_step_us(call: Callable[[], int], seconds: float) -> float:
    """Microseconds per step of ``call`` (returns the steps it ran), over ``seconds``."""
    t0, n = time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds or n == 0:
        n += call()
    return (time.perf_counter() - t0) / n * 1e6


def child_loop(spec: dict) -> None:
    """The training-loop measurements on the digits model (see the module docstring)."""
    import tensorflow as tf  # only in the child processes: the harness never loads it


    for k in [k for k in os.environ if k.startswith(("CSRUN_", "SLURM_"))]:
        del os.environ[k]  # single-process role
    run_py, base = common.PIPELINES["digits"]
    argv = [*base, "--mode", "train", "--model_dir", spec["model_dir"]]
    entry = load_entry(str(run_py), argv)
    resolved = resolve_params(argv, run_py=str(run_py))
    rc = resolved.params["runconfig"]
    rc.update({"checkpoint_steps": 0, "max_steps": None, "num_steps": spec["loop_steps"], "eval_frequency": None})
    chief = chief_mod.Chief(resolve_role(), resolved, entry.input_fn, entry.model_fn, None, time.time())
    chief.model_dir.mkdir(parents=True, exist_ok=True)
    ds, spec_, batch_size = chief._check_train_input()
    model = chief._build_model(spec_)
    chief._apply_jit(model)
    plan = service.plan_bundle(spec_, "auto")
    x, y = next(iter(ds))
    element = (tf.stack([x] * plan.bundle), tf.stack([y] * plan.bundle))
    floor_el = (tf.stack([x] * 256), tf.stack([y] * 256))
    steps = chief.train_steps(model)
    steps(element, 0, 1)
    steps(floor_el, 0, 1)
    model.train_on_batch(x, y)
    sec = spec["seconds"]
    fns: dict[str, Callable[[], int]] = {
        "train_on_batch": lambda: (model.train_on_batch(x, y, return_dict=True), 1)[1],
        f"TrainSteps, {plan.bundle} steps per call": lambda: (steps(element, 0, plan.bundle), plan.bundle)[1],
        "floor: TrainSteps, 256 steps per call": lambda: (steps(floor_el, 0, 256), 256)[1],
    }
    micro = common.round_robin({k: (lambda f=f: _per_step_us(f, sec)) for k, f in fns.items()},
                               spec["repeats"], warmup=0)
    loops = []
    for _ in range(spec["repeats"]):
        step_var, _ckpt, mgr, _ = chief._checkpointing(model)
        source = service.LocalSource(ds.take(1).cache().repeat(), plan)
        loop = training.training_loop(chief.loop_context(), model, step_var, mgr, source, batch_size, False)
        loop.run()
        c = loop.clock
        assert c.t_end is not None and c.t_first_end is not None
        n = loop.step - loop.start - 1
        loops.append({"us_per_step": (c.t_end - c.t_first_end) / n * 1e6, "steps": n,
                      "calls": sum(c.chunk_steps.values())})
    rate_ds = service.limit_threads(ds, 1)
    it = iter(rate_ds)
    digits_rate = _window(lambda: (next(it), 1)[1], 1.0, sec, [])["batches_per_sec"] * batch_size
    _write(spec["out"], {"micro_us_per_step": micro, "loop": loops, "bundle": plan.bundle,
                         "xla": bool(model.jit_compile), "batch_size": batch_size,
                         "log_steps": rc["log_steps"], "digits_in_process_samples_per_sec": digits_rate})


# =========================================================================== many workers
def _task_env(role: str, procid: int, k: int, job_id: str) -> dict[str, str]:
    """The environment csrun_wse gives a task (docs/CONTRACT.md): chief = task 0 of group 0;
    input workers = one component ``worker``."""
    env = {key: v for key, v in os.environ.items() if not key.startswith(("CSRUN_", "SLURM"))}
    chief = role == "chief"
    env.update({"TF_CPP_MIN_LOG_LEVEL": "2", "SLURM_PROCID": str(procid), "SLURM_JOB_ID": job_id,
                "SLURM_STEP_ID": "0", "SLURMD_NODENAME": f"node{procid + 1}", ADVERTISE_HOST: "localhost"})
    env.update(TaskEnv(role, 0 if chief else 1, 0 if chief else 1, 0, k, k + 1, 1).encode())
    return env


def _memory(pids: list[int], full: bool) -> list[dict[str, float]]:

    out = []
    for pid in pids:
        try:
            p = psutil.Process(pid)
            m = p.memory_full_info() if full else p.memory_info()
            rec = {"rss_mb": m.rss / 1e6}
            if full:
                rec.update({"pss_mb": getattr(m, "pss", float("nan")) / 1e6, "uss_mb": m.uss / 1e6})
            out.append(rec)
        except psutil.Error:
            pass
    return out


def run_many(k: int, steps: int, work: Path, timeout_s: float = 600.0) -> dict[str, Any]:
    """``examples/digits/run.py`` as a chief and ``k`` input workers (local processes), to
    ``steps`` steps: exit statuses, registration seconds, samples/s, worker memory."""
    run_py, base = common.PIPELINES["digits"]
    md, logs = work / "md", work / "logs"
    logs.mkdir(parents=True)
    job = f"bi{os.getpid()}{time.time_ns() % 10**6}"
    argv = [sys.executable, str(run_py), *base, "--mode", "train", "--max_steps", str(steps), "--model_dir", str(md)]
    procs = []
    t0 = time.monotonic()
    for i in range(k + 1):
        env = _task_env("chief" if i == 0 else "worker", i, k, job)
        with open(logs / f"task{i}.log", "w") as log:
            procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(REPO),
                                          stdin=subprocess.DEVNULL, start_new_session=True))
    pids = [p.pid for p in procs[1:]]
    rss_max: dict[int, float] = {}
    full: list[dict[str, float]] = []
    try:
        while procs[0].poll() is None and time.monotonic() - t0 < timeout_s:
            streaming = "training from global step" in (logs / "task0.log").read_text(errors="replace")
            for pid, m in zip(pids, _memory(pids, False), strict=False):
                rss_max[pid] = max(rss_max.get(pid, 0.0), m["rss_mb"])
            if streaming and not full:
                full = _memory(pids, True)  # once, mid-stream (reading smaps costs CPU)
            time.sleep(0.5)
        codes = []
        for p in procs:
            try:
                codes.append(p.wait(timeout=max(1.0, timeout_s - (time.monotonic() - t0))))
            except subprocess.TimeoutExpired:
                stop_process_group(p, grace=3.0)
                codes.append(None)
    finally:
        for p in procs:
            if p.poll() is None:
                stop_process_group(p, grace=3.0)
    wall = time.monotonic() - t0
    perf = json.loads((md / "performance" / "performance.json").read_text()) if codes[0] == 0 else {}
    chief_log = (logs / "task0.log").read_text(errors="replace")
    per = perf.get("batches_per_worker", {})
    return {
        "k": k, "steps": steps, "chief_exit": codes[0], "worker_exits": codes[1:], "wall_s": round(wall, 2),
        "workers_registered_secs": perf.get("workers_registered_secs"),
        "programming_time": perf.get("programming_time"), "samples_per_sec": perf.get("samples_per_sec"),
        "batches_per_worker": per, "workers_that_delivered": sum(1 for v in per.values() if v),
        "input_bundle": perf.get("input_bundle"),
        "worker_rss_mb": common.spread(list(rss_max.values()), 1),
        "worker_pss_mb": common.spread([m["pss_mb"] for m in full], 1) if full else None,
        "worker_uss_mb": common.spread([m["uss_mb"] for m in full], 1) if full else None,
        "chief_log_tail": chief_log.strip().splitlines()[-3:] if codes[0] != 0 else [],
    }


# =========================================================================== the harness
class _Children:
    """Child processes of one measurement (this script with a role); all stopped on exit."""

    def __init__(self, workdir: Path):
        self.workdir, self.procs = workdir, []
        workdir.mkdir(parents=True, exist_ok=True)

    def start(self, role: str, spec: dict, name: str) -> subprocess.Popen:
        path = self.workdir / f"{name}.spec.json"
        path.write_text(json.dumps(spec))
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
                   PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
        with open(self.workdir / f"{name}.log", "ab") as log:
            proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), role, str(path)],
                                    stdout=log, stderr=subprocess.STDOUT, cwd=str(REPO), env=env,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        self.procs.append(proc)
        return proc

    def tail(self, name: str) -> str:
        try:
            lines = [ln for ln in (self.workdir / f"{name}.log").read_text(errors="replace").splitlines()
                     if ln.strip() and not ln.startswith(("W0000", "I0000", "WARNING: All"))]
        except OSError:
            return ""
        return " | ".join(lines[-4:])[:600]

    def __enter__(self) -> _Children:
        return self

    def __exit__(self, *exc: object) -> None:
        for p in self.procs:
            if p.poll() is None:
                stop_process_group(p, grace=3.0)


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {"error": f"no result in {path.name}"}


def run_ceiling_k(k: int, plan: dict, work: Path) -> dict:
    """One chief process and ``k`` worker processes: every size × path (and the hop
    variants when ``plan["hop"]``) for this ``k``."""
    wd = work / f"k{k}"
    variants = sorted({v for v, _ in (list(PATHS.values()) + (list(HOP_VARIANTS.values()) if plan["hop"] else []))})
    base = {"rdv_dir": str(wd / "rdv"), "key": f"ingest{os.getpid()}.{k}", "sizes": plan["sizes"],
            "variants": variants, "workdir": str(wd)}
    with _Children(wd) as ch:
        chief = ch.start("--chief", {**base, "k": k, "paths": plan["paths"], "hop": plan["hop"],
                                     "repeats": plan["repeats"], "warmup_s": plan["warmup_s"],
                                     "window_s": plan["window_s"], "start_timeout_s": 300,
                                     "out": str(wd / "chief.json")}, "chief")
        for i in range(k):
            ch.start("--worker", {**base, "index": i, "out": str(wd / f"worker{i}.json")}, f"worker{i}")
        t_end = time.monotonic() + plan["timeout_s"]
        while chief.poll() is None and time.monotonic() < t_end:
            time.sleep(0.5)
        res = _read(wd / "chief.json")
        if "error" in res:
            res["error"] += f": chief: {ch.tail('chief')}; worker0: {ch.tail('worker0')}"
    return res


def _summary(recs: list[dict]) -> dict:
    return {"batches_per_sec": common.spread([r["batches_per_sec"] for r in recs], 1),
            "samples_per_sec": round(common.median(r["samples_per_sec"] for r in recs), 1),
            "mb_per_sec": round(common.median(r["mb_per_sec"] for r in recs), 1),
            "chief_cpu_s_per_mb": round(common.median(r["chief_cpu_s_per_mb"] for r in recs), 5),
            "workers_cpu_s_per_mb": round(common.median(r["workers_cpu_s_per_mb"] for r in recs), 5),
            "chief_cpu": round(common.median(r["chief_cpu"] for r in recs), 3),
            "workers_cpu": round(common.median(r["workers_cpu"] for r in recs), 3)}


def _paired(recs: dict[str, list[dict]], a: str, b: str) -> dict:
    return common.compare([r["mb_per_sec"] for r in recs[a]], [r["mb_per_sec"] for r in recs[b]])


def summarize_ceiling(raw: dict) -> tuple[dict, dict]:
    """Per size and path the medians (:func:`_summary`), the paired ratios service / raw TCP,
    service / unbundled, and each hop variant / service."""
    ceiling, hop = {}, {}
    for size, recs in raw["runs"].items():
        paths = {p: _summary(v) for p, v in recs.items() if p in (*PATHS, "raw TCP", "in-process", DATAPLANE)}
        if "raw TCP" in recs:
            paths["service / raw TCP"] = _paired(recs, "service", "raw TCP")
        if DATAPLANE in recs and "raw TCP" in recs:
            paths["data plane / raw TCP"] = _paired(recs, DATAPLANE, "raw TCP")
            paths["data plane / service"] = _paired(recs, DATAPLANE, "service")
            cpu = [d["chief_cpu_s_per_mb"] / r["chief_cpu_s_per_mb"]
                   for d, r in zip(recs[DATAPLANE], recs["raw TCP"], strict=False)
                   if d.get("chief_cpu_s_per_mb") and r.get("chief_cpu_s_per_mb")]
            paths["data plane / raw TCP, chief CPU-s per MB"] = round(common.median(cpu), 3)
        if "service, unbundled" in recs:
            paths["service / unbundled"] = _paired(recs, "service", "service, unbundled")
        ceiling[size] = paths
        variants = {v: {**_summary(recs[v]), "vs_service": _paired(recs, v, "service")}
                    for v in (*HOP_VARIANTS, LEAN) if v in recs}
        if LEAN in recs and "raw TCP" in recs:
            variants[LEAN]["vs_raw_tcp"] = _paired(recs, LEAN, "raw TCP")
        if variants:
            hop[size] = variants
    return ceiling, hop


def _loop_summary(res: dict) -> dict:
    micro = {k: common.spread(v, 2) for k, v in res["micro_us_per_step"].items()}
    floor = micro["floor: TrainSteps, 256 steps per call"]["median"]
    loop_us = common.median(r["us_per_step"] for r in res["loop"])
    overhead = loop_us - floor
    step_at_rate = res["batch_size"] / res["digits_in_process_samples_per_sec"] * 1e6
    tob = micro["train_on_batch"]["median"]
    return {"micro_us_per_step": micro, "loop_us_per_step": common.spread([r["us_per_step"] for r in res["loop"]], 2),
            "loop_calls": [r["calls"] for r in res["loop"]], "loop_steps": [r["steps"] for r in res["loop"]],
            "floor_us_per_step": floor, "overhead_us_per_step": round(overhead, 2),
            "overhead_vs_loop_step": round(overhead / loop_us, 4),
            "digits_in_process_samples_per_sec": round(res["digits_in_process_samples_per_sec"], 1),
            "step_us_at_digits_rate": round(step_at_rate, 2),
            "overhead_vs_step_at_digits_rate": round(overhead / step_at_rate, 4),
            "train_on_batch_overhead_vs_step_at_digits_rate": round((tob - floor) / step_at_rate, 4),
            "bundle": res["bundle"], "xla": res["xla"], "log_steps": res["log_steps"]}


def run(quick: bool = False, ceiling_only: bool = False) -> dict:
    """Every part (see the module docstring). Quick (the CI smoke test): k = 1, 256 KiB, one
    repetition of 1 s windows, no hop variants, a short loop, 2 workers. Full: k = 1, 2, 4, 8,
    16, all sizes, 3 repetitions of 1 s windows (after 0.3 s of warm-up; ~8 minutes in all on
    the 2-core host), the hop variants at k = 1, 16 workers. ``ceiling_only`` (``--ceiling-only``):
    the ceiling alone (no hop variants, loop or many workers)."""
    if quick:
        ks, hop_ks, sizes, repeats, warmup, window = [1], [], ["256 KiB"], 1, 0.5, 1.0
        loop_spec, many = {"loop_steps": 300, "repeats": 1, "seconds": 0.5}, (2, 300)
    else:
        ks, hop_ks, sizes, repeats, warmup, window = [1, 2, 4, 8, 16], [1], list(SIZES), 3, 0.3, 1.0
        loop_spec, many = {"loop_steps": 20000, "repeats": 3, "seconds": 2.0}, (16, 4000)
    paths = [*PATHS, "raw TCP", "in-process", DATAPLANE]
    if ceiling_only:
        hop_ks = []
    out: dict[str, Any] = {"unit": "batches/s of 64 samples; MB/s = 10^6 bytes/s; CPU-s per MB",
                           "sizes_bytes": {s: SIZES[s] for s in sizes}, "ks": ks, "repeats": repeats,
                           "warmup_s": warmup, "window_s": window, "rows_per_batch": ROWS,
                           "where": "local processes on this host (chief, workers, senders)",
                           "ceiling": {}, "hop": {}, "not_measured": NOT_MEASURED}
    common.ensure_example_data(["digits"])  # the loop and many-workers parts train digits
    with tempfile.TemporaryDirectory(prefix="bench_ingest_") as tmp:
        work = Path(tmp)
        for k in ks:
            plan = {"sizes": sizes, "paths": paths, "hop": k in hop_ks, "repeats": repeats, "warmup_s": warmup,
                    "window_s": window, "timeout_s": 420 + (900 if k in hop_ks else 0) * (0 if quick else 1)}
            try:
                raw = run_ceiling_k(k, plan, work)
                if "error" in raw:
                    raise RuntimeError(raw["error"])
                ceiling, hop = summarize_ceiling(raw)
                out["ceiling"][f"k={k}"] = {"registered_s": round(raw["registered_s"], 2),
                                             "workers_rss_mb": raw.get("workers_rss_mb"), "sizes": ceiling}
                if hop:
                    out["hop"][f"k={k}"] = hop
            except Exception as exc:  # noqa: BLE001 - recorded, the other parts go on
                out["ceiling"][f"k={k}"] = {"error": f"{type(exc).__name__}: {str(exc)[:1500]}"}
        if ceiling_only:
            out["targets"] = {k: v for k, v in _targets(out).items() if k.startswith(("dataplane", "ingest"))}
            return out
        out["loop"] = _run_loop(loop_spec, work)
        try:
            out["many"] = run_many(*many, work / "many")
        except Exception as exc:  # noqa: BLE001
            out["many"] = {"error": f"{type(exc).__name__}: {str(exc)[:1500]}"}
    out["targets"] = _targets(out)
    return out


def _run_loop(spec: dict, work: Path) -> dict:
    wd = work / "loop"
    with _Children(wd) as ch:
        proc = ch.start("--loop", {**spec, "model_dir": str(wd / "md"), "out": str(wd / "loop.json")}, "loop")
        try:
            proc.wait(timeout=900)
        except subprocess.TimeoutExpired:
            pass
        res = _read(wd / "loop.json")
        if "error" in res:
            return {"error": f"{res['error']}: {ch.tail('loop')}"}
    return _loop_summary(res)


def _targets(out: dict) -> dict:
    """The issue's targets, from this run: ingest of >= 256 KiB batches >= 50 % of raw TCP
    (every k), the loop's per-step overhead <= 5 % of the step at digits' delivered rate, 16
    workers streaming with exit 0."""
    ratios = {}
    for k, rec in out["ceiling"].items():
        for size, paths in (rec.get("sizes") or {}).items():
            if SIZES[size] >= SIZES["256 KiB"] and "service / raw TCP" in paths:
                ratios[f"{size}, {k}"] = paths["service / raw TCP"]["median_ratio"]
    loop = out.get("loop") or {}
    many = out.get("many") or {}
    dp: dict[str, dict[str, float]] = {"ge_256KiB": {}, "16KiB": {}, "chief_cpu_per_mb_vs_raw": {}}
    for k, rec in out["ceiling"].items():
        for size, paths in (rec.get("sizes") or {}).items():
            if "data plane / raw TCP" in paths:
                dp["ge_256KiB" if SIZES[size] >= SIZES["256 KiB"] else "16KiB"][f"{size}, {k}"] = \
                    paths["data plane / raw TCP"]["median_ratio"]
                dp["chief_cpu_per_mb_vs_raw"][f"{size}, {k}"] = paths["data plane / raw TCP, chief CPU-s per MB"]
    dp_targets = {
        "dataplane_vs_raw_tcp_ge_0.8_for_ge_256KiB": {"ratios": dp["ge_256KiB"], "met": bool(dp["ge_256KiB"]) and all(
            r >= 0.8 for r in dp["ge_256KiB"].values())},
        "dataplane_vs_raw_tcp_ge_0.6_for_16KiB": {"ratios": dp["16KiB"], "met": bool(dp["16KiB"]) and all(
            r >= 0.6 for r in dp["16KiB"].values())},
        "dataplane_chief_cpu_per_mb_le_1.5x_raw_tcp": {"ratios": dp["chief_cpu_per_mb_vs_raw"], "met": bool(
            dp["chief_cpu_per_mb_vs_raw"]) and all(r <= 1.5 for r in dp["chief_cpu_per_mb_vs_raw"].values())},
    }
    return {**dp_targets,
        "ingest_vs_raw_tcp_ge_0.5": {"ratios": ratios, "met": bool(ratios) and all(r >= 0.5 for r in ratios.values())},
        "loop_overhead_le_0.05": {"value": loop.get("overhead_vs_step_at_digits_rate"),
                                  "met": loop.get("overhead_vs_step_at_digits_rate") is not None
                                  and loop["overhead_vs_step_at_digits_rate"] <= 0.05},
        "many_workers_exit_0": {"k": many.get("k"), "met": many.get("chief_exit") == 0
                                and all(c == 0 for c in many.get("worker_exits") or [1])},
    }


#: What the hop study did not measure, and why.
NOT_MEASURED = {
    "data_transfer_protocol": "TensorFlow 2.21 registers two tf.data service data transfer protocols: 'grpc' "
                              "(the default, measured) and 'local' (a worker in the consumer's own process; "
                              "input workers are other processes)",
    "target_workers": "'LOCAL' reads only workers in the consumer's process and 'AUTO'/'ANY' read every "
                      "worker here (none is tagged as colocated): no choice for workers in other processes",
}


def _child_main(argv: list[str]) -> None:
    role, spec_path = argv[0], argv[1]
    spec = json.loads(Path(spec_path).read_text())
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    code = 0
    try:
        {"--chief": child_chief, "--worker": child_worker, "--sender": child_sender,
         "--dp-sender": child_dp_sender, "--loop": child_loop}[role](spec)
    except BaseException as exc:  # noqa: BLE001
        if spec.get("out"):
            try:
                _write(spec["out"], {"error": f"{type(exc).__name__}: {str(exc)[:800]}"})
            except OSError:
                pass

        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # tf.data service servers and iterators can hang interpreter exit


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] in ("--chief", "--worker", "--sender", "--dp-sender", "--loop"):
        _child_main(sys.argv[1:])
    result = run(quick="--quick" in sys.argv, ceiling_only="--ceiling-only" in sys.argv)
    if "--out" in sys.argv:  # e.g. --out bench/results/extra/ingest_dataplane.json
        common.write_json(Path(sys.argv[sys.argv.index("--out") + 1]), result)
    print(json.dumps(result, indent=1))
