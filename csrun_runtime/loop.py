"""The chief's training loop, for every framework: chunks of batches from the framework's
input, several steps per call, until the global step reaches the training target, with the
Model Zoo's logging, checkpoint and evaluation cadence and the measurements behind
``performance/performance.json`` and the verdict (docs/VERDICT.md).

The loop is the framework-neutral core's; what a framework does is behind
:class:`StepBackend` (the next chunk of batches, train its steps, save, evaluate, write
scalars): :mod:`csrun_runtime.tensorflow.training` is TensorFlow's (a chunk is one received element, its
steps one ``tf.function`` call), :mod:`csrun_runtime.pytorch.training` PyTorch's (a chunk is
one batch, one optimizer step). Imports neither TensorFlow nor PyTorch.

A chunk never crosses a step the loop must stop at: the first step (trained alone: it traces
and compiles), every multiple of ``checkpoint_steps`` and ``eval_frequency``, and the target.
Steps that log may fall inside a chunk: the call returns every step's loss, so each
``global_step = N, loss = X`` line and TensorBoard ``loss`` point is step N's own. So the log
lines, checkpoints, evaluations and the exact step count are those of a loop of single steps;
a stop between calls (:meth:`TrainingDriver.run`'s loop) lands between two chunks.

Log lines (the Cerebras document "Weight Streaming Quickstart" shows their form):
``global_step = N, loss = X``, ``Saving checkpoint at global step N``,
``Training finished with N samples in T seconds, S samples/second.``,
``Loss for final step: X.``; then the verdict block (:func:`csrun_runtime.artifacts.verdict_lines`):
steps, the steady-state rate with compile and programming time apart, the input-wait share and
whether training was input-bound -- also when a signal stopped it or it failed after its first
step. At each logged step that ends a call a live line gives the rate and input-wait share of
the current rate window (see :class:`LoopClock`).
"""
from __future__ import annotations

import logging
import os
import shlex
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, SupportsFloat

from csrun_common.atomic import write_json
from csrun_common.autoscale import AutoscaleSpec

from . import preemption, workernames
from .artifacts import PERFORMANCE_FIELDS, performance_record, verdict, verdict_lines, worker_rates
from .autoscale import Autoscaler
from .params import training_target
from .position import checkpoint
from .rankgroup import LoopRanks, rank_lines

if TYPE_CHECKING:
    from .rendezvous import Rendezvous

__all__ = ["TrainingDriver", "StepBackend", "LoopSetup", "LoopClock", "ended_text", "analyzer_command",
           "WINDOW_MIN_CALLS", "WINDOW_MIN_SECS", "WINDOW_MAX_SECS"]

log = logging.getLogger("csrun.runtime")

#: A rate window (the live line's and TensorBoard's ``samples_per_sec`` and
#: ``input_wait_fraction``) closes at a logged step once it holds at least WINDOW_MIN_CALLS
#: train calls and WINDOW_MIN_SECS seconds, or WINDOW_MAX_SECS seconds whatever its calls:
#: one call of many steps takes milliseconds while the wait for the next element falls in
#: another window, so windows of one call swung from 692 to 332,079 samples/s (issue 24).
WINDOW_MIN_CALLS = 4
WINDOW_MIN_SECS = 2.0
WINDOW_MAX_SECS = 10.0

#: ``write(values, step)``: TensorBoard scalars (tag -> value) at a global step.
ScalarWriter = Callable[[Mapping[str, float], int], None]


