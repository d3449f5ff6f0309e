"""``cs_input_analyzer shard-plan`` / ``reshard`` through click's CliRunner: the JSON
plan's shape and numbers, the printed summary, and one-line errors with exit 2."""
from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner

from analyzer.cli import main
from csrun_common import shardplan_schema as schema
from csrun_common import tfrecord as tfr


@pytest.fixture()
def data(tmp_path):
    d = tmp_path / "data"
    d.mkdir()
    for i, n in enumerate((30, 20, 20, 10, 10, 10)):
        tfr.write_records(d / f"part-{i}.tfrecord", [bytes([i]) * 40] * n)
    (d / "meta.json").write_text("{}")  # ignored: the directory has TFRecords
    return d


def run(args, cwd=None):
    runner = CliRunner()
    if cwd is None:
        return runner.invoke(main, args, catch_exceptions=False)
    old = os.getcwd()
    os.chdir(cwd)
    try:
        return runner.invoke(main, args, catch_exceptions=False)
    finally:
        os.chdir(old)


def one_line_error(result, *needles):
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    # "Error: ..." (click) or "<prog>: error: ..." (the analyzer's one-line main)
    assert len(lines) == 1 and (lines[0].startswith("Error: ") or ": error: " in lines[0]), result.output
    assert "Traceback" not in result.output
    for n in needles:
        assert n in lines[0], lines[0]


def test_plan_by_records_json_shape(data, tmp_path):
    out = tmp_path / "plan.json"
    r = run(["shard-plan", str(data), "--workers", "3", "--seed", "42", "-o", str(out)])
    assert r.exit_code == 0, r.output
    plan = schema.load_plan(out)
    assert plan["num_workers"] == 3 and plan["mode"] == "shard" and plan["balance_by"] == "records"
    assert plan["base_seed"] == 42 and plan["records_exact"] is True
    assert plan["totals"] == {"files": 6, "bytes": 100 * 56, "records": 100, "records_estimate": 100}
    # LPT on records 30,20,20,10,10,10 over 3 workers gives 30+10, 20+10, 20+10
    loads = sorted(w["records"] for w in plan["workers"])
    assert loads == [30, 30, 40]
    assert sorted(f for w in plan["workers"] for f in w["files"]) == sorted(
        str(p) for p in data.glob("*.tfrecord"))
    assert plan["imbalance"] == pytest.approx(max(loads) / (100 / 3), abs=1e-5)
    assert [w["seed"] for w in plan["workers"]][0] == 42
    assert "files per worker:" in r.output and f"written: {out}" in r.output
    assert "use it: csrun_wse --shard-plan" in r.output


def test_plan_json_output_and_layout_from_nodes(data, tmp_path):
    out = tmp_path / "p.json"
    r = run(["shard-plan", str(data / "*.tfrecord"), "--nodes", "2", "--tasks-per-node", "2",
             "-o", str(out), "--json"])
    assert r.exit_code == 0, r.output
    summary = json.loads(r.output)
    assert summary["num_workers"] == 3  # 2 nodes × 2 tasks − the chief
    assert summary["layout"]["nodes"] == 2 and summary["layout"]["input_workers"] == 3
    assert summary["output"] == str(out)


def test_from_report(data, tmp_path):
    rep = tmp_path / "analysis"
    rep.mkdir()
    (rep / "report.json").write_text(json.dumps({"recommendation": {
        "nodes": 3, "tasks_per_node": 2, "cpus_per_task": 4, "single_task_nodes": 0,
        "input_workers": 5}, "element_bytes": 1e6, "node_memory_bytes": 10 ** 9}))
    out = tmp_path / "p.json"
    r = run(["shard-plan", str(data), "--from-report", str(rep), "--shuffle-buffer", "1000",
             "-o", str(out)])
    assert r.exit_code == 0, r.output
    plan = json.loads(out.read_text())
    assert plan["num_workers"] == 5 and plan["mode"] == "shard"
    assert plan["layout"]["cpus_per_task"] == 4
    assert plan["shuffle"]["element_bytes_source"].startswith("measured by the analyzer")
    codes = [w["code"] for w in plan["warnings"]]
    assert "SHUFFLE_MEMORY" in codes  # 2 workers × 1000 × 1 MB > 80 % of 1 GB
    assert "fix: set train_input.shuffle_buffer <= 400" in r.output
    (rep / "report.json").write_text(json.dumps({"recommendation": {
        "nodes": 3, "tasks_per_node": 2, "cpus_per_task": 4, "input_workers": 6}}))
    one_line_error(run(["shard-plan", str(data), "--from-report", str(rep)]),
                   "recommendation.input_workers 6 disagrees", "= 5 input workers")
    (rep / "report.json").write_text(json.dumps({"recommendation": {"nodes": "x", "tasks_per_node": 2}}))
    one_line_error(run(["shard-plan", str(data), "--from-report", str(rep)]),
                   "recommendation.nodes: expected a positive integer, got 'x'")
    (rep / "report.json").write_text(json.dumps({"recommendation": {"nodes": 3, "tasks_per_node": 2,
                                                                    "single_task_nodes": "x"}}))
    one_line_error(run(["shard-plan", str(data), "--from-report", str(rep)]), "--from-report", "'x'")
    one_line_error(run(["shard-plan", str(data), "--from-report", str(tmp_path / "none")]),
                   "--from-report", "no report.json")


