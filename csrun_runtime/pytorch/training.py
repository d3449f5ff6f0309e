"""The PyTorch chief's side of the training loop (:mod:`csrun_runtime.loop`, the core's loop,
drives it, as it drives TensorFlow's): a chunk is one batch of the batch source, a step one
forward, backward and optimizer step, on the chief's device (batches moved with
:func:`.contract.to_torch`: pinned memory and ``non_blocking`` on CUDA); checkpoints
``model-ckpt-<step>.pt`` (:mod:`.checkpoint`), TensorBoard scalars through :mod:`.events`.

:class:`TorchStepBackend` gets what it uses (the module, its optimizer, the batch source, the
runconfig, the model_dir, the device, an evaluate callback), not the chief.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..loop import ScalarWriter
from . import checkpoint
from .contract import ContractError, batch_size_of, to_torch
from .events import EventWriter
from .ranks import ddp_misuse

__all__ = ["TorchStepBackend", "OneBatch", "LossTracker", "DeviceLoss"]

log = logging.getLogger("csrun.runtime")


@dataclass
class OneBatch:
    """A chunk of the PyTorch loop: one batch (a nest of numpy arrays or tensors) from input
    worker ``who`` (its index, or ``"in-process"``)."""

    nest: Any
    who: Any
    steps: int = 1

    @property
    def worker(self) -> Any:
        """The input worker's slot (the loop moves its stream's position: :mod:`csrun_runtime.position`)."""
        return self.who


class LossTracker:
    """The training losses kept on the device: no step reads one on the host. It keeps the
    first global step whose loss was not finite, and that loss, as device tensors (a few
    element-wise ops a step, no sync); :meth:`check` reads them (``.item()``: a host sync)."""

    def __init__(self) -> None:
        self.bad: Any = None        # int64 scalar tensor: first non-finite step, 0: none
        self.bad_value: Any = None  # that step's loss
        self.checked_to = 0         # steps read already

    def add(self, loss: Any, step: int) -> DeviceLoss:
        """Record global ``step``'s scalar ``loss`` tensor; returns its :class:`DeviceLoss`."""
        import torch

        with torch.no_grad():
            x = loss.detach().float()
            if self.bad is None:
                self.bad = torch.zeros((), dtype=torch.int64, device=x.device)
                self.bad_value = torch.zeros((), dtype=x.dtype, device=x.device)
            first = (~torch.isfinite(x)) & (self.bad == 0)
            self.bad = self.bad + first.to(torch.int64) * step
            self.bad_value = torch.where(first, x, self.bad_value)
        return DeviceLoss(x, step, self)

    def check(self, step: int) -> None:
        """At global ``step`` (a log line, a checkpoint, the end): raise RuntimeError ``loss
        is nan at global step N (read at global step M)`` when a loss up to here was not finite."""
        if self.bad is None or self.checked_to >= step:
            return
        bad = int(self.bad.item())  # the device may be ahead: a later step's is not this read's
        if not bad or bad > step:
            self.checked_to = step
            return
        if bad:
            raise RuntimeError(f"loss is {float(self.bad_value.item())} at global step {bad}"
                               + ("" if bad == step else f" (read at global step {step})"))


class DeviceLoss:
    """One step's loss, on the device until ``float()`` reads it (a host sync), which first
    checks every loss so far (:meth:`LossTracker.check`: RuntimeError on a non-finite one)."""

    __slots__ = ("tensor", "step", "tracker")

    def __init__(self, tensor: Any, step: int, tracker: LossTracker):
        self.tensor, self.step, self.tracker = tensor, step, tracker

    def __float__(self) -> float:
        self.tracker.check(self.step)
        return float(self.tensor.item())

    def __repr__(self) -> str:
        return f"DeviceLoss(step={self.step})"