class StepBackend(Protocol):
    """What a framework gives the training loop (the rest of the loop is the core's).

    Attributes:
        source: the batch source: ``describe() -> dict`` (performance.json's input keys:
            ``batches_per_worker``, ``worker_nodes``, ...); with ``--autoscale`` also the
            stream API :class:`csrun_runtime.autoscale.Autoscaler` drives.
        batch_size: samples per batch, or ``None`` until the first chunk has been trained.
    """

    source: Any
    batch_size: int | None

    def next_chunk(self, limit: int, timeout: float | None, what: str | None) -> Any:
        """The next chunk of at most ``limit`` batches (an object with ``steps``, >= 1), waiting
        at most ``timeout`` seconds (``what`` names the setting, for the error), or ``None``
        when the input has ended. Raises the source's stall error."""

    def train(self, chunk: Any) -> tuple[SupportsFloat, Sequence[SupportsFloat]]:
        """Train the chunk's steps (the first call traces or compiles): returns the last
        step's loss and every step's loss, in order: floats, or values the loop reads with
        ``float()`` only at its logging cadence, a checkpoint and the end (a device tensor
        kept there: no host sync per step; reading one may raise the backend's non-finite
        loss error, naming the step)."""

    def save(self, step: int) -> None:
        """Write a checkpoint of the model (and optimizer) at global step ``step``."""

    def evaluate(self, step: int) -> None:
        """Evaluate the model as it is at global step ``step`` (eval results written)."""

    def open_events(self) -> ScalarWriter:
        """Open the TensorBoard event file; returns the scalar writer."""

    def close_events(self) -> None:
        """Flush (and close, where the framework needs it) the event file."""

    def end_input(self) -> None:
        """Training is over: release the input the framework no longer reads (or nothing,
        when the chief closes its source later)."""

    def info(self) -> dict[str, Any]:
        """performance.json's framework keys (``xla``, ``framework``, ``device``, ...)."""


@dataclass
class LoopSetup:
    """What the training loop takes from the chief: values only.

    Attributes:
        rc: the resolved ``runconfig``; ``model_dir``: where checkpoints, events and
            ``performance/`` go; ``mode``: ``runconfig.mode``; ``start``: the restored global step.
        t_proc: the chief's process start (``time.time()`` seconds); ``node``: its node.
        num_input_workers: input workers of the job (0: in-process input).
        params_path: the params YAML the run read (for the verdict's cs_input_analyzer command).
        evaluating: ``train_and_eval``: evaluate every ``eval_frequency`` steps and at the end.
        ingest_info: what performance.json reports of the input path.
        rdv: the rendezvous (with input workers), for ``chief.json``.
        autoscale, addresses, registry: ``--autoscale``'s spec (``None``: not autoscaled),
            every slot's address and the workers' registrations (:class:`csrun_runtime.autoscale.Autoscaler`).
        ranks: with several trainer ranks, the loop's side of the framework's
            :class:`csrun_runtime.rankgroup.RankGroup` (stop agreement, rank 0 writes, the
            ranks' figures); ``None`` with one.
    """

    rc: Mapping[str, Any]
    model_dir: Path
    mode: str
    start: int
    t_proc: float
    node: str | None
    num_input_workers: int
    params_path: str | None
    evaluating: bool
    ingest_info: Mapping[str, Any] = field(default_factory=dict)
    rdv: Rendezvous | None = None
    autoscale: AutoscaleSpec | None = None
    addresses: list[str] = field(default_factory=list)
    registry: dict[int, dict[str, Any]] = field(default_factory=dict)
    ranks: LoopRanks | None = None


def _no_scalars(values: Mapping[str, float], step: int) -> None:
    # the scalar writer of a rank that writes no events (not rank 0)
    pass


