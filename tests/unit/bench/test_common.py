"""Unit tests of bench/common.py (statistics, pairing order, metadata) and bench/results_table.py (the
generated table)."""
from __future__ import annotations

import json
import math
import sys

import pytest

from tests.unit.paths import REPO

BENCH = REPO / "bench"
sys.path.insert(0, str(BENCH))

import common  # noqa: E402
import results_table  # noqa: E402


def test_median_odd_even_empty_and_nan():
    assert common.median([3, 1, 2]) == 2
    assert common.median([4, 1, 3, 2]) == 2.5
    assert math.isnan(common.median([]))
    assert common.median([1.0, float("nan"), 3.0]) == 2.0


def test_quantile_matches_linear_interpolation():
    xs = [1, 2, 3, 4, 5]
    assert common.quantile(xs, 0.25) == 2
    assert common.quantile(xs, 0.75) == 4
    assert common.quantile([1, 2], 0.5) == 1.5
    assert common.quantile([7], 0.9) == 7


def test_spread_fields():
    sp = common.spread([1.0, 2.0, 3.0, 4.0, 100.0])
    assert sp["median"] == 3.0
    assert sp["q1"] == 2.0 and sp["q3"] == 4.0 and sp["iqr"] == 2.0
    assert sp["rel_iqr"] == pytest.approx(2 / 3, rel=1e-5)
    assert sp["min"] == 1.0 and sp["max"] == 100.0 and sp["n"] == 5
    empty = common.spread([])
    assert empty["median"] is None and empty["n"] == 0


def test_ratio_of_medians():
    assert common.ratio_of_medians([2, 4, 6], [1, 2, 3]) == 2.0
    assert math.isnan(common.ratio_of_medians([1], [0]))
    assert math.isnan(common.ratio_of_medians([], [1]))


def test_compare_median_ratio_is_per_pair():
    a = [1.1, 2.2, 10.0]
    b = [1.0, 2.0, 5.0]
    c = common.compare(a, b)
    assert c["pairs"] == 3
    assert c["median_ratio"] == pytest.approx(1.1)
    assert c["ratio_of_medians"] == pytest.approx(1.1)
    assert c["median_difference"] == pytest.approx(0.2)
    assert c["ratio_iqr"][0] <= c["median_ratio"] <= c["ratio_iqr"][1]


def test_alternate_pairs_order_and_warmup():
    calls = []
    counter = {"a": 0, "b": 0}

    def a():
        counter["a"] += 1
        calls.append("a")
        return float(counter["a"])

    def b():
        counter["b"] += 1
        calls.append("b")
        return float(counter["b"]) * 10

    av, bv = common.alternate_pairs(a, b, pairs=4, warmup=1)
    assert calls == ["a", "b", "a", "b", "b", "a", "a", "b", "b", "a"]
    assert len(av) == len(bv) == 4
    assert av == [2.0, 3.0, 4.0, 5.0]
    assert bv == [20.0, 30.0, 40.0, 50.0]


def test_round_robin_rotates_first():
    order = []
    fns = {k: (lambda k=k: order.append(k) or 1.0) for k in ("x", "y", "z")}
    out = common.round_robin(fns, rounds=3, warmup=0)
    assert order == ["x", "y", "z", "y", "z", "x", "z", "x", "y"]
    assert all(len(v) == 3 for v in out.values())


def test_read_topology(tmp_path):
    p = tmp_path / "topology"
    p.write_text("PINNED=0\nNODE_CPUS=2\nHOST_CPUS=2\nNODES=5\n")
    assert common.read_topology(p) == {"pinned": 0, "node_cpus": 2, "host_cpus": 2, "nodes": 5}
    assert common.read_topology(tmp_path / "missing") == {}


def test_metadata_has_required_keys():
    m = common.metadata(quick=True)
    for key in ("date", "quick", "host_cores", "pinned", "versions", "cluster"):
        assert key in m
    assert m["quick"] is True
    assert m["versions"]["python"]


def test_fmt():
    assert results_table.fmt(None) == "—"
    assert results_table.fmt(float("nan")) == "—"
    assert results_table.fmt(1.23456, "s") == "1.23 s"
    assert results_table.fmt(12345.6, "samples/s") == "12,346 samples/s"
    assert results_table.fmt(0) == "0"


def _results():
    meta = {"date": "2026-01-02T03:04:05+0000", "quick": False, "host_cores": 2, "pinned": False,
            "processor": "x86_64", "cluster": {"nodes": 5, "node_cpus": 2},
            "versions": {"python": "3.11", "tensorflow": "2.21.0", "slurm": "slurm-wlm 22.05.8"}}
    return {
        "launch": {"meta": meta, "layout_text": "L", "csrun_wse_s": common.spread([1.1, 1.2]),
                   "srun_s": common.spread([1.0, 1.1]), "compare": common.compare([1.1, 1.2], [1.0, 1.1])},
        "startup": {"meta": {**meta, "quick": True},
                    "commands": {"python -c pass": common.spread([0.02, 0.03]),
                                 "csrun_wse --dry-run": common.spread([0.1, 0.12])},
                    "ratios": {"csrun_wse --dry-run": 4.4}},
        "shardplan": {"files": 1000000, "workers": 10000, "repeats": 5,
                      "plan_s": {"median": 0.25, "min": 0.2, "max": 0.3}, "imbalance": 1.0002,
                      "max_over_lower_bound": 1.0002, "when": "2026-01-01T00:00:00+0000"},
        "verify": {"meta": meta, "error": "ImportError: no bench_verify"},
        "streaming": {"meta": meta, "runs": {"digits, k=1": {
            "service": common.spread([100.0, 110.0]), "standalone_concurrent_sum": common.spread([200.0, 210.0]),
            "efficiency": 0.51}}},
        "recommend": {"meta": meta, "pipelines": {
            "serial": {"quality": 1.0, "recommended": {"tasks": 2, "cpus": 1, "samples_per_sec": 5000},
                       "oracle": {"tasks": 2, "cpus": 1, "samples_per_sec": 5000}, "repeats": 3,
                       "sweep": [{}, {}], "time_ratio": 0.5, "analyzer_s": 60, "sweep_s": 120,
                       "analyzer_budget_s": 30,
                       "vs_default": {"compare": {"median_ratio": 1.8, "pairs": 3},
                                      "recommended": {"median": 5000}, "default": {"median": 2800}}},
            "images": {"error": "RuntimeError: boom"}}},
    }


