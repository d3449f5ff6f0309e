"""The chief's training loop: chunks of batches from a :class:`csrun_runtime.service.BatchSource`,
several steps per call (:class:`csrun_runtime.steps.TrainSteps`), until the global step reaches
the training target, with the Model Zoo's logging, checkpoint and evaluation cadence, and the
measurements behind ``performance/performance.json``.

A chunk never crosses a step the loop must stop at: the first step (trained alone: it traces
and compiles), every multiple of ``checkpoint_steps`` and ``eval_frequency``, and the target.
Steps that log may fall inside a chunk: the call returns every step's loss, so each
``global_step = N, loss = X`` line and TensorBoard ``loss`` point is step N's own. So the log
lines, checkpoints, evaluations and the exact step count are those of a loop of single steps;
a stop between calls (:meth:`TrainingLoop.run`'s loop) lands between two chunks.

Log lines (the Cerebras document "Weight Streaming Quickstart" shows their form):
``global_step = N, loss = X``, ``Saving checkpoint at global step N``,
``Training finished with N samples in T seconds, S samples/second.``,
``Loss for final step: X.``

TensorFlow is imported inside the functions (see :mod:`csrun_runtime.worker`).
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from csrun_common.atomic import write_json

from . import preemption
from .artifacts import performance_record
from .autoscale import Autoscaler
from .params import training_target
from .service import BatchSource, Chunk, ServiceSource
from .steps import TrainSteps

if TYPE_CHECKING:
    from .chief import Chief

__all__ = ["TrainingLoop", "write_scalar"]

log = logging.getLogger("csrun.runtime")


def write_scalar(tag: str, value: float, step: int) -> None:
    """Write a TensorBoard scalar to the default summary writer with core TF ops only (the
    ``tensorboard`` package, which tf.summary's scalar() needs, is not installed with
    tensorflow-cpu here). The summary metadata names the ``scalars`` plugin, so TensorBoard
    shows it as a scalar."""
    import tensorflow as tf
    from tensorflow.core.framework import summary_pb2

    meta = summary_pb2.SummaryMetadata(
        plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"),
        data_class=summary_pb2.DATA_CLASS_SCALAR)
    tf.summary.write(tag, tf.constant(float(value), dtype=tf.float32), step=step, metadata=meta)


@dataclass
class LoopClock:
    """What the loop measures (monotonic seconds). The first step (trace and compile) is kept
    apart: ``waits``/``computes`` hold steps 2..N (a chunk's wait and compute time spread
    evenly over its steps); the TensorBoard window restarts at every logged step;
    ``chunk_steps`` counts the calls by chunk size."""

    waits: list[float] = field(default_factory=list)
    computes: list[float] = field(default_factory=list)
    t_first: float | None = None      # the first batch arrived
    t_first_end: float | None = None  # the first step ended
    t_end: float | None = None        # the last step ended
    first_step_time: float = 0.0
    programming_time: float = 0.0     # process start to the first step (s)
    eval_time: float = 0.0
    eval_time_after_first: float = 0.0
    win_t: float = 0.0
    win_samples: int = 0
    win_wait: float = 0.0
    chunk_steps: dict[int, int] = field(default_factory=dict)


class TrainingLoop:
    """Train ``chief``'s model from the restored global step to the target.

    Args:
        chief: the :class:`csrun_runtime.chief.Chief` (runconfig, model_dir, first-step XLA
            fallback, checkpoint saving, evaluation).
        model: the compiled ``keras.Model``.
        step_var: the ``tf.Variable`` global step (int64) saved in checkpoints.
        mgr: the ``tf.train.CheckpointManager``.
        source: where batches come from.
        batch_size: samples per batch (the input_fn contract fixes it).
        evaluating: ``train_and_eval``: evaluate every ``eval_frequency`` steps and at the end.

    Each call trains a chunk: at most ``runconfig.steps_per_execution`` steps (``auto``: as
    many as the element being handed out holds) and never past the next step the loop stops
    at (see the module docstring).
    """

    def __init__(self, chief: Chief, model: Any, step_var: Any, mgr: Any, source: BatchSource,
                 batch_size: int, evaluating: bool):
        self.chief, self.model, self.step_var, self.mgr = chief, model, step_var, mgr
        self.source, self.batch_size, self.evaluating = source, batch_size, evaluating
        rc = chief.rc
        self.start = int(step_var.numpy())
        self.target = training_target(self.start, rc)
        self.log_steps = int(rc["log_steps"])
        self.ckpt_steps = int(rc["checkpoint_steps"])
        self.eval_freq = rc.get("eval_frequency") if evaluating else None
        spe = rc.get("steps_per_execution", "auto")
        self.max_chunk = 1 << 30 if spe == "auto" else int(spe)
        self.first_timeout = float(rc["worker_start_timeout_secs"])
        self.timeout = float(rc["input_timeout_secs"])
        self.step = self.start
        self.last_saved: int | None = None
        self.loss = float("nan")
        self.clock = LoopClock()
        self.writer: Any = None
        self.steps_fn: TrainSteps | None = None
        self.autoscaler: Autoscaler | None = None
        if chief.autoscale is not None and isinstance(source, ServiceSource):
            self.autoscaler = Autoscaler(chief.autoscale, source, chief.addresses, chief.registry, batch_size)

    def run(self) -> None:
        """Train to the target, save the final checkpoint, write performance.json, and
        evaluate at the end when evaluating."""
        import tensorflow as tf

        if self.start >= self.target:
            log.info("global step %d already reached the training target %d; nothing to train",
                     self.start, self.target)
            if self.evaluating:
                self.chief.evaluate(self.model, self.start)
            return
        if self.chief.rc.get("save_initial_checkpoint"):
            self.chief.save(self.mgr, self.start)
            self.last_saved = self.start
        self.writer = tf.summary.create_file_writer(str(self.chief.model_dir))
        log.info("training from global step %d to %d (batch_size %d)", self.start, self.target,
                 self.batch_size)
        while self.step < self.target and not preemption.stop_requested():  # csrun_wse --requeue
            self._one_chunk()
        if self.step == self.start:  # stopped before the first step: nothing new to save
            self.source.close()
            self._record_allocation()
            return
        self._finish(time.monotonic())

    def _record_allocation(self) -> dict[str, Any]:
        """This allocation's steps in ``performance/allocations.json`` (:mod:`.preemption`);
        returns the keys performance.json gets."""
        c = self.chief
        first = c.t_proc + self.clock.programming_time if self.clock.t_first is not None else None
        stopped = preemption.stop_signal()
        if stopped:
            log.info("stopped by %s at global step %d: %s; exit status %d asks for a requeue", stopped, self.step,
                     "checkpoint saved" if self.step > self.start else "no step trained, the restored state stands",
                     preemption.REQUEUE_EXIT)
        alloc = preemption.Allocation(
            job_id=os.environ.get("SLURM_JOB_ID"), requeue=preemption.allocation_index(), node=c.role.node,
            start_step=self.start, end_step=self.step, target=self.target, stopped_by=stopped,
            process_start=c.t_proc, first_step_at=first, signal_at=preemption.stop_time(), ended_at=time.time())
        return preemption.record_allocation(c.model_dir, alloc, log.info)

    # ------------------------------------------------------------------ one chunk
    def _one_chunk(self) -> None:
        """Take a chunk, train its steps in one call (which advances the global step
        variable), log every step of it that logs, then checkpoint / evaluate when the chunk
        ended on such a step."""
        t0 = time.monotonic()
        chunk = self._next_chunk(self._chunk_limit())
        t1 = time.monotonic()
        logs, losses = self._train_on(chunk)
        t2 = time.monotonic()
        before, self.step = self.step, self.step + chunk.steps
        self._record(t0, t1, t2, chunk.steps)
        if self.autoscaler is not None and self.clock.t_first_end != t2:  # not the first step
            self.autoscaler.after_chunk(t1 - t0, t2 - t1, chunk.steps)
        self.loss = float(logs.get("loss", next(iter(logs.values()), float("nan"))))
        logged = [s for s in range(before + 1, self.step + 1) if self._logs_at(s)]
        for s in logged:
            self._log_step(s, losses[s - before - 1], last=s == logged[-1])
        if self.ckpt_steps and self.step % self.ckpt_steps == 0:
            self.chief.save(self.mgr, self.step)
            self.last_saved = self.step
        if self.eval_freq and self.step % self.eval_freq == 0 and self.step < self.target:
            self._evaluate_during_training()

    def _logs_at(self, step: int) -> bool:
        return step == self.start + 1 or step % self.log_steps == 0 or step == self.target

    def _chunk_limit(self) -> int:
        """Steps the next call may train: 1 for the first step, else up to
        ``steps_per_execution`` but never past the target or the next multiple of
        ``checkpoint_steps`` or ``eval_frequency`` (steps that need the model as it is then;
        a logged step inside a chunk gets its loss from the call)."""
        if self.clock.t_first is None:
            return 1
        limit = min(self.max_chunk, self.target - self.step)
        for every in (self.ckpt_steps, self.eval_freq):
            if every:
                limit = min(limit, every - self.step % every)
        return max(1, limit)

    def _next_chunk(self, limit: int) -> Chunk:
        if self.clock.t_first is None:
            return self.source.get_chunk(limit, self.first_timeout, "runconfig.worker_start_timeout_secs")
        return self.source.get_chunk(limit, self.timeout)

    def _train_on(self, chunk: Chunk) -> tuple[dict[str, float], list[float]]:
        if self.steps_fn is None:
            self.clock.t_first = time.monotonic()
            self.clock.programming_time = time.time() - self.chief.t_proc
            self.steps_fn = self.chief.train_steps(self.model, self.step_var)
        return self.steps_fn(chunk.batches, chunk.offset, chunk.steps)

    def _record(self, t0: float, t1: float, t2: float, steps: int) -> None:
        c = self.clock
        c.chunk_steps[steps] = c.chunk_steps.get(steps, 0) + 1
        if c.t_first_end is None:
            c.t_first_end = t2
            c.first_step_time = t2 - t1
            c.win_t = t2
            return
        c.waits.extend([(t1 - t0) / steps] * steps)
        c.computes.extend([(t2 - t1) / steps] * steps)
        c.win_samples += self.batch_size * steps
        c.win_wait += t1 - t0

    def _log_step(self, step: int, loss: float, last: bool) -> None:
        """The log line and the ``loss`` scalar of ``step``; at the ``last`` logged step of a
        chunk also the rate scalars of the window since the previous one."""
        c = self.clock
        log.info("global_step = %d, loss = %.6g", step, loss)
        with self.writer.as_default():
            write_scalar("loss", loss, step)
            if not last:
                return
            now = time.monotonic()
            if c.win_samples and now > c.win_t:
                write_scalar("samples_per_sec", c.win_samples / (now - c.win_t), step)
                write_scalar("input_wait_fraction", c.win_wait / (now - c.win_t), step)
            c.win_t, c.win_samples, c.win_wait = now, 0, 0.0

    def _evaluate_during_training(self) -> None:
        te = time.monotonic()
        self.chief.evaluate(self.model, self.step)
        dt = time.monotonic() - te
        self.clock.eval_time += dt
        if self.step > self.start + 1:
            self.clock.eval_time_after_first += dt
        self.clock.win_t = time.monotonic()

    # ------------------------------------------------------------------ the end
    def _finish(self, t_end: float) -> None:
        c = self.clock
        assert c.t_first is not None and c.t_first_end is not None  # at least one step ran
        c.t_end = t_end
        steps = self.step - self.start
        total_time = (t_end - c.t_first) - c.eval_time
        total_samples = steps * self.batch_size
        if self.last_saved != self.step:
            self.chief.save(self.mgr, self.step)
        self.writer.flush()
        desc = self.source.describe()
        if self.autoscaler is not None:
            desc["autoscale"] = self.autoscaler.describe()
        self.source.close()
        extra = {
            "global_step_start": self.start, "global_step_end": self.step,
            "xla": bool(self.model.jit_compile), "xla_note": self.chief.jit_note,
            "num_workers": self.chief.num_workers, **{k: v for k, v in desc.items() if k != "num_workers"},
            "mode": self.chief.mode, "eval_time": round(c.eval_time, 4),
            **self.chief.ingest_info,
            "steps_per_execution": {
                "setting": self.chief.rc.get("steps_per_execution", "auto"),
                "calls": sum(c.chunk_steps.values()),
                "mean_steps_per_call": round(steps / max(1, sum(c.chunk_steps.values())), 3),
                "calls_by_steps": {str(k): v for k, v in sorted(c.chunk_steps.items())}},
        }
        extra.update(self._record_allocation())
        rec = performance_record(
            batch_size=self.batch_size, steps=steps, total_time=total_time,
            first_step_time=c.first_step_time, compute_times=c.computes, wait_times=c.waits,
            loop_time_after_first=(t_end - c.t_first_end) - c.eval_time_after_first,
            programming_time=c.programming_time, extra=extra)
        write_json(self.chief.model_dir / "performance" / "performance.json", rec)
        self._log_summary(desc, steps, total_samples, total_time)
        if self.evaluating and not preemption.stop_requested():
            self.chief.evaluate(self.model, self.step)

    def _log_summary(self, desc: dict[str, Any], steps: int, total_samples: int, total_time: float) -> None:
        chief = self.chief
        if chief.rdv is not None:
            per = desc.get("batches_per_worker", {})
            nodes = desc.get("worker_nodes", {})
            log.info("batches received per input worker: %s",
                     ", ".join(f"{i} ({nodes.get(i)}): {n}" for i, n in per.items()))
            write_json(chief.rdv.dir / "chief.json", {**desc, "steps": steps})
        log.info("Training finished with %d samples in %.3f seconds, %.2f samples/second.",
                 total_samples, total_time, total_samples / total_time if total_time > 0 else 0.0)
        log.info("Loss for final step: %.6g.", self.loss)
        log.info("performance: %s", chief.model_dir / "performance" / "performance.json")
