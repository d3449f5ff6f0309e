"""The probe worker process: ``python -m analyzer.probe_worker SPEC.json``.

One process of a probe. It loads the user's run.py in capture mode
(:func:`csrun_runtime.capture.load_entry`), then either

* ``"mode": "once"`` — runs the one probe in ``spec["probe"]``, writes its result JSON and
  leaves, or
* ``"mode": "serve"`` — stays up and runs every probe command the driver
  (:mod:`analyzer.probe_driver`) drops into ``<workdir>/cmd/`` (so TensorFlow's ~4 s import and
  the run.py load are paid once per process, not once per probe), until an ``exit``
  command, a deadline or the loss of its parent.

A probe command ``{"seq", "probe_id", "kind": "pipeline"|"ingest"|"served", "tasks": T,
"cpus_per_task": C, "warmup_s", "measure_s", "barrier_timeout_s", "cache_elements"}`` is run
by the processes with index ``< T`` (index: ``spec["index"]``, else ``$CSRUN_PROBE_INDEX``,
else ``$SLURM_PROCID``); each pins all its threads to its own ``C`` CPUs
(``os.sched_setaffinity`` on every thread; CPUs ``[i·C, (i+1)·C)`` of the allowed set,
wrapping when the node is oversubscribed), builds worker 0 of 1's input through the
input-backend interface (:mod:`csrun_runtime.input_backend`, :func:`backend_for`): TensorFlow's
``input_fn(params)`` with ``threading.private_threadpool_size = C`` and
``max_intra_op_parallelism = 1``, or PyTorch's DataLoader with the command's
``"dataloader_workers"`` as ``train_input.num_workers`` and ``torch.set_num_threads(C)`` (a
DataLoader that cannot be built there: ``"invalid": true`` in the result), iterates it
for the warm-up, meets the other processes at a file barrier, measures ``measure_s``
seconds (samples/s, CPU-seconds, bytes read from psutil's I/O counters), keeps iterating
until every process has measured (so each window sees the full load), and writes
``<workdir>/res/<seq>_<index>.json``.

``kind == "ingest"`` measures the chief's ingest path instead (:func:`_ingest_role`):
process 0 hosts the tf.data service dispatchers and drains the streams as the runtime's
chief does, processes 1..T-1 are service workers serving the first ``cache_elements``
elements of the pipeline from a cache — the rate and the CPU-seconds per sample of the
service hop alone (with ``T == 1`` the worker servers live in the chief's process).

``kind == "served"`` is the same split with the real pipeline: processes 1..T-1 serve
``input_fn``'s dataset exactly as the runtime's input workers do (held to ``C`` CPUs each,
pinned to their own CPUs where the node has them), process 0 drains it as the chief. Each
process measures its own CPU, so the input workers' CPU-seconds per sample *with* the
service (the pipeline plus serving its elements) and the chief's per sample are known apart.
With ``"chief_apart": true`` in the command the chief is not one of the node's processes:
the driver runs it elsewhere (``"mode": "once"``, index 0; on a node with a single CPU the
chief would otherwise share the worker's CPU and inflate both costs), node process ``i``
plays role ``i + 1``, and the service addresses carry the host name instead of
``localhost``.

Results and the start-up record ``<workdir>/hello_<index>.json`` (pid, host, Slurm node,
CPUs, load time, or the load error) are written atomically (temp file + rename). The
process leaves with ``os._exit`` (a pipeline with ``tf.py_function`` can hang interpreter
exit); the driver still enforces a timeout.

TensorFlow is imported inside the functions that run a pipeline (and by :func:`main`
once run.py is loaded, so that the load time counts it); for a PyTorch run.py torch instead,
and never TensorFlow (the ingest kind is TensorFlow's only; a PyTorch ``served`` probe is the
chief's ingest over csrun's data plane instead: :mod:`analyzer.probe_plane`).
"""
from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Protocol

import psutil

from csrun_common import exits
from csrun_common.atomic import write_json
from csrun_common.env import PROBE_INDEX, PROBE_PARENT
from csrun_runtime import rendezvous
from csrun_runtime.capture import load_entry
from csrun_runtime.input_backend import BuiltInput, InputBackend, InputBuildError, samples_in
from csrun_runtime.tensorflow import contract, service
from csrun_runtime.tensorflow.input_backend import TFInputBackend, tf_passes
from csrun_runtime.tensorflow.input_backend import tf_samples_and_bytes as samples_and_bytes

