"""``python -m analyzer.verify_task [--framework F] [--seconds S] [--warmup W] [--dataloader-workers K]
--out FILE run.py ARGS...``.

The task that ``cs_input_analyzer verify`` launches with ``csrun_wse`` on every task of the
recommended layout (``python-ws`` for TensorFlow, ``python-pt`` for PyTorch). This module is the
framework-neutral harness: the start of every task (:func:`begin_drain`: its role, run.py
loaded in capture mode, the params resolved), the chief's drain (:func:`drain`) and its result
(:func:`failed_result`); what differs per framework is the backend's ``drain`` module
(:class:`csrun_runtime.probing.DrainBackend`, picked with
``csrun_runtime.registry.entry(framework, "drain")``: :mod:`csrun_runtime.tensorflow.drain`,
:mod:`csrun_runtime.pytorch.drain`). Per role (:func:`csrun_common.roles.resolve_role`,
docs/CONTRACT.md):

* an **input worker** runs exactly what a training job's worker runs (the backend's
  ``worker``: TensorFlow's ``input_fn(params_i)`` behind a tf.data service worker, PyTorch's
  DataLoader streamed over the data plane) until the chief is done;
* the **chief** sets up what the runtime's chief sets up for training (the backend's
  ``ChiefDrain``: the rendezvous, the input workers' streams, with the layout's chief input
  CPUs (:mod:`csrun_runtime.chief_input`) its CPU split and input worker 0 in its own task; the
  in-process input when there is no input worker) — but instead of training it only *drains*
  the stream: ``--warmup`` seconds after the first batch, then a measured window of
  ``--seconds``; it writes the delivered samples/s to ``--out`` (JSON), marks the job done
  (the workers leave) and exits with ``os._exit``.
* with several trainer ranks (``CSRUN_WORLD_SIZE > 1``, docs/MULTI-RANK.md) every task of het
  group 0 is a chief: each rank drains its own input workers (its own rendezvous directory, the
  :class:`csrun_common.roles.Role`'s rank view) and writes ``--out``'s ``.rank<r>`` file
  (:func:`rank_out`) with ``"rank"`` and ``"world_size"``; ``cs_input_analyzer verify`` sums the world.

``--dataloader-workers K`` (PyTorch) sets ``train_input.num_workers`` (the DataLoader's worker
processes) in every task: verify measures the count the report recommends for the layout.

Result JSON: ``{"status": "ok"|"failed", "samples_per_sec", "window_s", "samples",
"batches", "batch_size", "batches_per_worker", "num_workers", "startup_s" (process start to
the first batch), "chief_cpu_cores" (CPU-seconds per second of the chief process),
"job_cpu_cores_on_host" (the chief's and the input workers' on its host that the backend
names), "other_cores_busy", "host_cpus", "node", "error"}`` and the backend's own keys
(TensorFlow: "chief_input" with the chief's input CPUs: its CPU split; its stream is
``batches_per_worker["0"]``; PyTorch: "framework", "dataloader_workers", the own input
worker's).

ARGS are run.py's arguments; ``--mode train`` must be among them (verify adds it) so that the
workers stream.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from csrun_common.atomic import write_json
from csrun_common.roles import Role, RoleError
from csrun_runtime import registry
from csrun_runtime.capture import CapturedRun, load_entry
from csrun_runtime.params import ParamsError, Resolved, drop_options, resolve_params
from csrun_runtime.probing import DEFAULT_FRAMEWORK, DrainSource, host_busy_seconds
from csrun_runtime.task import begin, process_start_time

__all__ = ["drain", "begin_drain", "failed_result", "main", "rank_out"]


def _cpu(procs: list[psutil.Process]) -> float:
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system + getattr(t, "children_user", 0.0) + getattr(t, "children_system", 0.0)
        except Exception:  # noqa: BLE001 - a process that left
            pass
    return total


def drain(source: DrainSource, warmup_s: float, seconds: float,
          first_timeout: float, timeout: float, t_proc: float,
          local_pids: list[int] | None, samples_of: Callable[[Any], int]) -> dict[str, Any]:
    """Drain ``source`` (``get(timeout) -> (worker, batch)``, e.g. TensorFlow's
    ``ServiceSource``): the first batch, ``warmup_s`` seconds, then a ``seconds`` window.
    Returns the measured figures (see the module docstring; rates in samples/s).
    ``local_pids``: input-worker processes on this host; their CPU use is reported
    (``job_cpu_cores``) with the rest of the host's (``other_cores_busy``: other jobs on a
    shared host). ``samples_of(batch)``: the samples in a batch (the backend's
    ``ChiefDrain.samples_of``)."""
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


def rank_out(path: str | None, rank: int, world_size: int) -> str | None:
    """Where trainer ``rank`` of ``world_size`` writes its drain's result: ``path`` itself with
    one rank, else ``<stem>.rank<r><suffix>`` beside it (``drain.json`` -> ``drain.rank1.json``);
    ``None`` (stdout) stays ``None``."""
    if path is None or world_size <= 1:
        return path
    p = Path(path)
    return str(p.with_name(f"{p.stem}.rank{rank}{p.suffix}"))


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
            _write(rank_out(out, role.rank, role.world_size),
                   {"status": "failed", "error": f"{type(exc).__name__}: {exc}"})
        print(f"drain: {exc}", file=sys.stderr)
        return 2
    return role, entry, resolved


def main(argv: list[str] | None = None) -> int:
    """Entry point (see the module docstring). Returns the exit code: 0, 1 (failed), 2 (usage)."""
    t_proc = process_start_time()
    ns = _parse_args(argv)
    backend: Any = registry.entry(ns.framework, "drain")
    backend.prepare()

    def adjust(resolved: Resolved, entry: Any) -> None:
        backend.adjust(resolved, entry, ns.dataloader_workers)

    started = begin_drain(ns.run_py, _train_argv(list(ns.args)), ns.out, adjust)
    if isinstance(started, int):
        return started
    role, entry, resolved = started
    if role.kind == "worker":
        return int(backend.worker(role, resolved, entry))
    return _chief(ns, backend, role, entry, resolved, t_proc)


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m analyzer.verify_task",
                                 description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--framework", choices=registry.FRAMEWORKS, default=DEFAULT_FRAMEWORK,
                    help=f"run.py's framework (its backend's drain) [{DEFAULT_FRAMEWORK}]")
    ap.add_argument("--seconds", type=float, default=20.0, help="measured window (s) [20]")
    ap.add_argument("--warmup", type=float, default=5.0, help="drain this long (s) before measuring [5]")
    ap.add_argument("--dataloader-workers", type=int, default=None,
                    help="train_input.num_workers in every task (PyTorch) [the params']")
    ap.add_argument("--out", default=None, help="result JSON (chief only) [stdout]")
    ap.add_argument("run_py")
    ap.add_argument("args", nargs=argparse.REMAINDER)
    return ap.parse_args(argv)


def _chief(ns: argparse.Namespace, backend: Any, role: Role, entry: CapturedRun, resolved: Resolved,
           t_proc: float) -> int:
    """The chief's part: the backend's stream (``ChiefDrain.open``) drained (:func:`drain`);
    the result is written and the job marked done (``ChiefDrain.close``: the input workers
    leave). Returns 0, or 1 when the drain failed (its error in the result)."""
    rc = resolved.params["runconfig"]
    side = backend.ChiefDrain(role, resolved, entry, t_proc)
    res: dict[str, Any]
    try:
        source, local_pids = side.open()
        res = drain(source, ns.warmup, ns.seconds, float(rc["worker_start_timeout_secs"]),
                    float(rc["input_timeout_secs"]), t_proc, local_pids, side.samples_of)
        res["num_workers"] = role.num_input_workers  # drain.json's key
        res.update(node=role.node, **side.describe())
        code = 0
    except BaseException as exc:  # noqa: BLE001 - reported in the result
        res, code = failed_result(exc, role.num_input_workers), 1
    if role.world_size > 1:
        res.update(rank=role.rank, world_size=role.world_size)
    _write(rank_out(ns.out, role.rank, role.world_size), res)
    side.close(code == 0)
    print(f"drain: {json.dumps({k: res.get(k) for k in ('status', 'samples_per_sec', 'num_workers', 'error')})}",
          file=sys.stderr, flush=True)
    return code


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # tf.data service threads, DataLoader workers and zmq threads must not hold the exit
