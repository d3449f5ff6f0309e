"""csrun_runtime/pytorch/staging.py on CPU: a large leaf copied by several threads exactly."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from csrun_runtime.pytorch.staging import HostRing  # noqa: E402


def test_a_large_leaf_is_copied_by_several_threads_exactly():
    """HostRing's split copy (issue 31: one core's memcpy bounds a 38.5 MB batch): chunks of
    a length no thread count divides, a strided leaf copied whole, the pool ended by close()."""
    rng = np.random.default_rng(3)
    big = rng.integers(0, 256, (5 << 20) + 7, dtype=np.uint8)
    strided = rng.random((1100, 2000), dtype=np.float32)[:, ::2]  # 4.4 MB, not contiguous
    ring = HostRing(2, pin=False, copy_threads=3)
    for shift in range(3):  # every slot written, then the first again
        a = np.roll(big, shift)
        _, (x, s, none) = ring.fill([a, strided, None])
        assert np.array_equal(x.numpy(), a) and np.array_equal(s.numpy(), strided) and none is None
    assert ring._pool is not None and ring.allocations == 1
    ring.close()
    assert ring._pool is None
