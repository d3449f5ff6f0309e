"""TensorFlow's part of the analyzer's probes (:class:`csrun_runtime.probing.ProbeBackend`,
driven by :mod:`analyzer.probe_worker`): the input backend
(:class:`.input_backend.TFInputBackend`, the input_fn's signature checked first), and the
``ingest`` and ``served`` probes through the tf.data service, the runtime's chief/worker split:

* ``ingest`` with one task (:func:`ingest_counter`): the chief's ingest path on cached
  elements in one process: two dispatchers, each with a worker serving the first
  ``cache_elements`` elements of the pipeline from a cache, read by the chief's own
  :class:`.service.ServiceSource` (:class:`SourceCounter`): the CPU-seconds per sample of the
  service hop on both ends;
* ``ingest`` or ``served`` with ``T`` tasks (:func:`ingest_role`): process 0 hosts the
  dispatchers and drains the streams as the runtime's chief does, processes 1..T-1 are input
  workers serving the cached elements (``ingest``) or the real pipeline (``served``: each
  measures the pipeline alone first, ``local_cpu_seconds_per_sample``).

TensorFlow is imported inside the functions. The analyzer's login side reads this backend's
:class:`csrun_runtime.facts.ProbeFacts` from :mod:`.facts`.
"""
from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any

import psutil

from csrun_common.atomic import write_json

from .. import rendezvous
from ..input_backend import BuiltInput, InputBuildError
from ..probing import ContractViolation, Counter, IdleCounter, Stepper
from .input_backend import TFInputBackend, tf_passes, tf_samples_and_bytes

__all__ = ["prepare", "backend", "role", "file_coverage", "build_dataset", "tf_counter",
           "SourceCounter", "ingest_role", "ingest_counter", "local_cost"]

POLL_S = 0.05

def prepare() -> None:
    """Import TensorFlow (the probe process's load time counts it)."""
    import tensorflow  # noqa: F401


def backend(captured: Any) -> TFInputBackend:
    """The input backend of a captured TensorFlow run.py (``input_fn``, ``params``).
    Raises :class:`csrun_runtime.probing.ContractViolation` when ``input_fn``'s signature
    breaks the contract (:func:`.contract.check_signature`)."""
    from . import contract

    problems = contract.check_signature(captured.input_fn)
    if problems:
        raise ContractViolation("train_input: " + "; ".join(problems))
    return TFInputBackend(captured.input_fn, captured.params)


def file_coverage(captured: Any) -> dict[str, Any]:
    """Which files input workers 0 and 1 of 2 would read (:func:`.coverage.check_file_coverage`),
    as a dict."""
    from .coverage import check_file_coverage

    return check_file_coverage(captured.input_fn, captured.params).to_dict()


def role(entry: Any, cmd: dict[str, Any], index: int, workdir: Path) -> tuple[Stepper, Any, int]:
    """Process ``index``'s part in an ``ingest`` or ``served`` probe command (module docstring):
    ``(stepper, objects to keep referenced, the batches the warm-up must at least take: an
    ingest probe fills its caches first)``. ``entry``: the harness's probed pipeline
    (``backend``). Raises ``ValueError`` for another kind, ``TimeoutError`` when the other
    side does not appear."""
    kind = cmd.get("kind", "pipeline")
    T, C = int(cmd["tasks"]), int(cmd["cpus_per_task"])
    cache = int(cmd.get("cache_elements", 16))
    if kind not in ("ingest", "served"):
        raise ValueError(f"probe kind {kind!r}: TensorFlow's own kinds are ingest and served")
    if kind == "ingest" and T == 1:
        counter, servers = ingest_counter(entry, C, cache, workdir)
        return counter, servers, 2 * 2 * cache  # every cached element served twice: the cache is full
    warmup, measure = float(cmd["warmup_s"]), float(cmd["measure_s"])
    stepper, keep = ingest_role(entry, C, cache, workdir, int(cmd["seq"]), index, T,
                                float(cmd.get("barrier_timeout_s", 30.0)), cached=kind == "ingest",
                                local_s=(min(warmup, 2.0), measure / 2.0), apart=bool(cmd.get("chief_apart")))
    return stepper, keep, 2 * (T - 1) * cache if index == 0 and kind == "ingest" else 2


