"""Shard planning: which data files each input worker reads, with which shuffle seed.

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

Algorithm: LPT (longest processing time first). Files are taken in decreasing weight
(bytes, or records when every file was counted); each goes to the currently least
loaded worker, ties broken by the lower worker index; equal weights keep their input
order (the scanner sorts paths), so the plan is a deterministic function of the input.
A file of weight 0 counts as 1, so that with F >= W files every worker gets one.

Guarantee (Graham's list-scheduling argument, tested by property tests): with
effective weights ``max(w, 1)``, the most loaded worker carries at most
``mean + max_weight`` (the last file put on it went to a least loaded worker, whose
load was at most the mean), and LPT is within 4/3 of the optimal makespan. Imbalance
is reported as ``max / mean`` of the worker loads.

Speed: exact LPT is computed in NumPy bulk steps (a run of files that provably go to
distinct workers in ascending load order is assigned at once) with a binary-heap
fallback; 1,000,000 files onto 10,000 workers plan in well under 2 s
(``bench/bench_shardplan.py``).
"""
from __future__ import annotations

import heapq
import json
import math
import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from csrun_common import shardplan_schema as schema
from csrun_common import tfrecord
from csrun_common.atomic import atomic_open

__all__ = [
    "FileInfo", "FileTable", "PlanWarning", "ShardPlan", "GatherResult", "PlanOptions", "ShuffleBuffers", "worker_seed",
    "lpt_assign", "gather_files", "plan_shards", "suggest_num_shards", "format_bytes",
    "parse_size", "SHUFFLE_MEMORY_FRACTION", "TARGET_SHARD_BYTES",
]

TARGET_SHARD_BYTES = 128 * 2 ** 20   # suggested shard size when resharding (bytes)
SHUFFLE_MEMORY_FRACTION = 0.8        # share of a node's memory the shuffle buffers may take
IMBALANCE_WARN = 1.10                # warn above this max/mean
DOMINANCE_WARN = 1.25                # warn when one file > this × the mean worker load
REPLICATE_MAX_ENTRIES = 20_000_000   # files × workers path entries a replicate plan may list
_GOLDEN = 0x9E3779B97F4A7C15         # odd: i -> base + i*_GOLDEN is injective mod 2**63


@dataclass(frozen=True)
class FileInfo:
    """One data file: ``path`` (str), ``bytes`` (size, bytes), ``records`` (count, or
    None when not counted)."""

    path: str
    bytes: int
    records: int | None = None


@dataclass
class FileTable:
    """Columns of the data files (cheap for millions of files).

    ``paths``: list of F str; ``sizes``: int64 array (F,) of bytes; ``records``: int64
    array (F,) of record counts, or None when not (all) counted.
    """

    paths: list[str]
    sizes: np.ndarray
    records: np.ndarray | None = None

    def __post_init__(self) -> None:
        self.sizes = np.asarray(self.sizes, dtype=np.int64).reshape(-1)
        if len(self.paths) != len(self.sizes):
            raise ValueError(f"FileTable: {len(self.paths)} paths but {len(self.sizes)} sizes")
        if self.records is not None:
            self.records = np.asarray(self.records, dtype=np.int64).reshape(-1)
            if len(self.records) != len(self.sizes):
                raise ValueError(f"FileTable: {len(self.sizes)} sizes but {len(self.records)} records")

    @classmethod
    def from_infos(cls, infos: Sequence[FileInfo]) -> FileTable:
        """Columns from a list of :class:`FileInfo`; records kept only if all counted."""
        recs = [i.records for i in infos]
        records = None if any(r is None for r in recs) else np.asarray(recs, dtype=np.int64)
        return cls([i.path for i in infos], np.asarray([i.bytes for i in infos], dtype=np.int64), records)

    def __len__(self) -> int:
        return len(self.paths)


