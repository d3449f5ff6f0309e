"""model_dir artifacts ("Weight Streaming Quickstart"): performance/performance.json, params YAML, reports.

Pure Python; the checkpoint and TensorBoard helpers live in :mod:`csrun_runtime.tensorflow.runner`
(they need TensorFlow).

Layout written by the runtime::

    <model_dir>/
      model-ckpt-<step>.index / .data-*   checkpoints (tf.train.CheckpointManager), `checkpoint`
      events.out.tfevents.*               TensorBoard: loss, samples_per_sec, input_wait_fraction
      performance/performance.json        see :func:`performance_record`
      train/params_train.yaml             resolved params of a training run
      eval/params_eval.yaml, eval/results.json, eval/events.out.tfevents.*
      compile_report.txt, compile_report.json   compile_only
      validate_report.txt                 validate_only
      .csrun/<SLURM_JOB_ID>.<SLURM_STEP_ID>/    rendezvous of a multi-task job (service.py)
"""
from __future__ import annotations

import os
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from csrun_common.atomic import atomic_open, read_json, write_json

__all__ = ["write_json", "read_json", "write_params_yaml", "performance_record",
           "INPUT_BOTTLENECK_THRESHOLD", "SHORT_RUN_SECS", "SHORT_RUN_CALLS", "verdict", "verdict_lines",
           "worker_rates", "PERFORMANCE_FIELDS"]

#: The run is *input-bound* (``suspected_input_bottleneck``, the verdict) when the chief spent
#: more than this share of the steady-state loop time (after the first step) waiting for the
#: next batch. Why 10 %: removing a wait fraction ``w`` entirely speeds training up by at most
#: ``1 / (1 - w)``; below 10 % that is under 11 %, about the spread of one run's rate against
#: the next on a shared cluster, so more input workers would not show; above it they would.
INPUT_BOTTLENECK_THRESHOLD = 0.10
#: The verdict calls its figures rough when the steady state (steps 2..N) lasted less than
#: this many seconds or this many train calls: a few chunks say little about a rate.
SHORT_RUN_SECS = 2.0
SHORT_RUN_CALLS = 3


def write_params_yaml(model_dir: str | os.PathLike, params: Mapping[str, Any], kind: str) -> Path:
    """Write the resolved params as ``<model_dir>/<kind>/params_<kind>.yaml`` ("Weight Streaming Quickstart"),
    ``kind`` ``"train"`` or ``"eval"``; returns the file's path."""
    path = Path(model_dir) / kind / f"params_{kind}.yaml"
    with atomic_open(path) as f:
        yaml.safe_dump(_plain(params), f, sort_keys=False)
    return path


def _plain(obj: Any) -> Any:
    if isinstance(obj, Mapping):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    return str(obj)