__all__ = ["pin_all_threads", "cpus_for", "probe_cpus", "samples_in", "samples_and_bytes", "ProbedPipeline",
           "backend_for", "Counter", "run_probe", "serve", "main"]

POLL_S = 0.05


def pin_all_threads(cpus: list[int]) -> int:
    """Set the CPU affinity of every thread of this process to ``cpus``.

    Threads created later inherit the mask of their creator. Returns the number of
    threads pinned (threads that exit meanwhile are skipped)."""
    mask = set(cpus)
    count = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), mask)
            count += 1
        except (ProcessLookupError, OSError):
            pass
    return count


def cpus_for(index: int, cpus_per_task: int, allowed: list[int]) -> list[int]:
    """CPUs of task ``index`` of a probe: ``cpus_per_task`` consecutive CPUs of ``allowed``
    starting at ``index × cpus_per_task``, wrapping around (oversubscription)."""
    n = len(allowed)
    if cpus_per_task >= n:
        return list(allowed)
    start = index * cpus_per_task
    return sorted({allowed[(start + j) % n] for j in range(cpus_per_task)})


def probe_cpus(kind: str, index: int, tasks: int, cpus_per_task: int, allowed: list[int]) -> list[int]:
    """CPUs process ``index`` of a probe is pinned to: a pipeline task its own
    (:func:`cpus_for`); in a ``served`` probe, input worker ``i`` (index ``i ≥ 1``) the CPUs of
    task ``i - 1`` and the chief (index 0) the CPUs no worker holds (all of them when the
    workers hold every CPU); an ``ingest`` probe's processes share all allowed CPUs."""
    if kind == "pipeline":
        return cpus_for(index, cpus_per_task, allowed)
    if kind == "served":
        if index >= 1:
            return cpus_for(index - 1, cpus_per_task, allowed)
        held = {c for i in range(tasks - 1) for c in cpus_for(i, cpus_per_task, allowed)}
        return [c for c in allowed if c not in held] or list(allowed)
    return list(allowed)


class Marker:
    """The file barrier of one probe: ``<workdir>/bar/<seq>_<phase>_<index>``."""

    def __init__(self, workdir: Path, seq: int, tasks: int):
        self.dir = workdir / "bar"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.seq, self.tasks = seq, tasks

    def set(self, phase: str, index: int) -> None:
        (self.dir / f"{self.seq}_{phase}_{index}").touch()

    def count(self, phase: str) -> int:
        prefix = f"{self.seq}_{phase}_"
        return sum(1 for name in os.listdir(self.dir) if name.startswith(prefix))

    def all(self, phase: str) -> bool:
        return self.count(phase) >= self.tasks


class Stepper(Protocol):
    """What a probe process iterates: :class:`Counter`, :class:`IdleCounter` or the PyTorch
    served probe's :class:`analyzer.probe_plane.PlaneCounter` / ``PlaneSender``."""

    samples: int
    batches: int
    bytes: int

    @property
    def restarts(self) -> int: ...

    def step(self) -> None: ...


class ContractViolation(RuntimeError):
    """input_fn broke the runtime's contract (the message is csrun_runtime.tensorflow.contract's)."""


class InvalidPoint(RuntimeError):
    """The input cannot be built at the probe's point (e.g. DataLoader ``num_workers: 0`` with
    a ``prefetch_factor``): the probe is recorded ``invalid`` and the planner skips it."""


def backend_for(entry: Any) -> InputBackend:
    """The input backend of a captured run.py (:class:`csrun_runtime.capture.CapturedRun`: its
    ``framework``, ``input_fn`` and ``params``): :class:`csrun_runtime.tensorflow.input_backend.TFInputBackend`
    or :class:`csrun_runtime.pytorch.input_backend.TorchInputBackend` (torch's side imported only
    then). Raises ``ValueError`` for another framework."""
    fw = getattr(entry, "framework", "tensorflow")
    if fw == "tensorflow":
        return TFInputBackend(entry.input_fn, entry.params)
    if fw == "pytorch":
        from csrun_runtime.pytorch.input_backend import TorchInputBackend

        return TorchInputBackend(entry.input_fn, entry.params)
    raise ValueError(f"framework {fw!r}: no input backend (tensorflow or pytorch)")