class TorchStepBackend:
    """The PyTorch :class:`csrun_runtime.loop.StepBackend`.

    Args:
        model, opt: the ``nn.Module`` on ``device`` and its optimizer.
        source: the batch source, ``next() -> (nest | None, who)`` (``None``: the input ended),
            ``describe()``; with ``--autoscale`` a :class:`csrun_runtime.pytorch.remote.RemoteSource`.
        rc: the resolved ``runconfig`` (``keep_checkpoint_max``); ``model_dir``: checkpoints and events.
        evaluate: ``evaluate(model, step)`` (the model is put back in training mode after it).
        forward_loss: ``forward_loss(model, batch) -> scalar loss tensor``.
        start: the restored global step; ``info``: performance.json's extra keys at the end
            (``chief_input``, ...).
        scheduler: a learning-rate scheduler stepped after every optimizer step (the schedule of
            ``optimizer.learning_rate``, :func:`.contract.build_lr_scheduler`), or None.
        module: the module checkpoints and evaluations take when ``model`` wraps it (several
            trainer ranks: ``model`` is its ``DistributedDataParallel``); default ``model``.

    Each chunk is one batch (``steps_per_execution`` does not apply: a PyTorch step is one
    Python call anyway). No host sync in the step: :meth:`train` returns the loss as a
    :class:`DeviceLoss` that stays on the device until the loop reads it (``float()``) at its
    logging cadence, a checkpoint or the end; a non-finite loss raises RuntimeError there,
    naming the first step whose loss was not finite (:class:`LossTracker`).
    """

    def __init__(self, *, model: Any, opt: Any, source: Any, rc: Mapping[str, Any], model_dir: Path, device: Any,
                 evaluate: Callable[[Any, int], Any], forward_loss: Callable[[Any, Any], Any],
                 start: int = 0, info: Callable[[], dict[str, Any]] = dict, scheduler: Any = None,
                 module: Any = None):
        self.model, self.opt, self.source, self.rc = model, opt, source, rc
        self.module = model if module is None else module
        self.scheduler = scheduler
        self.model_dir, self.device = model_dir, device
        self._evaluate, self.forward_loss, self._info = evaluate, forward_loss, info
        self.keep = int(rc["keep_checkpoint_max"])
        self.step = start  # the global step the model is at
        self.batch_size: int | None = None
        self.writer: EventWriter | None = None
        self.losses = LossTracker()
        self.model.train()

    def next_chunk(self, limit: int, timeout: float | None, what: str | None) -> OneBatch | None:
        """The source's next batch (its timeout: ``runconfig.input_timeout_secs``); a :class:`.devicefeed.DeviceFeed`'s
        is on the device already (the wait for its queue and copy event counted here)."""
        nest, who = self.source.next()
        return None if nest is None else OneBatch(nest, who)

    def train(self, chunk: OneBatch) -> tuple[DeviceLoss, list[DeviceLoss]]:
        """One optimizer step on the chunk's batch, moved to the device. Raises
        :class:`.contract.ContractError` for DistributedDataParallel's unused-parameter error
        (:func:`.ranks.ddp_misuse`)."""
        batch = to_torch(chunk.nest, self.device)
        if self.batch_size is None:
            self.batch_size = batch_size_of(batch) or 0
            log.info("batch_size %d", self.batch_size)
        self.opt.zero_grad(set_to_none=True)
        try:
            loss = self.forward_loss(self.model, batch)
            loss.backward()
        except RuntimeError as e:  # several ranks: DDP's unused-parameter error is one line naming the key
            hint = ddp_misuse(e, self.module) if self.module is not self.model else None
            if hint is None:
                raise
            raise ContractError(hint) from None
        self.opt.step()
        if self.scheduler is not None:
            self.scheduler.step()
        self.step += 1
        value = self.losses.add(loss, self.step)  # stays on the device: no host sync here
        return value, [value]

    def save(self, step: int) -> None:
        """``model-ckpt-<step>.pt`` (model, optimizer, global step), ``keep_checkpoint_max`` kept.
        Raises RuntimeError when a step's loss was not finite (read here: a checkpoint reads
        the loss, as a log line does)."""
        self.losses.check(step)
        p = checkpoint.save(self.model_dir, step, self.module, self.opt, self.keep)
        log.info("saved %s", p)

    def evaluate(self, step: int) -> None:
        """The eval loader's metrics at ``step``; back in training mode after."""
        self._evaluate(self.module, step)
        self.model.train()

    def open_events(self) -> ScalarWriter:
        """A TensorBoard event file in the model_dir (:class:`.events.EventWriter`)."""
        self.writer = EventWriter(self.model_dir)
        writer = self.writer

        def write(values: Mapping[str, float], step: int) -> None:
            writer.scalars(dict(values), step)
            writer.flush()
        return write

    def close_events(self) -> None:
        """Close the event file."""
        if self.writer is not None:
            self.writer.close()

    def end_input(self) -> None:
        # nothing: the chief closes its source after done.json, so that the input workers read its status first
        pass

    def info(self) -> dict[str, Any]:
        """``framework``, ``device`` and the chief's ``info()`` keys (the device feed's: in the source's)."""
        return {"framework": "pytorch", "device": str(self.device), **self._info()}
