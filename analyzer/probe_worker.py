"""The probe worker process: ``python -m analyzer.probe_worker SPEC.json``.

One process of a probe. It loads the user's run.py in capture mode
(:func:`csrun_runtime.capture.load_entry`), then either

* ``"mode": "once"`` — runs the one probe in ``spec["probe"]``, writes its result JSON and
  leaves, or
* ``"mode": "serve"`` — stays up and runs every probe command the driver
  (:mod:`analyzer.probe_session`) drops into ``<workdir>/cmd/`` (so TensorFlow's ~4 s import and
  the run.py load are paid once per process, not once per probe), until an ``exit``
  command, a deadline or the loss of its parent.

A probe command ``{"seq", "probe_id", "kind": "pipeline"|"ingest"|"served", "tasks": T,
"cpus_per_task": C, "warmup_s", "measure_s", "barrier_timeout_s", "cache_elements"}`` is run
by the processes with index ``< T`` (index: ``spec["index"]``, else ``$CSRUN_PROBE_INDEX``,
else ``$SLURM_PROCID``); each pins all its threads to its own ``C`` CPUs
(``os.sched_setaffinity`` on every thread; CPUs ``[i·C, (i+1)·C)`` of the allowed set,
wrapping when the node is oversubscribed), builds what it iterates, iterates it for the
warm-up, meets the other processes at a file barrier, measures ``measure_s`` seconds
(samples/s, CPU-seconds, bytes read from psutil's I/O counters), keeps iterating until every
process has measured (so each window sees the full load), and writes
``<workdir>/res/<seq>_<index>.json``.

This module is the framework-neutral harness; what differs per framework is the backend's
``probe`` module (:class:`csrun_runtime.probing.ProbeBackend`, picked with
``csrun_runtime.registry.entry(framework, "probe")``: :mod:`csrun_runtime.tensorflow.probe`,
:mod:`csrun_runtime.pytorch.probe`):

* ``kind == "pipeline"``: worker 0 of 1's input built through the input-backend interface
  (:mod:`csrun_runtime.input_backend`, :func:`backend_for`): TensorFlow's ``input_fn(params)``
  with ``threading.private_threadpool_size = C`` and ``max_intra_op_parallelism = 1``, or
  PyTorch's DataLoader with the command's ``"dataloader_workers"`` as
  ``train_input.num_workers`` and ``torch.set_num_threads(C)`` (a DataLoader that cannot be
  built there: ``"invalid": true`` in the result);
* ``kind == "ingest"`` (TensorFlow's only) measures the chief's ingest path on cached
  elements: process 0 hosts the tf.data service dispatchers and drains the streams as the
  runtime's chief does, processes 1..T-1 serve the first ``cache_elements`` elements of the
  pipeline from a cache (with ``T == 1`` the worker servers live in the chief's process);
* ``kind == "served"`` is the same split with the real pipeline: processes 1..T-1 serve the
  input exactly as the runtime's input workers do (TensorFlow: through the tf.data service;
  PyTorch: the DataLoader streamed over csrun's data plane), process 0 drains it as the chief.
  Each process measures its own CPU, so the input workers' CPU-seconds per sample *with*
  serving and the chief's per sample are known apart.

With ``"chief_apart": true`` in the command the chief is not one of the node's processes:
the driver runs it elsewhere (``"mode": "once"``, index 0; on a node with a single CPU the
chief would otherwise share the worker's CPU and inflate both costs), node process ``i``
plays role ``i + 1``, and the service addresses carry the host name instead of
``localhost``.

Results and the start-up record ``<workdir>/hello_<index>.json`` (pid, host, Slurm node,
CPUs, load time, or the load error) are written atomically (temp file + rename). The
process leaves with ``os._exit`` (a pipeline with ``tf.py_function`` can hang interpreter
exit); the driver still enforces a timeout.

No framework is imported here: the backend imports its own (by :func:`main` once run.py is
loaded, ``ProbeBackend.prepare``, so that the load time counts it), and a PyTorch run.py's
probe never imports TensorFlow.
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
from typing import Any

import psutil

from csrun_common import exits
from csrun_common.atomic import write_json
from csrun_common.env import PROBE_INDEX, PROBE_PARENT
from csrun_runtime import registry
from csrun_runtime.capture import load_entry
from csrun_runtime.input_backend import InputBackend, InputBuildError, samples_in
from csrun_runtime.probing import (
    DEFAULT_FRAMEWORK,
    ContractViolation,
    Counter,
    InvalidPoint,
    ProbeBackend,
    Stepper,
    facts,
    host_busy_seconds,
)

__all__ = ["pin_all_threads", "cpus_for", "probe_cpus", "samples_in", "ProbedPipeline", "backend_for",
           "Counter", "host_busy_seconds", "run_probe", "serve", "main"]

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


def backend_for(entry: Any) -> InputBackend:
    """The input backend of a captured run.py, from its framework's ``probe`` module. Raises
    ``registry.UnknownFramework`` (a ``ValueError``) or :class:`probing.ContractViolation`."""
    backend: InputBackend = registry.entry(getattr(entry, "framework", DEFAULT_FRAMEWORK), "probe").backend(entry)
    return backend


class ProbedPipeline:
    """The captured run.py (:func:`csrun_runtime.capture.load_entry`): ``input_fn`` (PyTorch:
    ``train_data_fn``), the params input worker 0 of 1 receives (the single-process view:
    every probe process reads all the data, as an unsharded worker would), ``framework``, its
    backend's ``probe`` module (``probe``: :class:`csrun_runtime.probing.ProbeBackend`) and its
    input backend (``backend``). Raises :class:`csrun_runtime.probing.ContractViolation` when
    the input function breaks the contract."""

    def __init__(self, run_py: str, argv: list[str]):
        self.captured = load_entry(run_py, list(argv))
        self.framework = self.captured.framework
        self.input_fn = self.captured.input_fn
        self.params = self.captured.worker_params(0, 1)
        self.probe: ProbeBackend = registry.entry(self.framework, "probe")
        self.backend = self.probe.backend(self.captured)


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
    """What process ``index`` iterates for the probe ``cmd``: the pipeline built through the
    input backend (``pipeline``), or its role in an ``ingest`` / ``served`` probe, which the
    backend's ``probe`` module plays (:meth:`csrun_runtime.probing.ProbeBackend.role`: tf.data
    service, csrun's data plane). Returns the counter, the objects to keep referenced (or to
    close), and the batches the warm-up must at least take (an ingest probe fills its caches
    first). A build error is an :class:`~csrun_runtime.probing.InvalidPoint` where the backend
    sweeps DataLoader workers (the planner skips it), else a
    :class:`~csrun_runtime.probing.ContractViolation` (the contract's messages)."""
    kind = cmd.get("kind", "pipeline")
    if kind != "pipeline":
        return entry.probe.role(entry, cmd, index, workdir)
    try:
        built = entry.backend.build(0, 1, int(cmd["cpus_per_task"]), dataloader_workers=cmd.get("dataloader_workers"),
                                    prefetch_factor=cmd.get("prefetch_factor"))
    except InputBuildError as e:
        raise (InvalidPoint if facts(entry.framework).dataloader_workers else ContractViolation)(str(e)) from None
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


#: an ingest or served probe's servers and sources: never destroyed before ``os._exit``
#: (a tf.data service server's destructor can block forever, holding the GIL).
_KEEP: list[Any] = []


def _drop(counter: Any, servers: Any) -> None:
    """Release a probe's iterator: an object the backend gave to close is closed (a data-plane
    receiver, or a sender and its DataLoader); other servers and sources are kept until the
    process leaves; a built input is closed (a DataLoader's worker processes end before the
    next probe starts) and its iterator released in a daemon thread (tearing a tf.data
    pipeline down can block)."""
    if servers is not None and servers is counter and hasattr(servers, "close"):
        servers.close()
        return
    if servers is not None:
        _KEEP.append((counter, servers))
        return
    built = getattr(counter, "built", None)
    if built is not None:
        built.close()
    holder = [counter]

    def drop() -> None:
        holder.clear()

    threading.Thread(target=drop, daemon=True).start()


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
        entry.probe.prepare()  # the framework loaded here: the hello's load time counts it
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
