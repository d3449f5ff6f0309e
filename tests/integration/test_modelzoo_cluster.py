"""A Model Zoo-style data processor, unmodified, through csrun_wse on the Slurm test cluster
(issue 10), with the main job's layout (``--total-nodes 4 --single-task-nodes 1
--tasks-per-node 2``: 6 input workers) over 12 TFRecord files.

The processor (tests/fixtures/modelzoo_style) lists its files with
``tf.data.Dataset.list_files(shuffle=True, seed=shuffle_seed)``, shards them by ``TF_CONFIG``
when ``use_multiple_workers`` is true and knows only ``data_dir``. Every record carries an id
``file * 1000 + k``; the processor appends each id it reads to ``<tap_dir>/<pid>.ids``, and the
workers' reports map pids to worker indices, so the assertions are on what the workers'
pipelines actually read, not on what csrun says it gave them. The file list is reshuffled
every epoch (the same way on every worker) and sharded again, so the workers' files are
disjoint and cover the set within each epoch (a worker reads other files the next epoch).

Three 7-task jobs: ``use_multiple_workers: true`` (with ``train_and_eval``: the eval input from
the same processor, ``eval_steps`` honoured), ``false``, and a shard plan; plus one
``--mode eval`` on a one-task layout.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = [pytest.mark.cluster, pytest.mark.tf, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
FIXTURE = REPO / "tests" / "fixtures" / "modelzoo_style"
RUN_PY = str(FIXTURE / "run.py")
LAYOUT = ["--total-nodes", "4", "--single-task-nodes", "1", "--tasks-per-node", "2"]
WORKERS, FILES, RECORDS, BATCH, STEPS = 6, 12, 8, 8, 240
EVAL_STEPS = 3


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    """12 training files of 8 records and 2 eval files of 16 records."""
    root = tmp_path_factory.mktemp("zoo")
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import make_data; "
            "make_data.write(sys.argv[2] + '/train', 12, 8); "
            "make_data.write(sys.argv[2] + '/eval', 2, 16, prefix='eval', first=100)")
    subprocess.run([sys.executable, "-c", code, str(FIXTURE), str(root / "data")], check=True,
                   capture_output=True)
    return root


def params_file(root: Path, name: str, **train_input) -> Path:
    params = {
        "train_input": {"data_processor": "SyntheticRecordsProcessor", "data_dir": str(root / "data" / "train"),
                        "batch_size": BATCH, "shuffle_seed": 1234, "shuffle_buffer": 32,
                        "tap_dir": str(root / name / "tap"), **train_input},
        "eval_input": {"data_processor": "SyntheticRecordsProcessor", "data_dir": str(root / "data" / "eval"),
                       "batch_size": BATCH},
        "model": {"hidden_size": 16},
        "runconfig": {"max_steps": STEPS, "log_steps": 100, "eval_steps": EVAL_STEPS,
                      "model_dir": str(root / name / "model_dir")},
    }
    (root / name / "tap").mkdir(parents=True)
    path = root / name / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    return path


def csrun(args: list[str], env: dict, cwd: Path, cli: str = "csrun_wse", timeout: int = 400):
    return subprocess.run([str(BIN / cli), *args], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def launch(root: Path, env: dict, name: str, mode: str = "train", flags: tuple = (), **train_input) -> dict:
    params = params_file(root, name, **train_input)
    proc = csrun([*LAYOUT, *flags, "python-ws", RUN_PY, "--params", str(params), "--mode", mode], env, root)
    model_dir = root / name / "model_dir"
    reports = {int(p.name.split(".")[0]): json.loads(p.read_text())
               for p in model_dir.glob(".csrun/*/workers/*.report.json")}
    return {"proc": proc, "model_dir": model_dir, "reports": reports,
            "read": tapped(root / name / "tap", reports), "log": proc.stdout + proc.stderr}


def tapped(tap_dir: Path, reports: dict[int, dict]) -> dict[int, list[int]]:
    """Record ids each input worker's pipeline read, in order, by worker index."""
    by_pid = {r["pid"]: i for i, r in reports.items()}
    out: dict[int, list[int]] = {}
    for p in tap_dir.glob("*.ids"):
        pid = int(p.stem)
        assert pid in by_pid, f"records read by a process that is not an input worker: {p}"
        out[by_pid[pid]] = [int(x) for x in p.read_text().split()]
    return out


