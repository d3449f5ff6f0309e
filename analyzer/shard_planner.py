"""Shard planning: which data files each input worker reads, with which shuffle seed
(:func:`plan_shards`, making a :class:`analyzer.shardplan.ShardPlan`).

Rule sources. "Shard your input data" in the Cerebras document "Performance Optimization
Practices": "Optimal input data throughput performance can be achieved when you shard the
input dataset across the N input worker nodes", "you split your dataset into multiple,
shorter, distinct files and allocate them across the worker nodes so that different workers
have different slices of the dataset" (when the files are too few or too large:
``cs_input_analyzer reshard``). "Multiple input workers" in "Limitations of the
CerebrasEstimator": "each worker node must shuffle its data differently", so each worker
gets its own seed; and "In the simplest setup, the same input data is replicated across
every input worker": with fewer files than workers every worker reads every file with its
own seed. The plan's warnings cite the two documents by title.

Shard mode assigns whole files with exact LPT (:mod:`analyzer.lpt`: its bound, its speed);
imbalance is reported as ``max / mean`` of the worker loads.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from csrun_common import shardplan_schema as schema

from .filescan import FileInfo, FileTable
from .lpt import lpt_assign
from .shardplan import PlanWarning, ShardPlan, format_bytes, load_imbalance

__all__ = ["PlanOptions", "ShuffleBuffers", "worker_seed", "plan_shards", "suggest_num_shards",
           "SHUFFLE_MEMORY_FRACTION", "TARGET_SHARD_BYTES"]

TARGET_SHARD_BYTES = 128 * 2 ** 20   # suggested shard size when resharding (bytes)
SHUFFLE_MEMORY_FRACTION = 0.8        # share of a node's memory the shuffle buffers may take
IMBALANCE_WARN = 1.10                # warn above this max/mean
DOMINANCE_WARN = 1.25                # warn when one file > this × the mean worker load
REPLICATE_MAX_ENTRIES = 20_000_000   # files × workers path entries a replicate plan may list
_GOLDEN = 0x9E3779B97F4A7C15         # odd: i -> base + i*_GOLDEN is injective mod 2**63


def worker_seed(base_seed: int, index: int) -> int:
    """Worker ``index``'s shuffle seed, distinct per index, in ``[0, 2**63)`` (the rule: the module docstring)."""
    return (int(base_seed) + int(index) * _GOLDEN) % schema.SEED_LIMIT


def suggest_num_shards(total_bytes: int, num_input_workers: int, target_shard_bytes: int = TARGET_SHARD_BYTES) -> int:
    """Shards to reshard into: ``k × num_input_workers`` with the smallest ``k >= 1`` that keeps
    shards at or below ``target_shard_bytes`` (bytes). Equal shards balance exactly."""
    k = max(1, math.ceil(total_bytes / (num_input_workers * max(1, target_shard_bytes))))
    return k * num_input_workers