class ProbedPipeline:
    """The captured run.py (:func:`csrun_runtime.capture.load_entry`): ``input_fn`` (PyTorch:
    ``train_data_fn``), the params input worker 0 of 1 receives (the single-process view:
    every probe process reads all the data, as an unsharded worker would), ``framework`` and
    its input backend (:func:`csrun_runtime.input_backend.backend_for`)."""

    def __init__(self, run_py: str, argv: list[str]):
        self.captured = load_entry(run_py, list(argv))
        self.framework = self.captured.framework
        self.input_fn = self.captured.input_fn
        self.params = self.captured.worker_params(0, 1)
        self.backend = backend_for(self.captured)
        if self.framework == "tensorflow":
            problems = contract.check_signature(self.input_fn)
            if problems:
                raise ContractViolation("train_input: " + "; ".join(problems))


def build_dataset(entry: ProbedPipeline, cpus_per_task: int) -> Any:
    """``input_fn(params)`` (a ``tf.data.Dataset``) checked against the runtime's contract
    (:func:`csrun_runtime.tensorflow.contract.check_dataset`), held to ``cpus_per_task`` cores as
    the runtime holds its input workers (:func:`csrun_runtime.tensorflow.service.limit_threads`).

    Raises :class:`ContractViolation` with the contract's messages, or what input_fn raises.
    """
    # as an input worker builds it: TF_CONFIG of one worker, its seeds (csrun_runtime.tensorflow.pipeline)
    if not isinstance(entry.backend, TFInputBackend):
        raise ContractViolation("the chief's ingest probes measure tf.data service: TensorFlow only")
    try:
        return entry.backend.dataset(0, 1, cpus_per_task)
    except InputBuildError as e:
        raise ContractViolation(str(e)) from None


class Counter:
    """Iterates a built input (:class:`csrun_runtime.input_backend.BuiltInput`: endless, pass
    after pass), counting samples, batches and bytes."""

    def __init__(self, built: BuiltInput):
        self.built = built
        self.samples = self.batches = self.bytes = 0

    @property
    def restarts(self) -> int:
        """Passes begun after the first."""
        return self.built.restarts[0]

    def step(self) -> None:
        """Take one batch and count it."""
        self.count(next(self.built.batches))

    def count(self, el: Any) -> None:
        """Add one element's samples and bytes (the backend's ``measure``)."""
        s, b = self.built.measure(el)
        self.samples += s
        self.batches += 1
        self.bytes += b


def tf_counter(ds: Any) -> Counter:
    """A :class:`Counter` over a ``tf.data.Dataset`` (restarted at its end)."""
    import tensorflow as tf  # loaded already: ds is a tf.data.Dataset

    restarts = [0]
    return Counter(BuiltInput(batches=tf_passes(ds, restarts), restarts=restarts,
                              measure=lambda el: samples_and_bytes(el, tf.nest.flatten)))


def host_busy_seconds() -> float:
    """CPU-seconds the whole machine has been busy (all processes, all CPUs) so far."""
    t = psutil.cpu_times()
    return float(sum(t) - t.idle - getattr(t, "iowait", 0.0))


def _cpu_with_children(proc: psutil.Process) -> float:
    """CPU-seconds of this process, of its children that ended and were waited for, and of
    its live children (a PyTorch DataLoader's worker processes)."""
    t = proc.cpu_times()
    total = t.user + t.system + getattr(t, "children_user", 0.0) + getattr(t, "children_system", 0.0)
    for k in proc.children(recursive=True):
        try:
            kt = k.cpu_times()
            total += kt.user + kt.system
        except psutil.Error:
            pass
    return float(total)


def _io(proc: psutil.Process) -> tuple[int, int]:
    try:
        io = proc.io_counters()
        return int(getattr(io, "read_chars", 0)), int(getattr(io, "read_bytes", 0))
    except Exception:  # noqa: BLE001 - not every platform has it
        return 0, 0


