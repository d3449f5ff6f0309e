"""``python -m analyzer.verify_task [--seconds S] [--warmup W] --out FILE run.py ARGS...``.

The task that ``cs_input_analyzer verify`` launches with ``csrun_wse`` on every task of the
recommended layout. Per role (:func:`csrun_common.roles.resolve_role`, docs/CONTRACT.md):

* an **input worker** runs exactly what a training job's worker runs:
  :func:`csrun_runtime.tensorflow.worker.run_worker` (its own ``input_fn(params_i)`` behind a
  tf.data service worker) until the chief is done;
* the **chief** sets up what the runtime's chief sets up for training — the rendezvous, one
  dispatcher per input worker, the wait for their registrations
  (:class:`csrun_runtime.tensorflow.chief.Chief`) and the merged stream
  (:class:`csrun_runtime.tensorflow.service.ServiceSource`), or the in-process pipeline
  (:class:`csrun_runtime.tensorflow.service.LocalSource`, its pipeline held to the task's
  ``CSRUN_CPUS_PER_TASK`` threads as an input worker's is) when there is no input worker; with
  ``CSRUN_CHIEF_INPUT_CPUS`` (csrun_wse's chief input CPUs) it splits its CPUs and starts
  input worker 0 in its own task as the runtime's chief does (:mod:`csrun_runtime.chief_input`) —
  but instead of training it only *drains* the stream: ``--warmup`` seconds after the first batch, then a
  measured window of ``--seconds``; it writes the delivered samples/s to ``--out`` (JSON),
  marks the job done (the workers leave) and exits with ``os._exit``.

Result JSON: ``{"status": "ok"|"failed", "samples_per_sec", "window_s", "samples",
"batches", "batch_size", "batches_per_worker", "num_workers", "startup_s" (process start to
the first batch), "chief_cpu_cores" (CPU-seconds per second of the chief process),
"job_cpu_cores_on_host" (the chief's and the input workers' on its host, the chief's own input
worker and its children included), "chief_input" (with ``CSRUN_CHIEF_INPUT_CPUS``: its CPU split,
:meth:`csrun_runtime.chief_input.ChiefInputWorker.describe`; its stream is
``batches_per_worker["0"]``), "error"}``.

ARGS are run.py's arguments; ``--mode train`` must be among them (verify adds it) so that the
workers stream.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from csrun_common.atomic import write_json
from csrun_common.roles import Role, RoleError
from csrun_runtime.capture import CapturedRun, load_entry
from csrun_runtime.params import ParamsError, Resolved, drop_options, resolve_params
from csrun_runtime.rendezvous import Heartbeat, Rendezvous
from csrun_runtime.task import begin, process_start_time

# runner: imported as a launched task's run.py imports it (TensorFlow's start-up lines quieted,
# the stop signals caught before it loads)
from csrun_runtime.tensorflow import runner, service  # noqa: F401
from csrun_runtime.tensorflow.chief import Chief
from csrun_runtime.tensorflow.worker import run_worker

from .probe_worker import host_busy_seconds, samples_in

#: Objects that must never be destroyed before ``os._exit``: tearing down tf.data service
#: servers and iterators can block (forever, seen here) in their destructors.
_KEEP: list[Any] = []


def _keep_worker_servers() -> None:
    """Keep every tf.data service ``WorkerServer`` this process creates referenced until
    ``os._exit``. Destroying one stops it, and stopping it destroys its tasks' iterators
    while holding the GIL: a pipeline with a ``tf.py_function`` then deadlocks (its calls
    wait for the GIL) — seen here with a worker whose ``run_worker`` returned."""
    # TensorFlow is imported when a task runs, not when the unit tests import this module.
    import tensorflow as tf

    svc = tf.data.experimental.service
    base = svc.WorkerServer
    if getattr(base, "_csrun_kept", False):
        return

    class KeptWorkerServer(base):  # type: ignore[misc, valid-type]
        _csrun_kept = True

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            _KEEP.append(self)

    svc.WorkerServer = KeptWorkerServer


def _samples(batch: Any) -> int:
    import tensorflow as tf  # loaded already: the task's pipeline is running

    return samples_in(tf.nest.flatten(batch))


def _cpu(procs: list[psutil.Process]) -> float:
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system + getattr(t, "children_user", 0.0) + getattr(t, "children_system", 0.0)
        except Exception:  # noqa: BLE001 - a process that left
            pass
    return total


def drain(source: Any, warmup_s: float, seconds: float,
          first_timeout: float, timeout: float, t_proc: float,
          local_pids: list[int] | None = None, samples_of: Callable[[Any], int] = _samples) -> dict[str, Any]:
    """Drain ``source`` (``get(timeout) -> (worker, (features, labels))``, e.g.
    :class:`csrun_runtime.tensorflow.service.ServiceSource`): the first batch,
    ``warmup_s`` seconds, then a ``seconds`` window. Returns the measured figures (see the
    module docstring; rates in samples/s). ``local_pids``: input-worker processes on this
    host; their CPU use is reported (``job_cpu_cores``) with the rest of the host's
    (``other_cores_busy``: other jobs on a shared host). ``samples_of(batch)``: the samples in
    a batch (default: a tf.data element's leading dimension; PyTorch: :mod:`analyzer.verify_task_pt`)."""
    proc = psutil.Process()
    job = [proc]
    for pid in local_pids or []:
        try:
            job.append(psutil.Process(pid))
        except Exception:  # noqa: BLE001
            pass
    _, batch = source.get(first_timeout)
    startup = time.time() - t_proc
    batch_size = samples_of(batch)
    t_end = time.monotonic() + warmup_s
    while time.monotonic() < t_end:
        source.get(timeout)
    counts0 = dict(getattr(source, "counts", {}))
    ct0 = proc.cpu_times()
    job0, host0 = _cpu(job), host_busy_seconds()
    samples = batches = 0
    t0 = time.monotonic()
    t_end = t0 + seconds
    while True:
        now = time.monotonic()
        if now >= t_end:
            break
        _, batch = source.get(timeout)
        samples += samples_of(batch)
        batches += 1
    window = time.monotonic() - t0
    job1, host1 = _cpu(job), host_busy_seconds()
    ct1 = proc.cpu_times()
    counts1 = dict(getattr(source, "counts", {}))
    return {"status": "ok", "samples_per_sec": samples / window if window > 0 else 0.0, "window_s": window,
            "samples": samples, "batches": batches, "batch_size": batch_size, "warmup_s": warmup_s,
            "startup_s": startup,
            "batches_per_worker": {str(k): counts1.get(k, 0) - counts0.get(k, 0) for k in counts1},
            "chief_cpu_cores": ((ct1.user - ct0.user) + (ct1.system - ct0.system)) / window if window > 0 else None,
            "job_cpu_cores_on_host": (job1 - job0) / window if window > 0 else None,
            "other_cores_busy": max(0.0, (host1 - host0) - (job1 - job0)) / window if window > 0 else None,
            "host_cpus": psutil.cpu_count()}


def _train_argv(argv: list[str]) -> list[str]:
    """run.py's argv with ``--mode train`` (replacing any mode) and ``--max_steps`` if absent
    (the params need one for a training mode; the drain never trains)."""
    out = drop_options(argv, valued=("--mode",), flags=("--validate_only", "--compile_only"))
    out += ["--mode", "train"]
    if not any(a == "--max_steps" or a.startswith("--max_steps=") for a in out):
        out += ["--max_steps", str(10 ** 9)]
    return out


def _write(path: str | None, obj: dict[str, Any]) -> None:
    if not path:
        print(json.dumps(obj), flush=True)
        return
    write_json(path, obj)


def failed_result(exc: BaseException, num_input_workers: int) -> dict[str, Any]:
    """A failed drain's result: ``{"status": "failed", "error", "num_workers"}``, the error
    being the problems of a :class:`csrun_runtime.params.ParamsError` or the exception's line."""
    problems = getattr(exc, "problems", None)
    return {"status": "failed", "error": "; ".join(problems) if problems else f"{type(exc).__name__}: {exc}",
            "num_workers": num_input_workers}


def begin_drain(run_py: str, args: list[str], out: str | None,
                adjust: Callable[[Resolved, Any], None] | None = None) -> tuple[Role, Any, Resolved] | int:
    """A drain task's start, for either framework: its role (:func:`csrun_runtime.task.begin`),
    ``run_py`` loaded in capture mode with ``args`` and its params resolved, then
    ``adjust(resolved, entry)`` when given. Returns ``(role, entry, resolved)``, or the exit code
    2 after one line on stderr (a bad environment; run.py or its params unusable: the chief
    writes ``{"status": "failed", "error"}`` to ``out`` first)."""
    try:
        role, _prefix = begin()
    except RoleError as exc:
        print(f"drain: environment: {exc}", file=sys.stderr)
        return 2
    try:
        entry = load_entry(run_py, args)
        resolved = resolve_params(args, run_py=str(Path(run_py).resolve()))
        if adjust is not None:
            adjust(resolved, entry)
    except (ParamsError, Exception) as exc:  # noqa: BLE001 - CaptureError, ParamsError
        if role.is_chief:
            _write(out, {"status": "failed", "error": f"{type(exc).__name__}: {exc}"})
        print(f"drain: {exc}", file=sys.stderr)
        return 2
    return role, entry, resolved


def main(argv: list[str] | None = None) -> int:
    """Entry point (see the module docstring). Returns the exit code: 0, 1 (failed), 2 (usage)."""
    t_proc = process_start_time()
    ns = _parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    started = begin_drain(ns.run_py, _train_argv(list(ns.args)), ns.out)
    if isinstance(started, int):
        return started
    role, entry, resolved = started
    if role.kind == "worker":
        _keep_worker_servers()
        return run_worker(role, resolved, entry.input_fn)
    return _chief(ns, role, entry, resolved, t_proc)


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m analyzer.verify_task",
                                 description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=20.0, help="measured window (s) [20]")
    ap.add_argument("--warmup", type=float, default=5.0, help="drain this long (s) before measuring [5]")
    ap.add_argument("--out", default=None, help="result JSON (chief only) [stdout]")
    ap.add_argument("run_py")
    ap.add_argument("args", nargs=argparse.REMAINDER)
    return ap.parse_args(argv)


