"""analyzer/lpt.py: exact LPT (longest processing time first), its bound, and its refusals."""
from __future__ import annotations

import heapq

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analyzer.lpt import lpt_assign

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def reference_lpt(weights, W):
    """Textbook LPT: sort by (-weight, position), pop the (load, index)-least worker."""
    eff = [max(int(w), 1) for w in weights]
    items = sorted(range(len(eff)), key=lambda i: (-eff[i], i))
    heap = [(0, w) for w in range(W)]
    owner = [0] * len(eff)
    for i in items:
        load, w = heapq.heappop(heap)
        owner[i] = w
        heapq.heappush(heap, (load + eff[i], w))
    return owner


weights_st = st.one_of(
    st.lists(st.integers(0, 10 ** 12), max_size=400),
    st.lists(st.integers(0, 5), max_size=400),               # many ties and zeros
    st.lists(st.sampled_from([1, 1000, 10 ** 9]), max_size=400),
)


@FAST
@given(weights_st, st.integers(1, 300))
def test_lpt_is_exact_lpt_and_bounded(weights, W):
    owner, loads = lpt_assign(weights, W)
    assert owner.shape == (len(weights),)
    assert owner.tolist() == reference_lpt(weights, W)  # bulk steps == textbook LPT
    eff = np.maximum(np.asarray(weights, dtype=np.int64), 1)
    assert loads.tolist() == [int(eff[owner == w].sum()) for w in range(W)]
    if weights:
        # Graham's bound: max <= mean + max item  <=>  W*max <= sum + W*max_item.
        assert W * int(loads.max()) <= int(eff.sum()) + W * int(eff.max())
        if len(weights) >= W:
            assert (loads > 0).all()  # every worker gets a file


def test_lpt_large_worker_counts_match_reference():
    rng = np.random.default_rng(7)
    for F, W in ((5000, 1000), (3000, 64), (20000, 2000)):
        w = rng.lognormal(10, 2, F).astype(np.int64)
        w[:50] = 123  # ties
        assert lpt_assign(w, W)[0].tolist() == reference_lpt(w.tolist(), W)


def test_lpt_rejects_bad_input():
    with pytest.raises(ValueError, match="num_input_workers"):
        lpt_assign([1, 2], 0)
    with pytest.raises(ValueError, match="weights"):
        lpt_assign([1, -2], 2)
