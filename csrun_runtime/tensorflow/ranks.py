"""Several trainer ranks of the TensorFlow chief: ``tf.distribute.MultiWorkerMirroredStrategy``.

A job of several trainer ranks (``CSRUN_WORLD_SIZE > 1``, docs/MULTI-RANK.md) runs one chief
per rank; its task has a ``TF_CONFIG`` whose cluster is the chief ranks
(:func:`csrun_common.ranks.trainer_env`, set by :mod:`csrun_runtime.supervise`). Each rank:

* makes the strategy (:class:`TFRanks`) before any other TensorFlow op: the strategy enables
  TensorFlow's collective ops in the eager context (``MultiWorkerMirroredStrategy`` "should be
  created at program startup"); the collectives are ``RING`` (gRPC, CPU) unless
  ``CSRUN_TF_COLLECTIVES`` says ``NCCL`` or ``AUTO``;
* builds the model and its optimizer under ``strategy.scope()`` (mirrored variables, the
  initial values broadcast from worker 0) and trains each step through ``strategy.run`` on its
  own local batch (:func:`csrun_runtime.tensorflow.steps.TrainSteps` with a strategy): Keras'
  optimizer all-reduces the gradients, so every rank's weights stay the same;
* agrees with the others, before each training call, on how many steps it trains
  (:meth:`TFRanks.next_chunk`: the minimum of the steps every rank has at hand, 0 when one has
  none), so all ranks run the same collectives in the same order; the core's stop agreement
  (:mod:`csrun_runtime.rankgroup`, :meth:`TFRanks.agree`) follows;
* gathers every rank's figures at the end (:meth:`TFRanks.gather`) and the digest of its final
  weights (:meth:`TFRanks.digest`).

Only rank 0 (MWMS's chief, worker 0) writes checkpoints, events, performance.json and
evaluates, on an undistributed copy of the model (:meth:`TFRanks.eval_model`), so no
collective runs on one rank alone.

TensorFlow is imported inside the functions (see :mod:`csrun_runtime.tensorflow.worker`).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from csrun_common.atomic import read_json, write_json
from csrun_common.roles import Role

from .. import preemption

__all__ = ["TFRanks", "RankSetupError", "COLLECTIVES_ENV", "weights_digest"]

log = logging.getLogger("csrun.runtime")

#: The collectives' implementation (``RING``, ``NCCL`` or ``AUTO``; default ``RING``):
#: ``tf.distribute.experimental.CommunicationImplementation``.
COLLECTIVES_ENV = "CSRUN_TF_COLLECTIVES"


class RankSetupError(RuntimeError):
    """The strategy over the trainer ranks could not be made (the message names TF_CONFIG or
    the setting)."""


def weights_digest(model: Any) -> str:
    """``sha256:<hex>`` of ``model``'s weights (names sorted, each array's bytes, float32 as
    stored): identical weights give identical digests on every rank."""
    h = hashlib.sha256()
    for name, value in sorted((v.path, v.numpy()) for v in model.weights):
        h.update(name.encode())
        h.update(value.tobytes())
    return f"sha256:{h.hexdigest()}"


def _strategy() -> Any:
    """``MultiWorkerMirroredStrategy`` from ``TF_CONFIG`` with :data:`COLLECTIVES_ENV`'s
    collectives. Raises :class:`RankSetupError`."""
    import tensorflow as tf

    if not os.environ.get("TF_CONFIG"):
        raise RankSetupError("TF_CONFIG is not set: a trainer rank of several needs the ranks' cluster "
                             "(csrun_runtime.supervise sets it in a csrun_wse task)")
    name = (os.environ.get(COLLECTIVES_ENV) or "RING").upper()
    impl = getattr(tf.distribute.experimental.CommunicationImplementation, name, None)
    if impl is None:
        raise RankSetupError(f"{COLLECTIVES_ENV}={name}: use RING, NCCL or AUTO")
    opts = tf.distribute.experimental.CommunicationOptions(implementation=impl)
    return tf.distribute.MultiWorkerMirroredStrategy(communication_options=opts)


class TFRanks:
    """This rank of the job's trainer ranks, over ``MultiWorkerMirroredStrategy`` (the
    :class:`csrun_runtime.rankgroup.RankGroup` the core's loop uses, and the TensorFlow chief's
    chunk agreement).

    Args:
        role: the chief's role (``rank``, ``world_size``).

    Attributes:
        rank, world_size: this rank and the ranks (> 1); ``strategy``: the strategy;
        ``model``: the trained (distributed) model once :meth:`attach` gave it; ``start_secs``:
        seconds the strategy took to make.

    Raises :class:`RankSetupError` when the strategy cannot be made, or its cluster is not
    ``world_size`` workers.
    """

    def __init__(self, role: Role):
        self.rank, self.world_size = role.rank, role.world_size
        t = time.monotonic()
        self.strategy = _strategy()
        self.start_secs = time.monotonic() - t
        n = int(self.strategy.num_replicas_in_sync)
        if n != self.world_size:
            raise RankSetupError(f"TF_CONFIG's cluster has {n} replica(s) in sync, CSRUN_WORLD_SIZE is "
                                 f"{self.world_size}")
        self.model: Any = None
        self._eval: Any = None
        self._gather_fn: Any = None
        log.info("trainer rank %d of %d: MultiWorkerMirroredStrategy (%s collectives) in %.1f s", self.rank,
                 self.world_size, (os.environ.get(COLLECTIVES_ENV) or "RING").upper(), self.start_secs)

    def attach(self, model: Any) -> None:
        """The model this rank trains (built under :attr:`strategy`'s scope), for :meth:`digest`."""
        self.model = model

    # ------------------------------------------------------------------ collectives
    def _gather(self, values: list[int]) -> list[list[int]]:
        """Every rank's ``values`` (int64, the same length on every rank), in rank order."""
        import tensorflow as tf

        if self._gather_fn is None:
            strategy = self.strategy

            @tf.function(reduce_retracing=True)
            def gather(v: Any) -> Any:
                return strategy.gather(strategy.run(lambda: tf.reshape(v, [1, -1])), axis=0)

            self._gather_fn = gather
        return [list(map(int, row)) for row in self._gather_fn(tf.constant(values, tf.int64)).numpy()]

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

    def digest(self) -> str:
        """:func:`weights_digest` of the attached model."""
        return weights_digest(self.model) if self.model is not None else ""

    def next_chunk(self, source: Any, limit: int, timeout: float, what: str) -> Any:
        """This rank's next chunk of the steps every rank trains: the ranks agree on the minimum
        of the steps each has at hand (at most ``limit``; a :class:`csrun_runtime.tensorflow.service.ChunkedSource`'s
        :meth:`available`); ``None`` when a rank has none (its input ended or a stop signal
        ended its wait: :class:`csrun_runtime.preemption.Interrupted` is raised here after the
        agreement, so every rank made it). Raises what the source raises when it stalls."""
        have, interrupted = 0, None
        try:
            have = min(int(limit), source.available(timeout, what))
        except preemption.Interrupted as e:
            interrupted = e
        big = 1 << 40
        n = big - self.agree(big - have)  # the minimum of every rank's, through the maximum's collective
        if interrupted is not None:
            raise interrupted
        if n <= 0:
            return None
        return source.get_chunk(n, timeout, what)

    def record_ranks(self, performance: Path | None, node: str | None, step: int) -> list[dict[str, Any]]:
        """At the end of training, on every rank: gather each rank's ``{"rank", "node",
        "global_step_end", "weights_sha256"}`` (:meth:`digest` of its final weights) and log
        this rank's; rank 0 adds them to its ``performance`` file (performance.json) as
        ``ranks`` with ``weights_identical``. Returns the records."""
        mine = {"rank": self.rank, "node": node, "global_step_end": int(step), "weights_sha256": self.digest()}
        log.info("trainer rank %d: global step %d, final weights %s", self.rank, step, mine["weights_sha256"])
        records = self.gather(mine)
        if self.rank == 0 and performance is not None and performance.exists():
            rec = read_json(performance) or {}
            have = {int(r["rank"]): r for r in rec.get("ranks") or [] if isinstance(r, dict) and "rank" in r}
            rec["ranks"] = [{**have.get(int(r["rank"]), {}), **r} for r in records]
            rec["world_size"] = self.world_size
            rec["weights_identical"] = len({r["weights_sha256"] for r in records}) == 1
            write_json(performance, rec)
            log.info("trainer ranks: final weights %s on all %d ranks",
                     "identical" if rec["weights_identical"] else "DIFFER", self.world_size)
        self.agree(0)  # rank 0 has written: the ranks leave together (no rank sees a peer gone mid-call)
        return records

    # ------------------------------------------------------------------ rank 0's evaluation
    def eval_model(self, model_fn: Callable[[], Any], model: Any) -> Any:
        """An undistributed copy of ``model`` (built once by ``model_fn()`` outside the strategy's
        scope) holding its weights now: rank 0 evaluates on it alone, with no collective."""
        if self._eval is None:
            self._eval = model_fn()
        self._eval.set_weights(model.get_weights())
        return self._eval
