"""The trainer ranks' per-replica statistics made one before a checkpoint (docs/MULTI-RANK.md
"Weights and statistics").

Under ``MultiWorkerMirroredStrategy`` Keras' ``BatchNormalization`` keeps its moving mean and
variance as mirrored variables with no aggregation, each rank updating them from its own batch
(measured, TensorFlow 2.21 / Keras 3.15: ``ON_WRITE``, ``NONE``), so after a step they differ
between the ranks while the trainable weights, whose gradients are all-reduced, stay identical.
tf.distribute saves a variable aggregated over the replicas as the aggregate (``MEAN``:
their mean); :func:`sync_statistics` gives the checkpoint that: a gather of each statistic's
digest, then of the values (float64) of those that differ between the ranks, each set on every
rank to the mean over the ranks (computed the same way on every rank, so the result is
bit-identical everywhere); one that is the same everywhere is left as it is.

TensorFlow is imported inside the function (see :mod:`csrun_runtime.tensorflow.worker`).
"""
from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from ..rankgroup import RankLost

__all__ = ["sync_statistics"]

_gathers: dict[int, Any] = {}  # id(strategy) -> its gather tf.function


def _gather(strategy: Any) -> Any:
    import tensorflow as tf

    fn = _gathers.get(id(strategy))
    if fn is None:
        @tf.function(reduce_retracing=True)
        def fn(flat: Any) -> Any:
            return strategy.gather(strategy.run(lambda: tf.reshape(flat, [1, -1])), axis=0)

        _gathers[id(strategy)] = fn
    return fn


def _hash(a: Any) -> int:
    """A signed 64-bit digest of an array's values (its bytes, dtype and shape)."""
    h = hashlib.sha256(f"{a.dtype}|{a.shape}|".encode() + a.tobytes()).digest()
    return int.from_bytes(h[:8], "little", signed=True)


def _gathered(strategy: Any, flat: Any, rank: int, world_size: int) -> Any:
    """Every rank's ``flat`` (a 1-D numpy array, the same length everywhere) as rows, in rank
    order. Raises :class:`csrun_runtime.rankgroup.RankLost` when the gather fails."""
    import tensorflow as tf

    try:
        return _gather(strategy)(tf.constant(flat)).numpy()
    except tf.errors.OpError as e:
        first = (str(e.message).strip().splitlines() or [""])[0][:200]
        raise RankLost(f"trainer rank {rank}: gathering the statistics of the other {world_size - 1} rank(s) "
                       f"failed (a rank died or left): {type(e).__name__}: {first}") from None


def sync_statistics(strategy: Any, variables: Sequence[Any], rank: int, world_size: int) -> list[str]:
    """Set each of ``variables`` (this rank's non-trainable Keras variables) whose values differ
    between the ranks to the ranks' mean (a float variable; rank 0's values for another dtype),
    on every rank (the module docstring); returns the paths of those whose values changed here.
    Two gathers: one 64-bit digest per variable, then the values of those that differ only (a
    frozen layer's weights, the same everywhere, never travel). Every rank calls it at the same
    point. Raises :class:`csrun_runtime.rankgroup.RankLost` when a gather fails (a rank died)."""
    import numpy as np

    if not variables:
        return []
    values = [np.asarray(v.numpy()) for v in variables]
    hashes = _gathered(strategy, np.array([_hash(a) for a in values], dtype=np.int64), rank, world_size)
    differ = [i for i in range(len(values)) if len(set(hashes[:, i].tolist())) > 1]
    if not differ:
        return []
    flat = np.concatenate([values[i].astype(np.float64).reshape(-1) for i in differ])
    rows = _gathered(strategy, flat, rank, world_size)
    changed, at = [], 0
    for i in differ:
        mine = values[i]
        part = rows[:, at:at + mine.size]
        at += mine.size
        agg = part.mean(axis=0) if np.issubdtype(mine.dtype, np.floating) else part[0]
        new = agg.reshape(mine.shape).astype(mine.dtype)
        if not np.array_equal(new, mine):
            variables[i].assign(new)
            changed.append(str(variables[i].path))
    return changed
