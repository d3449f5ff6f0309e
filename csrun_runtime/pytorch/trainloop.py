"""The PyTorch chief's training loop: steps from a batch source until the target, a stop
signal or an error, with the timings performance.json and the verdict are made of.

:class:`TrainLoop` gets what it uses (the module, its optimizer, the batch source, the
runconfig, the model_dir, the device, an evaluate callback), not the chief;
:class:`StepClock` holds the timings (seconds, from ``time.monotonic``) and the live
log-interval window.
"""
from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from csrun_common.autoscale import AutoscaleSpec

from .. import preemption
from ..autoscale import Autoscaler
from . import checkpoint
from .contract import batch_size_of, to_torch
from .events import EventWriter

__all__ = ["LoopResult", "StepClock", "TrainLoop"]

log = logging.getLogger("csrun.runtime")


@dataclass
class StepClock:
    """Timings of one training run, in seconds (``time.monotonic``) unless said otherwise.

    ``waits``/``computes``: per step after the first, the time waiting for the batch and the
    time of the step (forward, backward, optimizer); ``first_step_time``: the first step's
    whole time (its wait included); ``eval_time``: evaluations during training (excluded from
    the rates); ``first_step_at``: wall-clock time (``time.time``) the first batch arrived.
    The window (``win_*``) is the live log interval's: samples and input wait since it began.
    """

    batch_size: int | None = None
    waits: list[float] = field(default_factory=list)
    computes: list[float] = field(default_factory=list)
    first_step_time: float = 0.0
    eval_time: float = 0.0
    eval_after_first: float = 0.0
    t_first: float | None = None
    t_first_end: float | None = None
    first_step_at: float | None = None
    win_t: float = field(default_factory=time.monotonic)
    win_samples: int = 0
    win_wait: float = 0.0

    def record(self, tw: float, tc: float, te: float) -> None:
        """One step: waited from ``tw`` to ``tc`` for its batch, computed until ``te``."""
        if self.t_first is None:
            self.t_first, self.t_first_end, self.first_step_time = tw, te, te - tw
        else:
            self.waits.append(tc - tw)
            self.computes.append(te - tc)
            self.win_wait += tc - tw
        self.win_samples += self.batch_size or 0

    def window(self, now: float) -> tuple[float, float]:
        """The window's (samples/s, input-wait fraction) up to ``now``; starts the next window."""
        dt = max(1e-9, now - self.win_t)
        out = (self.win_samples / dt, self.win_wait / dt)
        self.win_t, self.win_samples, self.win_wait = time.monotonic(), 0, 0.0
        return out

    def paused(self, seconds: float) -> None:
        """``seconds`` spent evaluating: kept out of the rates and of the window."""
        self.eval_time += seconds
        self.eval_after_first += seconds
        self.win_t += seconds


@dataclass
class LoopResult:
    """How a :meth:`TrainLoop.run` ended: the global steps (``start`` → ``step``, ``target``),
    the last checkpointed step, the last loss, ``ended`` (``"target reached"`` or
    ``"failed: ..."``), ``failed`` (the error's one line) and ``error`` (raised by the chief
    once performance.json is written)."""

    start: int
    target: int
    step: int
    clock: StepClock
    last_saved: int | None = None
    loss: float = float("nan")
    ended: str = "target reached"
    failed: str | None = None
    error: Exception | None = None


