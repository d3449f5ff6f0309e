"""The PyTorch input worker's bundles (``send_batches``): a batch of at least
``BUNDLE_BYTES`` goes as a bundle of one over the batch's own memory (no copy: issue 31's image
senders spent a 38.5 MB copy per batch here, bench/results/gpu_feed_cpu_sender.json), smaller
batches are stacked into one bundle with their values in order. The sender records what it is
given (the transport itself is tested against a real receiver in tests/unit/features/test_read_ahead.py)."""
from __future__ import annotations

import numpy as np
import torch

from csrun_runtime.dataplane import BUNDLE_BYTES
from csrun_runtime.pytorch.worker import send_batches


class RecordingSender:
    """What ``send_batches`` needs of a ``Sender``: ``send_bundle`` (recorded) and ``window_batches``."""

    window_batches = None

    def __init__(self) -> None:
        self.bundles: list[tuple[object, int]] = []

    def send_bundle(self, nest: object, n: int, timeout: float | None = None) -> None:
        self.bundles.append((nest, n))


def test_a_batch_as_large_as_a_bundle_is_sent_without_a_copy():
    big = [(torch.arange(BUNDLE_BYTES // 4, dtype=torch.float32) + i, torch.tensor([i])) for i in range(3)]
    s = RecordingSender()
    send_batches(s, iter(big))
    assert [n for _, n in s.bundles] == [1, 1, 1]
    for (nest, _), (x, y) in zip(s.bundles, big, strict=True):
        assert nest[0].shape == (1, *x.shape) and np.shares_memory(nest[0], x.numpy())
        assert np.shares_memory(nest[1], y.numpy())


def test_small_batches_are_stacked_in_order():
    small = [{"x": np.full((2, 3), i, np.float32), "y": np.array([i, i])} for i in range(5)]
    s = RecordingSender()
    send_batches(s, iter(small))
    assert sum(n for _, n in s.bundles) == 5
    nest, n = s.bundles[0]
    assert n == 5 and nest["x"].shape == (5, 2, 3)
    assert [int(v) for v in nest["x"][:, 0, 0]] == [0, 1, 2, 3, 4]
    assert not np.shares_memory(nest["x"], small[0]["x"])
