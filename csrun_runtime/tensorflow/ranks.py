"""Several trainer ranks of the TensorFlow chief: ``tf.distribute.MultiWorkerMirroredStrategy``.

A job of several trainer ranks (``CSRUN_WORLD_SIZE > 1``, docs/MULTI-RANK.md) runs one chief
per rank; its task has a ``TF_CONFIG`` whose cluster is the chief ranks
(:func:`csrun_common.ranks.trainer_env`, set by :mod:`csrun_runtime.supervise`). Each rank:

* makes the strategy (:class:`TFRanks`) before any other TensorFlow op: the strategy enables
  TensorFlow's collective ops in the eager context (``MultiWorkerMirroredStrategy`` "should be
  created at program startup"); the collectives are ``AUTO``: TensorFlow picks ``RING``
  (gRPC) on CPUs, ``NCCL`` for GPU all-reduces;
* builds the model and its optimizer under ``strategy.scope()`` (mirrored variables, the
  initial values broadcast from worker 0) and trains each step through ``strategy.run`` on its
  own local batch (:func:`csrun_runtime.tensorflow.steps.TrainSteps` with a strategy): Keras'
  optimizer all-reduces the gradients, so every rank's weights stay the same;
* takes part in the core's stop agreement before each chunk (:mod:`csrun_runtime.rankgroup`,
  :meth:`TFRanks.agree`), then agrees with the others on how many steps the chunk trains
  (:meth:`TFRanks.settle`: the minimum of the steps every rank has at hand, the rest of an
  element stays for the next chunk), so all ranks run the same collectives in the same order;
* gathers every rank's figures at the end (:meth:`TFRanks.gather`) and the digest of its final
  weights (:meth:`TFRanks.digest`).

Only rank 0 (MWMS's chief, worker 0) writes checkpoints, events, performance.json and
evaluates, on an undistributed copy of the model (:meth:`TFRanks.eval_model`), so no
collective runs on one rank alone.

TensorFlow is imported inside the functions (see :mod:`csrun_runtime.tensorflow.worker`).
"""
from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from typing import Any

from csrun_common.roles import Role

from .. import preemption
from ..rankgroup import RankLost
from ..rankgroup import weights_digest as digest_of

__all__ = ["TFRanks", "RankChunk", "RANKS_NO_XLA", "RankSetupError", "weights_digest", "synchronize_batchnorm"]

log = logging.getLogger("csrun.runtime")

#: The XLA note of a trainer rank of several (``runconfig.jit_compile`` auto or true).
RANKS_NO_XLA = "several trainer ranks: each step is a strategy.run, without XLA"


class RankSetupError(RuntimeError):
    """The strategy over the trainer ranks could not be made (the message names TF_CONFIG or
    the setting)."""


def weights_digest(variables: Any) -> str:
    """:func:`csrun_runtime.rankgroup.weights_digest` of ``variables`` (Keras variables: each
    one's value as stored, by its path)."""
    values = ((v.path, v.numpy()) for v in variables)
    return digest_of((name, str(a.dtype), tuple(a.shape), a.tobytes()) for name, a in values)


def _is_batchnorm(layer: Any) -> bool:
    return type(layer).__name__ == "BatchNormalization" and hasattr(layer, "synchronized")


def synchronize_batchnorm(model: Any) -> int:
    """``synchronized = True`` on every Keras ``BatchNormalization`` layer of ``model`` (nested
    ones too; Keras reads it when the layer is called, "Only applicable with the TensorFlow
    backend": its moments all-reduced across replicas). Returns how many layers."""
    layers = [layer for layer in model._flatten_layers(include_self=False) if _is_batchnorm(layer)]  # Keras' walk
    for layer in layers:
        layer.synchronized = True
    return len(layers)


def _strategy() -> Any:
    """``MultiWorkerMirroredStrategy`` from ``TF_CONFIG``, collectives ``AUTO`` (``RING`` on CPUs,
    ``NCCL`` on GPUs), without a per-collective timeout (see :class:`TFRanks`). Raises
    :class:`RankSetupError` when ``TF_CONFIG`` is not set."""
    import tensorflow as tf

    if not os.environ.get("TF_CONFIG"):
        raise RankSetupError("TF_CONFIG is not set: a trainer rank of several needs the ranks' cluster "
                             "(csrun_runtime.supervise sets it in a csrun_wse task)")
    opts = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.AUTO)
    return tf.distribute.MultiWorkerMirroredStrategy(communication_options=opts)


