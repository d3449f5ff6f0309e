"""Exact LPT (longest processing time first): which input worker each data file goes to
(:func:`lpt_assign`; the planner is :func:`analyzer.shard_planner.plan_shards`).

Algorithm: files are taken in decreasing weight (bytes, or records when every file was
counted); each goes to the currently least loaded worker, ties broken by the lower worker
index; equal weights keep their input order (the scanner sorts paths), so the assignment is a
deterministic function of the input. A file of weight 0 counts as 1, so that with F >= W files
every worker gets one.

Guarantee (Graham's list-scheduling argument, tested by property tests): with effective
weights ``max(w, 1)``, the most loaded worker carries at most ``mean + max_weight`` (the last
file put on it went to a least loaded worker, whose load was at most the mean), and LPT is
within 4/3 of the optimal makespan.

Speed: computed in NumPy bulk steps (a run of files that provably go to distinct workers in
ascending load order is assigned at once) with a binary-heap fallback; 1,000,000 files onto
10,000 workers plan in well under 2 s (``bench/bench_shardplan.py``).
"""
from __future__ import annotations

import heapq
from collections.abc import Sequence

import numpy as np

__all__ = ["lpt_assign"]


def _heap_stretch(x: np.ndarray, pos: int, count: int, loads: np.ndarray, own: np.ndarray) -> int:
    """Exact LPT for ``x[pos:pos+count]`` with a heap of keys ``load << B | worker``."""
    W = len(loads)
    B = max(W - 1, 1).bit_length()
    M = (1 << B) - 1
    heap = [(int(load) << B) | w for w, load in enumerate(loads.tolist())]
    heapq.heapify(heap)
    hr = heapq.heapreplace
    out: list[int] = []
    ap = out.append
    for v in x[pos:pos + count].tolist():
        k = heap[0]
        hr(heap, k + (v << B))
        ap(k & M)
    own[pos:pos + count] = out
    for k in heap:
        loads[k & M] = k >> B
    return pos + count


def lpt_assign(weights: Sequence[int] | np.ndarray, num_input_workers: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact LPT assignment of F items onto ``num_input_workers`` workers.

    ``weights``: F non-negative integers (bytes or records); a weight of 0 counts as 1.
    Items are taken by decreasing weight (ties: input order); each goes to the least
    loaded worker (ties: lower index). Returns ``(owner, loads)``: ``owner`` int64 (F,)
    the worker of each item, ``loads`` int64 (W,) the per-worker sums of the effective
    weights ``max(w, 1)``. Guarantees ``loads.max() <= loads.sum()/W + max(eff)``.
    Raises ``ValueError`` for ``num_input_workers < 1`` or a negative weight.
    O(F log F) time (sort) plus the assignment, mostly in NumPy.
    """
    if not isinstance(num_input_workers, (int, np.integer)) or num_input_workers < 1:
        raise ValueError(f"num_input_workers {num_input_workers!r}: must be an integer >= 1")
    W = int(num_input_workers)
    w = np.asarray(weights, dtype=np.int64).reshape(-1)
    if w.size and w.min() < 0:
        raise ValueError(f"weights: must be >= 0, got {int(w.min())}")
    eff = np.maximum(w, 1)
    F = len(eff)
    order = np.argsort(-eff, kind="stable")
    x = eff[order]
    loads = np.zeros(W, dtype=np.int64)
    own = np.empty(F, dtype=np.int64)
    pos = 0
    if W < 64:  # small heaps are cheap; bulk steps would be too short
        _heap_stretch(x, 0, F, loads, own)
    else:
        perm = np.arange(W, dtype=np.int64)  # workers by (load, index)
        while pos < F:
            m = min(W, F - pos)
            p = perm[:m]
            new = loads[p] + x[pos:pos + m]
            if m > 1:
                # Item j (j >= 1) goes to p[j] iff (load[p[j]], p[j]) is below every key
                # already updated in this step: checked conservatively on the prefix
                # minimum of the new loads and of the worker indices.
                lk = loads[p[1:]]
                pm = np.minimum.accumulate(new[:-1])
                mw = np.minimum.accumulate(p[:-1])
                bad = np.flatnonzero(~((lk < pm) | ((lk == pm) & (p[1:] < mw))))
                k = m if bad.size == 0 else int(bad[0]) + 1
            else:
                k = 1
            loads[p[:k]] = new[:k]
            own[pos:pos + k] = p[:k]
            pos += k
            if k < min(m, 32) and pos < F:  # poor progress (ties, small tail): heap stretch
                pos = _heap_stretch(x, pos, min(F - pos, max(4 * W, 1024)), loads, own)
            if pos < F:
                perm = np.argsort(loads, kind="stable")
    owner = np.empty(F, dtype=np.int64)
    owner[order] = own
    return owner, loads

