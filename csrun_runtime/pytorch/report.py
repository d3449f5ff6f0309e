"""The PyTorch chief's reports: the end of a training run (``performance/performance.json``
in the TensorFlow chief's schema, :func:`csrun_runtime.artifacts.performance_record`, the
summary lines and the verdict block, docs/VERDICT.md), compile_only's
``compile_report.txt`` / ``compile_report.json`` and validate_only's ``validate_report.txt``.

The functions get the values they use, not the chief
(:mod:`csrun_runtime.pytorch.chief` calls it).
"""
from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from csrun_common.atomic import write_json

from .. import preemption
from ..artifacts import PERFORMANCE_FIELDS, performance_record, verdict, verdict_lines, worker_rates
from ..rendezvous import Rendezvous
from .contract import ContractError, batch_size_of
from .trainloop import StepClock

__all__ = ["report_training", "compile_report", "validate_report"]

log = logging.getLogger("csrun.runtime")


def report_training(desc: dict[str, Any], steps: int, start: int, end: int, clock: StepClock, t_end: float,
                    ended: str, loss_v: float, *, model_dir: Path, t_proc: float, device: Any, num_workers: int,
                    mode: str, rdv: Rendezvous | None) -> None:
    """performance.json, the summary lines and the verdict of ``steps`` steps trained from
    global step ``start`` to ``end`` (``clock``: the loop's timings, monotonic s; ``t_end``:
    when it ended; ``t_proc``: the process start, ``time.time()`` s; ``desc``: the source's
    description and the allocation's keys). With a rendezvous also ``chief.json`` and the
    batches per input worker. Needs a trained first step (``clock.t_first_end`` set)."""
    assert clock.t_first is not None and clock.t_first_end is not None
    t_first, batch_size, computes = clock.t_first, clock.batch_size or 0, clock.computes
    eval_time = clock.eval_time
    total_time = (t_end - t_first) - eval_time
    steady_time = (t_end - clock.t_first_end) - clock.eval_after_first
    rates = worker_rates(desc.get("batches_per_worker") or {}, batch_size, steady_time)
    programming = max(0.0, time.time() - t_proc - (time.monotonic() - t_first))
    extra = {"global_step_start": start, "global_step_end": end, "framework": "pytorch",
             "device": str(device), "num_workers": num_workers, "mode": mode,
             "eval_time": round(eval_time, 4), **desc}
    rec = performance_record(batch_size=batch_size, steps=steps, total_time=total_time,
                             first_step_time=clock.first_step_time, compute_times=computes,
                             wait_times=clock.waits,
                             loop_time_after_first=steady_time, programming_time=programming, extra=extra)
    v = verdict(steps=steps, steady_steps=steps - 1, steady_time=steady_time, steady_calls=steps - 1,
                batch_size=batch_size, wait_fraction=rec["input_wait_fraction"], rates=rates,
                nodes=desc.get("worker_nodes"), ended=ended)
    rec.update({"verdict": v, "ended": ended, "steady_steps": steps - 1, "steady_time": round(steady_time, 4),
                "steady_samples_per_sec": v["steady_samples_per_sec"], "worker_samples_per_sec": rates,
                "stopped_by": preemption.stop_signal()})
    rec["fields"] = {k: d for k, d in PERFORMANCE_FIELDS.items() if k in rec}
    write_json(model_dir / "performance" / "performance.json", rec)
    total_samples = steps * batch_size
    if rdv is not None:
        per, nodes = desc.get("batches_per_worker", {}), desc.get("worker_nodes", {})
        log.info("batches received per input worker: %s",
                 ", ".join(f"{i} ({nodes.get(i)}): {n}" for i, n in per.items()))
        write_json(rdv.dir / "chief.json", {**desc, "steps": steps})
    log.info("Training finished with %d samples in %.3f seconds, %.2f samples/second.", total_samples,
             total_time, total_samples / total_time if total_time > 0 else 0.0)
    log.info("Loss for final step: %.6g.", loss_v)
    log.info("performance: %s", model_dir / "performance" / "performance.json")
    for line in verdict_lines(v, steps=steps, start_step=start, end_step=end, batch_size=batch_size,
                              steady_steps=max(0, steps - 1), steady_time=steady_time,
                              compile_time=rec["compile_time"], programming_time=programming,
                              compute_samples_per_sec=rec.get("est_samples_per_sec") if computes else None):
        log.info("%s", line)


def compile_report(model: Any, opt: Any, batch: Any, device: Any, forward_loss: Callable[[Any, Any], Any],
                   timed: int, model_dir: Path) -> None:
    """compile_only's measurement and report: one forward (the loss) and one backward on the
    training ``batch`` (already on ``device``), then ``timed`` timed forwards (s);
    ``compile_report.txt`` / ``compile_report.json`` in ``model_dir``, and the log."""
    t0 = time.monotonic()
    loss = forward_loss(model, batch)
    loss.backward()
    first = time.monotonic() - t0
    times = []
    for _ in range(timed):
        t = time.monotonic()
        forward_loss(model, batch)
        times.append(time.monotonic() - t)
    med = statistics.median(times) if times else first
    n = batch_size_of(batch) or 0
    params = sum(p.numel() for p in model.parameters())
    rec = {"framework": "pytorch", "device": str(device), "module": type(model).__name__,
           "parameters": params, "optimizer": type(opt).__name__, "batch_size": n,
           "first_step_time": round(first, 6), "median_forward_time": round(med, 6),
           "est_forward_samples_per_sec": round(n / med, 2) if med > 0 else None, "loss": float(loss.detach())}
    lines = [f"compile_only (PyTorch, no compiler: eager {device}): {type(model).__name__} with {params} "
             f"parameter(s), optimizer {type(opt).__name__}",
             f"  forward + backward on one batch of {n}: {first:.4f} s; median forward {med:.6f} s over "
             f"{len(times)} ({rec['est_forward_samples_per_sec']} samples/s); loss {rec['loss']:.6g}"]
    (model_dir / "compile_report.txt").write_text("\n".join(lines) + "\n")
    write_json(model_dir / "compile_report.json", rec)
    for line in lines:
        log.info("%s", line)


def validate_report(loader: Any, eval_loader: Callable[[], Any] | None, model_dir: Path,
                    more: list[str] | None = None) -> None:
    """validate_only's check and report: one batch of the training DataLoader ``loader`` (none is
    a :class:`.contract.ContractError`) and, when ``eval_loader`` is given, the first batch of
    the DataLoader it builds; ``more`` lines (the file-coverage check's) after them;
    ``validate_report.txt`` in ``model_dir``, and the log."""
    lines: list[str] = []
    first = next(iter(loader), None)
    if first is None:
        raise ContractError("train_input: the DataLoader yielded no batch")
    lines.append(f"train_input: DataLoader ok: batch_size {batch_size_of(first)}, {len(loader)} batch(es) per "
                 f"pass, num_workers {loader.num_workers}, drop_last {loader.drop_last}")
    if eval_loader is not None:
        ev = next(iter(eval_loader()), None)
        lines.append(f"eval_input: DataLoader ok: batch_size {batch_size_of(ev)}")
    lines += list(more or [])
    text = "\n".join(["validate_only: the run.py contract holds (PyTorch)", *lines])
    (model_dir / "validate_report.txt").write_text(text + "\n")
    for line in text.splitlines():
        log.info("%s", line)
