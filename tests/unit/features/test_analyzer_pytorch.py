"""The analyzer on a PyTorch run.py, across analyzer/dataloader_plan.py, analyzer/model.py,
analyzer/recommend.py, analyzer/report.py and analyzer/analyze.py: the model on each
CPUs-per-task's best DataLoader worker count and the report (python-pt, how to set num_workers, no
ingest term), from probe tables recorded with ``cs_input_analyzer --local`` on
tests/fixtures/probes/pt_pipelines (2 CPUs)."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from analyzer import dataloader_plan as D
from analyzer import findings as F
from analyzer import report as RP
from csrun_common.layout import LayoutSpec
from tests.unit.paths import FIXTURES

FIX = FIXTURES / "probes"
COMMAND = ["python", "run.py", "--params", "configs/gil.yaml", "--mode", "validate_only"]


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
    return F.build_report(base, rows, None)


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
