"""Disturbed (contended) probes, across analyzer/probe_driver.py, analyzer/model.py,
analyzer/report.py and analyzer/analyze.py: the planner measures them once more, the report leads
with a warning naming them and their load, and no speed-up larger than the resources added is
evidence (issue 24, item 2). Recorded probe tables and synthetic ones; nothing started."""
from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd
import pytest

from analyzer import analyze as A
from analyzer import findings as F
from analyzer import model as M
from analyzer import probe_driver as D
from analyzer import probe_plan as P
from analyzer import report as RP
from tests.unit.paths import FIXTURES

FIX = FIXTURES / "probes"


def row(t, c, rate, contended=False, other=0.0, kind="pipeline", util=0.95, n=2, pid=0):
    cores = util * min(t * c, n)
    return {"probe_id": pid, "kind": kind, "tasks": t, "cpus_per_task": c, "node_cpus": n, "status": "ok",
            "samples_per_sec": rate, "cpu_util": util, "cpu_cores_used": cores,
            "cpu_seconds_per_sample": cores / rate, "other_cores_busy": other, "contended": contended}


def base(stopped="done", available=2):
    return {"command": ["python", "run.py", "--params", "p.yaml", "--mode", "validate_only"], "run_py": "/x/run.py",
            "argv": ["--params", "p.yaml"], "available_nodes": available, "node_cpus": 2, "output_dir": "/tmp/x",
            "probing_s": 20.0, "probed_on": {"node": "node2"}, "stopped": stopped,
            "target": {"samples_per_sec": None, "source": "test"}, "notes": []}


def recorded(name):
    return pd.read_csv(FIX / name).to_dict("records")


# --------------------------------------------------------------------------- planner: measure again, once
def test_contended_oversubscribed_layout_is_measured_again_once():
    rows = [row(1, 2, 100.0), row(2, 1, 200.0, util=0.3), row(1, 1, 100.0), row(1, 2, 1e4, kind="ingest"),
            row(2, 1, 90.0, kind="served"), row(2, 1, 200.0, util=0.3), row(4, 1, 380.0, contended=True, other=1.2)]
    assert P.next_probe(rows, 2, 4) == ("pipeline", 4, 1)
    # a session of 2 processes cannot hold 4 tasks: the planner does not ask for it there
    assert P.next_probe(rows, 2, 2) != ("pipeline", 4, 1)
    rows.append(row(4, 1, 390.0, contended=True, other=1.1))  # disturbed again: not a third time by this rule
    assert P._measure_again(rows, 2, P.candidates(2, 4), P._stats(rows), {(1, 2): 1, (2, 1): 2, (1, 1): 1,
                                                                          (4, 1): 2}, True) is None


def test_contended_ingest_probe_is_measured_again_once():
    rows = [row(1, 2, 100.0), row(2, 1, 200.0), row(1, 1, 100.0),
            row(3, 2, 1e4, kind="ingest", contended=True, other=0.9), row(2, 1, 90.0, kind="served")]
    assert P.next_probe(rows, 2, 4) == ("ingest", 1, 2)
    rows.append(row(3, 2, 1.1e4, kind="ingest", contended=True, other=0.8))
    assert P.next_probe(rows, 2, 4) != ("ingest", 1, 2)


def test_contended_read_back_from_csv_strings():
    assert P.is_contended(True) and P.is_contended("True") and P.is_contended(" true ") and P.is_contended(1.0)
    for v in (False, "False", None, math.nan, 0, ""):
        assert not P.is_contended(v), v
    # a bracket read back from probes.csv as the string "True" is measured again
    rows = [dict(row(1, 2, 100.0), contended="True"), row(2, 1, 200.0), row(1, 1, 100.0),
            row(1, 2, 1e4, kind="ingest"), row(2, 1, 90.0, kind="served"), row(2, 1, 90.0, kind="served")]
    assert P.next_probe(rows, 2, 4) == ("pipeline", 1, 2)


# --------------------------------------------------------------------------- which probes stayed disturbed
def test_disturbed_lists_only_layouts_without_a_clean_probe():
    d = P.disturbed(recorded("gil_serial_local.csv"))  # 1x1 has one clean probe, 1x2 none
    assert [(x["kind"], x["tasks"], x["cpus_per_task"], x["probes"]) for x in d] == [("pipeline", 1, 2, 3)]
    assert d[0]["other_cores_busy_min"] == pytest.approx(1.006, abs=1e-3)
    assert d[0]["other_cores_busy_max"] == pytest.approx(1.017, abs=1e-3)
    assert d[0]["node_cpus"] == 2
    assert P.disturbed(recorded("images_cluster_cpu_parallel.csv")) == []
    failed = dict(row(1, 1, math.nan, contended=True), status="failed")
    assert P.disturbed([failed]) == []


# --------------------------------------------------------------------------- the report leads with the warning
def test_report_leads_with_a_warning_naming_probes_and_load(tmp_path):
    rep = F.build_report(base(stopped="budget"), recorded("sleep_latency_local.csv"), None)
    A._finish(tmp_path, rep)
    text = (tmp_path / RP.REPORT_TXT).read_text()
    head = text.splitlines()[:10]
    assert head[0].startswith("WARNING: disturbed measurements")
    joined = "\n".join(head)
    for layout, load in [("pipeline 1×2", "1.20–1.93 of the 2 CPUs"), ("pipeline 2×1", "0.94–1.88 of the 2 CPUs"),
                         ("pipeline 1×1", "1.33–1.54 of the 2 CPUs"), ("pipeline 4×1", "1.41–1.81 of the 2 CPUs")]:
        line = next(ln for ln in head if layout in ln)
        assert load in line and "measured 2 times, disturbed every time" in line, line
    ingest = next(ln for ln in head if "ingest" in ln)
    assert "0.99 of the 2 CPUs" in ingest and "time budget ran out" in ingest
    assert "rerun on a quiet" in joined
    assert "9 disturbed by other processes" in text  # the header counts them
    assert "cs_input_analyzer report" in text and text.rstrip().splitlines()[-1].strip().startswith("csrun_wse")


