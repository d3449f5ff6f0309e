"""Multi-process runs on tf.data service without csrun_wse: a chief and input workers started
with the environment of docs/CONTRACT.md, as local subprocesses and as a plain ``srun``
heterogeneous step on the test cluster. Each worker reads its own shard-plan files with its own
seed; the chief trains on batches from every worker and reaches the accuracy."""
from __future__ import annotations

import json
import re
import subprocess
import time

import pytest

from tests.fixtures.runtime import helpers

pytestmark = [pytest.mark.tf, pytest.mark.slow]
pytest.importorskip("tensorflow")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return helpers.prepare_digits(tmp_path_factory.mktemp("digits") / "data")


def train_files(data):
    return sorted(str(p) for p in data.glob("train-*.tfrecord"))


def test_chief_and_two_workers_with_a_shard_plan(data, tmp_path):
    files = train_files(data)
    plan = helpers.write_plan(tmp_path / "plan.json", [files[:4], files[4:]])
    params = helpers.digits_params(tmp_path, data)
    md = tmp_path / "md"
    job = helpers.LocalJob(["--params", str(params), "--mode", "train_and_eval", "--max_steps", "300",
                            "--model_dir", str(md)], 2, tmp_path / "logs",
                           extra_env={"CSRUN_SHARD_PLAN": str(plan)})
    try:
        codes = job.wait(timeout=240)
    finally:
        job.cleanup()
    chief = job.log(0)
    assert codes == [0, 0, 0], "\n".join(job.log(k) for k in range(3))
    # the chief trained on batches of both workers
    m = re.search(r"batches received per input worker: 0 \(node2\): (\d+), 1 \(node3\): (\d+)", chief)
    assert m, chief
    assert int(m.group(1)) > 0 and int(m.group(2)) > 0
    assert int(m.group(1)) + int(m.group(2)) == 300
    res = json.loads((md / "eval" / "results.json").read_text())
    assert res["metrics"]["accuracy"] >= 0.90
    perf = json.loads((md / "performance" / "performance.json").read_text())
    assert perf["num_workers"] == 2 and perf["total_samples"] == 300 * 64
    assert perf["batches_per_worker"] == {"0": int(m.group(1)), "1": int(m.group(2))}
    # small batches travel several to a service element (input_bundle: auto): 63 make 1 MiB,
    # capped at 300 steps // (4 × 2 workers) = 37 for this short run; trained in chunks
    assert "input bundling: auto: 37 batches of 16.2 KiB per element, capped by the run's length" in chief
    assert perf["input_bundle"]["batches_per_element"] == {"0": 37, "1": 37}
    assert perf["batches_per_element"] == {"0": 37, "1": 37}
    assert perf["steps_per_execution"]["calls"] < 300 / 10
    # each worker read only its own files, with its own seed, and says how much it produced
    reports = helpers.worker_reports(md)
    assert sorted(reports) == [0, 1]
    assert reports[0]["files"] == files[:4] and reports[1]["files"] == files[4:]
    assert not set(reports[0]["files"]) & set(reports[1]["files"])
    assert [reports[i]["shuffle_seed"] for i in (0, 1)] == [5000, 5001]
    assert all(reports[i]["files_source"] == "shard_plan" for i in (0, 1))
    for i in (0, 1):
        assert reports[i]["elements"] >= perf["batches_per_worker"][str(i)]
        assert reports[i]["samples"] == reports[i]["elements"] * 64
        assert reports[i]["chief_status"] == "ok"
    (rdv,) = helpers.rendezvous_dirs(md)
    assert json.loads((rdv / "done.json").read_text())["status"] == "ok"


def test_bundling_off_through_the_service(data, tmp_path):
    """input_bundle: 1 sends one batch per service element; the counts still add up."""
    params = helpers.digits_params(tmp_path, data, input_bundle=1, log_steps=20, checkpoint_steps=0)
    md = tmp_path / "md"
    job = helpers.LocalJob(["--params", str(params), "--mode", "train", "--max_steps", "60",
                            "--model_dir", str(md)], 2, tmp_path / "logs")
    try:
        codes = job.wait(timeout=240)
    finally:
        job.cleanup()
    assert codes == [0, 0, 0], "\n".join(job.log(k) for k in range(3))
    perf = json.loads((md / "performance" / "performance.json").read_text())
    assert perf["input_bundle"]["batches_per_element"] == {"0": 1, "1": 1}
    assert sum(perf["batches_per_worker"].values()) == 60
    assert perf["steps_per_execution"]["calls_by_steps"] == {"1": 60}
    reports = helpers.worker_reports(md)
    assert all(r["bundle"] == 1 and r["elements"] == r["service_elements"] for r in reports.values())


