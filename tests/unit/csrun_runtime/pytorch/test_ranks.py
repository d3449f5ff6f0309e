"""The PyTorch trainer ranks' digests (csrun_runtime/pytorch/ranks.py): trainable weights apart
from statistics (buffers), 0-dim tensors included."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


def test_the_digests_take_a_zero_dimensional_buffer():
    from csrun_runtime.pytorch.ranks import statistics_digest, weights_digest

    m = torch.nn.BatchNorm1d(3)  # num_batches_tracked: a 0-d int64 buffer (it failed: no byte view of a 0-d tensor)
    weights, stats = weights_digest(m), statistics_digest(m)
    m.num_batches_tracked += 1
    assert weights.startswith("sha256:") and stats.startswith("sha256:")
    assert weights_digest(m) == weights and statistics_digest(m) != stats  # a statistic, not a weight