def build_dataset(entry: Any, cpus_per_task: int) -> Any:
    """``input_fn(params)`` (a ``tf.data.Dataset``) built as input worker 0 of 1 through ``entry.backend``
    (:meth:`.input_backend.TFInputBackend.dataset`: contract checked, held to ``cpus_per_task`` cores). Raises
    :class:`csrun_runtime.probing.ContractViolation` with the contract's messages, or what input_fn raises."""
    if not isinstance(entry.backend, TFInputBackend):
        raise ContractViolation("the chief's ingest probes measure tf.data service: TensorFlow only")
    try:
        return entry.backend.dataset(0, 1, cpus_per_task)
    except InputBuildError as e:
        raise ContractViolation(str(e)) from None


def tf_counter(ds: Any) -> Counter:
    """A :class:`csrun_runtime.probing.Counter` over a ``tf.data.Dataset`` (restarted at its end)."""
    import tensorflow as tf  # loaded already: ds is a tf.data.Dataset

    restarts = [0]
    return Counter(BuiltInput(batches=tf_passes(ds, restarts), restarts=restarts,
                              measure=lambda el: tf_samples_and_bytes(el, tf.nest.flatten)))


def _serve_bundled(address: str, ds: Any, counter: list[int]) -> int:
    """Register ``ds`` with the dispatcher at ``address`` as the runtime's input workers do:
    bundled by :func:`.service.plan_bundle` (``input_bundle: auto``), each service element
    counted in ``counter[0]``, no compression. Returns the batches per element."""
    from . import bundling, service

    plan = bundling.plan_bundle(ds.element_spec, "auto")
    service.register_stream(address, ds, plan, counter)
    return plan.bundle


class SourceCounter(Counter):
    """A :class:`csrun_runtime.probing.Counter` over the runtime's chief-side batch source
    (:class:`.service.ServiceSource`: one reader thread per worker stream and a merge queue,
    the workers' elements bundled as the runtime's: exactly the chief's ingest path)."""

    def __init__(self, source: Any, timeout_s: float = 60.0):
        import tensorflow as tf  # loaded already: the source reads tf.data service streams

        self.source, self.timeout_s = source, timeout_s
        self._map = tf.nest.map_structure
        super().__init__(BuiltInput(batches=iter(()), measure=lambda el: tf_samples_and_bytes(el, tf.nest.flatten)))

    def step(self) -> None:
        """Take the rest of the element being handed out (a chunk, as the training loop takes
        it: no Python per batch of a bundle) and count its batches."""
        chunk = self.source.get_chunk(1 << 30, self.timeout_s)
        a = chunk.offset
        one = self._map(lambda t: None if t is None else t[a], chunk.batches)  # one batch of it
        s, b = self.built.measure(one)
        self.samples += s * chunk.steps
        self.batches += chunk.steps
        self.bytes += b * chunk.steps


def _worker_server(address: str, host: str) -> Any:
    """A tf.data service ``WorkerServer`` attached to the dispatcher at ``address``."""
    import tensorflow as tf  # loaded already by the pipeline's module

    svc = tf.data.experimental.service
    return svc.WorkerServer(svc.WorkerConfig(dispatcher_address=address, worker_address=f"{host}:%port%",
                                             port=0, protocol="grpc", heartbeat_interval_ms=1000))


def _wait_for(paths: list[Path], deadline: float, what: str) -> None:
    while not all(p.exists() for p in paths):
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(POLL_S)