class RankChunk:
    """A trainer rank's next chunk before the ranks agreed on its steps (:meth:`TFRanks.next_chunk`):
    ``steps`` is the batches this rank has at hand (at most the loop's limit) until
    :meth:`TFRanks.settle` sets it to the steps every rank trains. The core loop reads ``steps``
    only after training the chunk."""

    def __init__(self, source: Any, steps: int, timeout: float, what: str):
        self.source, self.steps, self.timeout, self.what = source, int(steps), timeout, what
        self.worker: Any = None  # the taken chunk's worker, set by settle


class TFRanks:
    """This rank of the job's trainer ranks, over ``MultiWorkerMirroredStrategy`` (the
    :class:`csrun_runtime.rankgroup.RankGroup` the core's loop uses, and the TensorFlow chief's
    chunk agreement).

    Args:
        role: the chief's role (``rank``, ``world_size``).

    A rank that dies is found by TensorFlow's coordination service (its heartbeats stop): the
    other ranks' collectives then fail with ``UnavailableError``, which :meth:`agree` and
    :meth:`gather` raise as :class:`csrun_runtime.rankgroup.RankLost` (a failed training call
    ends the chief as any error does). The collectives have no timeout of their own: with
    ``CommunicationOptions(timeout_seconds=...)`` TensorFlow 2.21 keeps one thread per
    collective call until its timeout (measured: 1,700 threads after 800 steps, until the
    process could make no more), and a rank whose input stalls leaves by itself
    (``runconfig.input_timeout_secs``).

    Attributes:
        rank, world_size: this rank and the ranks (> 1); ``strategy``: the strategy;
        ``model``: the trained (distributed) model once :meth:`build` made it; ``start_secs``:
        seconds the strategy took to make.

    Raises :class:`RankSetupError` when the strategy cannot be made, or its cluster is not
    ``world_size`` workers.
    """

    #: What the checkpoint holds of the statistics (the verdict's words): what tf.distribute saves
    #: for a variable aggregated over the replicas.
    statistics_kept = "their mean over the ranks (as tf.distribute saves an aggregated variable)"

    def __init__(self, role: Role, rc: Any = None):
        self.rank, self.world_size = role.rank, role.world_size
        self.sync_batchnorm = bool((rc or {}).get("sync_batchnorm"))
        t = time.monotonic()
        self.strategy = _strategy()
        self.start_secs = time.monotonic() - t
        # the strategy's coordination service takes SIGTERM for TensorFlow's own preemption
        # notifier (a C++ handler that replaces Python's): csrun's stop handling gets it back
        preemption.install_from_env()
        preemption.install_interrupts()
        n = int(self.strategy.num_replicas_in_sync)
        if n != self.world_size:
            raise RankSetupError(f"TF_CONFIG's cluster has {n} replica(s) in sync, CSRUN_WORLD_SIZE is "
                                 f"{self.world_size}")
        self.model: Any = None
        self._eval: Any = None
        self._gather_fn: Any = None
        log.info("trainer rank %d of %d: MultiWorkerMirroredStrategy (AUTO collectives: RING on CPUs, NCCL on "
                 "GPUs) in %.1f s", self.rank, self.world_size, self.start_secs)

    def build(self, build: Callable[[], Any]) -> Any:
        """``build()`` (the chief's model) under :attr:`strategy`'s scope: its variables and its
        optimizer's are mirrored, initialized from worker 0; kept for :meth:`digest`."""
        with self.strategy.scope():
            self.model = build()
        if self.sync_batchnorm:
            log.info("runconfig.sync_batchnorm: %d BatchNormalization layer(s) synchronized across the ranks",
                     synchronize_batchnorm(self.model))
        return self.model

    # ------------------------------------------------------------------ collectives
    def _gather(self, values: list[int]) -> list[list[int]]:
        """Every rank's ``values`` (int64, the same length on every rank), in rank order.
        Raises :class:`csrun_runtime.rankgroup.RankLost` when the collective fails (a rank died)."""
        import tensorflow as tf

        if self._gather_fn is None:
            strategy = self.strategy

            @tf.function(reduce_retracing=True)
            def gather(v: Any) -> Any:
                return strategy.gather(strategy.run(lambda: tf.reshape(v, [1, -1])), axis=0)

            self._gather_fn = gather
        try:
            rows = self._gather_fn(tf.constant(values, tf.int64)).numpy()
        except tf.errors.OpError as e:
            first = (str(e.message).strip().splitlines() or [""])[0][:200]
            raise RankLost(f"trainer rank {self.rank}: a collective with the other {self.world_size - 1} rank(s) "
                           f"failed (a rank died or left): {type(e).__name__}: {first}") from None
        return [list(map(int, row)) for row in rows]

    def agree(self, code: int, /) -> int:
        """The maximum of every rank's ``code`` (>= 0): one collective, the same on every rank."""
        return max(row[0] for row in self._gather([int(code)]))

    def gather(self, obj: Any, /) -> list[Any]:
        """Every rank's JSON-able ``obj``, in rank order, on every rank (two collectives: the
        lengths, then the bytes padded to the longest)."""
        data = json.dumps(obj, separators=(",", ":"), default=str).encode()
        longest = max(row[0] for row in self._gather([len(data)]))
        rows = self._gather(list(data) + [0] * (longest - len(data)))
        return [json.loads(bytes(b for b in row if b)) for row in rows]

    def close(self) -> None:
        # nothing to release: the strategy's servers end with the process
        pass

    def digest(self) -> tuple[str, str]:
        """:func:`weights_digest` of the model's trainable variables and of the others (its
        statistics: BatchNormalization's moving mean and variance); ``""`` both before :meth:`build`."""
        if self.model is None:
            return "", ""
        return weights_digest(self.model.trainable_weights), weights_digest(self.model.non_trainable_weights)

    def sync_statistics(self) -> list[str]:
        """Every rank, before rank 0 saves: each non-trainable variable (a per-replica statistic)
        whose values differ between the ranks is set to their mean over the ranks (as float64;
        rank 0's for a non-float one) on every rank, so the checkpoint holds the aggregate
        (:mod:`.statsync`). Returns the paths of this rank's variables that changed. Raises
        :class:`csrun_runtime.rankgroup.RankLost`."""
        from .statsync import sync_statistics

        if self.model is None:
            return []
        return sync_statistics(self.strategy, self.model.non_trainable_weights, self.rank, self.world_size)

    def next_chunk(self, source: Any, limit: int, timeout: float, what: str) -> RankChunk:
        """A :class:`RankChunk` of <= ``limit`` batches once ``source`` has some; raises its stall, ``Interrupted``."""
        return RankChunk(source, min(int(limit), source.available(timeout, what)), timeout, what)

    def settle(self, chunk: RankChunk) -> Any:
        """The chunk every rank trains now: the ranks agree on the minimum of their
        :meth:`next_chunk` steps (one collective, which every rank makes: only ranks that all
        agreed to go on call it), take that many batches and set ``chunk.steps`` to it. Returns
        the taken :class:`csrun_runtime.tensorflow.service.Chunk`. Raises
        :class:`csrun_runtime.rankgroup.RankLost`."""
        big = 1 << 40
        n = big - self.agree(big - chunk.steps)  # the minimum of every rank's, through the maximum's collective
        taken = chunk.source.get_chunk(max(1, n), chunk.timeout, chunk.what)
        chunk.steps, chunk.worker = taken.steps, taken.worker  # what the loop counts as trained
        return taken

    # ------------------------------------------------------------------ rank 0's evaluation
    def eval_model(self, model_fn: Callable[[], Any], model: Any) -> Any:
        """An undistributed copy of ``model`` (built once by ``model_fn()`` outside the strategy's
        scope) holding its weights now: rank 0 evaluates on it alone, with no collective."""
        if self._eval is None:
            self._eval = model_fn()
        self._eval.set_weights(model.get_weights())
        return self._eval