@dataclass(frozen=True)
class ShuffleBuffers:
    """What the shuffle-memory check of a plan needs: ``buffer_elements`` (each worker's
    ``train_input.shuffle_buffer``, elements), ``element_bytes`` (bytes per buffered
    element), ``element_source`` (where that size came from, quoted in the warning),
    ``workers_per_node`` (input workers sharing a node's memory) and ``node_memory_bytes``.

    Rule: the performance guide's "Shard your input data" (Cerebras, "Performance
    Optimization Practices"): "Sharding also improves the capacity to shuffle the dataset, as
    the shuffle buffer memory needed is only to shuffle shards, and not the entire dataset."
    """

    buffer_elements: int | None = None
    element_bytes: float | None = None
    element_source: str = ""
    workers_per_node: int = 1
    node_memory_bytes: int | None = None

    def check(self) -> tuple[dict | None, PlanWarning | None]:
        """The plan's ``shuffle`` record and a ``SHUFFLE_MEMORY`` warning when the buffers of
        a node's workers need more than :data:`SHUFFLE_MEMORY_FRACTION` of its memory
        (bytes: ``buffer_elements × element_bytes × workers_per_node``). ``(None, None)``
        without a buffer size; ``checked: False`` when a size or the memory is unknown."""
        buf, elem, mem = self.buffer_elements, self.element_bytes, self.node_memory_bytes
        workers = max(1, int(self.workers_per_node))
        if not buf or not elem or not mem:
            if buf:
                return {"buffer_elements": buf, "element_bytes": elem, "checked": False,
                        "why_not": "no element size (count TFRecords or give --element-bytes)"
                        if not elem else "no node memory"}, None
            return None, None
        per_worker = int(buf * elem)
        per_node = per_worker * workers
        limit = int(SHUFFLE_MEMORY_FRACTION * mem)
        info = {"buffer_elements": int(buf), "element_bytes": round(float(elem), 1),
                "element_bytes_source": self.element_source, "workers_per_node": workers,
                "per_worker_bytes": per_worker, "per_node_bytes": per_node, "node_memory_bytes": int(mem),
                "limit_fraction": SHUFFLE_MEMORY_FRACTION, "fits": per_node <= limit, "checked": True}
        if per_node <= limit:
            return info, None
        max_buf = int(limit // (workers * elem))
        max_tasks = int(limit // per_worker)
        alt = (f", or run at most {max_tasks} input worker(s) per node" if max_tasks >= 1 else "")
        warn = PlanWarning(
            "SHUFFLE_MEMORY",
            f"shuffle buffers need {format_bytes(per_node)} per node ({workers} worker(s) × "
            f"shuffle_buffer {buf} × {format_bytes(elem)} per element, "
            f"{self.element_source}), more than {SHUFFLE_MEMORY_FRACTION:.0%} of the node's "
            f"{format_bytes(mem)}",
            f"set train_input.shuffle_buffer <= {max_buf}{alt}; sharding lets each worker shuffle "
            "only its own slice (\"Performance Optimization Practices\": \"Shard your input data\")")
        return info, warn


@dataclass(frozen=True)
class PlanOptions:
    """How :func:`plan_shards` plans.

    Attributes:
        base_seed: the workers' seeds derive from it (:func:`worker_seed`).
        mode: ``"shard"`` (each file to exactly one worker; needs files >= workers),
            ``"replicate"`` (every worker reads every file with its own seed) or ``"auto"``
            (shard when there are at least as many files as workers, else replicate).
        balance_by: ``"records"`` or ``"bytes"``; ``None``: records when they were counted.
        layout: the csrun_wse layout the plan is for (stored in the plan).
        records_exact: whether every file's records were counted (default: records given).
        records_estimate: total records estimated from bytes when not all were counted.
        shuffle: the shuffle-memory check's inputs (:class:`ShuffleBuffers`).
        reshard_hint: the sources named in the suggested ``cs_input_analyzer reshard``.
        extra_warnings: findings of the file scan, put first in the plan's warnings.
        imbalance_warn: ``IMBALANCE`` above this max/mean.
        dominance_warn: ``DOMINANT_FILE`` when one file exceeds this × the mean worker load.
        target_shard_bytes: shard size the suggested reshard aims at (bytes).
        replicate_max_entries: most path entries (files × workers) a replicate plan may list.
    """

    base_seed: int = 0
    mode: str = "auto"
    balance_by: str | None = None
    layout: dict | None = None
    records_exact: bool | None = None
    records_estimate: int | None = None
    shuffle: ShuffleBuffers = field(default_factory=ShuffleBuffers)
    reshard_hint: str = "<data files>"
    extra_warnings: Sequence[PlanWarning] = ()
    imbalance_warn: float = IMBALANCE_WARN
    dominance_warn: float = DOMINANCE_WARN
    target_shard_bytes: int = TARGET_SHARD_BYTES
    replicate_max_entries: int = REPLICATE_MAX_ENTRIES


class _Assignment(NamedTuple):
    """Which files each worker reads (CSR: ``order`` and ``offsets``, as in
    :class:`ShardPlan`), with the per-worker bytes and records."""

    order: np.ndarray
    offsets: np.ndarray
    worker_bytes: np.ndarray
    worker_records: np.ndarray | None


def plan_shards(files: FileTable | Sequence[FileInfo], num_input_workers: int,
                options: PlanOptions | None = None) -> ShardPlan:
    """Plan which files each of ``num_input_workers`` input workers reads.

    ``files``: a :class:`FileTable` (or list of :class:`FileInfo`): F paths with sizes
    (bytes) and, when counted, records. ``options`` (:class:`PlanOptions`): the mode, what
    to balance, the seeds' base, the shuffle-memory check and the warning thresholds.
    Shard mode assigns whole files with LPT (:func:`lpt_assign`); seeds are
    :func:`worker_seed` of the base seed.

    Rules: the performance guide's "Shard your input data" (Cerebras, "Performance
    Optimization Practices"): "split your dataset into multiple, shorter, distinct files and
    allocate them across the worker nodes so that different workers have different slices of
    the dataset"; and "Multiple input workers" (Cerebras, "Limitations of the
    CerebrasEstimator"): "each worker node must shuffle its data differently" — "In the
    simplest setup, the same input data is replicated across every input worker."

    Warnings (in ``plan.warnings``, each with its fix): ``FEW_FILES`` (F < W),
    ``DOMINANT_FILE`` (a file alone exceeds ``dominance_warn`` × the mean worker load),
    ``IMBALANCE`` (max/mean above ``imbalance_warn`` otherwise), ``SHUFFLE_MEMORY``.

    Raises ``ValueError`` (one line) for W < 1, no files, an unknown mode or balance, records
    asked for but not counted, a negative size, ``shard`` mode with F < W, or a replicate
    plan over ``replicate_max_entries`` path entries.
    """
    opts = options or PlanOptions()
    table = files if isinstance(files, FileTable) else FileTable.from_infos(list(files))
    W = _check_workers(num_input_workers)
    balance_by = _check_inputs(table, opts)
    records_exact = table.records is not None if opts.records_exact is None else opts.records_exact
    total_bytes = int(table.sizes.sum())
    base_seed = int(opts.base_seed) % schema.SEED_LIMIT
    warnings = list(opts.extra_warnings)
    n_shards = suggest_num_shards(total_bytes, W, opts.target_shard_bytes)
    reshard_cmd = f"cs_input_analyzer reshard {opts.reshard_hint} --num-shards {n_shards} --output <new dir>"
    use_mode = _plan_mode(opts.mode, len(table), W, reshard_cmd)
    if use_mode == "replicate":
        assignment = _replicate(table, W, opts.replicate_max_entries, reshard_cmd, warnings)
    else:
        assignment = _shard(table, W, balance_by, opts, (n_shards, reshard_cmd), warnings)
    shuffle, warn = opts.shuffle.check()
    if warn is not None:
        warnings.append(warn)
    return ShardPlan(
        num_input_workers=W, mode=use_mode, balance_by=balance_by, base_seed=base_seed,
        paths=list(table.paths), order=assignment.order, offsets=assignment.offsets,
        worker_bytes=assignment.worker_bytes, worker_records=assignment.worker_records,
        seeds=[worker_seed(base_seed, i) for i in range(W)], warnings=warnings, layout=opts.layout,
        shuffle=shuffle, records_exact=bool(records_exact and table.records is not None),
        records_estimate=(int(table.records.sum()) if table.records is not None else opts.records_estimate))


def _check_workers(num_input_workers: int) -> int:
    n = num_input_workers
    if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < 1:
        raise ValueError(f"workers {n!r}: must be an integer >= 1")
    return int(n)


def _check_inputs(table: FileTable, opts: PlanOptions) -> str:
    """Validate the files and the options; returns what to balance (bytes or records)."""
    if len(table) == 0:
        raise ValueError("data files: none given; nothing to plan")
    if opts.mode not in ("auto", "shard", "replicate"):
        raise ValueError(f"--mode {opts.mode!r}: expected auto, shard or replicate")
    balance_by = opts.balance_by
    if balance_by is None:
        balance_by = "records" if table.records is not None else "bytes"
    if balance_by not in schema.BALANCE_BY:
        raise ValueError(f"balance_by {balance_by!r}: expected bytes or records")
    if balance_by == "records" and table.records is None:
        raise ValueError("balance_by 'records': the files' records were not counted")
    if table.sizes.size and table.sizes.min() < 0:
        raise ValueError(f"file sizes: must be >= 0, got {int(table.sizes.min())}")
    return balance_by


def _plan_mode(mode: str, F: int, W: int, reshard_cmd: str) -> str:
    """The mode to plan in: ``auto`` shards when every worker can get its own file."""
    if mode == "shard" and F < W:
        raise ValueError(f"--mode shard: {F} file(s) for {W} workers; every worker needs its own "
                         f"file: reshard ({reshard_cmd}) or use --mode replicate")
    return mode if mode != "auto" else ("shard" if F >= W else "replicate")


def _replicate(table: FileTable, W: int, max_entries: int, reshard_cmd: str,
               warnings: list[PlanWarning]) -> _Assignment:
    """Every worker reads every file (only the seeds differ); ``FEW_FILES`` when there are
    fewer files than workers."""
    F = len(table)
    if F * W > max_entries:
        raise ValueError(f"--mode replicate: {F} files × {W} workers = {F * W} path entries "
                         f"(limit {max_entries}); reshard instead: {reshard_cmd}")
    if F < W:
        warnings.append(PlanWarning(
            "FEW_FILES",
            f"{F} file(s) for {W} input workers: sharding would leave {W - F} worker(s) "
            "without a file, so every worker reads all files with its own shuffle seed "
            "(replicated: \"Limitations of the CerebrasEstimator\", \"Multiple input workers\")",
            f"reshard into k × {W} files so each worker reads distinct data (\"Performance Optimization "
            f"Practices\": \"Shard your input data\"): "
            f"{reshard_cmd}"))
    records = np.full(W, int(table.records.sum()), dtype=np.int64) if table.records is not None else None
    return _Assignment(np.arange(F, dtype=np.int64), np.zeros(W + 1, dtype=np.int64),
                       np.full(W, int(table.sizes.sum()), dtype=np.int64), records)


def _shard(table: FileTable, W: int, balance_by: str, opts: PlanOptions, reshard: tuple[int, str],
           warnings: list[PlanWarning]) -> _Assignment:
    """Each file to one worker, LPT-balanced on ``balance_by``; warns about a dominating file
    or uneven loads (:func:`_balance_warning`)."""
    F, sizes = len(table), table.sizes
    weights = table.records if balance_by == "records" and table.records is not None else sizes
    owner, _ = lpt_assign(weights, W)
    small = owner.astype(np.uint16 if W <= 2 ** 16 else np.uint32)
    order = np.argsort(small, kind="stable").astype(np.int64)
    offsets = np.zeros(W + 1, dtype=np.int64)
    np.cumsum(np.bincount(owner, minlength=W), out=offsets[1:])

    def sums(col: np.ndarray) -> np.ndarray:
        cs = np.zeros(F + 1, dtype=np.int64)
        np.cumsum(col[order], out=cs[1:])
        return cs[offsets[1:]] - cs[offsets[:-1]]

    assignment = _Assignment(order, offsets, sums(sizes), sums(table.records) if table.records is not None else None)
    loads = assignment.worker_records if balance_by == "records" else assignment.worker_bytes
    warn = _balance_warning(table, weights, loads, balance_by, opts, reshard)
    if warn is not None:
        warnings.append(warn)
    return assignment


def _balance_warning(table: FileTable, weights: np.ndarray, loads: np.ndarray | None, balance_by: str,
                     opts: PlanOptions, reshard: tuple[int, str]) -> PlanWarning | None:
    """``DOMINANT_FILE`` when one file alone exceeds ``dominance_warn`` × the mean worker
    load, else ``IMBALANCE`` when max/mean of the loads exceeds ``imbalance_warn``."""
    assert loads is not None  # the balanced quantity was counted (_check_inputs)
    n_shards, reshard_cmd = reshard
    W, F = len(loads), len(table)
    unit = "records" if balance_by == "records" else "bytes"
    mean = float(loads.sum()) / W
    imb = load_imbalance(loads) or 1.0
    big = int(np.argmax(weights))
    fix = (f"reshard into {n_shards} equal files (k × {W} workers; \"Performance Optimization Practices\": "
           f"\"Shard your input data\"): {reshard_cmd}")
    if mean > 0 and weights[big] > opts.dominance_warn * mean:
        return PlanWarning(
            "DOMINANT_FILE",
            f"{table.paths[big]} holds {int(weights[big])} {unit}, {weights[big] / mean:.2f}× the mean "
            f"worker load ({mean:.0f} {unit}); the worker reading it bounds the imbalance "
            f"(max/mean {imb:.3f})", fix)
    if imb > opts.imbalance_warn:
        return PlanWarning(
            "IMBALANCE",
            f"worker loads are uneven: max/mean {imb:.3f} {unit} with {F} files on {W} workers "
            f"({F / W:.2f} files per worker)", fix)
    return None
