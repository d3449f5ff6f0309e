"""The analyzer for several trainer ranks (issue 32, point 5), across analyzer/analyze.py,
analyzer/recommend.py, analyzer/report.py, analyzer/verify.py and analyzer/verify_task.py: the
world's target, the recommendation (W a multiple of the world size, the chief's nodes kept for
ranks), the report's lines and csrun_wse command, and verify's per-rank drain parts. No cluster,
no TensorFlow."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from analyzer import analyze as A
from analyzer import findings as F
from analyzer import model as M
from analyzer import recommend as R
from analyzer import report as RP
from analyzer import verify as V
from analyzer import verify_task as D
from analyzer.user_command import split_command
from csrun_common.layout import LayoutSpec
from tests.unit.paths import FIXTURES

FIX = FIXTURES / "probes"
BIN = Path(sys.executable).parent / "cs_input_analyzer"
RANKS = {"chief_nodes": 2, "chief_tasks_per_node": 2}  # world size 4


def node_model(n=8, r1=1000.0, p=0.9, k=1e-3) -> M.NodeModel:
    return M.NodeModel(node_cpus=n, r1=r1, p=p, sigma=0.0, k=k)


# ---------------------------------------------------------------- the world's target


def test_the_report_base_takes_the_world_from_the_flags(tmp_path):
    (tmp_path / "run.py").write_text("")
    md = tmp_path / "md"
    md.mkdir()
    (md / "compile_report.json").write_text(json.dumps({"est_samples_per_sec": 250.0}))
    opts = A.Options(command=["python", "run.py"], local=True, **RANKS)
    a = A.Analysis(opts=opts, cwd=str(tmp_path), cmd=split_command(["python", "run.py"], str(tmp_path)),
                   model_dir=str(md), out=tmp_path / "out")
    base = A._report_base(a)
    assert base["target"]["samples_per_sec"] == 1000.0  # the compile report's 250 per rank × 4 ranks
    assert base["target"]["per_rank_samples_per_sec"] == 250.0
    assert base["world"] == {**RANKS, "world_size": 4}
    one = A._report_base(A.Analysis(opts=A.Options(command=["python", "run.py"], local=True), cwd=str(tmp_path),
                                    cmd=a.cmd, model_dir=str(md), out=tmp_path / "out"))
    assert one["target"] == {"samples_per_sec": 250.0, "source": f"estimate in {md / 'compile_report.json'}"}
    assert "world" not in one


# ---------------------------------------------------------------- the prediction and the choice
def test_chief_nodes_run_ranks_only_and_each_rank_gets_its_share():
    m = node_model()
    pr = R.predict_layout(m, LayoutSpec(6, 2, 2, **RANKS))
    one = m.model_rate(2, 2)
    assert pr["input_workers"] == (6 - 2) * 2 and pr["input_workers_per_rank"] == 2
    assert pr["per_node"][:2] == [0.0, 0.0]  # the chief's nodes: no input worker
    assert pr["predicted_samples_per_sec"] == pytest.approx(4 * one)
    assert pr["per_rank_samples_per_sec"] == pytest.approx([one] * 4)
    assert (pr["chief_nodes"], pr["chief_tasks_per_node"], pr["world_size"]) == (2, 2, 4)
    assert "chief_nodes" not in R.predict_layout(m, LayoutSpec(3, 2, 2))  # one chief: the keys of before


def test_each_rank_has_its_own_ingest_cap_and_its_node_share():
    m = node_model()
    capped = R.predict_layout(m, LayoutSpec(6, 4, 2, **RANKS),
                              {"samples_per_sec": 3000.0, "cpu_seconds_per_sample": 1e-4})
    assert capped["predicted_samples_per_sec"] == pytest.approx(4 * 3000.0)
    assert capped["limited_by"] == "chief ingest"
    # CPU-bound stream: each rank has 8 // 2 = 4 CPUs, at 1 CPU-ms per sample: 4000/s per rank
    cpu = R.predict_layout(m, LayoutSpec(10, 8, 1, **RANKS), {"samples_per_sec": 1e9, "cpu_bound": True,
                                                             "chief_cpu_seconds_per_sample": 1e-3})
    assert cpu["predicted_samples_per_sec"] == pytest.approx(4 * 4000.0)
    assert cpu["limited_by"] == "chief ingest"


def test_the_world_takes_the_slowest_rank_times_the_world_size():
    # 2 ranks on one chief node, 2 worker nodes of one task: worker 0 feeds rank 0, worker 1
    # rank 1; worker 1's node has half a core (a shared host), so rank 1 is the slow one.
    m = node_model(n=2, r1=1000.0, p=1.0, k=1e-3)
    topo = {"node_hosts": ["h1", "h2", "h3"], "host_cores": {"h3": 0.5}}
    pr = R.predict_layout(m, LayoutSpec(3, 1, 1, chief_nodes=1, chief_tasks_per_node=2), topology=topo)
    fast, slow = pr["per_rank_samples_per_sec"]
    assert slow == pytest.approx(500.0) and fast == pytest.approx(1000.0)
    assert pr["predicted_samples_per_sec"] == pytest.approx(2 * slow)
    assert pr["limited_by"] == "slowest rank"


def test_predict_refuses_what_the_world_does_not_take():
    m = node_model()
    with pytest.raises(ValueError, match="multiple of the world size"):
        R.predict_layout(m, LayoutSpec(5, 3, 1, **RANKS))  # 9 input workers for 4 ranks
    with pytest.raises(ValueError, match="--chief-input-cpus 1: not predicted"):
        R.predict_layout(m, LayoutSpec(6, 2, 1, chief_input_cpus=1, **RANKS))


def test_the_recommendation_keeps_the_chief_nodes_and_a_multiple_of_the_world():
    m = node_model(n=4)
    rec = R.recommend(m, 8, 4 * 3000.0, **RANKS)
    for lay in [rec, *rec["alternatives"]]:
        spec = LayoutSpec.from_record(lay)
        assert (spec.chief_nodes, spec.chief_tasks_per_node) == (2, 2)
        assert lay["input_workers"] == (lay["nodes"] - 2) * lay["tasks_per_node"]
        assert lay["input_workers"] % 4 == 0
        spec.check_node(4)  # never a layout the launcher refuses
    assert rec["predicted_samples_per_sec"] >= 4 * 3000.0 and rec["meets_target"] is True
    # the same per-rank target for one chief asks for fewer nodes
    assert R.recommend(m, 8, 3000.0)["nodes"] < rec["nodes"]
    assert all(s.nodes > 2 for s in R.rank_layouts(4, 8, 2, 2))


def test_no_layout_for_the_world_names_the_flags():
    with pytest.raises(ValueError, match="--chief-nodes 2 --chief-tasks-per-node 2: no layout of at most 2"):
        R.recommend(node_model(), 2, **RANKS)
    # 3 nodes of 2 CPUs: one worker node of at most 2 tasks, never a multiple of 4
    assert R.rank_layouts(2, 3, 2, 2) == []


# ---------------------------------------------------------------- the report
def _rank_report(tmp_path: Path, available: int = 8, per_rank: float | None = 300.0) -> dict:
    rows = pd.read_csv(FIX / "images_cluster_cpu_parallel.csv").to_dict("records")
    base = {"command": ["python", "run.py", "--params", "configs/params.yaml", "--mode", "validate_only"],
            "run_py": "/x/run.py", "argv": ["--params", "configs/params.yaml"], "available_nodes": available,
            "node_cpus": 2, "output_dir": str(tmp_path), "probing_s": 30.0, "probed_on": {"node": "node2"},
            "target": A.world_target(per_rank, "test", 4), "notes": [], "world": {**RANKS, "world_size": 4}}
    return F.build_report(base, rows, None)


def test_report_gives_w_per_rank_and_in_total_and_the_flags(tmp_path):
    rep = _rank_report(tmp_path)
    rec = rep["recommendation"]
    w = rec["input_workers"]
    assert w % 4 == 0 and rec["nodes"] > 2
    A._finish(tmp_path, rep)
    text = (tmp_path / RP.REPORT_TXT).read_text()
    assert f"{w} input workers, {w // 4} per rank × 4 ranks" in text
    assert "chief nodes:    2 × 2 trainer rank(s) = world size 4" in text
    assert "Target: 1,200 samples/s for 4 trainer ranks (300 per rank × 4) (test): met" in text
    assert (f"csrun_wse --total-nodes {rec['nodes']} --tasks-per-node {rec['tasks_per_node']} --cpus-per-task "
            f"{rec['cpus_per_task']} --chief-nodes 2 --chief-tasks-per-node 2 python-ws run.py") in text
    saved = json.loads((tmp_path / RP.REPORT_JSON).read_text())["recommendation"]
    assert (saved["chief_nodes"], saved["chief_tasks_per_node"], saved["world_size"]) == (2, 2, 4)
    assert LayoutSpec.from_record(saved).world_size == 4
    assert all(p["nodes"] > 2 for p in rep["nodes_curve"])  # only the node counts the world takes
    # one chief's line and command are as before
    assert RP.workers_text({"input_workers": 3}) == "3 input worker(s)"


def test_report_without_a_layout_for_the_world_says_why(tmp_path):
    rep = _rank_report(tmp_path, available=2)
    assert "recommendation" not in rep
    assert "No recommendation: --chief-nodes 2 --chief-tasks-per-node 2: no layout" in RP.render_text(rep)


def run(*args, cwd):
    return subprocess.run([str(BIN), *args], capture_output=True, text=True, cwd=cwd, timeout=60)


@pytest.mark.parametrize("args, flag", [
    (["--local", "--chief-nodes", "2", "python", "run.py", "--mode", "validate_only"], "--chief-nodes 2"),
    (["--chief-tasks-per-node", "0", "python", "run.py"], "--chief-tasks-per-node"),
])
def test_analyze_refuses_a_world_it_cannot_lay_out(args, flag, tmp_path):
    (tmp_path / "run.py").write_text("")
    p = run(*args, cwd=tmp_path)
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode == 2 and len(lines) == 1 and flag in lines[0], p.stderr
    assert not (tmp_path / "model_dir").exists()


# ---------------------------------------------------------------- verify
def test_verify_refuses_a_world_its_input_workers_do_not_divide_in_one_line(tmp_path):
    d = tmp_path / "ana"
    d.mkdir()
    rep = {"run_py": "/x/run.py", "argv": [], "cwd": str(tmp_path),
           "model": {"node_cpus": 2, "r1": 100.0, "p": 0.5, "sigma": 0.0, "k": 0.01, "io_cap": None,
                     "rel_spread": 0.05, "resid_rms": 0.0, "n_probes": 3, "measured": {}},
           "recommendation": {"nodes": 4, "tasks_per_node": 2, "cpus_per_task": 1,
                              "predicted_samples_per_sec": 150.0, "interval": [135.0, 165.0]}}
    (d / "report.json").write_text(json.dumps(rep))
    # 3 input-worker nodes × 2 tasks = 6 input workers for 4 ranks
    p = run("verify", "--report", str(d), "--chief-nodes", "1", "--chief-tasks-per-node", "4", cwd=tmp_path)
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode == 2 and len(lines) == 1, p.stderr
    assert "6 input workers for 4 trainer ranks" in lines[0] and "(4, 8 would be)" in lines[0]
    assert not (d / "verify").exists()


def test_each_rank_writes_its_own_result():
    assert D.rank_out("/r/drain.json", 0, 1) == "/r/drain.json"
    assert D.rank_out("/r/drain.json", 3, 4) == "/r/drain.rank3.json"
    assert D.rank_out(None, 3, 4) is None
    assert [p.name for p in V.result_paths(Path("/r"), 2)] == ["drain.rank0.json", "drain.rank1.json"]
    assert [str(p) for p in V.result_paths(Path("/r"), 1)] == [D.rank_out("/r/drain.json", 0, 1)]


def test_the_world_drain_sums_the_ranks_and_names_the_slowest(tmp_path):
    def rank(rate, counts):
        return {"status": "ok", "samples_per_sec": rate, "samples": int(rate * 10), "batches": sum(counts.values()),
                "num_workers": 2, "window_s": 10.0, "startup_s": 5.0, "batches_per_worker": counts}

    paths = V.result_paths(tmp_path, 2)
    paths[0].write_text(json.dumps(rank(800.0, {"0": 40, "1": 40})))
    paths[1].write_text(json.dumps(rank(600.0, {"0": 30, "1": 30})))
    world = V.read_drains(paths)
    assert world["status"] == "ok" and world["samples_per_sec"] == 1400.0
    assert world["num_workers"] == 4 and world["slowest_rank"] == 1
    # job-wide input worker g = slot × world + rank
    assert world["batches_per_worker"] == {"0": 40, "2": 40, "1": 30, "3": 30}
    res = {"layout": {"nodes": 4, "tasks_per_node": 2, "cpus_per_task": 1, **{"chief_nodes": 1,
                                                                              "chief_tasks_per_node": 2}},
           "predicted_samples_per_sec": 1500.0, "interval": [1300.0, 1700.0], "limited_by": "input workers",
           "measured_samples_per_sec": 1400.0, "error_pct": -6.7, "within_interval": True, "drain": world}
    text = V.render(res)
    assert "1 chief node(s) × 2 trainer rank(s)" in text
    assert "ranks:     rank 0 800 (2 input worker(s)), rank 1 600 (2 input worker(s)); slowest: rank 1" in text
    paths[1].unlink()
    failed = V.read_drains(paths)
    assert failed["status"] == "failed" and failed["error"] == "rank 1: no result written"


def test_launch_waits_for_every_ranks_result(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    script = f"echo {{}} > {a}; sleep 1; echo {{}} > {b}; sleep 60"
    launch = V.launch_drain(["sh", "-c", script], str(tmp_path), tmp_path / "log", [a, b], timeout_s=30,
                            grace_s=0.5)
    assert launch.stopped_after_result and b.exists()
    assert 1.0 <= launch.wall_s < 20