def test_params_yaml_data_dir_list(data, tmp_path):
    other = tmp_path / "more"
    other.mkdir()
    tfr.write_records(other / "x.tfrecord", [b"q" * 40] * 5)
    y = tmp_path / "params.yaml"
    y.write_text(f"train_input:\n  data_dir: [{data}, {other}]\n  batch_size: 4\n  shuffle_seed: 7\n")
    out = tmp_path / "p.json"
    r = run(["shard-plan", "--params", str(y), "--workers", "2", "-o", str(out)])
    assert r.exit_code == 0, r.output
    plan = json.loads(out.read_text())
    assert plan["totals"]["files"] == 7 and plan["base_seed"] == 7
    assert plan["shuffle"]["buffer_elements"] == 40  # 10 × batch_size


def test_few_files_warns_and_replicates(data, tmp_path):
    out = tmp_path / "p.json"
    r = run(["shard-plan", str(data), "--workers", "10", "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert "warning [FEW_FILES]: 6 file(s) for 10 input workers" in r.output
    assert "fix: reshard into k × 10 files" in r.output and "--num-shards 10" in r.output
    plan = schema.load_plan(out)
    assert plan["mode"] == "replicate" and len({w["seed"] for w in plan["workers"]}) == 10


@pytest.mark.parametrize("args,needles", [
    (["--workers", "2", "--nodes", "2"], ["exactly one worker layout", "--workers and --nodes"]),
    ([], ["exactly one worker layout"]),
    (["--workers", "0"], ["--workers: expected a positive integer, got 0"]),
    (["--workers", "x"], ["'--workers'", "'x' is not a valid integer"]),
    (["--nodes", "1", "--tasks-per-node", "1"], ["no input worker"]),
    (["--nodes", "2", "--single-task-nodes", "2"], ["--single-task-nodes 2: must be less than --nodes 2"]),
    (["--workers", "2", "--tasks-per-node", "2"], ["--tasks-per-node: only with --nodes"]),
    (["--workers", "10", "--mode", "shard"], ["--mode shard: 6 file(s) for 10 workers"]),
    (["--workers", "2", "--node-memory", "lots"], ["--node-memory 'lots'"]),
    (["--workers", "2", "--mode", "bogus"], ["'--mode'", "bogus"]),
])
def test_bad_input_is_one_line_exit_2(data, tmp_path, args, needles):
    one_line_error(run(["shard-plan", str(data), "-o", str(tmp_path / "p.json"), *args]), *needles)
    assert not (tmp_path / "p.json").exists()


def test_missing_sources(tmp_path):
    one_line_error(run(["shard-plan", "--workers", "2"]), "no data files")
    one_line_error(run(["shard-plan", str(tmp_path / "nope-*.tfrecord"), "--workers", "2"]),
                   "SOURCES", "matched no files")
    y = tmp_path / "p.yaml"
    y.write_text("train_input:\n  batch_size: 3\n")
    one_line_error(run(["shard-plan", "--params", str(y), "--workers", "2"]),
                   f"--params {y}: train_input.data_dir")


def test_reshard_cli(data, tmp_path):
    out = tmp_path / "shards"
    r = run(["reshard", str(data), "--num-shards", "4", "--output", str(out), "--no-progress"])
    assert r.exit_code == 0, r.output
    assert "verified: the multiset of records is unchanged (100 records" in r.output
    assert len(os.listdir(out)) == 4
    one_line_error(run(["reshard", str(data), "--num-shards", "4", "--output", str(out)]),
                   f"--output {out}: already exists")
    one_line_error(run(["reshard", str(data), "--num-shards", "0", "--output", str(tmp_path / "x")]),
                   "--num-shards 0")
    one_line_error(run(["reshard", str(data), "--output", str(tmp_path / "x")]), "--num-shards")
    one_line_error(run(["reshard", str(data), "--num-shards", "1000", "--output", str(tmp_path / "x"),
                        "--no-progress"]),
                   "only 100 record(s)")
    assert not (tmp_path / "x").exists()
    r = run(["reshard", str(out), "--num-shards", "2", "--output", str(tmp_path / "y"), "--json",
             "--no-progress"])
    res = json.loads(r.output)
    assert res["records"] == 100 and res["verified"] is True and res["num_shards"] == 2


def test_plan_after_reshard_is_balanced(data, tmp_path):
    out = tmp_path / "shards"
    assert run(["reshard", str(data), "--num-shards", "6", "-o", str(out), "--no-progress"]).exit_code == 0
    r = run(["shard-plan", str(out), "--workers", "3", "-o", str(tmp_path / "p.json"), "--json"])
    summary = json.loads(r.output)
    # 100 equal records in 6 shards (17,17,17,17,16,16) -> 2 shards per worker: 34/33/33
    assert summary["imbalance"] == pytest.approx(34 / (100 / 3), abs=1e-5) and summary["warnings"] == []


def test_from_report_of_several_trainer_ranks(data, tmp_path):
    """A recommendation for 2 chief nodes × 2 ranks: the input workers are the other nodes'
    tasks only, (4 - 2) × 2 = 4, planned job-wide (every rank's workers shard one data set)."""
    rep = tmp_path / "analysis"
    rep.mkdir()
    rec = {"nodes": 4, "tasks_per_node": 2, "cpus_per_task": 1, "chief_nodes": 2, "chief_tasks_per_node": 2,
           "input_workers": 4}
    (rep / "report.json").write_text(json.dumps({"recommendation": rec}))
    out = tmp_path / "p.json"
    r = run(["shard-plan", str(data), "--from-report", str(rep), "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert json.loads(out.read_text())["num_workers"] == 4
    (rep / "report.json").write_text(json.dumps({"recommendation": {**rec, "input_workers": 7}}))
    one_line_error(run(["shard-plan", str(data), "--from-report", str(rep)]),
                   "chief_nodes 2 × chief_tasks_per_node 2 ranks", "= 4 input workers")