def run_probe(entry: ProbedPipeline, cmd: dict[str, Any], index: int, allowed: list[int],
              workdir: Path) -> dict[str, Any]:
    """Run one probe command as process ``index``; returns the result dict (see module doc).

    Steps: pin this process to its CPUs, build what it iterates (:func:`_counter_for`), warm
    up, meet the other processes at the ``ready`` barrier, measure the window
    (:func:`_measure`), then keep the load on until every process has measured (the ``done``
    barrier).

    Result keys: ``index``, ``cpus`` (list), ``samples``, ``batches``, ``window_s``,
    ``samples_per_sec``, ``cpu_seconds``, ``read_chars``, ``read_bytes`` (bytes in the
    window), ``element_bytes``, ``first_element_s``, ``build_s``, ``synchronized`` (bool),
    ``restarts``; or ``error`` (one line) and ``traceback`` on failure.
    """
    kind = cmd.get("kind", "pipeline")
    T, C = int(cmd["tasks"]), int(cmd["cpus_per_task"])
    barrier_timeout = float(cmd.get("barrier_timeout_s", 30.0))
    marker = Marker(workdir, int(cmd["seq"]), T)
    if cmd.get("chief_apart") and index == 0:
        avoid = set(cmd.get("chief_avoid_cpus") or [])
        cpus = [c for c in allowed if c not in avoid] or list(allowed)
    else:
        cpus = probe_cpus(kind, index, T, C, allowed)
    pin_all_threads(cpus)
    res: dict[str, Any] = {"index": index, "cpus": cpus, "kind": kind, "tasks": T,
                           "cpus_per_task": C, "pid": os.getpid()}
    t_build = time.monotonic()
    counter, servers, min_batches = _counter_for(entry, cmd, index, workdir)
    pin_all_threads(cpus)
    res["build_s"] = time.monotonic() - t_build
    res["first_element_s"] = _warm_up(counter, float(cmd["warmup_s"]), min_batches)
    marker.set("ready", index)
    synchronized = _barrier(marker, "ready", counter, barrier_timeout)
    res.update(_measure(counter, float(cmd["measure_s"])))
    marker.set("done", index)
    all_done = _barrier(marker, "done", counter, barrier_timeout)  # the load stays on meanwhile
    res["synchronized"] = synchronized and all_done
    local = getattr(counter, "local_cpu_seconds_per_sample", None)  # a served probe's input worker
    if local is not None:
        res["local_cpu_seconds_per_sample"] = local
    built = getattr(counter, "built", None)
    if built is not None and built.info:
        res["input"] = dict(built.info)  # PyTorch: the DataLoader's workers, prefetch, torch threads
    _drop(counter, servers)
    return res


def _counter_for(entry: ProbedPipeline, cmd: dict[str, Any], index: int,
                 workdir: Path) -> tuple[Stepper, Any, int]:
    """What process ``index`` iterates for the probe ``cmd``: the pipeline (``pipeline``),
    the chief's ingest path on cached elements in one process (``ingest`` with one task), or
    its role in a multi-process ``ingest`` / ``served`` probe (:func:`_ingest_role`; a PyTorch
    ``served`` probe: :func:`analyzer.probe_plane.plane_role`, over csrun's data plane). Returns
    the counter, the objects to keep referenced, and the batches the warm-up must at least
    take (an ingest probe fills its caches first)."""
    kind = cmd.get("kind", "pipeline")
    T, C = int(cmd["tasks"]), int(cmd["cpus_per_task"])
    cache = int(cmd.get("cache_elements", 16))
    if kind == "ingest" and T == 1:
        counter, servers = _ingest_counter(entry, C, cache, workdir)
        return counter, servers, 2 * 2 * cache  # every cached element served twice: the cache is full
    if kind == "served" and entry.framework == "pytorch":  # the chief's ingest over csrun's data plane
        from .probe_plane import plane_role

        try:
            plane = plane_role(entry, cmd, index, workdir)
        except InputBuildError as e:
            raise InvalidPoint(str(e)) from None
        return plane, plane, 2
    if kind in ("ingest", "served"):
        warmup, measure = float(cmd["warmup_s"]), float(cmd["measure_s"])
        counter, servers = _ingest_role(entry, C, cache, workdir, int(cmd["seq"]), index, T,
                                        float(cmd.get("barrier_timeout_s", 30.0)), cached=kind == "ingest",
                                        local_s=(min(warmup, 2.0), measure / 2.0),
                                        apart=bool(cmd.get("chief_apart")))
        return counter, servers, 2 * (T - 1) * cache if index == 0 and kind == "ingest" else 2
    try:
        built = entry.backend.build(0, 1, C, dataloader_workers=cmd.get("dataloader_workers"),
                                    prefetch_factor=cmd.get("prefetch_factor"))
    except InputBuildError as e:  # PyTorch: a DataLoader count it cannot be built at (the planner skips it)
        if entry.framework == "pytorch":
            raise InvalidPoint(str(e)) from None
        raise ContractViolation(str(e)) from None  # TensorFlow: the contract's messages, as before
    return Counter(built), None, 2


