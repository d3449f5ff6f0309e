"""The PyTorch trainer ranks' weights digest (csrun_runtime/pytorch/ranks.py)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


def test_the_weights_digest_takes_a_zero_dimensional_buffer():
    from csrun_runtime.pytorch.ranks import weights_digest

    m = torch.nn.BatchNorm1d(3)  # num_batches_tracked: a 0-d int64 buffer (it failed: no byte view of a 0-d tensor)
    before = weights_digest(m)
    m.num_batches_tracked += 1
    assert before.startswith("sha256:") and weights_digest(m) != before