class TrainLoop:
    """Train ``model`` with ``opt`` on batches of ``source`` (``next() -> (nest | None, who)``).

    Every ``runconfig.log_steps`` a live line (the window's samples/s and input-wait %) and
    TensorBoard scalars; a checkpoint every ``checkpoint_steps``; ``evaluate(model, step)``
    every ``eval_frequency`` steps when given. SIGINT/SIGTERM and ``--requeue``'s signals are
    deferred (:func:`csrun_runtime.preemption.deferred`) and end the loop before the next step.

    With ``autoscale`` (``csrun_wse --autoscale``; ``source`` a
    :class:`csrun_runtime.pytorch.remote.RemoteSource` opened on the spec's first ``initial``
    slots) an :class:`csrun_runtime.autoscale.Autoscaler` over the source is made at the first
    step (the batch size known) and given every later step's input wait and compute seconds:
    it decides every ``window`` seconds of training, as after the TensorFlow loop's chunks
    (evaluations are not counted: they happen outside the steps' timings).
    """

    def __init__(self, *, model: Any, opt: Any, source: Any, rc: dict[str, Any], model_dir: Path, device: Any,
                 evaluate: Callable[[Any, int], Any] | None, forward_loss: Callable[[Any, Any], Any],
                 autoscale: AutoscaleSpec | None = None):
        self.model, self.opt, self.source, self.rc = model, opt, source, rc
        self.model_dir, self.device = model_dir, device
        self.evaluate, self.forward_loss = evaluate, forward_loss
        self.writer = EventWriter(model_dir)
        self.keep = int(rc["keep_checkpoint_max"])
        self.ck_steps, self.log_steps = int(rc["checkpoint_steps"]), int(rc["log_steps"])
        self.eval_every = int(rc["eval_frequency"]) if evaluate and rc.get("eval_frequency") else 0
        self.autoscale = autoscale
        self.autoscaler: Autoscaler | None = None

    def run(self, start: int, target: int) -> LoopResult:
        """Steps from global step ``start`` to ``target`` (or a stop signal, or the source's
        end). An error before the first step is raised (the writer closed); after it, it is
        returned in :class:`LoopResult` so that the chief writes performance.json first."""
        res = LoopResult(start=start, target=target, step=start, clock=StepClock())
        self.model.train()
        defer = preemption.deferred()  # SIGINT/SIGTERM and --requeue's signals: recorded, acted on here
        defer.__enter__()
        try:
            while res.step < target and not preemption.stop_requested():
                if not self._step(res):
                    break
        except Exception as e:
            res.error = e
            res.failed = f"{type(e).__name__}: {str(e).strip()[:300]}"
            res.ended = f"failed: {res.failed}"
            if res.clock.t_first is None:
                self.writer.close()
                raise
        finally:
            defer.__exit__(None, None, None)
        return res

    def _step(self, res: LoopResult) -> bool:
        """One training step and what follows it (log line, checkpoint, evaluation); False when
        the source has ended. Raises RuntimeError on a non-finite loss."""
        clock = res.clock
        tw = time.monotonic()
        nest, _who = self.source.next()
        if nest is None:
            return False
        tc = time.monotonic()
        if clock.first_step_at is None:
            clock.first_step_at = time.time()
        batch = to_torch(nest, self.device)
        if clock.batch_size is None:
            clock.batch_size = batch_size_of(batch) or 0
            log.info("batch_size %d", clock.batch_size)
        self.opt.zero_grad(set_to_none=True)
        loss = self.forward_loss(self.model, batch)
        loss.backward()
        self.opt.step()
        res.loss = float(loss.detach())
        te = time.monotonic()
        res.step += 1
        clock.record(tw, tc, te)
        if not math.isfinite(res.loss):
            raise RuntimeError(f"loss is {res.loss} at global step {res.step}")
        if self.autoscale is not None:
            self._autoscale_step(clock, tc - tw, te - tc)
        self._after_step(res, te)
        return True

    def _autoscale_step(self, clock: StepClock, wait_s: float, compute_s: float) -> None:
        """The autoscaler's share of a step (``wait_s`` seconds waiting for the batch,
        ``compute_s`` training on it): made at the first step, whose wait (the workers' start)
        is not judged; every later step is accounted, and a window's end decides and acts."""
        assert self.autoscale is not None
        if self.autoscaler is None:
            self.autoscaler = Autoscaler(self.autoscale, self.source, self.source.addresses, self.source.registry,
                                         clock.batch_size or 0)
            return
        self.autoscaler.after_chunk(wait_s, compute_s, 1)

    def describe_autoscale(self) -> dict[str, Any]:
        """performance.json's ``autoscale`` (:meth:`csrun_runtime.autoscale.Autoscaler.describe`)
        as ``{"autoscale": {...}}``; ``{}`` without ``--autoscale`` or before the first step."""
        return {} if self.autoscaler is None else {"autoscale": self.autoscaler.describe()}

    def _after_step(self, res: LoopResult, te: float) -> None:
        step, clock = res.step, res.clock
        if step % self.log_steps == 0 or step == res.target:
            rate, wait = clock.window(te)
            log.info("global_step = %d, loss = %.6g (%.1f samples/s, input wait %.1f %%)", step, res.loss,
                     rate, 100.0 * wait)
            self.writer.scalars({"loss": res.loss, "samples_per_sec": rate, "input_wait_fraction": wait}, step)
            self.writer.flush()
        if self.ck_steps and step % self.ck_steps == 0 and step < res.target:
            checkpoint.save(self.model_dir, step, self.model, self.opt, self.keep)
            res.last_saved = step
        if self.evaluate is not None and self.eval_every and step % self.eval_every == 0 and step < res.target:
            t_e = time.monotonic()
            self.evaluate(self.model, step)
            self.model.train()
            clock.paused(time.monotonic() - t_e)
