"""Unit tests of the adaptive planner and the probe summary (no processes started)."""
from __future__ import annotations

import math

import pytest

from analyzer import probe_plan as P


def row(t, c, rate, util=0.95, kind="pipeline", status="ok", contended=False):
    return {"kind": kind, "tasks": t, "cpus_per_task": c, "status": status, "samples_per_sec": rate,
            "cpu_util": util, "contended": contended}


def test_candidates():
    assert P.candidates(2, 4) == [(1, 1), (2, 1), (1, 2), (4, 1)]
    c8 = P.candidates(8, 16)
    assert (1, 8) in c8 and (8, 1) in c8 and (2, 4) in c8 and (16, 1) in c8
    assert all(t * c <= 8 for t, c in c8[:-1])
    assert P.candidates(1, 1) == [(1, 1)]


def test_brackets_come_first_then_ingest_then_a_repeat():
    rows = []
    seen = []
    for rate in (100.0, 180.0, 60.0):
        nxt = P.next_probe(rows, 4, 8)
        seen.append(nxt)
        rows.append(row(nxt[1], nxt[2], rate))
    assert seen == [("pipeline", 1, 4), ("pipeline", 4, 1), ("pipeline", 1, 1)]
    assert P.next_probe(rows, 4, 8) == ("ingest", 1, 4)
    rows.append(row(1, 4, 5000.0, kind="ingest"))
    assert P.next_probe(rows, 4, 8) == ("served", 2, 1)  # one worker serving the real pipeline
    assert P.next_probe(rows, 4, 1) == ("pipeline", 4, 1)  # a single process cannot serve a chief
    rows.append(row(2, 1, 90.0, kind="served"))
    assert P.next_probe(rows, 4, 8) == ("pipeline", 4, 1)  # repeat the best
    rows.append(row(4, 1, 175.0))
    assert P.next_probe(rows, 4, 8) == ("served", 2, 1)  # the served probe's second window
    assert P.next_probe(rows[:3], 4, 8, want_ingest=False) == ("pipeline", 4, 1)


def test_oversubscription_only_when_cpus_idle():
    rows = [row(1, 2, 10.0, 0.05), row(2, 1, 20.0, 0.06), row(1, 1, 10.0, 0.05), row(2, 1, 20.0, 0.06),
            row(1, 2, 1e4, kind="ingest"), row(2, 1, 9.0, kind="served"), row(2, 1, 9.0, kind="served")]
    assert P.next_probe(rows, 2, 4) == ("pipeline", 4, 1)
    busy = [dict(r, cpu_util=0.99) for r in rows]
    assert P.next_probe(busy, 2, 4) != ("pipeline", 4, 1)


def test_contended_bracket_is_measured_again():
    rows = [row(1, 2, 100.0, contended=True), row(2, 1, 200.0), row(1, 1, 100.0), row(1, 2, 1e4, kind="ingest"),
            row(2, 1, 90.0, kind="served"), row(2, 1, 90.0, kind="served")]
    assert P.next_probe(rows, 2, 4) == ("pipeline", 1, 2)


def test_planner_stops_when_everything_is_known():
    rows = []
    for t, c, rate in [(1, 2, 190.0), (2, 1, 200.0), (1, 1, 100.0)]:
        rows += [row(t, c, rate)] * 3
    rows.append(row(1, 2, 1e4, kind="ingest"))
    assert P.next_probe(rows, 2, 2) == ("served", 2, 1)
    rows += [row(2, 1, 95.0, kind="served")] * 2
    assert P.next_probe(rows, 2, 2) == ("served", 2, 1)  # a third window before stopping
    rows.append(row(2, 1, 95.0, kind="served"))
    assert P.next_probe(rows, 2, 2) is None


def test_all_brackets_failed_stops():
    rows = [row(1, 2, math.nan, status="failed"), row(2, 1, math.nan, status="failed"),
            row(1, 1, math.nan, status="timeout")]
    assert P.next_probe(rows, 2, 4) is None


def test_summarize_sums_rates_and_cpu():
    res = [{"samples_per_sec": 100.0, "window_s": 2.0, "cpu_seconds": 1.8, "samples": 200, "batches": 10,
            "read_chars": 2000, "read_bytes": 0, "element_bytes": 4000, "first_element_s": 0.1,
            "host_busy_cores": 2.0, "synchronized": True},
           {"samples_per_sec": 120.0, "window_s": 2.0, "cpu_seconds": 2.0, "samples": 240, "batches": 12,
            "read_chars": 2000, "read_bytes": 0, "element_bytes": 4000, "first_element_s": 0.3,
            "host_busy_cores": 2.0, "synchronized": True}]
    r = P.summarize("pipeline", 2, 1, 2, res, "ok", "", 0.0, 5.0, 1.0, "node2", 7)
    assert r["samples_per_sec"] == pytest.approx(220.0)
    assert r["cpu_cores_used"] == pytest.approx(1.9)
    assert r["cpu_util"] == pytest.approx(0.95)
    assert r["cpu_seconds_per_sample"] == pytest.approx(3.8 / 440)
    assert r["read_bytes_per_sec"] == pytest.approx(2000.0)
    assert r["other_cores_busy"] == pytest.approx(0.1)
    assert r["contended"] is False
    assert r["task_rate_min"] == 100.0 and r["first_element_s"] == 0.3
    assert "chief_cpu_seconds_per_sample" not in r  # a pipeline probe has no chief
    failed = P.summarize("pipeline", 2, 1, 2, [], "timeout", "no result", 0.0, 5.0, 1.0, "node2", 8)
    assert failed["status"] == "timeout" and math.isnan(failed["samples_per_sec"])


def test_summarize_served_splits_chief_and_worker_cpu():
    chief = {"index": 0, "samples_per_sec": 500.0, "window_s": 2.0, "cpu_seconds": 0.2, "samples": 1000,
             "batches": 31, "host_busy_cores": 1.0}
    worker = {"index": 1, "samples_per_sec": 0.0, "window_s": 2.0, "cpu_seconds": 1.8, "samples": 0,
              "batches": 200, "host_busy_cores": 1.0}
    r = P.summarize("served", 2, 1, 1, [chief, worker], "ok", "", 0.0, 5.0, 1.0, "node2", 3)
    assert r["samples_per_sec"] == pytest.approx(500.0)
    assert r["chief_cpu_seconds_per_sample"] == pytest.approx(0.2 / 1000)
    assert r["worker_cpu_seconds_per_sample"] == pytest.approx(1.8 / 1000)
