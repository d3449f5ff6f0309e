"""The TensorFlow chief's side of the training loop (:mod:`csrun_runtime.loop`, the core's
loop, drives it): chunks are :class:`csrun_runtime.tensorflow.service.Chunk` s of a
:class:`csrun_runtime.tensorflow.service.BatchSource` (one received element, bundled batches), several
steps per call (:class:`csrun_runtime.tensorflow.steps.TrainSteps`: one ``tf.function``/XLA call), the
chief's checkpoint and evaluation, TensorBoard scalars through ``tf.summary``.

TensorFlow is imported inside the functions (see :mod:`csrun_runtime.tensorflow.worker`).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from csrun_common.autoscale import AutoscaleSpec

from ..loop import LoopSetup, ScalarWriter, TrainingDriver
from ..rankgroup import LoopRanks
from .ranks import RankChunk
from .remote import DataplaneSource
from .service import ServiceSource
from .sources import BatchSource, Chunk
from .steps import StepLoss, TrainSteps

if TYPE_CHECKING:
    from ..rendezvous import Rendezvous
    from .ranks import TFRanks

__all__ = ["training_loop", "TFStepBackend", "LoopContext", "write_scalar"]


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
class LoopContext:
    """What the TensorFlow side of the training loop takes from the chief
    (:meth:`csrun_runtime.tensorflow.chief.Chief.loop_context`): values, and the chief's operations as
    callables, so that this module does not depend on :mod:`csrun_runtime.tensorflow.chief`.

    Attributes:
        rc: the resolved ``runconfig``; ``model_dir``: where checkpoints, events and
            ``performance/`` go; ``mode``: ``runconfig.mode``.
        t_proc: the chief's process start (``time.time()`` seconds); ``node``: its node.
        num_input_workers: input workers of the job (0: in-process pipeline).
        params_path: the params YAML the run read (for the verdict's cs_input_analyzer command).
        save: ``save(mgr, step)`` writes a checkpoint; ``evaluate(model, step)`` evaluates.
        train_steps: ``train_steps(model, step_var) -> TrainSteps``, with the first-step XLA fallback.
        jit_note: ``jit_note()``: the XLA note as it stands (the fallback may set it).
        ingest_info: what performance.json reports of the input path.
        rdv: the rendezvous (with input workers), for ``chief.json``.
        autoscale, addresses, registry: ``--autoscale``'s spec, every dispatcher address and
            the workers' registrations (:class:`csrun_runtime.autoscale.Autoscaler`).
        ranks: several trainer ranks' :class:`csrun_runtime.tensorflow.ranks.TFRanks` (the
            chunk agreement, and the core's :class:`csrun_runtime.rankgroup.LoopRanks` over it:
            the stop agreement, rank 0 writes, the ranks' figures), or ``None``.
    """

    rc: Mapping[str, Any]
    model_dir: Path
    mode: str
    t_proc: float
    node: str | None
    num_input_workers: int
    params_path: str | None
    save: Callable[[Any, int], None]
    evaluate: Callable[[Any, int], Any]
    train_steps: Callable[[Any, Any], TrainSteps]
    jit_note: Callable[[], str]
    ingest_info: Mapping[str, Any] = field(default_factory=dict)
    rdv: Rendezvous | None = None
    autoscale: AutoscaleSpec | None = None
    addresses: list[str] = field(default_factory=list)
    registry: dict[int, dict[str, Any]] = field(default_factory=dict)
    ranks: TFRanks | None = None



class TFStepBackend:
    """The TensorFlow :class:`csrun_runtime.loop.StepBackend`: chunks from ``source``
    (``get_chunk``), trained by the chief's :class:`csrun_runtime.tensorflow.steps.TrainSteps` (made at
    the first chunk, with the first-step XLA fallback), ``chief.save(mgr, step)``,
    ``chief.evaluate(model, step)``, scalars to a ``tf.summary`` file writer in the model_dir.

    Args:
        chief: the chief's :class:`LoopContext`; ``model``: the compiled ``keras.Model``;
        step_var: the ``tf.Variable`` global step (int64) saved in checkpoints; ``mgr``: the
        ``tf.train.CheckpointManager``; ``source``: where batches come from; ``batch_size``:
        samples per batch (the input_fn contract fixes it).
    """

    def __init__(self, chief: LoopContext, model: Any, step_var: Any, mgr: Any, source: BatchSource,
                 batch_size: int):
        self.chief, self.model, self.step_var, self.mgr = chief, model, step_var, mgr
        self.source = source
        self.batch_size: int | None = batch_size
        self.steps_fn: TrainSteps | None = None
        self.writer: Any = None

    def next_chunk(self, limit: int, timeout: float | None, what: str | None) -> Chunk | RankChunk:
        """``source.get_chunk(limit, timeout, what)``; with several trainer ranks this rank's
        chunk before the ranks agree on its steps (:meth:`csrun_runtime.tensorflow.ranks.TFRanks.next_chunk`)."""
        what = what or "runconfig.input_timeout_secs"
        if self.chief.ranks is not None:
            return self.chief.ranks.next_chunk(self.source, limit, float(timeout or 0), what)
        return self.source.get_chunk(limit, float(timeout or 0), what)

    def train(self, chunk: Chunk | RankChunk) -> tuple[StepLoss, list[StepLoss]]:
        """The chunk's steps in one call (which advances the global step variable); the losses
        stay tensors until the loop reads one (``float()``) at its logging cadence (issue 31:
        no host read per call). With several trainer ranks the ranks first agree on the steps
        (:meth:`csrun_runtime.tensorflow.ranks.TFRanks.settle`)."""
        if isinstance(chunk, RankChunk):
            assert self.chief.ranks is not None  # only TFRanks.next_chunk makes a RankChunk
            taken: Chunk = self.chief.ranks.settle(chunk)
        else:
            taken = chunk
        if self.steps_fn is None:
            self.steps_fn = self.chief.train_steps(self.model, self.step_var)
        _logs, losses = self.steps_fn(taken.batches, taken.offset, taken.steps)
        return losses[-1], losses

    def save(self, step: int) -> None:
        """The chief's checkpoint at ``step``."""
        self.chief.save(self.mgr, step)

    def evaluate(self, step: int) -> None:
        """The chief's evaluation at ``step``."""
        self.chief.evaluate(self.model, step)

    def open_events(self) -> ScalarWriter:
        """A ``tf.summary`` file writer in the model_dir; scalars with :func:`write_scalar`."""
        import tensorflow as tf

        self.writer = tf.summary.create_file_writer(str(self.chief.model_dir))

        def write(values: Mapping[str, float], step: int) -> None:
            with self.writer.as_default():
                for tag, value in values.items():
                    write_scalar(tag, value, step)
        return write

    def close_events(self) -> None:
        """Flush the writer (TensorFlow closes it at exit)."""
        if self.writer is not None:
            self.writer.flush()

    def end_input(self) -> None:
        """Close the source (tf.data service or data plane readers)."""
        self.source.close()

    def info(self) -> dict[str, Any]:
        """``xla`` (the model's jit_compile after any first-step fallback) and ``xla_note``."""
        return {"xla": bool(self.model.jit_compile), "xla_note": self.chief.jit_note()}


def training_loop(chief: LoopContext, model: Any, step_var: Any, mgr: Any, source: BatchSource,
                  batch_size: int, evaluating: bool) -> TrainingDriver:
    """The core's :class:`csrun_runtime.loop.TrainingDriver` over :class:`TFStepBackend`:
    from the global step in ``step_var`` to the target; ``evaluating``: ``train_and_eval``.
    ``--autoscale`` applies to the streamed sources only (service or data plane)."""
    streamed = isinstance(source, (ServiceSource, DataplaneSource))
    setup = LoopSetup(
        rc=chief.rc, model_dir=chief.model_dir, mode=chief.mode, start=int(step_var.numpy()), t_proc=chief.t_proc,
        node=chief.node, num_input_workers=chief.num_input_workers, params_path=chief.params_path,
        evaluating=evaluating,
        ingest_info=chief.ingest_info, rdv=chief.rdv, autoscale=chief.autoscale if streamed else None,
        addresses=chief.addresses, registry=chief.registry,
        ranks=LoopRanks(chief.ranks, chief.node) if chief.ranks is not None else None)
    return TrainingDriver(setup, TFStepBackend(chief, model, step_var, mgr, source, batch_size))