#: What every key of ``performance/performance.json`` measures (written into the file as its
#: ``fields`` key; docs/VERDICT.md gives the same table). All times are wall seconds on the chief.
PERFORMANCE_FIELDS: dict[str, str] = {
    "verdict": "input-bound / compute-bound / unknown, with the sentence the run printed (docs/VERDICT.md)",
    "ended": "how training ended: 'target reached', 'stopped by SIG...', 'failed: ...'",
    "stopped_by": "the signal that stopped training (SIGINT, SIGTERM, --requeue's SIGUSR2), null when none did",
    "steps": "global steps trained in this allocation",
    "batch_size": "samples per step (the input_fn contract)",
    "total_samples": "steps x batch_size",
    "total_time": "first step's start to the last step's end, evaluation excluded; includes the first "
                  "step's trace and compile, input waits and checkpoint saves",
    "samples_per_sec": "total_samples / total_time (the Model Zoo figure; low for short runs because the "
                       "compile is in it)",
    "steady_steps": "steps 2..N: the steps after the first (trace and compile) step",
    "steady_time": "wall time of steps 2..N, evaluation excluded; includes input waits and checkpoint saves",
    "steady_samples_per_sec": "steady_steps x batch_size / steady_time: the training rate once compiled",
    "est_samples_per_sec": "compute-only rate ('train step alone'): steady_steps x batch_size / the seconds "
                           "steps 2..N spent inside train calls, no input wait, no checkpoint: what the train "
                           "steps could take if input were free (cs_input_analyzer's target); the same steps "
                           "as steady_samples_per_sec over a part of the same time, so never below it; null "
                           "without a step after the first",
    "compute_fraction": "share of steady_time inside train calls (steps 2..N); with input_wait_fraction, "
                        "the rest is checkpoint saves, logging and the loop's own work",
    "compile_time": "the first step's time minus the median later step: trace and XLA compile",
    "programming_time": "process start to the start of the first step (imports, contract checks, "
                        "waiting for the input workers)",
    "input_wait_fraction": "share of steady_time the chief waited for the next batch",
    "input_wait_time": "seconds the chief waited for batches over steps 2..N",
    "compute_time": "seconds inside train calls, the first step included",
    "median_step_time": "median seconds per step inside train calls, steps 2..N",
    "suspected_input_bottleneck": "input_wait_fraction > input_bottleneck_threshold",
    "input_bottleneck_threshold": "the wait share above which the run is called input-bound",
    "worker_samples_per_sec": "samples per second each input worker delivered to training "
                              "(its batches handed to training x batch_size / steady_time)",
    "allocation_history": "every allocation of the run (one per requeue): its job, steps, the signal that "
                          "stopped it and its workers_lost, workers_replaced, workers_given_up, workers_paused",
    "input_positions": "each input stream's position (job-wide worker index -> batches of its stream trained "
                       "since it began) at this allocation's start and end, the checkpoint it resumed from, the "
                       "batches its merge dropped as duplicates or found missing, and where each worker resumed "
                       "(docs/RESILIENCE.md 'The input position')",
}


def worker_rates(batches_per_worker: Mapping[str, int], batch_size: int, seconds: float) -> dict[str, float]:
    """Samples/s each input worker delivered: ``batches x batch_size / seconds`` per key of
    ``batches_per_worker`` (a worker index as a string, or ``"in-process"``); ``{}`` when
    ``seconds <= 0``."""
    if seconds <= 0:
        return {}
    return {str(k): round(int(n) * int(batch_size) / seconds, 2) for k, n in batches_per_worker.items()}


def _pct(fraction: float) -> str:
    return f"{100.0 * fraction:.1f} %"