@dataclass
class LoopClock:
    """What the loop measures (monotonic seconds). The first step (trace and compile) is kept
    apart: ``waits``/``computes`` hold steps 2..N (a chunk's wait and compute time spread
    evenly over its steps); the rate window (``win_*``: since ``win_t``, from global step
    ``win_step``) closes as :data:`WINDOW_MIN_CALLS` says; ``chunk_steps`` counts the calls
    by chunk size."""

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
    win_calls: int = 0
    win_step: int = 0
    windows_written: int = 0  # rate points written to TensorBoard
    chunk_steps: dict[int, int] = field(default_factory=dict)

    def record(self, t0: float, t1: float, t2: float, steps: int, step: int, batch_size: int) -> None:
        """One call of ``steps`` steps that ended at global ``step``: asked for input at
        ``t0``, got it at ``t1``, trained until ``t2`` (monotonic s). The first call is the
        first step (kept apart); later ones go to the waits, computes and the rate window."""
        self.chunk_steps[steps] = self.chunk_steps.get(steps, 0) + 1
        if self.t_first_end is None:
            self.t_first_end = t2
            self.first_step_time = t2 - t1
            self.win_t, self.win_step = t2, step + 1
            return
        self.waits.extend([(t1 - t0) / steps] * steps)
        self.computes.extend([(t2 - t1) / steps] * steps)
        self.win_samples += batch_size * steps
        self.win_wait += t1 - t0
        self.win_calls += 1

    def add_eval(self, dt: float, after_first: bool) -> None:
        """An evaluation of ``dt`` seconds during training (``after_first``: after the first
        step ended, so inside the steady state's wall time, which leaves it out; the loop's
        evaluations all are, the first step's own included); the rate window leaves it out."""
        self.eval_time += dt
        if after_first:
            self.eval_time_after_first += dt
        self.win_t += dt

    def live_window(self, step: int, write: ScalarWriter) -> None:
        """At the last logged ``step`` of a call: the live line of the open rate window; when
        the window closes (:data:`WINDOW_MIN_CALLS`) its ``samples_per_sec`` and
        ``input_wait_fraction`` scalars go to ``write`` and a new one opens."""
        now = time.monotonic()
        dt = now - self.win_t
        if not self.win_samples or dt <= 0:
            return
        rate, wait = self.win_samples / dt, min(1.0, self.win_wait / dt)
        log.info("rate over global steps %d..%d (%.2f s, %d call(s)): %.1f samples/s, input wait %.1f %%",
                 self.win_step, step, dt, self.win_calls, rate, 100.0 * wait)
        if (self.win_calls >= WINDOW_MIN_CALLS and dt >= WINDOW_MIN_SECS) or dt >= WINDOW_MAX_SECS:
            write({"samples_per_sec": rate, "input_wait_fraction": wait}, step)
            self.windows_written += 1
            self.win_t, self.win_samples, self.win_wait, self.win_calls, self.win_step = now, 0, 0.0, 0, step + 1

    def calls(self, setting: Any, steps: int) -> dict[str, Any]:
        """performance.json's ``steps_per_execution`` of a run of ``steps`` steps: the
        ``setting``, the calls, their mean steps and the calls by steps per call."""
        return {
            "setting": setting,
            "calls": sum(self.chunk_steps.values()),
            "mean_steps_per_call": round(steps / max(1, sum(self.chunk_steps.values())), 3),
            "calls_by_steps": {str(k): v for k, v in sorted(self.chunk_steps.items())}}


def ended_text(failed: str | None = None) -> str:
    """performance.json's ``ended``: ``failed: ...``, ``stopped by SIGNAL`` or ``target reached``."""
    if failed:
        return f"failed: {failed}"
    stopped = preemption.stop_signal()
    return f"stopped by {stopped}" if stopped else "target reached"


def analyzer_command(params_path: str | None, target: float | None) -> str:
    """The cs_input_analyzer command an input-bound verdict suggests (README "cs_input_analyzer"):
    ``target`` samples/s (the train step's rate) and the run's params YAML."""
    cmd = ["cs_input_analyzer"]
    if target:
        cmd += ["--target-samples-per-sec", f"{target:.0f}"]
    cmd += ["python", sys.argv[0] if sys.argv and sys.argv[0] else "run.py"]
    if params_path:
        cmd += ["--params", params_path]
    return shlex.join([*cmd, "--mode", "validate_only"])


