"""input_fn of the serial pipeline: synthetic samples made by a GIL-bound Python function.

Pipeline::

    range(num_samples) -> shuffle(seed) -> repeat -> map(tf.py_function(_make), AUTOTUNE)
        -> batch(drop_remainder=True) -> prefetch

``_make(i)`` spins ``work_iterations`` rounds of integer arithmetic in pure Python (no NumPy
in the loop, so the GIL is held throughout) and returns ``(float32[FEATURES], int32 label)``.
Parallel map calls of one process serialize on the GIL; separate processes do not.

``params["train_input"]`` keys: ``batch_size``, ``num_samples`` (epoch length),
``work_iterations`` (Python loop rounds per sample: the cost knob), ``shuffle_seed``.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

FEATURES = 16
NUM_CLASSES = 10


def _make(i):
    x = int(i.numpy()) if hasattr(i, "numpy") else int(i)
    acc = x & 0xFFFF
    for k in range(_ITER[0]):
        acc = (acc * 31 + (k ^ x)) & 0xFFFFF
    rng = acc
    feats = []
    for _ in range(FEATURES):
        rng = (rng * 1103515245 + 12345) & 0x7FFFFFFF
        feats.append((rng % 2000) / 1000.0 - 1.0)
    return np.asarray(feats, np.float32), np.int32(acc % NUM_CLASSES)


_ITER = [2000]


def input_fn(params: dict) -> tf.data.Dataset:
    """Training input: infinite, shuffled, fixed-size batches ``(float32[B, 16], int32[B])``."""
    p = params["train_input"]
    _ITER[0] = int(p.get("work_iterations", 2000))
    batch_size = int(p["batch_size"])
    seed = p.get("shuffle_seed")

    def make(i):
        x, y = tf.py_function(_make, [i], (tf.float32, tf.int32))
        x.set_shape([FEATURES])
        y.set_shape([])
        return x, y

    ds = tf.data.Dataset.range(int(p.get("num_samples", 100_000)))
    ds = ds.shuffle(int(p.get("shuffle_buffer", 1024)), seed=seed)
    ds = ds.repeat()
    ds = ds.map(make, num_parallel_calls=tf.data.AUTOTUNE)
    ds = ds.batch(batch_size, drop_remainder=True)
    return ds.prefetch(tf.data.AUTOTUNE)