@dataclass
class PlanWarning:
    """A finding about the data or the layout, with the fix: ``code`` (e.g.
    ``FEW_FILES``), ``severity`` (``warning`` or ``info``), ``message``, ``fix``."""

    code: str
    message: str
    fix: str = ""
    severity: str = "warning"

    def to_dict(self) -> dict:
        return {"code": self.code, "severity": self.severity, "message": self.message, "fix": self.fix}


def worker_seed(base_seed: int, index: int) -> int:
    """Shuffle seed of worker ``index``: ``(base_seed + index × 0x9E3779B97F4A7C15) mod
    2**63``; distinct for distinct indices (the multiplier is odd, hence invertible
    mod 2**63), non-negative and int64-safe ("each worker node must shuffle its data
    differently": "Multiple input workers", Cerebras, "Limitations of the
    CerebrasEstimator")."""
    return (int(base_seed) + int(index) * _GOLDEN) % schema.SEED_LIMIT


def format_bytes(n: float | None) -> str:
    """``1536`` -> ``"1.5 KiB"`` (binary units)."""
    if n is None:
        return "?"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} PiB"  # pragma: no cover


_UNITS = {"": 1, "b": 1, "k": 1024, "kb": 1000, "kib": 1024, "m": 1024 ** 2, "mb": 1000 ** 2,
          "mib": 1024 ** 2, "g": 1024 ** 3, "gb": 1000 ** 3, "gib": 1024 ** 3,
          "t": 1024 ** 4, "tb": 1000 ** 4, "tib": 1024 ** 4}


def parse_size(text: str) -> int:
    """``"64G"``/``"64GiB"`` (binary), ``"64GB"`` (decimal), ``"1.5M"``, ``"4096"`` -> bytes.
    Raises ``ValueError`` for anything else."""
    t = str(text).strip().lower().replace("_", "")
    num = t.rstrip("abcdefghijklmnopqrstuvwxyz ")
    unit = t[len(num):].strip()
    try:
        value = float(num)
    except ValueError:
        raise ValueError(f"not a size: {text!r} (e.g. 4096, 512M, 64G)") from None
    if unit not in _UNITS or value < 0 or not math.isfinite(value):
        raise ValueError(f"not a size: {text!r} (e.g. 4096, 512M, 64G)")
    return int(value * _UNITS[unit])


# --------------------------------------------------------------------------- LPT

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


# --------------------------------------------------------------------------- gathering

@dataclass
class GatherResult:
    """Output of :func:`gather_files`: ``table`` (:class:`FileTable`, empty files
    dropped), ``records_exact`` (every file counted), ``records_estimate`` (total
    records, extrapolated by bytes when not all counted; None when none counted),
    ``mean_record_bytes`` (mean record data size over the counted files, bytes, or
    None), ``counted_files``, ``count_seconds``, ``warnings``."""

    table: FileTable
    records_exact: bool
    records_estimate: int | None
    mean_record_bytes: float | None
    counted_files: int
    count_seconds: float
    warnings: list[PlanWarning] = field(default_factory=list)