def _warm_up(counter: Stepper, warmup_s: float, min_batches: int) -> float:
    """Take the first element, then iterate for ``warmup_s`` seconds and at least
    ``min_batches`` elements. Returns the seconds the first element took."""
    t0 = time.monotonic()
    counter.step()
    first = time.monotonic() - t0
    t_end = time.monotonic() + warmup_s
    while time.monotonic() < t_end or counter.batches < min_batches:
        counter.step()
    return first


def _barrier(marker: Marker, phase: str, counter: Stepper, timeout_s: float) -> bool:
    """Keep iterating (the load stays on) until every process of the probe has reached
    ``phase`` (True) or ``timeout_s`` seconds passed (False)."""
    deadline = time.monotonic() + timeout_s
    next_poll = 0.0
    while True:
        now = time.monotonic()
        if now >= next_poll:
            if marker.all(phase):
                return True
            if now > deadline:
                return False
            next_poll = now + POLL_S
        counter.step()


def _measure(counter: Stepper, measure_s: float) -> dict[str, Any]:
    """Iterate for ``measure_s`` seconds; the window's samples, batches, samples/s, this
    process's CPU-seconds and bytes read (psutil's I/O counters), the element bytes and the
    whole machine's busy cores meanwhile (``host_busy_cores``)."""
    proc = psutil.Process()
    s0, b0, e0 = counter.samples, counter.batches, counter.bytes
    cpu0 = _cpu_with_children(proc)
    io0 = _io(proc)
    host0 = host_busy_seconds()
    w0 = time.monotonic()
    w_end = w0 + measure_s
    while time.monotonic() < w_end:
        counter.step()
    w1 = time.monotonic()
    cpu1 = _cpu_with_children(proc)
    io1 = _io(proc)
    host1 = host_busy_seconds()
    samples = counter.samples - s0
    window = w1 - w0
    return {
        "samples": samples, "batches": counter.batches - b0, "window_s": window,
        "samples_per_sec": samples / window if window > 0 else 0.0,
        "cpu_seconds": cpu1 - cpu0,
        "read_chars": io1[0] - io0[0], "read_bytes": io1[1] - io0[1],
        "element_bytes": counter.bytes - e0, "restarts": counter.restarts,
        "host_busy_cores": (host1 - host0) / window if window > 0 else None,
    }


#: tf.data service servers and sources of ingest probes: never destroyed before ``os._exit``
#: (their destructors can block forever, holding the GIL).
_KEEP: list[Any] = []


def _drop(counter: Any, servers: Any) -> None:
    """Release a probe's iterator in a daemon thread (tearing a tf.data pipeline down can
    block); service servers and sources are kept until the process leaves; a PyTorch
    DataLoader is closed here (its worker processes joined: none left to load the next probe)."""
    if servers is not None and servers is counter and hasattr(servers, "close"):
        servers.close()  # a PyTorch served probe: the receiver, or the sender and its DataLoader
        return
    if servers is not None:
        _KEEP.append((counter, servers))
        return
    built = getattr(counter, "built", None)
    if built is not None and built.info.get("framework") == "pytorch":
        built.close()  # its DataLoader worker processes end before the next probe starts
        return
    holder = [counter]

    def drop() -> None:
        holder.clear()

    threading.Thread(target=drop, daemon=True).start()


def _serve_bundled(address: str, ds: Any, counter: list[int]) -> int:
    """Register ``ds`` with the dispatcher at ``address`` as the runtime's input workers do:
    bundled by :func:`csrun_runtime.tensorflow.service.plan_bundle` (``input_bundle: auto``), each service
    element counted in ``counter[0]``, no compression. Returns the batches per element."""
    plan = service.plan_bundle(ds.element_spec, "auto")
    service.register_stream(address, ds, plan, counter)
    return plan.bundle


