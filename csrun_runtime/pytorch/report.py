"""The PyTorch chief's reports: compile_only's ``compile_report.txt`` / ``compile_report.json``
and validate_only's ``validate_report.txt`` (a training run's performance.json and verdict
are the core loop's, :mod:`csrun_runtime.loop`).

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

from .contract import ContractError, batch_size_of

__all__ = ["compile_report", "validate_report"]

log = logging.getLogger("csrun.runtime")


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
