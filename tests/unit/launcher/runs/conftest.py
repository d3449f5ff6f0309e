"""Records of runs in a temporary state directory ($XDG_STATE_HOME, never the real home's), with
their attempts' directories as the batch script's filter writes them."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from launcher.attempts import AttemptLog, job_dir
from launcher.runs.record import RunRecord, RunStore

GROUPS = [{"het_group": 0, "role": "chief", "first_task": 0, "ntasks": 2, "nodes": 1},
          {"het_group": 1, "role": "worker", "first_task": 2, "ntasks": 4, "nodes": 2}]


@pytest.fixture()
def store(tmp_path, monkeypatch) -> RunStore:
    """The index under a temporary $XDG_STATE_HOME (and no site config)."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("CSRUN_CONFIG", str(tmp_path / "no-site-config.toml"))
    (tmp_path / "no-site-config.toml").write_text("")
    return RunStore(tmp_path / "state" / "csrun")


def make_run(store: RunStore, tmp_path: Path, run_id: str = "wse-1128-abcd", jobs: tuple[str, ...] = ("57",),
             model_dir: bool = True, **fields) -> RunRecord:
    """A recorded sbatch run of a 2-group layout, submitted a minute ago."""
    md = tmp_path / "md" / run_id
    rec = RunRecord(run_id=run_id, kind="csrun_wse", argv=["csrun_wse", "--use-sbatch", "python-ws", "run.py"],
                    command=["python", "run.py"], submit_dir=str(tmp_path), path="sbatch",
                    submitted_at=time.time() - 60, job_name="csrun_wse", log_root=str(tmp_path / "csrun_logs"),
                    model_dir=str(md) if model_dir else None, groups=GROUPS, jobs=list(jobs),
                    script="#!/bin/bash\n#SBATCH --job-name=csrun_wse\n", **fields)
    store.save(rec)
    return rec


def write_attempt(rec: RunRecord, number: int, lines: dict[int, list[str]], status: int | None = 0,
                  ended: bool = True, job: str | None = None) -> Path:
    """Attempt ``number`` of the run's (last) job: ``lines`` per task, its markers."""
    log = AttemptLog(job_dir(rec.log_root, rec.job_name, job or rec.jobs[-1]) / f"attempt-{number}")
    log.start(job or rec.jobs[-1], number, {"0": "node1", "1": "node[2-3]"})
    for task, texts in lines.items():
        for text in texts:
            log.line(task, text)
    if ended:
        log.end(status, {0: "node1"})
    return log.directory
