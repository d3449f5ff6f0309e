"""The shard plan: which data files each input worker reads, with which shuffle seed
(:class:`ShardPlan`), in memory and as the JSON file ``csrun_wse --shard-plan`` takes (format:
``csrun_common/shardplan_schema.py``), with the findings about the data or the layout that
come with it (:class:`PlanWarning`). Made by :func:`analyzer.shard_planner.plan_shards` from
the files :func:`analyzer.filescan.gather_files` measured.
"""
from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from csrun_common import shardplan_schema as schema
from csrun_common.atomic import atomic_open

__all__ = ["PlanWarning", "ShardPlan", "format_bytes", "load_imbalance", "parse_size"]


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


def load_imbalance(loads: np.ndarray | None) -> float | None:
    """``max / mean`` of per-worker loads (1.0: even; None: no loads)."""
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
        return load_imbalance(self.worker_bytes) or 1.0

    @property
    def imbalance_records(self) -> float | None:
        """max/mean of the per-worker records, or None when not counted."""
        return load_imbalance(self.worker_records)

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