def gather_files(paths: Sequence[str], *, count: str = "auto", budget_s: float = 10.0,
                 duplicates: int = 0) -> GatherResult:
    """Stat the files and (optionally) count their TFRecord records.

    ``count``: ``"auto"`` counts when the files are TFRecords (a non-TFRecord file stops
    counting, the plan then balances bytes), ``"yes"`` requires it (raises
    ``ValueError`` naming the file otherwise), ``"no"`` skips it. Counting walks the
    framing only (:func:`csrun_common.tfrecord.count_records`), in a fixed pseudo-random
    file order, and stops after ``budget_s`` seconds: the total is then extrapolated
    by bytes and the plan balances bytes. Empty files are dropped (a worker could not
    read anything from them). Raises ``ValueError`` when a file cannot be stat'ed or
    no non-empty file remains.
    """
    warnings: list[PlanWarning] = []
    if duplicates:
        warnings.append(PlanWarning("DUPLICATE_FILES", f"{duplicates} duplicate path(s) given "
                                    "(same real file); each file is planned once", "", "info"))
    table = _nonempty_files(paths, warnings)
    if count not in ("auto", "yes", "no"):
        raise ValueError(f"--count {count!r}: expected auto, yes or no")
    if count == "no":
        return GatherResult(table, False, None, None, 0, 0.0, warnings)
    t0 = time.monotonic()
    tally = _count_records(table.paths, count == "yes", t0 + max(0.0, float(budget_s)))
    secs = time.monotonic() - t0
    if tally.not_tfrecord:
        warnings.append(PlanWarning(
            "NOT_TFRECORD", f"records not counted: {tally.not_tfrecord}; the plan balances bytes",
            "convert the data to uncompressed TFRecord files to balance records", "info"))
        return GatherResult(table, False, None, None, 0, secs, warnings)
    counted_mask = tally.records >= 0
    n_rec = int(tally.records[counted_mask].sum())
    mean_rec = (tally.data_bytes / n_rec) if n_rec else None
    if tally.counted == len(table):
        table.records = tally.records
        return GatherResult(table, True, n_rec, mean_rec, tally.counted, secs, warnings)
    counted_bytes = int(table.sizes[counted_mask].sum())
    estimate = int(round(n_rec * int(table.sizes.sum()) / counted_bytes)) if counted_bytes else None
    warnings.append(PlanWarning(
        "RECORDS_NOT_COUNTED",
        f"counted {tally.counted} of {len(table)} files in the {budget_s:g} s budget; total records "
        f"estimated at {estimate if estimate is not None else '?'} from bytes; the plan balances bytes",
        f"raise --count-budget (counting ran at {counted_bytes / max(secs, 1e-9) / 2**20:.0f} MiB/s) "
        "to balance records", "info"))
    return GatherResult(table, False, estimate, mean_rec, tally.counted, secs, warnings)


def _nonempty_files(paths: Sequence[str], warnings: list[PlanWarning]) -> FileTable:
    """The files' sizes (bytes), empty files left out (an ``EMPTY_FILES`` note). Raises
    ``ValueError`` when a file cannot be stat'ed or none is non-empty."""
    sizes = np.empty(len(paths), dtype=np.int64)
    for i, p in enumerate(paths):
        try:
            sizes[i] = os.stat(p).st_size
        except OSError as exc:
            raise ValueError(f"data file {p!r}: cannot stat ({exc.strerror})") from None
    keep = np.flatnonzero(sizes > 0)
    if len(keep) < len(paths):
        empty = [paths[i] for i in np.flatnonzero(sizes == 0)[:3].tolist()]
        warnings.append(PlanWarning(
            "EMPTY_FILES", f"{len(paths) - len(keep)} empty file(s) left out of the plan "
            f"(e.g. {', '.join(empty)})", "", "info"))
        paths = [paths[i] for i in keep.tolist()]
        sizes = sizes[keep]
    if not paths:
        raise ValueError("data files: none is non-empty; nothing to plan")
    return FileTable(list(paths), sizes)


class _Tally(NamedTuple):
    """Records counted per file (-1: not counted), their data bytes, the files counted, and
    the reason counting stopped at a file that is no TFRecord ("" otherwise)."""

    records: np.ndarray
    data_bytes: int
    counted: int
    not_tfrecord: str


def _count_records(paths: list[str], required: bool, deadline: float) -> _Tally:
    """Count the files' records in a fixed pseudo-random order until ``deadline``
    (``time.monotonic``). A file that is no TFRecord stops counting, or raises
    ``ValueError`` when counting is ``required`` (``--count yes``)."""
    records = np.full(len(paths), -1, dtype=np.int64)
    data_bytes = counted = 0
    for i in np.random.default_rng(0).permutation(len(paths)).tolist():
        try:
            rc = tfrecord.count_records(paths[i], deadline=deadline)
        except tfrecord.TFRecordError as exc:
            if required:
                raise ValueError(f"--count yes: {exc}") from None
            return _Tally(records, data_bytes, counted, str(exc))
        if rc is not None:
            records[i] = rc.records
            data_bytes += rc.data_bytes
            counted += 1
        if rc is None or time.monotonic() > deadline:
            break
    return _Tally(records, data_bytes, counted, "")


