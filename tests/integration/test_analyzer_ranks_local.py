"""verify's drain of several trainer ranks on this machine (no Slurm): the tasks of a job of one
chief node × 2 ranks and 2 input workers, started as local processes with the environment
csrun_wse gives them (docs/CONTRACT.md, docs/MULTI-RANK.md), each running
``analyzer.verify_task`` on the PyTorch digits example: each rank drains its own input worker
(its own rendezvous directory) and writes its own result, and verify's merge sums the world.

Until csrun_wse's launcher plans the chief's het group as ranks, ``verify`` refuses a world above
1 (docs/INPUT-ANALYZER.md); this is the check of the per-rank drain it will launch. About 10 s
on a 2-core machine (four processes loading torch, a 1.5 s window each).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from analyzer import verify as V

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parent.parent.parent
EXAMPLE = REPO / "examples" / "digits_pt"


def _env(**task: str) -> dict[str, str]:
    """This process's environment without Slurm's or csrun's variables, plus the task's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "CSRUN_"))}
    return {**env, "CSRUN_NUM_WORKERS": "2", "CSRUN_WORLD_SIZE": "2", "CSRUN_LOCAL_WORLD_SIZE": "2",
            "SLURM_JOB_ID": "4242", "CSRUN_WORKER_OFFSET": "0", **task}


def test_each_rank_drains_its_own_input_workers_and_verify_sums_the_world(tmp_path):
    argv = [sys.executable, "-m", "analyzer.verify_task", "--framework", "pytorch", "--seconds", "1.5",
            "--warmup", "0.5", "--out", str(tmp_path / "drain.json"), str(EXAMPLE / "run.py"),
            "--params", str(EXAMPLE / "configs" / "params.yaml"), "--model_dir", str(tmp_path / "model_dir")]
    tasks = [_env(CSRUN_ROLE="chief", CSRUN_HET_GROUP="0", SLURM_PROCID=str(r), SLURM_LOCALID=str(r),
                  CSRUN_TASK_OFFSET="0") for r in range(2)]
    tasks += [_env(CSRUN_ROLE="worker", CSRUN_HET_GROUP="1", SLURM_PROCID=str(2 + g), SLURM_LOCALID=str(g),
                   CSRUN_TASK_OFFSET="2") for g in range(2)]
    procs = [subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for env in tasks]
    try:
        outputs = [p.communicate(timeout=120)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [0, 0, 0, 0], "\n".join(o[-800:] for o in outputs)
    paths = V.result_paths(tmp_path, 2)
    assert [p.name for p in tmp_path.glob("drain*.json")] and all(p.exists() for p in paths)
    assert not (tmp_path / "drain.json").exists()  # no rank writes the one chief's file
    # each rank's own rendezvous directory (<job>.<step>.rank<r>)
    assert sorted(p.name for p in (tmp_path / "model_dir" / ".csrun").iterdir()) == ["4242.0.rank0", "4242.0.rank1"]
    world = V.read_drains(paths)
    assert world["status"] == "ok", world
    assert [(x["rank"], x["num_workers"]) for x in world["ranks"]] == [(0, 1), (1, 1)]
    assert world["num_workers"] == 2
    assert world["samples_per_sec"] == pytest.approx(sum(x["samples_per_sec"] for x in world["ranks"]))
    assert all(x["samples_per_sec"] > 0 for x in world["ranks"])
    # input worker g fed rank g % 2 as its slot 0: job-wide keys 0 and 1
    assert sorted(world["batches_per_worker"]) == ["0", "1"]
