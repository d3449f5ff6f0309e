"""The analyzer's ``--chief-input-cpus`` (input worker 0 in the chief's task), across
analyzer/model.py, analyzer/recommend.py, analyzer/report.py and analyzer/verify.py: the model,
the choice, the report's command, verify's layout and drain command (no cluster, no TensorFlow)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from analyzer import model as M
from analyzer import recommend as R
from analyzer import report as RP
from analyzer import verify as V
from csrun_common.errors import CsrunError
from csrun_common.layout import LayoutSpec


def node_model(n=8, r1=1000.0, p=0.9, k=None, **kw) -> M.NodeModel:
    return M.NodeModel(node_cpus=n, r1=r1, p=p, sigma=0.0, k=k if k is not None else 1.0 / r1, **kw)


def ingest(k_c: float, h: float = 0.0) -> dict:
    """A CPU-bound ingest probe (no fixed cap): the chief's CPUs are the limit."""
    return {"samples_per_sec": 1e9, "cpu_bound": True, "cpu_seconds_per_sample": k_c,
            "chief_cpu_seconds_per_sample": k_c, "worker_hop_cpu_seconds_per_sample": h}


def rate(pr: dict) -> float:
    return pr["predicted_samples_per_sec"]


def test_spare_chief_cpus_add_about_one_task():
    # 2 nodes × 2 tasks × 4 CPUs: the chief's 4 CPUs are nearly idle (0.05 ms/sample).
    m = node_model(n=8, r1=1000.0, p=0.9, k=1e-3)
    ing = ingest(0.05e-3, 0.1e-3)
    task = m.node_rate(2, 4) / 2
    base = R.predict_layout(m, LayoutSpec(2, 2, 4), ing)
    shared = R.predict_layout(m, LayoutSpec(2, 2, 4, chief_input_cpus=4), ing)
    pinned = R.predict_layout(m, LayoutSpec(2, 2, 4, chief_input_cpus=3), ing)
    assert base["input_workers"] == 3 and base["chief_input_cpus"] == 0
    assert shared["input_workers"] == pinned["input_workers"] == 4
    assert shared["chief_input_cpus"] == 4 and pinned["chief_input_cpus"] == 3
    # all 4 CPUs: one more task's rate; 3 pinned CPUs: a task of 3 CPUs among the node's 2
    assert rate(shared) - rate(base) == pytest.approx(task, rel=1e-6)
    assert rate(pinned) - rate(base) == pytest.approx(m.node_rate(2, 3) / 2, rel=1e-6)
    assert shared["chief_input_samples_per_sec"] == pytest.approx(task, rel=1e-6)
    # node 1's delivery counts it
    assert shared["per_node"][0] == pytest.approx(base["per_node"][0] + task, rel=1e-6)
    assert shared["per_node"][1:] == pytest.approx(base["per_node"][1:])


def test_single_task_chief_node_worker_is_a_task_alone_on_the_node():
    m = node_model(n=8, r1=1000.0, p=0.9, k=1e-3)
    ing = ingest(0.05e-3, 0.1e-3)
    base = R.predict_layout(m, LayoutSpec(5, 1, 8, single_task_nodes=1), ing)
    shared = R.predict_layout(m, LayoutSpec(5, 1, 8, single_task_nodes=1, chief_input_cpus=8), ing)
    assert base["per_node"][0] == 0.0
    assert shared["chief_input_samples_per_sec"] == pytest.approx(m.node_rate(1, 8), rel=1e-6)
    assert rate(shared) == pytest.approx(rate(base) + m.node_rate(1, 8), rel=1e-6)
    # the chief's task is the whole node: more than its CPUs is refused
    with pytest.raises(ValueError, match=r"--chief-input-cpus 9: more than the chief task.s 8 CPU"):
        R.predict_layout(m, LayoutSpec(5, 1, 8, single_task_nodes=1, chief_input_cpus=9))


