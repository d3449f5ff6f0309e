"""The child processes of bench_ingest (``python bench/ingest_roles.py --ROLE SPEC``; SPEC a
JSON file, the result written to its ``out``):

* ``--chief``: the ceiling's and hop study's chief (:func:`child_chief`, :class:`Ceiling`);
* ``--worker``: an input worker of the ceiling serving tf.data service (:func:`child_worker`);
* ``--sender``: a raw TCP sender (:func:`child_sender`);
* ``--dp-sender``: a data-plane sender (:func:`child_dp_sender`);
* ``--loop``: the training-loop measurements (:func:`child_loop`).

bench_ingest_gap and bench_gpu_feed start ``--sender`` / ``--dp-sender`` too. TensorFlow is
imported only inside the roles that need it (the senders stay light).
"""
from __future__ import annotations

import json
import os
import queue
import socket
import struct
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import common  # bench/ is on sys.path: these modules run as scripts from it
import psutil
from ingest_lib import (
    DATAPLANE,
    DATAPLANE_OPEN,
    HOP_VARIANTS,
    LEAN,
    PATHS,
    ROWS,
    SIZES,
    WORKER_VARIANTS,
    measure_dataplane,
    measure_raw,
    window,
    write,
)

from csrun_common.roles import resolve_role
from csrun_runtime import rendezvous
from csrun_runtime.capture import load_entry
from csrun_runtime.params import resolve_params
from csrun_runtime.tensorflow import bundling, service, sources, training
from csrun_runtime.tensorflow import chief as chief_mod

#: The roles (the first argument) and their functions.
ROLES = ("--chief", "--worker", "--sender", "--dp-sender", "--loop")


def synthetic_dataset(nbytes: int) -> Any:
    """A ``take(1).cache().repeat()`` dataset of one batch of :data:`ROWS` samples and
    ``nbytes`` bytes: float32 features ``[ROWS, (nbytes - 4 ROWS) / (4 ROWS)]`` and int32
    labels ``[ROWS]``."""
    import tensorflow as tf  # only in the child processes: the harness never loads it

    cols = max(1, (nbytes - 4 * ROWS) // (4 * ROWS))
    x = tf.random.uniform([ROWS, cols])
    y = tf.zeros([ROWS], tf.int32)
    return tf.data.Dataset.from_tensors((x, y)).take(1).cache().repeat()



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
            ds = bundling.limit_threads(synthetic_dataset(nbytes), 1)
            plan = bundling.plan_bundle(ds.element_spec, setting)
            counter = [0]
            counters.append(counter)
            ds_id = f"{size}/{name}"
            bundles[ds_id] = plan.bundle
            if prefetch:  # bundle here, prefetch, and register it as it is
                ds = bundling.bundle_dataset(ds, plan.bundle).prefetch(2)
                plan = bundling.BundlePlan(1, plan.batch_bytes, setting, "bundled before the prefetch")
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


    ds = bundling.limit_threads(synthetic_dataset(req["nbytes"]), 1)
    ds = bundling.bundle_dataset(ds, bundling.plan_bundle(ds.element_spec, "auto").bundle)
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
    as numpy arrays, ``Sender.send`` in a loop (bundled ``spec["bundle"]``, default ``auto``;
    ``spec["authenticate"]``, default True) until the receiver closes."""
    import numpy as np

    from csrun_runtime.dataplane import ReceiverGone, Sender

    cols = max(1, (spec["nbytes"] - 4 * ROWS) // (4 * ROWS))
    batch = (np.random.default_rng(spec["index"]).random((ROWS, cols), dtype=np.float32), np.zeros(ROWS, np.int32))
    s = Sender(spec["endpoint"], spec["index"], bundle=spec.get("bundle", "auto"),
               keep_memory=spec.get("keep_memory", True), authenticate=spec.get("authenticate", True))
    try:
        while True:
            s.send(batch, timeout=60)
    except (ReceiverGone, TimeoutError):
        pass
    finally:
        s.close(timeout=1.0)



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
        elif path in (DATAPLANE, DATAPLANE_OPEN):
            rec = measure_dataplane(self.k, nbytes, w, m, lambda spec: self._start_sender(spec, "--dp-sender"),
                                    authenticate=path == DATAPLANE)
        elif path == "in-process":
            it = iter(synthetic_dataset(nbytes))
            self._keep.append(it)
            rec = window(lambda: (next(it), 1)[1], w, m, [])
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
            return window(step, warmup_s, window_s, self.pids)
        cls = service.ServiceSource if reader == "threads" else _variant_source(reader)
        src = cls(self.rdv, self.addresses, regs, dataset_id=ds_id)
        self._keep.append(src)
        try:
            return window(lambda: src.get_chunk(1 << 30, 60).steps, warmup_s, window_s, self.pids)
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
        write(self.rdv.dir / "lean" / f"{time.time_ns()}.json", {"port": port, "nbytes": nbytes})
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

            return window(step, warmup_s, window_s, self.pids)
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
    write(spec["out"], out)
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
    plan = bundling.plan_bundle(spec_, "auto")
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
        source = sources.LocalSource(ds.take(1).cache().repeat(), plan)
        loop = training.training_loop(chief.loop_context(), model, step_var, mgr, source, batch_size, False)
        loop.run()
        c = loop.clock
        assert c.t_end is not None and c.t_first_end is not None
        n = loop.step - loop.start - 1
        loops.append({"us_per_step": (c.t_end - c.t_first_end) / n * 1e6, "steps": n,
                      "calls": sum(c.chunk_steps.values())})
    rate_ds = bundling.limit_threads(ds, 1)
    it = iter(rate_ds)
    digits_rate = window(lambda: (next(it), 1)[1], 1.0, sec, [])["batches_per_sec"] * batch_size
    write(spec["out"], {"micro_us_per_step": micro, "loop": loops, "bundle": plan.bundle,
                         "xla": bool(model.jit_compile), "batch_size": batch_size,
                         "log_steps": rc["log_steps"], "digits_in_process_samples_per_sec": digits_rate})



def main(argv: list[str]) -> None:
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
                write(spec["out"], {"error": f"{type(exc).__name__}: {str(exc)[:800]}"})
            except OSError:
                pass

        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # tf.data service servers and iterators can hang interpreter exit



if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] in ROLES:
        main(sys.argv[1:])
    sys.exit(f"usage: {sys.argv[0]} {{{'|'.join(ROLES)}}} SPEC.json")