def verdict(*, steps: int, steady_steps: int, steady_time: float, steady_calls: int, batch_size: int,
            wait_fraction: float,
            rates: Mapping[str, float] | None = None, nodes: Mapping[str, Any] | None = None,
            ended: str = "target reached", analyzer_command: str | None = None,
            threshold: float = INPUT_BOTTLENECK_THRESHOLD) -> dict[str, Any]:
    """Whether training waited on input (pure: figures in, facts and a plain sentence out).

    Args:
        steps: global steps trained; ``steady_steps``, ``steady_time`` (s), ``steady_calls``:
            steps 2..N, their wall time (evaluation excluded) and the train calls they took.
        wait_fraction: share of ``steady_time`` spent waiting for the next batch (0..1).
        rates: samples/s each input worker delivered (:func:`worker_rates`), by worker index
            (``"in-process"`` for the chief's own pipeline); ``nodes``: their nodes.
        ended: how training ended (``"target reached"``, ``"stopped by SIGINT"``, ``"failed: ..."``).
        analyzer_command: the ``cs_input_analyzer`` command an input-bound verdict suggests.
        threshold: :data:`INPUT_BOTTLENECK_THRESHOLD`.

    Returns:
        ``{"bound": "input" | "compute" | "unknown", "sentence", "ended",
        "steady_samples_per_sec", "input_wait_fraction", "short_run", "slowest_input_worker"}``;
        ``bound`` is ``"input"`` when ``wait_fraction > threshold``, ``"unknown"`` without a
        steady-state step (only the first, compiling step ran).
    """
    steady_rate = steady_steps * batch_size / steady_time if steady_time > 0 and steady_steps > 0 else None
    wait = min(1.0, max(0.0, float(wait_fraction)))
    active = {k: v for k, v in (rates or {}).items() if v > 0}
    slowest = None
    if active:
        k = min(active, key=lambda key: active[key])
        slowest = {"worker": k, "node": (nodes or {}).get(k), "samples_per_sec": active[k]}
    short = steady_steps > 0 and (steady_time < SHORT_RUN_SECS or steady_calls < SHORT_RUN_CALLS)
    if steady_rate is None:
        bound = "unknown"
        sentence = ("no verdict: only the first step (trace and compile) ran, so there is no steady state "
                    "to measure input waits on")
    elif wait > threshold:
        bound = "input"
        sentence = f"input-bound: training waited for input {_pct(wait)} of the time"
        if slowest is not None:
            who = ("the in-process input pipeline" if slowest["worker"] == "in-process" else
                   f"the slowest input worker ({slowest['worker']}"
                   + (f" on {slowest['node']}" if slowest["node"] else "") + ")")
            sentence += f"; {who} delivered {slowest['samples_per_sec']:.1f} samples/s"
        if analyzer_command:
            sentence += f"; run `{analyzer_command}` to size the input workers"
    else:
        bound = "compute"
        sentence = (f"compute-bound: input waited {_pct(wait)} of the time (input-bound above "
                    f"{_pct(threshold)}); more input workers would not speed training up")
    if short:
        sentence += (f" (short run: {steady_time:.2f} s of steady state in {steady_calls} call(s), "
                     f"the figures are rough)")
    return {"bound": bound, "sentence": sentence, "ended": ended,
            "steady_samples_per_sec": None if steady_rate is None else round(steady_rate, 2),
            "input_wait_fraction": round(wait, 4), "short_run": bool(short), "slowest_input_worker": slowest}


def verdict_lines(v: Mapping[str, Any], *, steps: int, start_step: int, end_step: int, batch_size: int,
                  steady_steps: int, steady_time: float, compile_time: float, programming_time: float,
                  compute_samples_per_sec: float | None = None, rank_wait_fraction: float | None = None) -> list[str]:
    """The verdict block the chief prints at the end of training (pure): a header with how
    training ended, then steps, the steady-state rate with compile and programming time
    apart, the input-wait share and :func:`verdict`'s sentence, one clause a line (srun splits
    output lines longer than about 250 characters). ``compute_samples_per_sec`` is the
    "train step alone" rate of the same steps 2..N (performance.json's
    ``est_samples_per_sec``): with it the wait line also gives the train steps' share of the
    steady-state time and the rest (steady rate / step-alone rate = the train steps' share);
    ``rank_wait_fraction`` (several trainer ranks): the share waited for the other ranks, a
    share of its own, not in the rest."""
    rate = v.get("steady_samples_per_sec")
    clauses = str(v.get("sentence")).split("; ")
    wait = float(v.get("input_wait_fraction") or 0.0)
    shares = ""
    ranks = float(rank_wait_fraction or 0.0)
    if rate and compute_samples_per_sec:  # the same steps over all their time and over their compute time
        compute = min(1.0, float(rate) / compute_samples_per_sec)
        rest = max(0.0, 1.0 - compute - wait - ranks)
        shares = (f"; train steps {_pct(compute)}"
                  + (f", waits for the other ranks {_pct(ranks)}" if rank_wait_fraction is not None else "")
                  + f", the rest {_pct(rest)} (checkpoints, logging)")
    elif rank_wait_fraction is not None and rate:  # no steady state: no shares
        shares = f"; waits for the other ranks {_pct(ranks)}"
    return [
        f"verdict ({v.get('ended')}): {steps} step(s) trained, global step {start_step} -> {end_step}, "
        f"batch_size {batch_size}",
        "  steady state: " + (f"{rate:.1f} samples/s over steps 2..N ({steady_steps} steps in {steady_time:.3f} s)"
                              if rate is not None else "none (only the first step ran)")
        + (f"; train step alone {compute_samples_per_sec:.1f} samples/s (the same steps, their compute time only)"
           if compute_samples_per_sec else ""),
        f"  apart: first step's trace and compile {compile_time:.3f} s, process start to first step "
        f"{programming_time:.3f} s",
        f"  input wait: {_pct(wait)} of the steady-state time{shares}",
        *[f"  {c}" + (";" if i < len(clauses) - 1 else "") for i, c in enumerate(clauses)],
    ]


