"""``csrun_wse --chief-input-cpus`` on the test cluster (docs/CHIEF-INPUT.md).

One run through csrun_wse: 2 nodes × 2 tasks × 1 CPU (the chief and input worker 1 on the GRES
node, workers 2 and 3 on the other) plus input worker 0 in the chief's own task, under
``--autoscale --initial-workers 1``, on the latency-bound digits pipeline of the autoscale tests
(tests/fixtures/paced/run.py). It must show that

* worker 0 is a process of the chief's task on the chief's node, registered like any worker;
* the job has W + 1 = 4 input workers: a shard plan for 4 workers is accepted, and the four
  read disjoint files that cover the training set, each with its planned seed;
* autoscale streams worker 0 first, adds the tasks' workers after it, and every stream delivers;
* worker 0, killed with SIGKILL during training (its pid from the rendezvous), is replaced in
  the chief's task and streams again, as a task's worker is (docs/RESILIENCE.md "Lost input workers");
* training reaches max_steps, exit 0, and performance.json records the CPU split.

It runs on csrun's data plane, the default transport (docs/DATAPLANE.md), where worker 0 and the
others send to the chief's one receiver, slots autoscale has not opened yet are held paused at
it, the replaced worker 0 connects again as attempt 1, and the workers on the chief's node send
through shared-memory rings. (Its tf.data service variant, 40 s of the suite, was dropped to pay
for the rings' tests: worker 0 is started by the transport-neutral csrun_runtime/chief_input.py
and is then an ordinary input worker of its transport, and tf.data service's replacement path is
tested with task workers in test_elastic_cluster.py, test_node_loss_cluster.py and
test_exactly_once_cluster.py.)
"""
from __future__ import annotations

import json
import os
import signal
import subprocess

import pytest

from tests.fixtures.runtime import helpers

pytestmark = [pytest.mark.cluster, pytest.mark.tf, pytest.mark.slow]

REPO = helpers.REPO
BIN, PACED = helpers.BIN, helpers.PACED


def test_the_chiefs_task_streams_input_worker_zero_first(cli_env, tmp_path):
    data = helpers.prepare_digits(tmp_path / "data")
    params = helpers.digits_params(tmp_path, data, train_input={"pace_ms": 40}, model={"step_pace_ms": 10},
                                   log_steps=100, checkpoint_steps=0, eval_frequency=None, jit_compile=False,
                                   transport="dataplane")
    md = tmp_path / "md"
    plan = tmp_path / "plan4.json"
    made = subprocess.run([str(BIN / "cs_input_analyzer"), "shard-plan", str(data / "train-*"), "--workers", "4",
                           "-o", str(plan)], env=cli_env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    argv = [str(BIN / "csrun_wse"), "--total-nodes", "2", "--tasks-per-node", "2", "--cpus-per-task", "1",
            "--chief-input-cpus", "1", "--shard-plan", str(plan), "--autoscale", "--initial-workers", "1",
            "--autoscale-window", "4", "python-ws", PACED, "--params", str(params), "--mode", "train",
            "--max_steps", "2000", "--model_dir", str(md)]
    log = tmp_path / "csrun_wse.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=cli_env, cwd=tmp_path)
    try:
        helpers.wait_for(lambda: "global_step = 300," in log.read_text(), 300, "training to start")
        (reg_file,) = md.glob(".csrun/*/workers/0.json")
        killed = json.loads(reg_file.read_text())
        os.kill(killed["pid"], signal.SIGKILL)
        code = proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=60)
    res = subprocess.CompletedProcess(argv, code, "", log.read_text())
    assert res.returncode == 0, res.stderr[-5000:]
    perf = json.loads((md / "performance" / "performance.json").read_text())
    assert perf["global_step_end"] == 2000 and perf["num_workers"] == 4

    split = perf["chief_input"]
    assert split["worker"] == 0 and split["cpus"] == 1 and split["nice"] == 10 and split["reason"]
    assert "input worker 0 runs in the chief's task" in res.stderr

    # worker 0: a process of the chief's own task, on the chief's node; 1..3 are Slurm tasks
    (rdv,) = (md / ".csrun").iterdir()
    reports = {int(p.name.split(".")[0]): json.loads(p.read_text())
               for p in (rdv / "workers").glob("*.report.json")}
    assert sorted(reports) == [0, 1, 2, 3]
    chief_node = json.loads((rdv / "endpoints.json").read_text())["chief"]["node"]
    assert reports[0]["component"] == "chief-input" and reports[0]["node"] == chief_node
    assert killed["component"] == "chief-input" and killed["node"] == chief_node
    # the killed worker 0 replaced in the chief's task: same index and node, a new process
    (lost,) = perf["workers_lost"]
    (rep,) = perf["workers_replaced"]
    assert lost["index"] == 0 and lost["pid"] == killed["pid"]
    assert rep["index"] == 0 and rep["node"] == chief_node and rep["attempt"] == 1 and rep["pid"] != killed["pid"]
    assert reports[0]["attempt"] == 1 and reports[0]["elements"] > 0
    assert reports[1]["component"] == "chief" and reports[1]["node"] == chief_node
    assert {reports[i]["component"] for i in (2, 3)} == {"worker"}
    assert all(r["chief_status"] == "ok" for r in reports.values())
    # W + 1 producers: the plan's 4 shards, disjoint and covering the training set
    read = [f for r in reports.values() for f in r["files"]]
    assert len(read) == len(set(read)), "two workers read the same file"
    assert sorted(read) == sorted(str(f) for f in data.glob("train-*")), "the shards do not cover the set"
    for w in json.loads(plan.read_text())["workers"]:
        assert reports[w["index"]]["shuffle_seed"] == w["seed"]
    assert "the 4 input workers read" in res.stderr

    # autoscale: worker 0 alone at first, the others added after it, every stream delivering
    auto = perf["autoscale"]
    assert auto["windows"][0]["workers"] == 1
    adds = [e["worker"] for e in auto["events"] if e["action"] == "add"]
    assert adds and 0 not in adds and adds[0] == 1, auto["events"]
    assert perf["batches_per_worker"]["0"] > 0
    assert sum(perf["batches_per_worker"].values()) == 2000
    # every worker sent to the one receiver; worker 0 again as attempt 1
    assert perf["transport"] == "dataplane" and "tf.data service:" not in res.stderr
    assert "data plane: one receiver at tcp://" in res.stderr
    plane = perf["dataplane"]
    assert plane["0"]["attempt"] == 1 and all(plane[str(i)]["bundles"] > 0 for i in adds + [0]), plane
    assert all(c["errors"] == 0 for c in plane.values()) and perf["dataplane_errors"] == []
    # the chief's node's workers (0, and 1 if autoscale opened it) through shared-memory rings
    # (docs/DATAPLANE.md "Co-located input workers"), workers 2 and 3 (the other node) over TCP
    shared = perf["dataplane_shm"]["bundles_per_worker"]
    assert shared.get("0", 0) > 0 and "2" not in shared and "3" not in shared, shared