def record_allocation(s: LoopSetup, clock: LoopClock, start: int, step: int, target: int,
                      end_step: int | None = None, desc: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """This allocation's steps (``start``..``end_step``, default ``step``, of ``target``) and its
    input workers (``desc``: the source's description, :data:`.preemption.WORKER_KEYS`) in
    ``performance/allocations.json`` (:mod:`.preemption`), with the stop's log line when a
    signal stopped it; returns the keys performance.json gets."""
    first = s.t_proc + clock.programming_time if clock.t_first is not None else None
    stopped = preemption.stop_signal()
    if stopped:
        log.info("stopped by %s at global step %d: %s; exit status %d%s", stopped, step,
                 f"checkpoint model-ckpt-{step} saved" if step > start
                 else "no step trained, the restored state stands", preemption.exit_code(),
                 " asks for a requeue" if preemption.requeue_requested() else "")
    alloc = preemption.Allocation(
        job_id=os.environ.get("SLURM_JOB_ID"), requeue=preemption.allocation_index(), node=s.node,
        start_step=start, end_step=step if end_step is None else end_step, target=target, stopped_by=stopped,
        process_start=s.t_proc, first_step_at=first, signal_at=preemption.stop_time(), ended_at=time.time(),
        workers={k: (desc or {}).get(k) or [] for k in preemption.WORKER_KEYS})
    return preemption.record_allocation(s.model_dir, alloc, log.info)


class TrainingDriver:
    """Train from the restored global step (``setup.start``) to the target with a framework's
    :class:`StepBackend`, a chunk of steps per call (the module docstring); with ``setup.autoscale``
    an :class:`csrun_runtime.autoscale.Autoscaler` over ``backend.source``, once the batch size is known."""

    def __init__(self, setup: LoopSetup, backend: StepBackend):
        self.setup, self.backend = setup, backend
        rc = setup.rc
        self.start = setup.start
        self.target = training_target(self.start, rc)
        self.log_steps = int(rc["log_steps"])
        self.ckpt_steps = int(rc["checkpoint_steps"])
        self.eval_freq = rc.get("eval_frequency") if setup.evaluating else None
        spe = rc.get("steps_per_execution", "auto")
        self.max_chunk = 1 << 30 if spe in (None, "auto") else int(spe)
        self.first_timeout = rc.get("worker_start_timeout_secs")
        self.timeout = rc.get("input_timeout_secs")
        self.step = self.start
        self.last_saved: int | None = None
        self.loss: SupportsFloat = float("nan")
        self.clock = LoopClock()
        self.scalars: ScalarWriter | None = None
        self.autoscaler: Autoscaler | None = None
        self.ranks = setup.ranks
        self.writes = self.ranks is None or self.ranks.writes  # rank 0 (or the only chief) writes
        self.positions = getattr(backend.source, "positions", None)  # the input streams' (.position)
        self.end_positions: dict[int, int] | None = None  # the job's, at the last checkpoint
        if setup.autoscale is not None and backend.batch_size:
            self._start_autoscaler(backend.batch_size)

    def _start_autoscaler(self, batch_size: int) -> None:
        assert self.setup.autoscale is not None
        self.autoscaler = Autoscaler(self.setup.autoscale, self.backend.source, self.setup.addresses,
                                     self.setup.registry, batch_size)

    @property
    def batch_size(self) -> int:
        """Samples per batch (0 before the backend knows it)."""
        return self.backend.batch_size or 0

    def run(self) -> None:
        """Train to the target, save, write performance.json and the verdict (after a failure past step 1 too,
        ``ended: failed: ...``), evaluate at the end; stops between two calls at a stop signal (``deferred``)."""
        with preemption.deferred():
            self._run()

    def _run(self) -> None:
        s, b = self.setup, self.backend
        if self.start >= self.target:
            log.info("global step %d already reached the training target %d; nothing to train",
                     self.start, self.target)
            if s.evaluating and self.writes:
                b.evaluate(self.start)
            return
        if s.rc.get("save_initial_checkpoint"):
            self._save(self.start)
        self.scalars = b.open_events() if self.writes else _no_scalars
        log.info("training from global step %d to %d%s", self.start, self.target,
                 f" (batch_size {b.batch_size})" if b.batch_size else "")
        try:
            while self.step < self.target and (self.ranks is not None or not preemption.stop_requested()):
                if not self._one_chunk():
                    break
            self.loss = float(self.loss)  # the end reads the last loss (a backend's check may raise)
        except Exception as e:
            if self.clock.t_first_end is not None:  # a step was trained: say what it measured
                try:
                    first_line = (str(e).strip().splitlines() or [""])[0]
                    self._finish(time.monotonic(), failed=f"{type(e).__name__}: {first_line[:120]}")
                except Exception:  # noqa: BLE001  (the original error is the one to report)
                    log.debug("writing the verdict of a failed run failed", exc_info=True)
            else:
                b.close_events()
            raise
        if self.clock.t_first_end is None:  # stopped before the first step: nothing new to save
            stopped_before_first_step(self.setup, self.backend, self.clock, self.start, self.step, self.target,
                                      self.writes)
            return
        self._finish(time.monotonic())

    # ------------------------------------------------------------------ one chunk
    def _one_chunk(self) -> bool:
        """Take a chunk, train its steps in one call, log every step of it that logs, then
        checkpoint / evaluate when the chunk ended on such a step. False: the input ended."""
        t0 = time.monotonic()
        chunk, interrupted = None, False
        try:
            with preemption.waiting_for_input():  # a stop signal ends the wait: stop at this step
                chunk = self._next_chunk(self._chunk_limit())
        except preemption.Interrupted:
            interrupted = True
        if self.ranks is not None and not self.ranks.go_on(chunk is None and not interrupted):
            return False  # a signal or an input end on any rank: all stop before this chunk (not trained)
        if chunk is None:
            return interrupted
        t1 = time.monotonic()
        if self.clock.t_first is None:
            self.clock.t_first = t1
            self.clock.programming_time = time.time() - self.setup.t_proc
        self.loss, losses = self.backend.train(chunk)
        if self.positions is not None:  # trained: its stream's position moves on
            self.positions.trained(getattr(chunk, "worker", None), chunk.steps)
        t2 = time.monotonic()
        before, self.step = self.step, self.step + chunk.steps
        first = self.clock.t_first_end is None
        sync = self.ranks.last_sync if self.ranks else 0.0  # the agreement's wait for the other ranks: apart
        self.clock.record(t0 + sync, t1, t2, chunk.steps, self.step, self.batch_size)
        self._autoscale_after(first, t1 - t0, t2 - t1, chunk.steps)
        logged = [s for s in range(before + 1, self.step + 1) if self._logs_at(s)]
        for s in logged:
            self._log_step(s, losses[s - before - 1], last=s == logged[-1])
        if self.ckpt_steps and self.step % self.ckpt_steps == 0:
            self._save(self.step)
        if self.eval_freq and self.step % self.eval_freq == 0 and self.step < self.target and self.writes:
            te = time.monotonic()
            self.backend.evaluate(self.step)
            # after the first step's end even at the first step: inside the steady state's wall time
            self.clock.add_eval(time.monotonic() - te, True)
        return True

    def _save(self, step: int) -> None:
        """A checkpoint at ``step``, on every rank at the same steps (:func:`.position.checkpoint`);
        with several ranks first their statistics made the same
        (:meth:`csrun_runtime.rankgroup.LoopRanks.before_save`)."""
        if self.ranks is not None:
            self.ranks.before_save()
        self.end_positions = checkpoint(self.positions, self.setup.model_dir, step, self.ranks, self.writes,
                                        self.backend.save) or self.end_positions
        self.last_saved = step

    def _autoscale_after(self, first: bool, wait_s: float, compute_s: float, steps: int) -> None:
        """The autoscaler's share of a chunk: made at the first one when the batch size was not
        known before, whose wait (the workers' start) is never judged."""
        if self.setup.autoscale is None:
            return
        if self.autoscaler is None:
            if self.batch_size:
                self._start_autoscaler(self.batch_size)
            return
        if not first:
            self.autoscaler.after_chunk(wait_s, compute_s, steps)

    def _logs_at(self, step: int) -> bool:
        return step == self.start + 1 or step % self.log_steps == 0 or step == self.target

    def _chunk_limit(self) -> int:
        """Steps the next call may train: 1 for the first step, else up to ``steps_per_execution``,
        never past the target or the next multiple of ``checkpoint_steps`` or ``eval_frequency``."""
        if self.clock.t_first is None:
            return 1
        limit = min(self.max_chunk, self.target - self.step)
        for every in (self.ckpt_steps, self.eval_freq):
            if every:
                limit = min(limit, every - self.step % every)
        return max(1, limit)

    def _next_chunk(self, limit: int) -> Any:
        if self.clock.t_first is None:
            return self.backend.next_chunk(limit, self.first_timeout, "runconfig.worker_start_timeout_secs")
        return self.backend.next_chunk(limit, self.timeout, "runconfig.input_timeout_secs")

    def _log_step(self, step: int, loss: SupportsFloat, last: bool) -> None:
        """The log line and ``loss`` scalar of ``step`` (``float()`` may raise the backend's
        non-finite loss error); at a chunk's ``last`` logged step also the rate window's live line."""
        assert self.scalars is not None
        value = float(loss)
        log.info("global_step = %d, loss = %.6g", step, value)
        self.scalars({"loss": value}, step)
        if last:
            self.clock.live_window(step, self.scalars)

    # ------------------------------------------------------------------ the end
    def _finish(self, t_end: float, failed: str | None = None) -> None:
        """The end of training (target reached, stopped by a signal, or ``failed`` after its
        first step): the final checkpoint (not after a failure), performance.json, the log's
        summary and the verdict block; the final evaluation when evaluating."""
        c, s, b = self.clock, self.setup, self.backend
        assert c.t_first is not None and c.t_first_end is not None  # at least one step ran
        c.t_end = t_end
        steps = self.step - self.start
        if self.last_saved != self.step and failed is None:
            self._save(self.step)
        desc = workernames.renumber(b.source.describe())  # job-wide indices with several ranks
        if self.autoscaler is not None:
            desc["autoscale"] = self.autoscaler.describe()
        b.end_input()
        rec, v, total_time = self._performance(desc, steps, t_end, failed)
        world = self.ranks.gather(rec) if self.ranks is not None and failed is None else None
        if not self.writes:  # a rank other than 0: its figures went to rank 0, it writes nothing
            b.close_events()
            log_summary(s, desc, steps, 0, 0.0, self.loss, quiet=True)
            return
        if world is not None:
            rec.update(world)
            rec["fields"] = {k: d for k, d in PERFORMANCE_FIELDS.items() if k in rec}
        if not c.windows_written and self.scalars is not None and v["steady_samples_per_sec"] is not None:
            # a run shorter than one rate window: its steady state
            self.scalars({"samples_per_sec": v["steady_samples_per_sec"],
                          "input_wait_fraction": v["input_wait_fraction"]}, self.step)
        b.close_events()
        write_json(s.model_dir / "performance" / "performance.json", rec)
        if failed is None:
            log_summary(s, desc, steps, steps * self.batch_size, total_time, self.loss)
        say_verdict(v, steps=steps, start=self.start, end=self.step, batch_size=self.batch_size,
                    steady_time=rec["steady_time"], compile_time=rec["compile_time"],
                    compute_rate=rec.get("est_samples_per_sec") if c.computes else None,
                    programming_time=c.programming_time,
                    rank_wait=self.ranks.rank_wait_fraction(rec["steady_time"]) if self.ranks else None)
        for line in rank_lines(world) if world is not None else []:
            log.info("%s", line)
        if s.evaluating and failed is None and not preemption.stop_requested():
            b.evaluate(self.step)

    def _performance(self, desc: dict[str, Any], steps: int, t_end: float,
                     failed: str | None) -> tuple[dict[str, Any], dict[str, Any], float]:
        """performance.json's record, the verdict and the total time (seconds, evaluations
        left out) of ``steps`` steps that ended at ``t_end`` (monotonic s); a failed run's
        allocation ends at its last checkpoint."""
        c, s = self.clock, self.setup
        assert c.t_first is not None and c.t_first_end is not None
        total_time = (t_end - c.t_first) - c.eval_time
        extra = {"global_step_start": self.start, "global_step_end": self.step, **self.backend.info(),
                 "num_workers": s.num_input_workers, **{k: v for k, v in desc.items() if k != "num_workers"},
                 "mode": s.mode, "eval_time": round(c.eval_time, 4), **s.ingest_info,
                 "steps_per_execution": c.calls(s.rc.get("steps_per_execution", "auto"), steps)}
        if self.positions is not None:
            extra["input_positions"] = self.positions.describe(self.end_positions)
        end = None if failed is None else (self.last_saved if self.last_saved is not None else self.start)
        if self.writes:  # performance/allocations.json: rank 0's
            extra.update(record_allocation(s, c, self.start, self.step, self.target, end_step=end, desc=desc))
        steady_time = (t_end - c.t_first_end) - c.eval_time_after_first
        rates = worker_rates(desc.get("batches_per_worker") or {}, self.batch_size, steady_time)
        rec = performance_record(
            batch_size=self.batch_size, steps=steps, total_time=total_time,
            first_step_time=c.first_step_time, compute_times=c.computes, wait_times=c.waits,
            loop_time_after_first=steady_time, programming_time=c.programming_time, extra=extra)
        v = verdict(steps=steps, steady_steps=steps - 1, steady_time=steady_time,
                    steady_calls=sum(c.chunk_steps.values()) - 1, batch_size=self.batch_size,
                    wait_fraction=rec["input_wait_fraction"], rates=rates, nodes=desc.get("worker_nodes"),
                    ended=ended_text(failed),
                    analyzer_command=analyzer_command(s.params_path, rec.get("est_samples_per_sec")))
        rec.update({"verdict": v, "ended": v["ended"], "steady_steps": steps - 1,
                    "steady_time": round(steady_time, 4), "steady_samples_per_sec": v["steady_samples_per_sec"],
                    "worker_samples_per_sec": rates, "stopped_by": preemption.stop_signal()})
        rec["fields"] = {k: d for k, d in PERFORMANCE_FIELDS.items() if k in rec}
        return rec, v, total_time


def stopped_before_first_step(s: LoopSetup, b: StepBackend, clock: LoopClock, start: int, step: int, target: int,
                              writes: bool = True) -> None:
    """A stop signal before the first step: the allocation record and a performance.json
    that says so (no checkpoint: the restored state stands); nothing written when not
    ``writes`` (a trainer rank other than 0)."""
    desc = b.source.describe()
    b.end_input()
    b.close_events()
    if not writes:
        return
    batch_size = b.batch_size or 0
    extra = record_allocation(s, clock, start, step, target, desc=desc)
    v = verdict(steps=0, steady_steps=0, steady_time=0.0, steady_calls=0, batch_size=batch_size,
                wait_fraction=0.0, ended=ended_text())
    say_verdict(v, steps=0, start=start, end=step, batch_size=batch_size, steady_time=0.0,
                compile_time=0.0, compute_rate=None)
    write_json(s.model_dir / "performance" / "performance.json",
               {"verdict": v, "ended": v["ended"], "steps": 0, "global_step_start": start,
                "global_step_end": step, "mode": s.mode, **b.info(), **desc, **extra})


def say_verdict(v: dict[str, Any], *, steps: int, start: int, end: int, batch_size: int, steady_time: float,
                compile_time: float, compute_rate: float | None, programming_time: float = 0.0,
                rank_wait: float | None = None) -> None:
    """Log the verdict block (:func:`csrun_runtime.artifacts.verdict_lines`) of ``steps`` steps
    from global step ``start`` to ``end``; its input-bound line as a warning. ``rank_wait``:
    the share waited for the other trainer ranks (several ranks)."""
    for line in verdict_lines(v, steps=steps, start_step=start, end_step=end, batch_size=batch_size,
                              steady_steps=max(0, steps - 1), steady_time=steady_time, compile_time=compile_time,
                              programming_time=programming_time, compute_samples_per_sec=compute_rate,
                              rank_wait_fraction=rank_wait):
        (log.warning if v.get("bound") == "input" and line.startswith("  input-bound") else log.info)("%s", line)


def log_summary(s: LoopSetup, desc: dict[str, Any], steps: int, total_samples: int, total_time: float,
                loss: SupportsFloat, quiet: bool = False) -> None:
    """The end of a training run in the log (the Model Zoo's two lines, ``total_time`` seconds)
    and, with input workers, the batches each sent and ``chief.json`` in the rendezvous (the
    rank's own, with several trainer ranks); ``quiet`` (a rank other than 0): only those."""
    if s.rdv is not None:
        per = desc.get("batches_per_worker", {})
        nodes = desc.get("worker_nodes", {})
        log.info("batches received per input worker: %s",
                 ", ".join(f"{i} ({nodes.get(i)}): {n}" for i, n in per.items()))
        s.rdv.write("chief.json", {**desc, "steps": steps})
    if quiet:
        return
    log.info("Training finished with %d samples in %.3f seconds, %.2f samples/second.",
             total_samples, total_time, total_samples / total_time if total_time > 0 else 0.0)
    log.info("Loss for final step: %.6g.", float(loss))
    log.info("performance: %s", s.model_dir / "performance" / "performance.json")
