"""``csrun_wse python-pt`` on the Slurm test cluster (docs/PYTORCH.md, issue 25): the PyTorch
digits example trained by a chief fed by 3 input workers over the data plane, then evaluated;
and an input worker killed during a paced run, replaced by its task (same index and seed) and
read again, the job reaching max_steps; input worker 0 in the chief's own task
(``--chief-input-cpus``). ``--autoscale`` growing the input workers from 1 (docs/AUTOSCALE.md) and
``--requeue`` on the srun path: tests/integration/test_exactly_once_cluster.py. A lost node
(``--survive-node-loss``): tests/integration/test_pytorch_node_loss_cluster.py."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from csrun_runtime.pytorch.remote import READ_AHEAD_BATCHES

pytest.importorskip("torch")

from csrun_runtime.pytorch.checkpoint import list_checkpoints  # noqa: E402
from csrun_runtime.pytorch.events import read_scalars  # noqa: E402

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
RUN_PY = str(REPO / "examples" / "digits_pt" / "run.py")
PACED = str(REPO / "tests" / "fixtures" / "pytorch_paced" / "run.py")
LAYOUT = ["--total-nodes", "4", "--tasks-per-node", "1", "--cpus-per-task", "1"]  # chief + 3 input workers
STEPS, BATCH = 300, 64


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    import yaml

    root = tmp_path_factory.mktemp("digits_pt")
    data = root / "data"
    subprocess.run([sys.executable, str(REPO / "examples/digits_pt/prepare_data.py"), "--out-dir", str(data)],
                   check=True, capture_output=True)
    params = yaml.safe_load((REPO / "examples/digits_pt/configs/params.yaml").read_text())
    params["train_input"]["data_dir"] = params["eval_input"]["data_dir"] = str(data)
    params["train_input"].update(num_workers=1, prefetch_factor=4, persistent_workers=True)  # DataLoader processes
    p = root / "params.yaml"
    p.write_text(yaml.safe_dump(params))
    return {"root": root, "params": p, "yaml": params}


def csrun_wse(args, env, cwd, timeout=400):
    return subprocess.run([str(BIN / "csrun_wse"), *args], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def reports(md: Path) -> dict[int, dict]:
    return {int(p.name.split(".")[0]): json.loads(p.read_text()) for p in md.glob(".csrun/*/workers/*.report.json")}


@pytest.fixture(scope="module")
def trained(digits, slurm_cluster):
    md = digits["root"] / "model dir"
    args = LAYOUT + ["python-pt", RUN_PY, "--params", str(digits["params"]), "--model_dir", str(md),
                     "--mode", "train", "--max_steps", str(STEPS)]
    proc = csrun_wse(args, dict(slurm_cluster["env"]), digits["root"])
    return {"proc": proc, "md": md}


def test_pytorch_job_trains_from_three_input_workers(trained):
    proc, md = trained["proc"], trained["md"]
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    assert "data plane: receiving from 3 input worker(s)" in log
    assert f"Training finished with {STEPS * BATCH} samples in" in log
    perf = json.loads((md / "performance" / "performance.json").read_text())
    assert perf["framework"] == "pytorch" and perf["total_samples"] == STEPS * BATCH
    assert perf["samples_per_sec"] == pytest.approx(perf["total_samples"] / perf["total_time"], rel=0.01)
    per = {int(k): v for k, v in perf["batches_per_worker"].items()}
    assert sorted(per) == [0, 1, 2] and sum(per.values()) == STEPS
    assert sum(1 for v in per.values() if v > 0) >= 2, per
    assert perf["data_plane"]["errors"] == [] and perf["verdict"]["bound"] in ("input", "compute")
    assert [s for s, _ in list_checkpoints(md)] == [200, 300]
    assert {t for _, t, _ in read_scalars(next(md.glob("events.out.tfevents.*")))} >= {"loss", "samples_per_sec"}
    assert (md / "train" / "params_train.yaml").exists()
    rep = reports(md)
    assert sorted(rep) == [0, 1, 2] and all(r["chief_status"] == "ok" for r in rep.values()), rep
    # the seed rule: the job-wide shuffle_seed on every worker, torch seeded per worker, and the
    # DataLoader's own num_workers (its processes) untouched by csrun's facts
    assert {r["shuffle_seed"] for r in rep.values()} == {1234}
    assert sorted(r["torch_seed"] for r in rep.values()) == [1234, 1235, 1236]
    assert all(r["num_streamers"] == 3 and r["dataloader_workers"] == 1 for r in rep.values())
    assert sorted(r["streaming_rank"] for r in rep.values()) == [0, 1, 2]


def test_pytorch_job_eval_reports_accuracy(trained, digits, cli_env):
    assert trained["proc"].returncode == 0
    proc = csrun_wse(LAYOUT + ["python-pt", RUN_PY, "--params", str(digits["params"]), "--model_dir",
                               str(trained["md"]), "--mode", "eval"], cli_env, digits["root"])
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    res = json.loads((trained["md"] / "eval" / "results.json").read_text())
    assert res["global_step"] == STEPS and res["eval_samples"] == 360
    assert res["metrics"]["accuracy"] >= 0.9, res
    assert "Eval results at global step 300 (360 samples)" in proc.stdout + proc.stderr


def test_killed_pytorch_input_worker_is_replaced(digits, cli_env):
    import yaml

    params = json.loads(json.dumps(digits["yaml"]))
    params["train_input"].update(num_workers=0, pace_ms=20)
    for k in ("prefetch_factor", "persistent_workers"):
        params["train_input"].pop(k)
    # on the bulk channel (runconfig.dataplane_bulk): the killed worker's connection ends, maybe
    # inside a bundle, and its replacement connects a new one (the default path: the tests above)
    params["runconfig"].update(checkpoint_steps=0, eval_frequency=None, log_steps=50, dataplane_bulk=True)
    path = digits["root"] / "paced.yaml"
    path.write_text(yaml.safe_dump(params))
    md = digits["root"] / "md_killed"
    log = digits["root"] / "killed.log"
    max_steps, kill_at = 1000, 200  # 800 paced steps (16 s) after the kill: its replacement takes ~4 s
    argv = [str(BIN / "csrun_wse"), "--total-nodes", "3", "--tasks-per-node", "1", "--cpus-per-task", "1",
            "python-pt", PACED, "--params", str(path), "--mode", "train", "--max_steps", str(max_steps),
            "--model_dir", str(md)]
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=cli_env, cwd=digits["root"])
    try:
        deadline = time.monotonic() + 300
        while f"global_step = {kill_at}," not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)
        (reg_file,) = md.glob(".csrun/*/workers/1.json")
        reg = json.loads(reg_file.read_text())
        os.kill(reg["pid"], signal.SIGKILL)
        code = proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=60)
    output = log.read_text()
    assert code == 0, output[-3000:]
    perf = json.loads((md / "performance" / "performance.json").read_text())
    assert perf["global_step_end"] == max_steps
    (lost,) = perf["workers_lost"]
    assert lost["index"] == 1 and lost["pid"] == reg["pid"] and "died of SIGKILL" in lost["reason"]
    assert f"input worker 1 on {reg['node']} (pid {reg['pid']}) lost" in output
    (rep,) = perf["workers_replaced"]
    assert rep["index"] == 1 and rep["attempt"] == 1
    report = reports(md)[1]
    assert report["attempt"] == 1 and report["batches"] > 0 and report["torch_seed"] == reg["torch_seed"]
    assert perf["data_plane"]["errors"] == [] and perf["data_plane"]["bulk"] is True
    assert "(runconfig.dataplane_bulk)" in output and all(int(v) > 0 for v in perf["batches_per_worker"].values())


def test_pytorch_chief_runs_input_worker_zero_in_its_task(digits, cli_env):
    """``--chief-input-cpus 1`` with python-pt (docs/CHIEF-INPUT.md): 2 nodes × 1 task, so the
    chief, input worker 1 in the other node's task and input worker 0 a supervised process of
    the chief's own task (W + 1 = 2 streamers); every worker reports, training reaches
    max_steps with exit 0, and performance.json records the CPU split."""
    md = digits["root"] / "chief_input_md"
    proc = csrun_wse(["--total-nodes", "2", "--tasks-per-node", "1", "--cpus-per-task", "1",
                      "--chief-input-cpus", "1", "python-pt", RUN_PY, "--params", str(digits["params"]),
                      "--model_dir", str(md), "--mode", "train", "--max_steps", "200"], cli_env, digits["root"])
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    assert "input worker 0 runs in the chief's task (pid " in log and "not wired for PyTorch" not in log
    assert "data plane: receiving from 2 input worker(s)" in log
    perf = json.loads((md / "performance" / "performance.json").read_text())
    assert perf["global_step_end"] == 200 and perf["num_workers"] == 2
    split = perf["chief_input"]
    assert split["worker"] == 0 and split["cpus"] == 1 and split["nice"] == 10 and split["reason"]
    assert set(perf["batches_per_worker"]) <= {"0", "1"} and sum(perf["batches_per_worker"].values()) == 200
    rep = reports(md)
    assert sorted(rep) == [0, 1] and all(r["chief_status"] == "ok" for r in rep.values()), rep
    assert rep[0]["component"] == "chief-input" and rep[0]["node"] == split["node"]
    assert rep[1]["component"] == "worker" and rep[1]["node"] != split["node"]
    assert sorted(r["streaming_rank"] for r in rep.values()) == [0, 1]
    assert all(r["num_streamers"] == 2 for r in rep.values())
    # input worker 1 streamed; input worker 0 (nice 10 on the chief's CPU) may start after the 200 fast
    # steps and then read nothing: the read-ahead bound (runconfig.input_read_ahead_batches) keeps it from
    # reading batches the chief never takes, as it did before (a 4 MiB window of them)
    assert rep[1]["batches"] > 0
    assert all(r["batches"] - perf["batches_per_worker"].get(str(i), 0) <= READ_AHEAD_BATCHES for i, r in rep.items())
    assert sorted(r["torch_seed"] for r in rep.values()) == [1234, 1235]