def performance_record(*, batch_size: int, steps: int, total_time: float, first_step_time: float,
                       compute_times: Sequence[float], wait_times: Sequence[float],
                       loop_time_after_first: float, programming_time: float,
                       extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The ``performance/performance.json`` record of a training run (the keys of "Weight Streaming Quickstart" first).

    Every figure is measured on the chief:

    - ``total_samples`` = ``steps`` × ``batch_size`` (samples);
    - ``total_time``: wall seconds from the start of the first step to the end of the last
      (includes the first step's trace/compile, input waits and checkpoint saves);
    - ``samples_per_sec`` = ``total_samples / total_time``;
    - ``compile_time``: the first step's wall time minus the median later step (seconds;
      tracing + XLA compile of the train step);
    - ``est_samples_per_sec``: steps 2..N × ``batch_size`` / their seconds inside train calls,
      the rate if input were free (samples/s; "train step alone"): the steady state's steps
      over a part of its time, so never below ``steps 2..N × batch_size /
      loop_time_after_first``; ``None`` without a step after the first (a median per step
      could fall below the steady rate when step times are bimodal: issue 33);
    - ``compute_fraction``: seconds inside train calls over ``loop_time_after_first``;
    - ``programming_time``: seconds from process start to the start of the first step;
    - ``input_wait_fraction``: time waiting for the next batch over loop time, steps 2..N;
    - ``suspected_input_bottleneck``: ``input_wait_fraction > INPUT_BOTTLENECK_THRESHOLD``.

    Args:
        compute_times, wait_times: per-step seconds for steps 2..N (the first excluded).
        loop_time_after_first: wall seconds of steps 2..N.
        extra: more keys appended (layout, per-worker batch counts, ...).
    """
    median_compute = statistics.median(compute_times) if compute_times else first_step_time
    steady_compute = float(sum(compute_times))
    total_samples = int(steps) * int(batch_size)
    wait_total = float(sum(wait_times))
    wait_fraction = (wait_total / loop_time_after_first) if loop_time_after_first > 0 else 0.0
    rec: dict[str, Any] = {
        "compile_time": round(max(0.0, first_step_time - median_compute), 4),
        "est_samples_per_sec": (round(len(compute_times) * batch_size / steady_compute, 2)
                                if compute_times and steady_compute > 0 else None),
        "compute_fraction": (round(min(1.0, steady_compute / loop_time_after_first), 4)
                             if loop_time_after_first > 0 else None),
        "programming_time": round(programming_time, 4),
        "samples_per_sec": round(total_samples / total_time, 2) if total_time > 0 else None,
        "suspected_input_bottleneck": bool(wait_fraction > INPUT_BOTTLENECK_THRESHOLD),
        "total_samples": total_samples,
        "total_time": round(total_time, 4),
        "input_wait_fraction": round(min(1.0, wait_fraction), 4),
        "input_wait_time": round(wait_total, 4),
        "compute_time": round(float(sum(compute_times)) + first_step_time, 4),
        "median_step_time": round(median_compute, 6),
        "batch_size": int(batch_size),
        "steps": int(steps),
        "input_bottleneck_threshold": INPUT_BOTTLENECK_THRESHOLD,
    }
    if extra:
        rec.update(extra)
    rec["fields"] = {k: d for k, d in PERFORMANCE_FIELDS.items() if k in rec}
    return rec