def _chief(ns: argparse.Namespace, role: Role, entry: CapturedRun, resolved: Resolved, t_proc: float) -> int:
    """The chief's part: the stream (:func:`_service_source`, or :func:`_local_source` with
    no input worker), drained (:func:`drain`); the result is written and the job marked done
    (the input workers leave). Returns 0, or 1 when the drain failed (its error in the
    result)."""
    chief = Chief(role, resolved, entry.input_fn, entry.model_fn, entry.eval_input_fn, t_proc)
    rc = resolved.params["runconfig"]
    rdv: Rendezvous | None = None
    source: service.ServiceSource | service.LocalSource
    res: dict[str, Any]
    try:
        chief.model_dir.mkdir(parents=True, exist_ok=True)
        if role.num_input_workers > 0:
            chief.place_chief_input()  # before the source is built: the chief's threads pinned
            rdv = _rendezvous(chief, role)
            source, local_pids = _service_source(chief, role, rdv)
        else:
            source, local_pids = _local_source(chief, role), []
        res = drain(source, ns.warmup, ns.seconds, float(rc["worker_start_timeout_secs"]),
                    float(rc["input_timeout_secs"]), t_proc, local_pids)
        res["num_workers"] = role.num_input_workers
        res["node"] = role.node
        if chief.chief_input is not None:
            res["chief_input"] = chief.chief_input.describe()
        code = 0
    except BaseException as exc:  # noqa: BLE001 - reported in the result
        res, code = failed_result(exc, role.num_input_workers), 1
    _write(ns.out, res)
    if rdv is not None:
        rdv.mark_done("ok" if code == 0 else "failed", "drain finished")
    if chief.chief_input is not None:  # it leaves on done.json
        chief.chief_input.stop()
    print(f"drain: {json.dumps({k: res.get(k) for k in ('status', 'samples_per_sec', 'num_workers', 'error')})}",
          file=sys.stderr, flush=True)
    _KEEP.append(chief)
    return code


