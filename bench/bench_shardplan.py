"""Benchmark: shard planning of 1,000,000 files onto 10,000 input workers (issue 5: < 2 s).

Synthetic file sizes: lognormal (median e**17 B ≈ 23 MiB, sigma 1), seed 0. Measured:

* ``plan_s``: :func:`analyzer.shard_planner.plan_shards` on a ready :class:`FileTable`
  (sort, exact LPT, per-worker CSR lists, sums, warnings), median of ``repeats`` runs;
* ``lpt_s``: the assignment alone (:func:`analyzer.lpt.lpt_assign`);
* ``reference_heap_lpt_s``: a textbook tuple-heap LPT for comparison (full run only;
  its assignment must be identical);
* ``write_json_s`` / ``load_plan_s``: writing the plan file and loading + validating it
  with the launcher's :func:`csrun_common.shardplan_schema.load_plan` (what each input
  worker does at start-up);
* ``imbalance``: max/mean worker bytes; ``vs_lower_bound``: max load / max(mean, largest
  file), an upper bound on the distance from the optimum;
* ``count_records``: framing-walk speed on a synthetic TFRecord file (records/s, MiB/s).

Usage: ``python bench/bench_shardplan.py [--quick]``; writes
``bench/results/shardplan.json`` (``shardplan_quick.json`` with ``--quick``).
"""
from __future__ import annotations

import heapq
import json
import os
import platform
import statistics
import sys
import tempfile
import time

import common  # puts the repository root on sys.path
import numpy as np

HERE = common.BENCH

from analyzer.filescan import FileTable  # noqa: E402
from analyzer.lpt import lpt_assign  # noqa: E402
from analyzer.shard_planner import plan_shards  # noqa: E402
from csrun_common import shardplan_schema as schema  # noqa: E402
from csrun_common import tfrecord as tfr  # noqa: E402


def _reference_lpt(sizes: np.ndarray, W: int) -> list[int]:
    order = np.argsort(-sizes, kind="stable").tolist()
    s = sizes.tolist()
    heap = [(0, w) for w in range(W)]
    owner = [0] * len(s)
    for i in order:
        load, w = heap[0]
        heapq.heapreplace(heap, (load + s[i], w))
        owner[i] = w
    return owner


def _machine() -> dict:
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover
        affinity = None
    return {"cpu_count": os.cpu_count(), "cpus_usable": affinity, "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "python": platform.python_version(), "numpy": np.__version__,
            "loadavg_at_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None}


def _count_bench(tmp: str, n_records: int, size: int) -> dict:
    path = os.path.join(tmp, "count.tfrecord")
    f = tfr.frame(os.urandom(size))
    with open(path, "wb") as fh:
        for _ in range(n_records // 10_000):
            fh.write(f * 10_000)
    n = (n_records // 10_000) * 10_000
    t0 = time.perf_counter()
    rc = tfr.count_records(path)
    dt = time.perf_counter() - t0
    assert rc is not None and rc.records == n
    return {"records": n, "record_bytes": size, "seconds": round(dt, 4),
            "records_per_s": round(n / dt), "mib_per_s": round(rc.file_bytes / dt / 2 ** 20, 1)}


def run(quick: bool = False) -> dict:
    """Run the benchmark; returns the result dict (also what ``__main__`` writes).

    ``quick``: 100,000 files onto 1,000 workers, 3 repeats, no reference LPT (a few
    seconds); else 1,000,000 onto 10,000, 5 repeats, with the reference (~20 s).
    """
    F, W, repeats = (100_000, 1_000, 3) if quick else (1_000_000, 10_000, 5)
    rng = np.random.default_rng(0)
    sizes = rng.lognormal(17.0, 1.0, F).astype(np.int64)
    table = FileTable([f"/data/train/part-{i:07d}.tfrecord" for i in range(F)], sizes)

    plan_times, lpt_times = [], []
    plan = None
    for _ in range(repeats):
        t0 = time.perf_counter()
        plan = plan_shards(table, W)
        plan_times.append(time.perf_counter() - t0)
    for _ in range(repeats):
        t0 = time.perf_counter()
        owner, loads = lpt_assign(sizes, W)
        lpt_times.append(time.perf_counter() - t0)
    assert plan is not None
    mean = float(sizes.sum()) / W
    lower = max(mean, float(sizes.max()))
    result: dict = {
        "benchmark": "shard planning (analyzer.shard_planner.plan_shards, exact LPT)",
        "files": F, "workers": W, "repeats": repeats,
        "size_distribution": "lognormal(mu=17, sigma=1) bytes, numpy seed 0",
        "total_bytes": int(sizes.sum()),
        "plan_s": {"median": round(statistics.median(plan_times), 4), "min": round(min(plan_times), 4),
                   "max": round(max(plan_times), 4)},
        "lpt_s": {"median": round(statistics.median(lpt_times), 4), "min": round(min(lpt_times), 4)},
        "imbalance": round(plan.imbalance, 6),
        "max_over_lower_bound": round(float(plan.worker_bytes.max()) / lower, 6),
        "warnings": [w.code for w in plan.warnings],
        "requirement": "plan 1,000,000 files onto 10,000 workers in < 2 s",
    }
    if not quick:
        t0 = time.perf_counter()
        ref = _reference_lpt(sizes, W)
        result["reference_heap_lpt_s"] = round(time.perf_counter() - t0, 4)
        result["reference_identical"] = ref == owner.tolist()
        result["meets_requirement"] = result["plan_s"]["median"] < 2.0
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "plan.json")
        t0 = time.perf_counter()
        plan.write_json(out)
        result["write_json_s"] = round(time.perf_counter() - t0, 4)
        result["plan_file_bytes"] = os.path.getsize(out)
        t0 = time.perf_counter()
        loaded = schema.load_plan(out)
        result["load_plan_s"] = round(time.perf_counter() - t0, 4)
        assert loaded["num_workers"] == W
        del loaded
        result["count_records"] = _count_bench(tmp, 100_000 if quick else 1_000_000, 200)
    result["machine"] = _machine()
    result["when"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    return result


if __name__ == "__main__":
    quick = "--quick" in sys.argv[1:]
    res = run(quick=quick)
    out_dir = HERE / "results"
    out_dir.mkdir(exist_ok=True)
    path = out_dir / ("shardplan_quick.json" if quick else "shardplan.json")
    path.write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps({k: res[k] for k in res if k not in ("machine",)}, indent=1))
    print(f"written: {path}")