class SourceCounter(Counter):
    """A :class:`Counter` over the runtime's chief-side batch source
    (:class:`csrun_runtime.tensorflow.service.ServiceSource`: one reader thread per worker stream and
    a merge queue, the workers' elements bundled as the runtime's: exactly the chief's ingest
    path)."""

    def __init__(self, source: service.ServiceSource, timeout_s: float = 60.0):
        import tensorflow as tf  # loaded already: the source reads tf.data service streams

        self.source, self.timeout_s = source, timeout_s
        self.built = BuiltInput(batches=iter(()), measure=lambda el: samples_and_bytes(el, tf.nest.flatten))
        self.samples = self.batches = self.bytes = 0

    def step(self) -> None:
        """Take the rest of the element being handed out (a chunk, as the training loop takes
        it: no Python per batch of a bundle) and count its batches."""
        chunk = self.source.get_chunk(1 << 30, self.timeout_s)
        a = chunk.offset
        s, b = self.built.measure(service._map(lambda t: t[a], chunk.batches))  # one batch of it
        self.samples += s * chunk.steps
        self.batches += chunk.steps
        self.bytes += b * chunk.steps


class IdleCounter:
    """The :class:`Counter` interface for a process that only serves (a tf.data service
    worker of an ingest probe): ``step`` waits 10 ms; nothing is consumed here."""

    def __init__(self, local_cpu_seconds_per_sample: float | None = None) -> None:
        self.samples = self.bytes = self.restarts = 0
        self.batches = 0
        self.local_cpu_seconds_per_sample = local_cpu_seconds_per_sample

    def step(self) -> None:
        time.sleep(0.01)
        self.batches += 1


def _ingest_role(entry: ProbedPipeline, cpus: int, cache_elements: int, workdir: Path, seq: int, index: int,
                 tasks: int, timeout_s: float, cached: bool = True,
                 local_s: tuple[float, float] = (0.0, 0.0), apart: bool = False):
    """One process of a multi-process ingest or served probe: the runtime's chief/worker
    split with a cached pipeline (``cached``) or the real one. Process 0 is the chief: one dispatcher per worker
    (:func:`csrun_runtime.tensorflow.service.start_dispatchers`), the addresses in
    ``<workdir>/ingest_<seq>.json``, and :class:`csrun_runtime.tensorflow.service.ServiceSource` reading
    the streams. Processes 1..T-1 are input workers: a ``WorkerServer`` attached to their
    dispatcher serving the first ``cache_elements`` elements of the pipeline from a cache,
    wrapped and registered as :func:`csrun_runtime.tensorflow.worker.run_worker` does (with
    ``cached=False``: the whole pipeline, repeated at its end; before it registers, the
    worker iterates the same pipeline in-process for ``local_s = (warm-up, window)``
    seconds while the chief waits, and keeps its CPU-seconds per sample as
    ``local_cpu_seconds_per_sample``: the pipeline alone on the same CPUs just before it is
    served, so the cost of serving is a difference of two back-to-back measurements).
    Every process
    measures its own CPU, so the probe's CPU-seconds per sample are the service hop's on both
    ends, each in its own process. Returns ``(counter, objects to keep alive)``.
    Raises ``TimeoutError`` when the other side does not appear within ``timeout_s``.
    ``apart``: the chief runs on another host (addresses by host name)."""
    import tensorflow as tf  # loaded already by the pipeline's module

    svc = tf.data.experimental.service
    host = socket.gethostname() if apart else "localhost"
    addr_file = workdir / f"ingest_{seq}.json"
    deadline = time.monotonic() + timeout_s
    if index == 0:
        servers, ports = service.start_dispatchers(tasks - 1)
        addresses = [f"{host}:{p}" for p in ports]
        write_json(addr_file, {"addresses": addresses})
        regs = [workdir / f"ingest_{seq}_w{i}.json" for i in range(1, tasks)]
        while not all(r.exists() for r in regs):
            if time.monotonic() > deadline:
                raise TimeoutError("the ingest probe's workers did not register")
            time.sleep(POLL_S)
        rdv = rendezvous.Rendezvous(workdir / "ingest", f"probe{seq}")
        rdv.reset()
        bundles = [int(json.loads(r.read_text()).get("bundle") or 1) for r in regs]
        source = service.ServiceSource(rdv, addresses, {i: {"node": socket.gethostname(), "bundle": bundles[i]}
                                                        for i in range(tasks - 1)})
        return SourceCounter(source), (servers, source)
    while not addr_file.exists():
        if time.monotonic() > deadline:
            raise TimeoutError("the ingest probe's chief did not publish its dispatchers")
        time.sleep(POLL_S)
    address = json.loads(addr_file.read_text())["addresses"][index - 1]
    ds = build_dataset(entry, cpus)
    ds = ds.take(max(1, cache_elements)).cache().repeat() if cached else ds.repeat()
    local = None if cached or local_s[1] <= 0 else _local_cost(ds, *local_s)
    counter = [0]
    worker = svc.WorkerServer(svc.WorkerConfig(dispatcher_address=address, worker_address=f"{host}:%port%",
                                               port=0, protocol="grpc", heartbeat_interval_ms=1000))
    bundle = _serve_bundled(address, ds, counter)
    write_json(workdir / f"ingest_{seq}_w{index}.json", {"pid": os.getpid(), "bundle": bundle})
    return IdleCounter(local[0] if local else None), (worker, counter, local)


