"""The analyzer on a PyTorch run.py: the DataLoader num_workers axis of the probe grid
(analyzer/dataloader_plan.py), the model on each CPUs-per-task's best count, invalid points
skipped, and the report (python-pt, how to set num_workers, no ingest term), from probe tables
recorded with ``cs_input_analyzer --local`` on tests/fixtures/probes/pt_pipelines (2 CPUs)."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from analyzer import analyze as A
from analyzer import dataloader_plan as D
from analyzer import report as RP
from analyzer.probe_driver import next_probe
from csrun_common.layout import LayoutSpec

FIX = Path(__file__).resolve().parent.parent / "fixtures" / "probes"
COMMAND = ["python", "run.py", "--params", "configs/gil.yaml", "--mode", "validate_only"]


def _row(t, c, w, rate, status="ok", contended=False):
    return {"kind": "pipeline", "tasks": t, "cpus_per_task": c, "dataloader_workers": w, "status": status,
            "samples_per_sec": rate if status == "ok" else float("nan"), "cpu_util": 0.9, "contended": contended}


def _plan(rows, n=4, max_tasks=8):
    return D.next_point(rows, n, max_tasks, next_probe)


def test_candidates_are_zero_one_and_powers_of_two_up_to_c():
    assert D.candidates(1) == [0, 1, 2]
    assert D.candidates(2) == [0, 1, 2, 4]
    assert D.candidates(6) == [0, 1, 2, 4, 6, 8, 12]
    assert D.candidates(16) == [0, 1, 2, 4, 8, 16, 32]


def test_sweep_order_then_the_tensorflow_planner_at_the_best_count():
    assert _plan([]) == ("pipeline", 1, 4, 0)  # the 1 x n bracket at num_workers 0
    rows = [_row(1, 4, 0, 100.0)]
    assert _plan(rows) == ("pipeline", 1, 4, 1)
    rows += [_row(1, 4, 1, 150.0), _row(1, 4, 2, 300.0)]
    assert _plan(rows) == ("pipeline", 1, 4, 4)
    rows += [_row(1, 4, 4, 390.0)]
    assert _plan(rows) == ("pipeline", 1, 4, 8)  # up to 2C: a wait per sample scales past the CPUs
    rows += [_row(1, 4, 8, 380.0)]
    # the sweep at C=4 is done: the n x 1 bracket, starting its own sweep at 0
    assert _plan(rows) == ("pipeline", 4, 1, 0)
    rows += [_row(4, 1, 0, 200.0)]
    assert _plan(rows) == ("pipeline", 4, 1, 1)
    rows += [_row(4, 1, 1, 320.0), _row(4, 1, 2, 300.0), _row(1, 1, 1, 80.0)]
    assert D.best_workers(rows) == {1: 1, 4: 4}
    nxt = _plan(rows)
    assert nxt is not None and nxt[3] == D.best_workers(rows).get(nxt[2], 0)


def test_the_fewest_workers_within_five_percent_is_best_and_at_best_keeps_only_it():
    rows = [_row(1, 4, 0, 400.0), _row(1, 4, 1, 200.0), _row(1, 4, 2, 395.0), _row(1, 4, 4, 410.0),
            _row(2, 4, 2, 700.0), _row(2, 4, 0, 800.0)]
    assert D.best_workers(rows) == {4: 0}  # 400 is within 5 % of 410: fewer processes win
    kept = D.at_best(rows)
    assert [(r["tasks"], r["dataloader_workers"]) for r in kept] == [(1, 0), (2, 0)]


def test_a_sweep_stops_after_two_slower_counts_and_an_invalid_point_is_skipped():
    rows = [_row(1, 16, 0, 1000.0), _row(1, 16, 1, 500.0), _row(1, 16, 2, 950.0)]
    assert _plan(rows, n=16)[3] == 4  # one slower count does not end the sweep
    rows += [_row(1, 16, 4, 700.0)]
    assert _plan(rows, n=16) == ("pipeline", 1, 16, 8)
    rows += [_row(1, 16, 8, 600.0)]
    assert _plan(rows, n=16)[1:] != (1, 16, 16)  # 4 and 8 both below 0.9 x best: stopped
    assert D.best_workers(rows) == {16: 0}
    bad = [_row(1, 2, 0, 0.0, status="invalid")]
    assert _plan(bad, n=2) == ("pipeline", 1, 2, 1)  # skipped, the sweep goes on
    bad += [_row(1, 2, 1, 50.0), _row(1, 2, 2, 90.0), _row(1, 2, 4, 60.0)]
    assert D.best_workers(bad) == {2: 2}
    assert all(r["status"] != "invalid" for r in D.at_best(bad))


def test_workers_for_an_unswept_c_scales_the_nearest_best():
    rows = [_row(1, 2, 0, 10.0), _row(1, 2, 1, 15.0), _row(1, 2, 2, 30.0), _row(2, 1, 0, 10.0), _row(2, 1, 1, 9.0)]
    assert D.workers_for(rows, 2) == {"num_workers": 2, "measured_at_cpus": 2, "how": "measured"}
    assert D.workers_for(rows, 4) == {"num_workers": 4, "measured_at_cpus": 2, "how": "scaled"}
    assert D.workers_for([_row(1, 1, 0, 1.0), _row(1, 1, 2, 3.0)], 2)["num_workers"] == 4
    assert D.workers_for(rows, 1)["num_workers"] == 0
    assert D.workers_for([_row(1, 2, 0, 1.0) | {"dataloader_workers": None}], 2) == {}


def test_served_probes_come_once_the_count_at_one_cpu_is_known():
    rows = [_row(1, 2, 0, 100.0), _row(1, 2, 1, 90.0), _row(1, 2, 2, 80.0), _row(1, 2, 4, 70.0),
            _row(2, 1, 0, 150.0), _row(2, 1, 1, 120.0), _row(2, 1, 2, 100.0)]
    assert D.next_point(rows, 2, 4, next_probe, served=True) == ("served", 2, 1, 0)  # the best count at C=1
    assert D.next_point(rows, 2, 4, next_probe)[0] == "pipeline"  # served=False: none (and never ingest)
    served = {"kind": "served", "tasks": 2, "cpus_per_task": 1, "status": "ok", "samples_per_sec": 50.0}
    nxt = [D.next_point(rows + [served] * k, 2, 4, next_probe, served=True) for k in (1, 3)]
    assert nxt[0][0] == "pipeline"  # one served probe so far: the planner goes on
    assert all(p is None or p[0] != "ingest" for p in nxt)


def test_a_large_batch_recording_is_capped_by_the_data_plane_ingest(tmp_path):
    """pt_parallel_served_local.csv: the 16 MB-batch ``parallel`` fixture with two served probes (an input worker
    streaming its DataLoader over csrun's data plane to a chief draining it): what the chief and the workers
    spend per sample is charged to every layout with input workers, as the TensorFlow served probe's is."""
    from analyzer import recommend as rc
    from analyzer.model import fit

    rows = pd.read_csv(FIX / "pt_parallel_served_local.csv").to_dict("records")
    srv = [r for r in rows if r["kind"] == "served" and r["status"] == "ok"]
    assert len(srv) == 2
    rep = _report(tmp_path, "pt_parallel_served_local.csv",
                  ["python", "run.py", "--params", "configs/parallel.yaml", "--mode", "validate_only"])
    ing = rep["ingest"]
    assert ing["source"] == "served probe" and ing["samples_per_sec"] is None  # no fixed cap, no tf.data prior
    assert ing["cpu_seconds_per_sample"] is None
    k_c = float(pd.Series([r["chief_cpu_seconds_per_sample"] for r in srv]).median())
    assert ing["chief_cpu_seconds_per_sample"] == k_c > 0
    assert ing["worker_hop_cpu_seconds_per_sample"] > 0  # to_numpy, the bundle's stack and the send: per sample
    model = fit(pd.DataFrame(D.at_best(rows)), 2)
    # one node, 2 input workers of 1 CPU (the layout verify measured at -89 % before): the served figures
    # bring the prediction down by the workers' sending and the chief's ingest
    bare, served = (rc.predict_layout(model, LayoutSpec(1, 2, 1), i) for i in ({}, ing))
    assert served["predicted_samples_per_sec"] < 0.25 * bare["predicted_samples_per_sec"]
    assert served["limited_by"] == "node CPUs (pipeline and serving)"
    # the chief's measured CPU-seconds per sample cap the job exactly as the TensorFlow path's do: with the
    # workers' sending left free, 2 nodes × 1 worker of 1 CPU would outrun the chief's task of 1 CPU
    free = rc.predict_layout(model, LayoutSpec(2, 1, 1), {**ing, "worker_hop_cpu_seconds_per_sample": 0.0})
    assert free["limited_by"] == "chief ingest"
    assert abs(free["predicted_samples_per_sec"] - 1 / k_c) < 1e-6 / k_c
    # on one node, streaming costs more than a second worker brings: the in-process DataLoader is recommended
    rec = rep["recommendation"]
    assert rec["input_workers"] == 0, rec
    assert all(a["predicted_samples_per_sec"] <= rec["predicted_samples_per_sec"] * 1.05
               for a in rec["alternatives"])
    text = RP.render_text(rep)
    assert "the chief's ingest over csrun's data plane was measured by 2 served probe(s)" in text
    assert f"the chief spends {k_c * 1e6:.2f} CPU-µs per sample" in text
    assert "serving the real pipeline over csrun's data plane costs an input worker" in text
    assert "not measured" not in text and "tf.data service" not in text


def _report(tmp_path: Path, table: str, command=COMMAND) -> dict:
    rows = pd.read_csv(FIX / table).to_dict("records")
    base = {"command": command, "run_py": "/x/run.py", "argv": command[2:], "available_nodes": 1,
            "node_cpus": 2, "output_dir": str(tmp_path), "probing_s": 30.0, "probed_on": {"node": "vm"},
            "local": True, "framework": "pytorch", "target": {"samples_per_sec": None, "source": "test"},
            "notes": []}
    return A.build_report(base, rows, None)


def test_gil_bound_and_cpu_parallel_recordings_get_different_num_workers(tmp_path):
    gil, par = _report(tmp_path, "pt_gil_local.csv"), _report(tmp_path, "pt_parallel_local.csv")
    assert gil["dataloader_workers"]["2"] == 4  # processes scale the pure-Python work and the waits (2C)
    assert gil["dataloader_workers"]["1"] == 2
    assert par["dataloader_workers"] == {"1": 0, "2": 0}  # threads in-process; workers pay to ship 16 MB
    g, p = gil["recommendation"], par["recommendation"]
    assert (g["tasks_per_node"], g["cpus_per_task"], g["dataloader_workers"]) == (2, 1, 2)
    assert (p["tasks_per_node"], p["cpus_per_task"], p["dataloader_workers"]) == (2, 1, 0)
    for rep in (gil, par):
        # recorded before the served probes: no chief-ingest figure, and no tf.data service prior
        assert rep["ingest"]["chief_cpu_seconds_per_sample"] is None
        assert rep["ingest"]["cpu_seconds_per_sample"] is None and rep["ingest"]["source"] == "none"
        assert rep["csrun_wse_command"].split(" python-pt ")[1].startswith("run.py ")
        assert "--mode train" in rep["csrun_wse_command"]
        # the model rests on the best count at each C: its 1 x 2 rate is the best measured there
        agg = [r for r in D.at_best(rep["probes"]) if r["status"] == "ok" and r["tasks"] == 1
               and r["cpus_per_task"] == 2]
        assert {r["dataloader_workers"] for r in agg} == {rep["dataloader_workers"]["2"]}


def test_report_text_of_a_recording_with_invalid_points(tmp_path):
    rep = _report(tmp_path, "pt_prefetch0_local.csv",
                  ["python", "run.py", "--params", "configs/prefetch0.yaml", "--mode", "validate_only"])
    rec = rep["recommendation"]
    assert rec["dataloader_workers"] >= 1  # 0 cannot be built: never recommended
    text = RP.render_text(rep)
    invalid = sum(1 for r in rep["probes"] if r["status"] == "invalid")
    assert invalid == 2
    assert f"{invalid} invalid (a DataLoader num_workers its data function cannot build at)" in text
    assert "(PyTorch: train_data_fn's DataLoader)" in text
    assert (f"  DataLoader num_workers (train_input.num_workers): {rec['dataloader_workers']} "
            f"(best measured at {rec['cpus_per_task']} CPU(s) per task)") in text
    assert "    0 pipeline 1×2 w0 invalid         n/a" in text
    assert ("  - DataLoader num_workers 0: the data function could not build its DataLoader there "
            "(skipped; see the probes' errors)") in text
    assert ("  - PyTorch: no served probe ran (the time budget): the chief's ingest over csrun's data plane "
            "was not measured and the prediction leaves it out; give a larger --time-budget") in text
    assert "the chief ingests" not in text
    tail = text.rstrip("\n").splitlines()[-3:]
    assert tail[0] == "Run it with:"
    assert tail[1].startswith("  csrun_wse --total-nodes 1 ") and " python-pt run.py --params " in tail[1]
    assert tail[2] == (f"  with train_input.num_workers: {rec['dataloader_workers']} in the params YAML (the "
                       f"DataLoader's worker processes per input worker; the command line has no override for it)")


def test_train_command_for_pytorch_uses_python_pt():
    assert RP.train_command(["python", "run.py", "--mode", "validate_only"], "pytorch") == \
        ["python-pt", "run.py", "--mode", "train"]
    assert RP.train_command(["python-pt", "run.py"]) == ["python-ws", "run.py", "--mode", "train"]
    assert RP.train_command(["python-pt", "run.py"], "pytorch")[0] == "python-pt"