# --------------------------------------------------------------------------- the plan

def suggest_num_shards(total_bytes: int, num_input_workers: int, target_shard_bytes: int = TARGET_SHARD_BYTES) -> int:
    """Shards to reshard into: ``k × num_input_workers`` with the smallest ``k >= 1`` that keeps
    shards at or below ``target_shard_bytes`` (bytes). Equal shards balance exactly."""
    k = max(1, math.ceil(total_bytes / (num_input_workers * max(1, target_shard_bytes))))
    return k * num_input_workers


def _imbalance(loads: np.ndarray | None) -> float | None:
    if loads is None or len(loads) == 0:
        return None
    mean = float(loads.sum()) / len(loads)
    return 1.0 if mean <= 0 else float(loads.max()) / mean


@dataclass
class ShardPlan:
    """A shard plan in memory (see ``csrun_common/shardplan_schema.py`` for the JSON).

    Per-worker data is held in CSR form: worker ``i`` reads ``paths[order[offsets[i]:
    offsets[i+1]]]`` (shard mode; in replicate mode every worker reads all paths).
    ``worker_bytes`` int64 (W,) bytes; ``worker_records`` int64 (W,) records or None;
    ``seeds`` list of W ints; ``warnings`` list of :class:`PlanWarning`; ``layout`` and
    ``shuffle`` dicts (or None) describe the worker layout and the shuffle-memory check.
    """

    num_input_workers: int
    mode: str
    balance_by: str
    base_seed: int
    paths: list[str]
    order: np.ndarray
    offsets: np.ndarray
    worker_bytes: np.ndarray
    worker_records: np.ndarray | None
    seeds: list[int]
    warnings: list[PlanWarning] = field(default_factory=list)
    layout: dict | None = None
    shuffle: dict | None = None
    records_exact: bool = False
    records_estimate: int | None = None
    created_by: str = "cs_input_analyzer shard-plan"

    # -- views
    def worker_file_indices(self, index: int) -> np.ndarray:
        """Indices into ``paths`` of the files of worker ``index`` (int64 array)."""
        if self.mode == "replicate":
            return np.arange(len(self.paths), dtype=np.int64)
        return self.order[self.offsets[index]:self.offsets[index + 1]]

    def worker_files(self, index: int) -> list[str]:
        """Paths read by worker ``index``."""
        p = self.paths
        return [p[j] for j in self.worker_file_indices(index).tolist()]

    @property
    def imbalance_bytes(self) -> float:
        """max/mean of the per-worker bytes (1.0 = perfect)."""
        return _imbalance(self.worker_bytes) or 1.0

    @property
    def imbalance_records(self) -> float | None:
        """max/mean of the per-worker records, or None when not counted."""
        return _imbalance(self.worker_records)

    @property
    def imbalance(self) -> float:
        """max/mean of the balanced quantity (``balance_by``)."""
        if self.balance_by == "records" and self.worker_records is not None:
            return self.imbalance_records or 1.0
        return self.imbalance_bytes

    @property
    def total_bytes(self) -> int:
        return int(self.worker_bytes[0]) if self.mode == "replicate" else int(self.worker_bytes.sum())

    @property
    def total_records(self) -> int | None:
        if self.worker_records is None:
            return None
        return int(self.worker_records[0]) if self.mode == "replicate" else int(self.worker_records.sum())

    # -- JSON
    def header_dict(self) -> dict:
        """Everything but the ``workers`` list (small)."""
        return {
            "schema": schema.SCHEMA,
            "version": schema.VERSION,
            "created_by": self.created_by,
            "num_workers": self.num_input_workers,
            "mode": self.mode,
            "balance_by": self.balance_by,
            "base_seed": self.base_seed,
            "records_exact": self.records_exact,
            "imbalance": round(self.imbalance, 6),
            "imbalance_bytes": round(self.imbalance_bytes, 6),
            "imbalance_records": (None if self.imbalance_records is None
                                  else round(self.imbalance_records, 6)),
            "totals": {"files": len(self.paths), "bytes": self.total_bytes,
                       "records": self.total_records,
                       "records_estimate": self.records_estimate},
            "layout": self.layout,
            "shuffle": self.shuffle,
            "warnings": [w.to_dict() for w in self.warnings],
        }

    def worker_dicts(self) -> Iterable[dict]:
        """The ``workers`` entries, in index order (generated lazily)."""
        recs = None if self.worker_records is None else self.worker_records.tolist()
        wb = self.worker_bytes.tolist()
        allp = self.paths if self.mode == "replicate" else None
        for i in range(self.num_input_workers):
            yield {"index": i, "seed": self.seeds[i], "bytes": wb[i],
                   "records": None if recs is None else recs[i],
                   "files": list(allp) if allp is not None else self.worker_files(i)}

    def to_dict(self) -> dict:
        """The plan as the JSON-ready dict of ``csrun_common/shardplan_schema.py``."""
        d = self.header_dict()
        d["workers"] = list(self.worker_dicts())
        return d

    def to_json(self) -> str:
        """The plan as a compact JSON string (see :meth:`write_json` for files)."""
        return json.dumps(self.to_dict())

    def write_json(self, path: os.PathLike[str] | str) -> str:
        """Write the plan atomically (temporary file + rename) and return the absolute
        path. Small fields are indented; each worker is one line (fast for millions of
        files)."""
        path = os.path.abspath(os.fspath(path))
        head = json.dumps(self.header_dict(), indent=1)
        with atomic_open(path) as fh:
            fh.write(head[:-2])  # drop "\n}"
            fh.write(',\n "workers": [\n')
            first = True
            for w in self.worker_dicts():
                if not first:
                    fh.write(",\n")
                fh.write("  ")
                fh.write(json.dumps(w))
                first = False
            fh.write("\n ]\n}\n")
        return path

    @classmethod
    def from_dict(cls, data: dict, source: str = "<plan>") -> ShardPlan:
        """Rebuild a plan from its JSON dict (validated with
        :func:`csrun_common.shardplan_schema.validate_plan`; raises ``ValueError``)."""
        schema.validate_plan(data, source)
        workers = data["workers"]
        W = data["num_workers"]
        if data["mode"] == "replicate":
            paths = list(workers[0]["files"])
            order = np.arange(len(paths), dtype=np.int64)
            offsets = np.zeros(W + 1, dtype=np.int64)
        else:
            paths = [f for w in workers for f in w["files"]]
            order = np.arange(len(paths), dtype=np.int64)
            offsets = np.cumsum([0] + [len(w["files"]) for w in workers]).astype(np.int64)
        recs = [w.get("records") for w in workers]
        tot = data.get("totals") or {}
        plan = cls(
            num_input_workers=W, mode=data["mode"], balance_by=data["balance_by"],
            base_seed=int(data.get("base_seed", 0)), paths=paths, order=order, offsets=offsets,
            worker_bytes=np.asarray([w["bytes"] for w in workers], dtype=np.int64),
            worker_records=None if any(r is None for r in recs) else np.asarray(recs, dtype=np.int64),
            seeds=[w["seed"] for w in workers],
            warnings=[PlanWarning(w.get("code", ""), w.get("message", ""), w.get("fix", ""),
                                  w.get("severity", "warning")) for w in data.get("warnings") or []],
            layout=data.get("layout"), shuffle=data.get("shuffle"),
            records_exact=bool(data.get("records_exact", False)),
            records_estimate=tot.get("records_estimate"),
            created_by=data.get("created_by", ""))
        return plan

    @classmethod
    def from_json(cls, path: os.PathLike[str] | str) -> ShardPlan:
        """Load and validate a plan file (``ValueError`` naming the field on error)."""
        return cls.from_dict(schema.load_plan(path), os.fspath(path))


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
    imb = _imbalance(loads) or 1.0
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