def test_chief_saturated_by_its_stream_gains_nothing():
    # S = 1: the chief alone on an 8-CPU node takes 0.5 ms/sample: 16,000 samples/s at most,
    # fewer than the 4 worker nodes deliver.
    m = node_model(n=8, r1=1000.0, p=0.9, k=1e-3)
    ing = ingest(0.5e-3, 0.1e-3)
    base = R.predict_layout(m, LayoutSpec(5, 1, 8, single_task_nodes=1), ing)
    assert rate(base) == pytest.approx(8 / 0.5e-3)
    assert base["limited_by"] == "chief ingest"
    shared = R.predict_layout(m, LayoutSpec(5, 1, 8, single_task_nodes=1, chief_input_cpus=8), ing)
    assert rate(shared) == pytest.approx(rate(base), rel=1e-6)
    assert shared["chief_input_samples_per_sec"] == pytest.approx(0.0, abs=1e-6)
    # pinned apart, the chief's stream keeps 1 CPU: worse, and the model says so
    pinned = R.predict_layout(m, LayoutSpec(5, 1, 8, single_task_nodes=1, chief_input_cpus=7), ing)
    assert rate(pinned) == pytest.approx(1 / 0.5e-3)
    assert pinned["limited_by"] == "chief ingest"


def test_busy_chief_node_gains_little():
    # S = 0, 4 CPU-bound tasks × 1 CPU per node: the chief's one CPU is taken by its stream
    # (0.1 ms/sample at ~10,000 samples/s), so a worker sharing it gets almost nothing.
    m = node_model(n=4, r1=1000.0, p=1.0, k=1e-3)
    ing = ingest(1e-4)
    base = R.predict_layout(m, LayoutSpec(3, 4, 1), ing)
    with_ci = R.predict_layout(m, LayoutSpec(3, 4, 1, chief_input_cpus=1), ing)
    assert rate(with_ci) >= rate(base) * (1 - 1e-9)
    assert rate(with_ci) <= rate(base) * 1.01
    assert with_ci["chief_input_samples_per_sec"] < 0.02 * m.node_rate(4, 1) / 4
    # the same node with a cheap chief: the worker gets most of a task's rate
    cheap = R.predict_layout(m, LayoutSpec(3, 4, 1, chief_input_cpus=1), ingest(1e-5))
    assert cheap["chief_input_samples_per_sec"] > 0.8 * m.node_rate(4, 1) / 4


def test_saturated_chief_domain_caps_the_job_at_its_cores():
    # S = 0: the other nodes alone give the chief more than its node's 2 cores can take
    # (0.25 ms/sample: 8,000 samples/s): the job is capped there, the chief node's worker idle.
    m = node_model(n=2, r1=5000.0, p=1.0, k=0.2e-3)
    ing = ingest(0.25e-3)
    pr = R.predict_layout(m, LayoutSpec(4, 2, 1), ing)
    assert rate(pr) == pytest.approx(2 / 0.25e-3)
    assert pr["limited_by"] == "chief ingest"
    assert pr["per_node"][0] == pytest.approx(0.0, abs=1e-6)


def test_in_process_case_unchanged_and_one_node_with_chief_input():
    m = node_model(n=4, r1=1000.0, p=1.0, k=1e-3)
    inproc = R.predict_layout(m, LayoutSpec(1, 1, 4))
    assert inproc["limited_by"] == "in-process pipeline"
    assert inproc["input_workers"] == 0 and inproc["chief_input_cpus"] == 0
    assert rate(inproc) == pytest.approx(m.model_rate(1, 4))
    # N = T = 1 with L = 3: the chief and its one input worker on 3 pinned CPUs
    one = R.predict_layout(m, LayoutSpec(1, 1, 4, chief_input_cpus=3))
    assert one["input_workers"] == 1
    assert one["limited_by"] != "in-process pipeline"
    assert rate(one) == pytest.approx(m.node_rate(1, 3))
    # with a chief cost the chief's stream keeps 1 CPU: at most 1 / k_c
    capped = R.predict_layout(m, LayoutSpec(1, 1, 4, chief_input_cpus=3), ingest(0.5e-3))
    assert rate(capped) == pytest.approx(1 / 0.5e-3)


def test_bad_chief_input_cpus_raise():
    m = node_model(n=4)
    with pytest.raises(ValueError):
        R.predict_layout(m, LayoutSpec(2, 2, 2, chief_input_cpus=3))
    with pytest.raises(ValueError):
        R.predict_layout(m, LayoutSpec(2, 2, 2, chief_input_cpus=-1))