def _local_cost(ds: Any, warmup_s: float, measure_s: float) -> tuple[float, Any]:
    """Iterate ``ds`` in this process for ``warmup_s`` then ``measure_s`` seconds; returns
    ``(CPU-seconds per sample, the counter)``. The counter must stay referenced (its
    iterator idles once its prefetch buffers are full; deleting it can block)."""
    proc = psutil.Process()
    c = tf_counter(ds)
    t_end = time.monotonic() + warmup_s
    c.step()
    while time.monotonic() < t_end:
        c.step()
    ct0, s0 = proc.cpu_times(), c.samples
    t_end = time.monotonic() + measure_s
    while time.monotonic() < t_end or c.samples == s0:
        c.step()
    ct1 = proc.cpu_times()
    cpu = (ct1.user - ct0.user) + (ct1.system - ct0.system)
    return cpu / max(c.samples - s0, 1), c


def _ingest_counter(entry: ProbedPipeline, cpus: int, cache_elements: int, workdir: Path, streams: int = 2):
    """The chief's ingest path on cached elements: ``streams`` tf.data service dispatchers
    (:func:`csrun_runtime.tensorflow.service.start_dispatchers`), each with a worker in this process
    serving the first ``cache_elements`` elements of the pipeline from a cache, wrapped and
    registered as the runtime's input workers do (``count_elements``, ``compression=None``),
    and read by :class:`csrun_runtime.tensorflow.service.ServiceSource` (a reader thread per stream
    and a merge queue). Its CPU-seconds per sample are the cost of the service hop on both
    ends. Returns the counter and what must stay referenced."""
    import tensorflow as tf  # loaded already by the pipeline's module

    svc = tf.data.experimental.service
    servers, ports = service.start_dispatchers(streams)
    addresses = [f"localhost:{p}" for p in ports]
    workers, counters, bundles = [], [], []
    for address in addresses:
        ds = build_dataset(entry, cpus).take(max(1, cache_elements)).cache().repeat()
        counter = [0]
        counters.append(counter)
        workers.append(svc.WorkerServer(svc.WorkerConfig(
            dispatcher_address=address, worker_address="localhost:%port%", port=0, protocol="grpc",
            heartbeat_interval_ms=1000)))
        bundles.append(_serve_bundled(address, ds, counter))
    rdv = rendezvous.Rendezvous(workdir / "ingest", f"probe{os.getpid()}_{time.time_ns()}")
    rdv.reset()
    source = service.ServiceSource(rdv, addresses, {i: {"node": socket.gethostname(), "pid": os.getpid(),
                                                        "bundle": bundles[i]} for i in range(streams)})
    return SourceCounter(source), (servers, workers, source, counters)


def _error(exc: BaseException) -> dict:
    msg = str(exc).strip().splitlines()
    line = msg[0] if msg else ""
    return {"error": f"{type(exc).__name__}: {line}"[:2000], "traceback": traceback.format_exc()[-8000:]}