def _rendezvous(chief: Chief, role: Role) -> Rendezvous:
    """The rendezvous the runtime's chief sets up before training (reset, with its heartbeat),
    given to ``chief`` for :meth:`csrun_runtime.tensorflow.chief.Chief.wait_workers`."""
    key = role.rendezvous_key
    if key is None:  # resolve_role already requires SLURM_JOB_ID when there are input workers
        raise RoleError("SLURM_JOB_ID is required when CSRUN_NUM_WORKERS > 0")
    rdv = Rendezvous(chief.model_dir, key)
    rdv.reset()
    Heartbeat(rdv, "chief").start()
    chief.rdv = rdv
    return rdv


def _service_source(chief: Chief, role: Role,
                    rdv: Rendezvous) -> tuple[service.ServiceSource, list[int]]:
    """The training chief's stream: one dispatcher per input worker, their addresses
    published, the chief's own input worker started (:meth:`Chief.start_chief_input`, when
    :meth:`Chief.place_chief_input` placed one), the registrations awaited, and the merged
    stream of every worker. Returns the source and the pids of the input workers on this host
    (their CPU is reported apart)."""
    servers, ports = service.start_dispatchers(role.num_input_workers)
    _KEEP.append(servers)
    addresses = [f"{role.host}:{p}" for p in ports]
    rdv.publish_dispatchers(addresses, {
        "num_workers": role.num_input_workers, "mode": "train (drain)",
        "chief": {"node": role.node, "host": role.host, "pid": os.getpid()}})
    chief.start_chief_input()
    registry = chief.wait_workers()
    source = service.ServiceSource(rdv, addresses, registry)
    _KEEP.append(source)
    local_pids = [int(r["pid"]) for r in registry.values()
                  if r.get("pid") and r.get("host") in (role.host, socket.gethostname())]
    if chief.chief_input is not None:
        local_pids += [pid for pid in process_tree(chief.chief_input.pid) if pid not in local_pids]
    return source, local_pids


def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants' pids (psutil, recursive); ``[pid]`` when it cannot be read."""
    try:
        return [pid] + [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return [pid]


def _local_source(chief: Chief, role: Role) -> service.LocalSource:
    """No input worker: the chief's in-process pipeline, held to the task's CPUs as
    run_worker holds an input worker and the runtime's chief its in-process pipeline (and as
    the probes were): on a cluster that does not bind tasks to CPUs the pipeline would
    otherwise use every core of the node."""
    ds, _spec, _bs = chief._check_train_input()
    source = service.LocalSource(service.limit_threads(ds, role.cpus_per_task))
    _KEEP.append(source)
    return source


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