def files_of(ids: list[int]) -> list[int]:
    """File numbers in the order their first record was read."""
    return list(dict.fromkeys(i // 1000 for i in ids))


def epoch(ids: list[int], files_per_epoch: int, k: int) -> list[int]:
    """The ids of epoch ``k`` (0-based) of a worker that reads ``files_per_epoch`` whole files of
    ``RECORDS`` records per epoch (epochs do not overlap: the repeat is the pipeline's last
    step). Asserts that the epoch is complete and made of whole files."""
    size = files_per_epoch * RECORDS
    chunk = ids[k * size:(k + 1) * size]
    assert len(chunk) == size, f"epoch {k} incomplete: {len(chunk)} of {size} records read"
    per_file: dict[int, set[int]] = {}
    for i in chunk:
        per_file.setdefault(i // 1000, set()).add(i % 1000)
    assert all(v == set(range(RECORDS)) for v in per_file.values()), per_file
    return chunk


@pytest.fixture(scope="module")
def sharded(zoo, slurm_cluster):
    return launch(zoo, dict(slurm_cluster["env"]), "sharded", mode="train_and_eval", use_multiple_workers=True)


def test_use_multiple_workers_shards_the_files_disjoint_and_covering(sharded):
    assert sharded["proc"].returncode == 0, sharded["log"][-4000:]
    read = sharded["read"]
    assert sorted(read) == list(range(WORKERS)), sorted(read)
    for k in (0, 1):
        sets = {i: set(files_of(epoch(ids, FILES // WORKERS, k))) for i, ids in read.items()}
        every = [f for s in sets.values() for f in s]
        assert len(every) == len(set(every)), f"epoch {k}: two workers read the same file: {sets}"
        assert sorted(every) == list(range(FILES)), f"epoch {k}: files read by no worker: {sets}"
    reports = sharded["reports"]
    # TF_CONFIG as the Cerebras system set it; record-level shuffles seeded per worker
    assert {r["tf_config"]["task"]["index"] for r in reports.values()} == set(range(WORKERS))
    assert all(len(r["tf_config"]["cluster"]["worker"]) == WORKERS for r in reports.values())
    assert len({r["shuffle_seed"] for r in reports.values()}) == WORKERS
    assert all(r["file_list_job_wide"] for r in reports.values())
    assert "input workers' files (checked as workers 0 and 1 of 2): sharded" in sharded["log"]
    assert f"the {WORKERS} input workers read {FILES} distinct training file(s): sharded" in sharded["log"]


def test_train_and_eval_reads_eval_input_from_the_same_processor(sharded):
    assert sharded["proc"].returncode == 0, sharded["log"][-4000:]
    results = json.loads((sharded["model_dir"] / "eval" / "results.json").read_text())
    assert results["global_step"] == STEPS
    assert results["eval_batches"] == EVAL_STEPS and results["eval_samples"] == EVAL_STEPS * BATCH
    assert 0.0 <= results["metrics"]["accuracy"] <= 1.0
    assert f"Eval results at global step {STEPS}: " in sharded["log"]


def test_eval_mode_honours_eval_steps(sharded, zoo, cli_env):
    assert sharded["proc"].returncode == 0
    params = zoo / "sharded" / "params.yaml"
    proc = csrun(["--total-nodes", "1", "--tasks-per-node", "1", "python-ws", RUN_PY, "--params", str(params),
                  "--mode", "eval", "--eval_steps", "2"], cli_env, zoo)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((sharded["model_dir"] / "eval" / "results.json").read_text())
    assert results["global_step"] == STEPS and results["eval_batches"] == 2, results
    assert "accuracy" in results["metrics"]


def test_without_multiple_workers_every_worker_reads_every_file_in_its_own_order(zoo, cli_env):
    job = launch(zoo, cli_env, "replicated", use_multiple_workers=False)
    assert job["proc"].returncode == 0, job["log"][-4000:]
    read = job["read"]
    assert sorted(read) == list(range(WORKERS))
    orders = {i: files_of(epoch(ids, FILES, 0)) for i, ids in read.items()}
    for i, order in orders.items():
        assert sorted(order) == list(range(FILES)), f"worker {i} did not read every file: {order}"
    assert len({tuple(o) for o in orders.values()}) == WORKERS, orders
    assert all(r["tf_config"]["task"]["index"] == i for i, r in job["reports"].items())
    assert f"the {WORKERS} input workers read {FILES} distinct training file(s): replicated" in job["log"]


def test_shard_plan_reaches_a_data_dir_only_processor(zoo, cli_env):
    plan = zoo / "plan.json"
    proc = csrun(["shard-plan", str(zoo / "data" / "train"), *LAYOUT, "-o", str(plan)], cli_env, zoo,
                 cli="cs_input_analyzer", timeout=120)
    assert proc.returncode == 0, proc.stderr
    # the processor also shards by TF_CONFIG: under a plan TF_CONFIG names one worker
    job = launch(zoo, cli_env, "planned", flags=("--shard-plan", str(plan)), use_multiple_workers=True)
    assert job["proc"].returncode == 0, job["log"][-4000:]
    entries = {w["index"]: {int(Path(f).name.split("-")[1].split(".")[0]) for f in w["files"]}
               for w in json.loads(plan.read_text())["workers"]}
    read = {i: set(files_of(ids)) for i, ids in job["read"].items()}
    assert read == entries, (read, entries)
    assert sorted(f for s in read.values() for f in s) == list(range(FILES))
    assert all(len(r["tf_config"]["cluster"]["worker"]) == 1 for r in job["reports"].values())
    assert f"the {WORKERS} input workers read {FILES} distinct training file(s): planned" in job["log"]