def test_no_warning_on_a_quiet_table(tmp_path):
    rep = F.build_report(base(), recorded("images_cluster_cpu_parallel.csv"), None)
    assert rep["disturbed"] == [] and rep["bottleneck"]["disturbed"] is False
    text = RP.render_text(rep)
    assert text.startswith("cs_input_analyzer report") and "WARNING" not in text and "disturbed" not in text


def test_warning_without_a_model():
    """A report with no fit (every pipeline probe failed) still names a disturbed probe."""
    rows = [dict(row(1, 2, math.nan), status="failed", error="boom"),
            row(3, 2, 1e4, kind="ingest", contended=True, other=1.5)]
    rep = F.build_report(base(), rows, None)
    text = RP.render_text(rep)
    assert "No recommendation" in text and text.startswith("WARNING")
    assert "ingest 3×2: other processes kept 1.50 of the 2 CPUs busy; not measured again" in text


# --------------------------------------------------------------------------- evidence within the resources added
def test_issue_case_speedup_from_more_tasks_is_capped():
    """1 × 1 measured while a hog held the cores, 2 × 1 after it left: ×8.45 from 2 tasks is
    not evidence; it is shown as ×2 and called disturbed."""
    rows = [row(1, 2, 1900.0, contended=True, other=1.6, pid=0), row(2, 1, 8450.0, pid=1),
            row(1, 1, 1000.0, contended=True, other=1.7, pid=2), row(1, 1, 1000.0, contended=True, other=1.7, pid=3)]
    rep = F.build_report(base(), rows, None)
    b = rep["bottleneck"]
    assert b["task_speedup"] == pytest.approx(2.0) and b["cpu_speedup"] == pytest.approx(1.9)
    assert b["disturbed"] is True
    ev = "\n".join(b["evidence"])
    assert "×2.00 from more tasks" in ev and "×8.45 was measured" in ev and "a disturbed measurement" in ev
    assert "×8.45 from more tasks" not in ev
    assert "1×1, 1×2 measured only while other processes" in ev
    text = RP.render_text(rep)
    assert text.startswith("WARNING") and "1×1" in text.split("cs_input_analyzer report")[0]


def test_oversubscribed_speedup_is_capped_at_the_tasks_added():
    df = pd.DataFrame([row(1, 2, 100.0, util=0.1), row(2, 1, 200.0, util=0.1), row(1, 1, 100.0, util=0.1),
                       row(4, 1, 1000.0, util=0.1)])
    c = M.classify(df, M.fit(df, 2))
    assert c["oversubscribed_speedup"] == pytest.approx(2.0)
    assert any("×5.00 was measured with ×2 the tasks" in e for e in c["evidence"])


_BRACKET = re.compile(r"×([0-9.]+) from more (?:CPUs per task|tasks)")
_OVER = re.compile(r"^(\d+) tasks on \d+ CPUs \(oversubscribed\): ×([0-9.]+)")


@pytest.mark.parametrize("seed", range(40))
def test_no_evidence_larger_than_the_resources_added(seed):
    """Random tables (rates off by up to ×20 either way, random contention): every speed-up
    the evidence states is at most the factor of CPUs or tasks added (n for the brackets,
    T/n for an oversubscribed T × 1 over n × 1)."""
    rng = np.random.default_rng(seed)
    n = int(rng.choice([2, 4]))
    rows = []
    for i, (t, c) in enumerate(P.candidates(n, 2 * n) * 2):
        if rng.random() < 0.3:
            continue
        rows.append(row(t, c, float(100.0 * 20 ** rng.uniform(-1, 1)), contended=bool(rng.random() < 0.5),
                        other=float(rng.uniform(0, n)), util=float(rng.uniform(0.05, 1.0)), n=n, pid=i))
    df = pd.DataFrame(rows)
    c = M.classify(df, M.fit(df, n))
    assert c["cpu_speedup"] <= n + 1e-9 and c["task_speedup"] <= n + 1e-9
    stated = 0
    for e in c["evidence"]:
        for m in _BRACKET.finditer(e):
            stated += 1
            assert float(m.group(1)) <= n + 0.005, e
        if (m := _OVER.search(e)) is not None:
            assert float(m.group(2)) <= int(m.group(1)) / n + 0.005, e
    assert stated == 2


def test_ingest_limits_prefer_an_undisturbed_ingest_probe():
    rows = [row(1, 2, 100.0), row(3, 2, 500.0, kind="ingest", contended=True, other=1.5),
            row(3, 2, 5000.0, kind="ingest")]
    assert M.ingest_limits(pd.DataFrame(rows))["samples_per_sec"] == pytest.approx(5000.0)
    only = [row(1, 2, 100.0), row(3, 2, 500.0, kind="ingest", contended=True, other=1.5)]
    assert M.ingest_limits(pd.DataFrame(only))["samples_per_sec"] == pytest.approx(500.0)


def test_progress_line_says_a_probe_was_disturbed():
    r = dict(row(2, 1, 1000.0, contended=True, other=1.234), error="")
    assert D._row_line(r).endswith("; disturbed: other processes kept 1.23 cores busy")
    assert "disturbed" not in D._row_line(dict(row(2, 1, 1000.0), error=""))