def test_choices():
    m = node_model(n=8, r1=1000.0, p=0.9, k=1e-3)
    assert R.chief_input_choices(m, LayoutSpec(2, 8, 1)) == [1]
    assert R.chief_input_choices(m, LayoutSpec(2, 2, 4)) == [3]
    assert R.chief_input_choices(m, LayoutSpec(2, 1, 1), ingest(1e-4)) == [1]
    # the chief's stream needs m = ceil(k_c × rate) CPUs: C - m pinned is tried too
    ing = ingest(0.5e-3)
    p0 = R.predict_layout(m, LayoutSpec(2, 1, 8), ing)
    need = -(-0.5e-3 * (rate(p0) + m.node_rate(1, 7)) // 1)
    assert R.chief_input_choices(m, LayoutSpec(2, 1, 8), ing) == [7, 8 - int(need)]


def test_recommend_uses_the_chief_input_to_save_a_node():
    # 4-CPU nodes, perfectly parallel, 1 ms/sample: 2 nodes deliver at most 7,000 samples/s
    # without the chief's input worker (interval low end 6,580 < 6,700); with it, the chief's
    # CPU gives ~850 more and 2 nodes meet the target for sure.
    m = node_model(n=4, r1=1000.0, p=1.0, k=1e-3)
    ing = ingest(0.02e-3)
    target = 6700.0
    two = [R.predict_layout(m, LayoutSpec(2, t, c), ing) for _, t, c in R.candidate_layouts(4, 1)]
    assert max(p["interval"][0] for p in two) < target
    rec = R.recommend(m, 3, target=target, ingest=ing)
    assert rec["nodes"] == 2
    assert rec["chief_input_cpus"] > 0
    assert rec["interval"][0] >= target and rec["input_starved"] is False
    assert rec["input_workers"] == 2 * rec["tasks_per_node"]  # W + 1: the chief's own counted
    line = RP.csrun_wse_command(rec, ["python", "run.py"])
    assert f"--chief-input-cpus {rec['chief_input_cpus']}" in line
    assert all("chief_input_cpus" in a for a in rec["alternatives"])


def test_recommend_prefers_no_chief_input_when_it_adds_nothing():
    # Every layout's chief node is CPU-bound (the chief's stream fills its CPU): no variant
    # with a chief input worker gains 1 %, so none is chosen or listed.
    m = node_model(n=2, r1=5000.0, p=1.0, k=0.2e-3)
    rec = R.recommend(m, 4, target=1e6, ingest=ingest(0.25e-3))
    assert rec["chief_input_cpus"] == 0
    assert all(a["chief_input_cpus"] == 0 for a in rec["alternatives"])
    assert "--chief-input-cpus" not in RP.csrun_wse_command(rec, ["python", "run.py"])


def _rec(**kw) -> dict:
    rec = {"nodes": 2, "tasks_per_node": 2, "cpus_per_task": 4, "single_task_nodes": 0, "chief_input_cpus": 3,
           "input_workers": 4, "predicted_samples_per_sec": 12000.0, "interval": [11000.0, 13000.0],
           "limited_by": "input workers", "reason": "r",
           "alternatives": [{"nodes": 2, "tasks_per_node": 2, "cpus_per_task": 4, "chief_input_cpus": 0,
                             "predicted_samples_per_sec": 9000.0, "interval": [8000.0, 10000.0]},
                            {"nodes": 3, "tasks_per_node": 1, "cpus_per_task": 4, "chief_input_cpus": 2,
                             "predicted_samples_per_sec": 8000.0, "interval": [7000.0, 9000.0]}]}
    rec.update(kw)
    return rec


def test_report_command_and_text_say_it():
    rec = _rec()
    line = RP.csrun_wse_command(rec, ["python", "run.py"])
    assert "--cpus-per-task 4 --chief-input-cpus 3 python-ws run.py" in line
    assert "--chief-input-cpus" not in RP.csrun_wse_command(_rec(chief_input_cpus=0), ["python", "run.py"])
    text = RP.render_text({"recommendation": rec, "target": {}, "csrun_wse_command": line})
    assert "4 input worker(s), input worker 0 in the chief's task on 3 CPU(s), limited by" in text
    assert "3 node(s) × 1 task(s) × 4 CPU(s), chief's input worker on 2 CPU(s): 8,000 samples/s" in text
    assert "2 node(s) × 2 task(s) × 4 CPU(s): 9,000 samples/s" in text
    plain = RP.render_text({"recommendation": _rec(chief_input_cpus=0), "target": {}})
    assert "chief's task" not in plain


def _report(tmp_path: Path, **rec_kw) -> Path:
    d = tmp_path / "ana"
    d.mkdir()
    m = node_model(n=8, r1=1000.0, p=0.9, k=1e-3)
    rec = R.predict_layout(m, LayoutSpec(2, 2, 4, chief_input_cpus=3), ingest(0.05e-3))
    rec.update(rec_kw)
    rep = {"run_py": "/x/run.py", "argv": ["--params", "p.yaml"], "cwd": str(tmp_path), "mount_dirs": None,
           "model": m.to_dict(), "recommendation": rec, "ingest": ingest(0.05e-3), "topology": None}
    (d / "report.json").write_text(json.dumps(rep))
    return d


def test_verify_layout_keeps_the_recommendations_chief_input(tmp_path):
    rec = V.load_report(_report(tmp_path))["recommendation"]
    assert V.verify_layout(rec, 8)["chief_input_cpus"] == 3
    # an overridden layout starts without it, unless given
    assert V.verify_layout(rec, 8, {"nodes": 3})["chief_input_cpus"] == 0
    assert V.verify_layout(rec, 8, {"nodes": 3, "chief_input_cpus": 2})["chief_input_cpus"] == 2
    assert V.verify_layout(rec, 8, {"chief_input_cpus": 0})["chief_input_cpus"] == 0
    # a report of an earlier release has no chief_input_cpus
    assert V.verify_layout({k: v for k, v in rec.items() if k != "chief_input_cpus"}, 8)["chief_input_cpus"] == 0
    with pytest.raises(CsrunError, match="--chief-input-cpus 5"):
        V.verify_layout(rec, 8, {"chief_input_cpus": 5})


def test_verify_refuses_too_many_chief_input_cpus_before_launching(tmp_path):
    d = _report(tmp_path)
    with pytest.raises(CsrunError, match="chief task's 4 CPU"):
        V.verify(str(d), 5, 1, {"chief_input_cpus": 6}, 60, None)
    assert not (d / "verify").exists()


def test_drain_command_passes_chief_input_cpus(tmp_path):
    d = _report(tmp_path)
    rep = V.load_report(d)
    lay = V.verify_layout(rep["recommendation"], 8)
    argv = V.drain_command(rep, d / "verify", lay, 10, 3, None)
    i = argv.index("--chief-input-cpus")
    assert argv[i + 1] == "3"
    assert i < argv.index("python-ws")
    none = V.drain_command(rep, d / "verify", dict(lay, chief_input_cpus=0), 10, 3, None)
    assert "--chief-input-cpus" not in none


def test_predicted_for_passes_chief_input_cpus(tmp_path):
    rep = V.load_report(_report(tmp_path))
    rec = rep["recommendation"]
    assert V.predicted_for(rep, LayoutSpec(2, 2, 4, chief_input_cpus=3)) is rec
    other = V.predicted_for(rep, LayoutSpec(2, 2, 4, chief_input_cpus=4))
    assert other is not rec and other["chief_input_cpus"] == 4 and other["input_workers"] == 4
    without = V.predicted_for(rep, LayoutSpec(2, 2, 4))
    assert without["input_workers"] == 3
    assert rate(other) > rate(without)


def test_chief_input_measured_from_the_drain():
    pred = {"chief_input_samples_per_sec": 2500.0}
    out = V.chief_input_measured({"samples_per_sec": 10000.0, "batches_per_worker": {"0": 25, "1": 25, "2": 50}},
                                 pred)
    assert out == {"batches": 25, "share": 0.25, "measured_samples_per_sec": 2500.0,
                   "predicted_samples_per_sec": 2500.0}
    empty = V.chief_input_measured({"samples_per_sec": 0.0, "batches_per_worker": {}}, pred)
    assert empty["share"] is None and empty["measured_samples_per_sec"] is None
    res = {"layout": {"nodes": 2, "tasks_per_node": 2, "cpus_per_task": 4, "chief_input_cpus": 3},
           "predicted_samples_per_sec": 12000.0, "interval": [11000.0, 13000.0], "limited_by": "input workers",
           "measured_samples_per_sec": 10000.0, "error_pct": -16.7, "within_interval": False,
           "drain": {"window_s": 10.0, "num_workers": 4, "startup_s": 5.0}, "chief_input": out}
    text = V.render(res)
    assert "input worker 0 in the chief's task on 3 CPU(s)" in text
    assert "chief's input worker 0: 2,500 samples/s (25 % of the batches; predicted 2,500)" in text


def test_verify_cli_has_the_option():
    res = CliRunner().invoke(V.verify_command, ["--help"])
    assert res.exit_code == 0 and "--chief-input-cpus" in res.output
    bad = CliRunner().invoke(V.verify_command, ["--chief-input-cpus", "-1"])
    assert bad.exit_code == 2
