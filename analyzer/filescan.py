"""The data files a shard plan divides, as columns: their sizes and, for TFRecord files, their
record counts (:func:`gather_files`: stat, then count within a time budget). Finding the files
(globs, directories, a params YAML) is :mod:`analyzer.datafiles`; dividing them is
:mod:`analyzer.shard_planner`.
"""
from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from csrun_common import tfrecord

from .shardplan import PlanWarning

__all__ = ["FileInfo", "FileTable", "GatherResult", "gather_files"]


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

