"""analyzer/filescan.py: gathering the data files and counting their records within a budget."""
from __future__ import annotations

import pytest

from analyzer.datafiles import expand_sources
from analyzer.filescan import gather_files
from analyzer.shard_planner import plan_shards
from csrun_common import tfrecord as tfr


def _write(path, n, size=20):
    tfr.write_records(path, [bytes([i % 256]) * size for i in range(n)])


def test_gather_counts_records_and_drops_empty(tmp_path):
    for i, n in enumerate((3, 10, 0, 7)):
        _write(tmp_path / f"p{i}.tfrecord", n)
    paths, _ = expand_sources([str(tmp_path)])
    g = gather_files(paths)
    assert g.records_exact and g.table.records.tolist() == [3, 10, 7]
    assert g.mean_record_bytes == 20.0
    assert [w.code for w in g.warnings] == ["EMPTY_FILES"]
    plan = plan_shards(g.table, 2)
    assert plan.balance_by == "records" and plan.total_records == 20


def test_gather_budget_and_non_tfrecord(tmp_path):
    for i in range(4):
        _write(tmp_path / f"p{i}.tfrecord", 5)
    paths, _ = expand_sources([str(tmp_path / "*.tfrecord")])
    g = gather_files(paths, budget_s=0)
    assert not g.records_exact and g.table.records is None
    assert any(w.code == "RECORDS_NOT_COUNTED" for w in g.warnings)
    assert g.records_estimate == 20  # extrapolated from the counted file(s) by bytes
    assert plan_shards(g.table, 2).balance_by == "bytes"
    (tmp_path / "z.csv").write_text("a,b\n" * 100)
    mixed = paths + [str(tmp_path / "z.csv")]
    g2 = gather_files(mixed)
    assert g2.table.records is None and [w.code for w in g2.warnings] == ["NOT_TFRECORD"]
    with pytest.raises(ValueError, match="--count yes"):
        gather_files(mixed, count="yes")
    assert gather_files(mixed, count="no").counted_files == 0
