"""The chief's evaluation: the eval input's contract checks, one pass over it with the
model's compiled test step, the ``eval/`` TensorBoard scalars and ``eval/results.json``, and
the verdict block of an ``eval`` run (docs/VERDICT.md).

Evaluation always runs on the chief, in-process, so held-out data is read exactly once.
TensorFlow is imported inside the functions (see :mod:`csrun_runtime.tensorflow.worker`).
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from csrun_common.atomic import read_json, write_json

from .contract import Refused, build_eval_input, check_dataset, check_signature
from .training import write_scalar

if TYPE_CHECKING:  # annotations only: TensorFlow is imported inside the functions
    import keras

__all__ = ["Evaluator"]

log = logging.getLogger("csrun.runtime")


class Evaluator:
    """Evaluates the chief's model on the eval input.

    Args:
        input_fn: the training input function (the eval input's fallback,
            :func:`csrun_runtime.tensorflow.contract.build_eval_input`).
        eval_input_fn: the user's eval input function, or None.
        params: the resolved params (``runconfig.eval_steps``, ``eval_input.batch_size``).
        model_dir: where ``eval/`` goes.

    The eval dataset is built and checked once (:meth:`dataset`); ``last`` is the last
    evaluation's ``results.json`` record.
    """

    def __init__(self, input_fn: Callable[..., Any], eval_input_fn: Callable[..., Any] | None,
                 params: dict[str, Any], model_dir: Path):
        self.input_fn, self.eval_input_fn, self.params = input_fn, eval_input_fn, params
        self.rc = params["runconfig"]
        self.model_dir = model_dir
        self.info: dict[str, Any] = {}  # the eval input's contract info (batch_size)
        self.last: dict[str, Any] | None = None
        self._ds: Any = None
        self._writer: Any = None

    def dataset(self) -> Any:
        """The checked eval ``tf.data.Dataset`` (built on the first call). Raises
        :class:`csrun_runtime.tensorflow.contract.Refused` with the contract violations."""

        if self._ds is None:
            if self.eval_input_fn is not None:
                problems = check_signature(self.eval_input_fn, "eval_input_fn")
                if problems:
                    raise Refused([f"eval_input: {m}" for m in problems])
            try:
                ds = build_eval_input(self.input_fn, self.params, self.eval_input_fn)
            except Exception as e:  # noqa: BLE001
                raise Refused([f"eval_input: the input function raised {type(e).__name__}: {e}"]) from None
            rep = check_dataset(ds, "eval", eval_steps=self.rc.get("eval_steps"),
                                batch_size=(self.params.get("eval_input") or {}).get("batch_size"))
            for w in rep.warnings:
                log.warning("%s", w)
            if not rep.ok:
                raise Refused(rep.violations)
            self._ds = ds
            self.info = rep.info["eval_input"]
        return self._ds

    def evaluate(self, model: keras.Model, step: int) -> dict[str, float]:
        """Evaluate ``model`` at global ``step`` (``runconfig.eval_steps`` batches, else the
        whole eval input); logs and writes the results (TensorBoard ``eval/``,
        ``eval/results.json`` with the last 100 in ``history``) and returns the metrics.
        Raises :class:`csrun_runtime.tensorflow.contract.Refused` when the eval input gives no batch."""
        ds = self.dataset()
        if self.rc.get("eval_steps"):
            ds = ds.take(int(self.rc["eval_steps"]))
        t = time.monotonic()
        # Keras' evaluate() without steps warns that a finite dataset "ran out of data"; a plain
        # loop over the test step accumulates the compiled metrics and counts the samples.
        model.make_test_function()
        model.reset_metrics()
        logs: dict[str, Any] = {}
        batches = samples = 0
        for x, y in ds:
            logs = model.test_function(iter([(x, y, None)]))
            batches += 1
            first = x if not isinstance(x, dict) else next(iter(x.values()))
            samples += int(first.shape[0])
        dt = time.monotonic() - t
        if not batches:
            raise Refused(["eval_input: the eval Dataset produced no batch"])
        res = {k: float(v) for k, v in logs.items()}
        log.info("Eval results at global step %d: %s (%d samples in %d batches, %.2f s)", step,
                 ", ".join(f"{k} = {v:.6g}" for k, v in res.items()), samples, batches, dt)
        self._write(res, step, samples, batches, dt)
        return res

    def _write(self, res: dict[str, float], step: int, samples: int, batches: int, dt: float) -> None:
        """The scalars of one evaluation in ``eval/`` and its record in ``eval/results.json``."""
        import tensorflow as tf

        if self._writer is None:
            self._writer = tf.summary.create_file_writer(str(self.model_dir / "eval"))
        with self._writer.as_default():
            for k, v in res.items():
                write_scalar(k, v, step)
        self._writer.flush()
        path = self.model_dir / "eval" / "results.json"
        prev = read_json(path) or {}
        history = prev.get("history", []) if isinstance(prev, dict) else []
        rec = {"global_step": step, "metrics": res, "eval_samples": samples,
               "eval_batches": batches, "time": round(dt, 4)}
        history.append(rec)
        write_json(path, {**rec, "history": history[-100:]})
        self.last = rec

    def verdict(self) -> None:
        """The verdict block of an ``eval`` run (docs/VERDICT.md): what was evaluated and how
        fast; an eval run trains nothing, so there is no input wait to judge."""
        rec = self.last or {}
        t = float(rec.get("time") or 0.0)
        n = int(rec.get("eval_samples") or 0)
        log.info("verdict (eval done): evaluated the checkpoint at global step %s: %d samples in %d batches "
                 "in %.3f s (%.1f samples/s)", rec.get("global_step"), n, int(rec.get("eval_batches") or 0), t,
                 n / t if t > 0 else 0.0)
        log.info("  no training in mode eval: input waits are judged on train runs; results in %s",
                 self.model_dir / "eval" / "results.json")