def test_a_chief_task_holding_its_whole_node_pins_training_and_worker_zero_apart(cli_env, tmp_path):
    """One task holding every CPU of the node (``--cpus-per-task`` = the node's CPUs, which the
    unpinned test cluster gives every node) may run on exactly the CPUs it holds: the chief
    pins its threads to all but one, worker 0 runs on the last one, as each process reports."""
    out = subprocess.run(["sinfo", "--noheader", "--nodes=node1", "--format=%c"], env=cli_env,
                         capture_output=True, text=True, check=True).stdout.split()
    node_cpus = int(out[0])
    if node_cpus < 2 or node_cpus != len(os.sched_getaffinity(0)):
        pytest.skip(f"node1 declares {node_cpus} CPU(s) and this host has {len(os.sched_getaffinity(0))}: "
                    f"a task of the node's CPUs is not bound to them")
    serial = REPO / "bench" / "pipelines" / "serial"
    md = tmp_path / "md"
    argv = [str(BIN / "csrun_wse"), "--total-nodes", "1", "--tasks-per-node", "1", "--cpus-per-task",
            str(node_cpus), "--chief-input-cpus", "1", "python-ws", str(serial / "run.py"),
            "--params", str(serial / "configs" / "params.yaml"), "--mode", "train", "--max_steps", "300",
            "--model_dir", str(md)]
    res = subprocess.run(argv, env=cli_env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-5000:]
    perf = json.loads((md / "performance" / "performance.json").read_text())
    split = perf["chief_input"]
    assert split["pinned"] and split["input_cpus"] == [max(os.sched_getaffinity(0))]
    assert split["chief_affinity"] == split["training_cpus"] and len(split["training_cpus"]) == node_cpus - 1
    (report_file,) = md.glob(".csrun/*/workers/0.report.json")
    report = json.loads(report_file.read_text())
    assert report["component"] == "chief-input" and report["cpu_affinity"] == split["input_cpus"]
    assert perf["num_workers"] == 1 and perf["batches_per_worker"] == {"0": 300}