def ingest_role(entry: Any, cpus: int, cache_elements: int, workdir: Path, seq: int, index: int,
                tasks: int, timeout_s: float, cached: bool = True,
                local_s: tuple[float, float] = (0.0, 0.0), apart: bool = False) -> tuple[Stepper, Any]:
    """One process of a multi-process ingest or served probe: the runtime's chief/worker
    split with a cached pipeline (``cached``) or the real one. Process 0 is the chief: one
    dispatcher per worker (:func:`.service.start_dispatchers`), the addresses in
    ``<workdir>/ingest_<seq>.json``, and :class:`.service.ServiceSource` reading the streams.
    Processes 1..T-1 are input workers: a ``WorkerServer`` attached to their dispatcher serving
    the first ``cache_elements`` elements of the pipeline from a cache, wrapped and registered
    as :func:`.worker.run_worker` does (with ``cached=False``: the whole pipeline, repeated at
    its end; before it registers, the worker iterates the same pipeline in-process for
    ``local_s = (warm-up, window)`` seconds while the chief waits, and keeps its CPU-seconds
    per sample as ``local_cpu_seconds_per_sample``: the pipeline alone on the same CPUs just
    before it is served, so the cost of serving is a difference of two back-to-back
    measurements). Every process measures its own CPU. Returns ``(stepper, objects to keep
    alive)``. Raises ``TimeoutError`` when the other side does not appear within ``timeout_s``.
    ``apart``: the chief runs on another host (addresses by host name)."""
    from . import service

    host = socket.gethostname() if apart else "localhost"
    addr_file = workdir / f"ingest_{seq}.json"
    deadline = time.monotonic() + timeout_s
    if index == 0:
        servers, ports = service.start_dispatchers(tasks - 1)
        addresses = [f"{host}:{p}" for p in ports]
        write_json(addr_file, {"addresses": addresses})
        regs = [workdir / f"ingest_{seq}_w{i}.json" for i in range(1, tasks)]
        _wait_for(regs, deadline, "the ingest probe's workers did not register")
        rdv = rendezvous.Rendezvous(workdir / "ingest", f"probe{seq}")
        rdv.reset()
        bundles = [int(json.loads(r.read_text()).get("bundle") or 1) for r in regs]
        source = service.ServiceSource(rdv, addresses, {i: {"node": socket.gethostname(), "bundle": bundles[i]}
                                                        for i in range(tasks - 1)})
        return SourceCounter(source), (servers, source)
    _wait_for([addr_file], deadline, "the ingest probe's chief did not publish its dispatchers")
    address = json.loads(addr_file.read_text())["addresses"][index - 1]
    ds = build_dataset(entry, cpus)
    ds = ds.take(max(1, cache_elements)).cache().repeat() if cached else ds.repeat()
    local = None if cached or local_s[1] <= 0 else local_cost(ds, *local_s)
    counter = [0]
    worker = _worker_server(address, host)
    bundle = _serve_bundled(address, ds, counter)
    write_json(workdir / f"ingest_{seq}_w{index}.json", {"pid": os.getpid(), "bundle": bundle})
    return IdleCounter(local[0] if local else None), (worker, counter, local)


def local_cost(ds: Any, warmup_s: float, measure_s: float) -> tuple[float, Any]:
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


def ingest_counter(entry: Any, cpus: int, cache_elements: int, workdir: Path,
                   streams: int = 2) -> tuple[SourceCounter, Any]:
    """The chief's ingest path on cached elements: ``streams`` tf.data service dispatchers
    (:func:`.service.start_dispatchers`), each with a worker in this process serving the first
    ``cache_elements`` elements of the pipeline from a cache, wrapped and registered as the
    runtime's input workers do (``count_elements``, ``compression=None``), and read by
    :class:`.service.ServiceSource` (a reader thread per stream and a merge queue). Its
    CPU-seconds per sample are the cost of the service hop on both ends. Returns the counter
    and what must stay referenced."""
    from . import service

    servers, ports = service.start_dispatchers(streams)
    addresses = [f"localhost:{p}" for p in ports]
    workers, counters, bundles = [], [], []
    for address in addresses:
        ds = build_dataset(entry, cpus).take(max(1, cache_elements)).cache().repeat()
        counter = [0]
        counters.append(counter)
        workers.append(_worker_server(address, "localhost"))
        bundles.append(_serve_bundled(address, ds, counter))
    rdv = rendezvous.Rendezvous(workdir / "ingest", f"probe{os.getpid()}_{time.time_ns()}")
    rdv.reset()
    source = service.ServiceSource(rdv, addresses, {i: {"node": socket.gethostname(), "pid": os.getpid(),
                                                        "bundle": bundles[i]} for i in range(streams)})
    return SourceCounter(source), (servers, workers, source, counters)