def test_shard_plan_for_another_worker_count_is_refused(data, tmp_path):
    files = train_files(data)
    plan = helpers.write_plan(tmp_path / "plan.json", [files[:3], files[3:6], files[6:]])
    params = helpers.digits_params(tmp_path, data)
    job = helpers.LocalJob(["--params", str(params), "--mode", "train", "--max_steps", "10",
                            "--model_dir", str(tmp_path / "md")], 2, tmp_path / "logs",
                           extra_env={"CSRUN_SHARD_PLAN": str(plan)})
    try:
        codes = job.wait(timeout=120)
    finally:
        job.cleanup()
    chief = job.log(0)
    assert codes[0] == 2, chief
    assert "is for 3 workers but the job has 2 input workers" in chief
    assert all(c is not None for c in codes)  # nobody hangs


def _srun_het(argv, num_input_workers, extra_export="", kill_on_bad_exit=True):
    exp0 = (f"ALL,CSRUN_ROLE=chief,CSRUN_HET_GROUP=0,CSRUN_TASK_OFFSET=0,CSRUN_WORKER_OFFSET=0,"
            f"CSRUN_NUM_WORKERS={num_input_workers},CSRUN_NUM_TASKS={num_input_workers + 1},"
            f"CSRUN_CPUS_PER_TASK=1,TF_CPP_MIN_LOG_LEVEL=2{extra_export}")
    exp1 = (f"ALL,CSRUN_ROLE=worker,CSRUN_HET_GROUP=1,CSRUN_TASK_OFFSET=1,CSRUN_WORKER_OFFSET=0,"
            f"CSRUN_NUM_WORKERS={num_input_workers},CSRUN_NUM_TASKS={num_input_workers + 1},"
            f"CSRUN_CPUS_PER_TASK=1,TF_CPP_MIN_LOG_LEVEL=2{extra_export}")
    cmd = [helpers.PY, str(helpers.DIGITS / "run.py"), *argv]
    nodes = min(num_input_workers, 2)
    return (["srun", "--job-name=csrun-runtime-test", "-t", "10"]
            + (["--kill-on-bad-exit=1"] if kill_on_bad_exit else [])
            + ["-N1", "-n1", "-c1", f"--export={exp0}", *cmd, ":",
               f"-N{nodes}", f"-n{num_input_workers}", "-c1", f"--export={exp1}", *cmd])


@pytest.mark.cluster
def test_srun_het_step_one_chief_three_workers(slurm_cluster, data, tmp_path):
    params = helpers.digits_params(tmp_path, data)
    md = tmp_path / "md"
    cmd = _srun_het(["--params", str(params), "--mode", "train_and_eval", "--max_steps", "300",
                     "--model_dir", str(md)], 3)
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=400, cwd=str(helpers.REPO),
                          env=slurm_cluster["env"])
    elapsed = time.monotonic() - t0
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    m = re.search(r"batches received per input worker: (.*)", out)
    assert m, out
    counts = [int(x) for x in re.findall(r": (\d+)", m.group(1))]
    assert len(counts) == 3 and sum(counts) == 300
    assert sum(1 for c in counts if c > 0) >= 2, m.group(1)
    res = json.loads((md / "eval" / "results.json").read_text())
    assert res["metrics"]["accuracy"] >= 0.90
    reports = helpers.worker_reports(md)
    assert sorted(reports) == [0, 1, 2]
    assert len({r["shuffle_seed"] for r in reports.values()}) == 3
    assert {r["node"] for r in reports.values()} <= {f"node{k}" for k in range(1, 6)}
    print(f"srun het step: {elapsed:.1f} s wall, accuracy {res['metrics']['accuracy']:.4f}")