def test_summary_rows_cover_every_benchmark_in_order():
    rows = results_table.summary_rows(_results())
    names = [r["benchmark"] for r in rows]
    # issue order: launch, startup, recommend, verify, streaming, shardplan
    firsts = list(dict.fromkeys(names))
    assert firsts == ["launch", "startup", "recommend", "verify", "streaming", "shardplan"]
    launch = [r for r in rows if r["benchmark"] == "launch"]
    assert launch[0]["value"] == results_table.fmt(common.compare([1.1, 1.2], [1.0, 1.1])["median_ratio"], "×")
    assert any(r["value"] == "error" and "no bench_verify" in r["spread"] for r in rows)
    assert any(r["benchmark"] == "recommend" and "images" in r["figure"] and r["value"] == "error" for r in rows)
    assert any(r["benchmark"] == "recommend" and r["value"] == "1.8 ×" for r in rows)
    startup = [r for r in rows if r["benchmark"] == "startup"]
    assert startup[0]["mode"] == "quick"
    assert [r for r in rows if r["benchmark"] == "shardplan"][0]["date"] == "2026-01-01"


def test_summary_rows_survive_unexpected_shapes():
    rows = results_table.summary_rows({"launch": {"compare": "not a dict", "x": 3}, "mystery": {"a": 1.5}})
    assert rows and all("figure" in r for r in rows)


def test_render_table_escapes_pipes():
    t = results_table.render_table([{"benchmark": "b", "figure": "a|b", "value": "1", "spread": "", "compared": "",
                              "mode": "full", "date": "d"}])
    lines = t.splitlines()
    assert lines[0].startswith("| benchmark |")
    assert "a\\|b" in lines[2]
    assert results_table.render_table([]).count("\n") == 2


def test_update_markdown_replaces_only_between_markers(tmp_path):
    md = tmp_path / "B.md"
    start, end = results_table.TABLE_START, results_table.TABLE_END
    md.write_text(f"# T\n\nprose before\n\n{start}\nold table\n{end}\n\nprose after\n")
    section = results_table.generated_section(_results())
    results_table.update_markdown(md, section)
    text = md.read_text()
    assert "old table" not in text
    assert text.startswith("# T\n\nprose before\n")
    assert text.rstrip().endswith("prose after")
    assert text.count(results_table.TABLE_START) == 1 and text.count(results_table.TABLE_END) == 1
    assert "NOT pinned" in text
    # idempotent
    results_table.update_markdown(md, section)
    assert md.read_text() == text


def test_update_markdown_appends_or_creates(tmp_path):
    md = tmp_path / "new.md"
    results_table.update_markdown(md, results_table.generated_section({}))
    assert results_table.TABLE_START in md.read_text() and "(no results)" in md.read_text()
    md2 = tmp_path / "old.md"
    md2.write_text("# Old\n")
    results_table.update_markdown(md2, results_table.generated_section({}))
    assert md2.read_text().startswith("# Old\n\n" + results_table.TABLE_START)


def test_load_results_keeps_unreadable_files(tmp_path):
    (tmp_path / "good.json").write_text(json.dumps({"a": 1}))
    (tmp_path / "bad.json").write_text("{nope")
    (tmp_path / "list.json").write_text("[1]")
    res = results_table.load_results(tmp_path)
    assert res["good"] == {"a": 1}
    assert res["bad"]["error"].startswith("unreadable")
    assert "error" in res["list"]


def test_write_json_is_atomic_and_handles_nan(tmp_path):
    p = tmp_path / "sub" / "x.json"
    common.write_json(p, {"a": 1.5, "b": [1, 2]})
    assert json.loads(p.read_text()) == {"a": 1.5, "b": [1, 2]}
    assert not list(p.parent.glob(".*.tmp"))


def test_verify_rows_from_bench_verify_shape():
    r = {"runs": [{"name": "images, recommended 1×1×2", "predicted_samples_per_sec": 2000.0,
                   "measured_samples_per_sec": common.spread([2100.0, 2200.0, 2300.0]),
                   "error_pct": common.spread([5.0, 10.0, 15.0])},
                  {"name": "digits: analysis", "error": "boom"}]}
    rows = results_table.summary_rows({"verify": r})
    assert rows[0]["value"] == "10 %"
    assert "2,200 samples/s" in rows[0]["spread"] and "n=3" in rows[0]["spread"]
    assert rows[1]["value"] == "error" and "boom" in rows[1]["spread"]