def _index(spec: dict) -> int:
    for v in (spec.get("index"), os.environ.get(PROBE_INDEX), os.environ.get("SLURM_PROCID")):
        if v is not None and str(v) != "":
            return int(v)
    return 0


def _alive(ppid: int) -> bool:
    return ppid <= 1 or os.getppid() == ppid


def serve(spec: dict, index: int, entry: ProbedPipeline, allowed: list[int]) -> None:
    """Run probe commands from ``<workdir>/cmd/<seq>.json`` until ``exit`` or the deadline."""
    workdir = Path(spec["workdir"])
    cmd_dir = workdir / "cmd"
    res_dir = workdir / "res"
    res_dir.mkdir(parents=True, exist_ok=True)
    deadline = float(spec.get("deadline", time.time() + 3600))
    ppid = int(os.environ.get(PROBE_PARENT) or 0)
    seq = 0
    while time.time() < deadline and _alive(ppid):
        path = cmd_dir / f"{seq}.json"
        if not path.exists():
            time.sleep(POLL_S)
            continue
        cmd = json.loads(path.read_text())
        seq += 1
        if cmd.get("kind") == "exit":
            return
        T = int(cmd["tasks"])
        role = index + 1 if cmd.get("chief_apart") else index  # the chief runs elsewhere
        if role >= T:
            continue
        try:
            res = run_probe(entry, cmd, role, allowed, workdir)
        except BaseException as exc:  # noqa: BLE001 - reported to the driver
            res = {"index": role, **_error(exc), "invalid": isinstance(exc, InvalidPoint)}
        res["seq"] = cmd["seq"]
        write_json(res_dir / f"{cmd['seq']}_{role}.json", res)
        pin_all_threads(allowed)


def main(argv: list[str] | None = None) -> None:
    """Entry point: ``python -m analyzer.probe_worker SPEC.json`` (see the module docstring;
    the node agent that starts these processes is :mod:`analyzer.probe_agent`)."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m analyzer.probe_worker SPEC.json", file=sys.stderr)
        os._exit(exits.USAGE)
    spec = json.loads(Path(argv[0]).read_text())
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    index = _index(spec)
    workdir = Path(spec["workdir"])
    workdir.mkdir(parents=True, exist_ok=True)
    allowed = sorted(os.sched_getaffinity(0))
    hello: dict[str, Any] = {
        "index": index, "pid": os.getpid(), "host": socket.gethostname(),
        "node": os.environ.get("SLURMD_NODENAME", socket.gethostname()),
        "cpu_count": os.cpu_count(), "allowed_cpus": allowed,
        "job_id": os.environ.get("SLURM_JOB_ID"),
    }
    rc = 0
    t0 = time.monotonic()
    try:
        if spec.get("cwd"):
            os.chdir(spec["cwd"])
        entry = ProbedPipeline(spec["run_py"], spec.get("argv", []))
        # the framework loaded here so that the hello's load time counts it (never the other one)
        __import__("torch" if entry.framework == "pytorch" else "tensorflow")
        hello["framework"] = entry.framework
        hello["load_s"] = time.monotonic() - t0
        hello_path = Path(spec.get("hello") or workdir / f"hello_{index}.json")
        write_json(hello_path, hello)
        if spec.get("mode", "serve") == "once":
            cmd = dict(spec["probe"])
            cmd.setdefault("seq", 0)
            try:
                res = run_probe(entry, cmd, index, allowed, workdir)
            except BaseException as exc:  # noqa: BLE001
                res = {"index": index, **_error(exc), "invalid": isinstance(exc, InvalidPoint)}
                rc = 1
            out = Path(spec.get("out") or workdir / "res" / f"{cmd['seq']}_{index}.json")
            out.parent.mkdir(parents=True, exist_ok=True)
            write_json(out, res)
        else:
            serve(spec, index, entry, allowed)
    except BaseException as exc:  # noqa: BLE001 - the load failed: tell the driver
        hello.update(_error(exc))
        hello["load_s"] = time.monotonic() - t0
        write_json(Path(spec.get("hello") or workdir / f"hello_{index}.json"), hello)
        rc = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)


if __name__ == "__main__":
    main()
