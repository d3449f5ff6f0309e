"""The chief's modes that train nothing: ``validate_only`` (the contract checks, their report
in ``validate_report.txt``) and ``compile_only``'s timing and report (``compile_report.txt``
and ``compile_report.json``). Modes and artifacts: csrun_runtime/README.md.

The functions get the values they use, not the chief (:mod:`csrun_runtime.tensorflow.chief` calls them).
TensorFlow is imported inside the functions (see :mod:`csrun_runtime.tensorflow.worker`).
"""
from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from csrun_common.atomic import write_json

from .bundling import plan_bundle
from .contract import synthetic_batch, validate
from .steps import TrainSteps

if TYPE_CHECKING:  # annotations only: TensorFlow is imported inside the functions
    import keras

__all__ = ["validate_only", "time_steps", "compile_report"]

log = logging.getLogger("csrun.runtime")


def validate_only(input_fn: Callable[..., Any], model_fn: Callable[..., Any], params: dict[str, Any],
                  eval_input_fn: Callable[..., Any] | None, plan: dict[str, Any] | None, num_input_workers: int,
                  model_dir: Path) -> int:
    """Mode ``validate_only``: :func:`csrun_runtime.tensorflow.contract.validate` as input workers
    ``0..num_input_workers-1`` (at least 1) would build the input, the report written to
    ``model_dir/validate_report.txt`` and logged. Returns the exit code: 0 when the contract
    holds, 2 with violations."""
    rep = validate(input_fn, model_fn, params, eval_input_fn, plan=plan, num_input_workers=max(1, num_input_workers),
                   strict=bool(params["runconfig"].get("strict")))
    text = rep.text()
    cov = rep.info.get("file_coverage")
    if cov:
        line = (f"input workers' files (checked as workers 0 and 1 of {cov['num_workers']}): "
                f"{cov['verdict']}" + (f" ({cov['note']})" if cov.get("note") else ""))
        log.info("validate_only: %s", line)
        text += f"\nINFO: {line}"
    (model_dir / "validate_report.txt").write_text(text + "\n")
    for w in rep.warnings:
        log.warning("%s", w)
    for v in rep.violations:
        log.error("%s", v)
    if rep.ok:
        log.info("validate_only: input_fn and model satisfy the contract (%s)",
                 ", ".join(f"{k}: batch_size {v.get('batch_size')}" for k, v in rep.info.items()
                           if isinstance(v, dict) and "batch_size" in v))
        return 0
    log.error("validate_only: %d violation(s)", len(rep.violations))
    return 2


def time_steps(model: keras.Model, spec: Any, rc: Mapping[str, Any],
               train_steps: Callable[[keras.Model], TrainSteps]) -> tuple[float, list[float], int]:
    """compile_only's timing: the first step (trace and compile, with the XLA fallback
    ``train_steps(model)`` gives), then ``runconfig.compile_only_steps`` steps on a synthetic
    element of the input's shapes, in calls of as many steps as training would make (the
    bundle :func:`csrun_runtime.tensorflow.service.plan_bundle` gives, capped by
    ``steps_per_execution``). Returns ``(first step s, seconds per step of each timed call,
    steps per call)``."""
    import tensorflow as tf

    batch = synthetic_batch(spec, "random")
    bundle = plan_bundle(spec, rc.get("input_bundle", "auto")).bundle
    spe = rc.get("steps_per_execution", "auto")
    n = int(rc["compile_only_steps"])
    per_call = max(1, min(n, bundle, bundle if spe == "auto" else int(spe)))
    element = tf.nest.map_structure(lambda t: None if t is None else tf.stack([t] * bundle), batch)
    steps = train_steps(model)
    t = time.monotonic()
    float(steps(element, 0, 1)[1][-1])  # the loss read: a timing waits for the device's steps
    first = time.monotonic() - t
    times, done = [], 0
    while done < n:
        k = min(per_call, n - done)
        t = time.monotonic()
        float(steps(element, 0, k)[1][-1])
        times.append((time.monotonic() - t) / k)
        done += k
    return first, times, per_call


def compile_report(model: keras.Model, spec: Any, batch_size: int, timing: tuple[float, list[float], int],
                   rc: Mapping[str, Any], model_dir: Path, jit_note: str) -> None:
    """compile_only's report from :func:`time_steps`' ``timing``: ``compile_report.txt`` and
    ``compile_report.json`` in ``model_dir`` (compile time = first step minus the median
    step, s; the estimated samples/s of ``batch_size`` at the median step), logged."""
    import tensorflow as tf

    first, times, per_call = timing
    n = int(rc["compile_only_steps"])
    med = statistics.median(times)
    compile_time = max(0.0, first - med)
    est = batch_size / med if med > 0 else None
    xla = bool(model.jit_compile)
    rec: dict[str, Any] = {
        "compile_time": round(compile_time, 4),
        "est_samples_per_sec": round(est, 2) if est else None,
        "first_step_time": round(first, 4),
        "median_step_time": round(med, 6),
        "timed_steps": n,
        "steps_per_call": per_call,
        "batch_size": batch_size,
        "xla": xla,
        "xla_note": jit_note,
        "parameters": int(model.count_params()),
        "element_spec": repr(spec),
        "devices": [d.name for d in tf.config.list_logical_devices()],
        "note": "steps run on synthetic batches of the input's shapes (no input pipeline)",
    }
    lines = [
        "csrun compile_only report",
        f"model_dir: {model_dir}",
        f"train step: {'XLA (jit_compile=True)' if xla else 'TF graph without XLA'}"
        + (f" [{jit_note}]" if jit_note else ""),
        f"compile time: {rec['compile_time']} s (first step {rec['first_step_time']} s "
        f"minus median step {rec['median_step_time']} s)",
        f"estimated samples/s: {rec['est_samples_per_sec']} (batch_size {batch_size} / "
        f"median of {n} timed steps on synthetic batches, {per_call} steps per call)",
        f"model parameters: {rec['parameters']}",
        f"element_spec: {rec['element_spec']}",
        f"devices: {', '.join(rec['devices'])}",
    ]
    (model_dir / "compile_report.txt").write_text("\n".join(lines) + "\n")
    write_json(model_dir / "compile_report.json", rec)
    for line in lines[2:5]:
        log.info("compile_only: %s", line)
    log.info("compile_only: report in %s", model_dir / "compile_report.txt")
