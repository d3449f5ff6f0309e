"""One attempt of a run on disk: each task's log in a file of its own, and the attempt's start and
end markers, written by whoever watches srun's output (the batch script's filter,
:func:`launcher.tasklog.main`; csrun_wse itself on the srun path).

An attempt is one allocation of the run's job: the first, or one after a requeue (sbatch: the
same job id, ``SLURM_RESTART_COUNT`` + 1; srun: each launch of ``--requeue``'s loop). Layout::

    <log root>/<job name>-<job id>/attempt-<K>/     K = 1, 2, ... (docs/RUNS.md)
      task-<I>.log     task I's lines (srun's --label numbering, the label taken off)
      srun.log         srun's and slurmstepd's own lines
      start.json       {"job_id", "attempt", "nodes": {het group: node list}, "time"}
      end.json         {"status": srun's exit status or null (its output ended without one:
                        cancelled, requeued, killed), "task_nodes": {task: node},
                        "exit_codes": {task: the exit code srun reported}, "time"}

The markers are what the run's state falls back on when Slurm no longer knows the job and keeps
no accounting (:mod:`launcher.runs.states`). Writes are :mod:`csrun_common.atomic`'s.
"""
from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from csrun_common.atomic import read_json, write_json

#: The batch script's attempt directory, as the shell expands it in the job (the log root is
#: ``$CSRUN_LOG_DIR`` or ``csrun_logs`` in the submit directory, as the task log's).
SCRIPT_ATTEMPT_DIR = "${%s:-csrun_logs}/%s-${SLURM_JOB_ID}/attempt-$((${SLURM_RESTART_COUNT:-0} + 1))"
START, END, SRUN_LOG = "start.json", "end.json", "srun.log"


def job_dir(log_root: str | os.PathLike[str], job_name: str, job_id: str) -> Path:
    """``<log_root>/<job_name>-<job_id>``: the attempts of one job."""
    return Path(log_root) / f"{job_name}-{job_id}"


def task_file(attempt_dir: Path, task: int) -> Path:
    """Task ``task``'s log in ``attempt_dir``."""
    return attempt_dir / f"task-{int(task)}.log"


def het_nodes(env: Mapping[str, str]) -> dict[str, str]:
    """The node list of every het group of the job this process runs in (``{"0": "node1", ...}``,
    from ``SLURM_JOB_NODELIST_HET_GROUP_<k>``; one group ``"0"`` from ``SLURM_JOB_NODELIST``
    in a job of one component)."""
    prefix = "SLURM_JOB_NODELIST_HET_GROUP_"
    groups = {k[len(prefix):]: v for k, v in env.items() if k.startswith(prefix)}
    if not groups and env.get("SLURM_JOB_NODELIST"):
        groups = {"0": env["SLURM_JOB_NODELIST"]}
    return dict(sorted(groups.items(), key=lambda kv: int(kv[0]) if kv[0].isdigit() else 0))


@dataclass
class AttemptLog:
    """The writer of one attempt's directory (see the module docstring). Not thread-safe: its
    caller serialises :meth:`line` (the filter reads one merged stream; csrun_wse holds a lock)."""

    directory: Path
    _files: dict[int | None, IO[str]] = field(default_factory=dict)

    def start(self, job_id: str, attempt: int, nodes: Mapping[str, str]) -> None:
        """Create the directory and write ``start.json``."""
        self.directory.mkdir(parents=True, exist_ok=True)
        write_json(self.directory / START, {"job_id": str(job_id), "attempt": int(attempt), "nodes": dict(nodes),
                                            "time": time.time()})

    def line(self, task: int | None, text: str) -> None:
        """One line of srun's ``--label``'d output, its label taken off
        (:func:`launcher.tasklog.parse_label`): to task ``task``'s file, or to ``srun.log``
        (``None``, or slurmstepd's notices, which come labelled too)."""
        if text.startswith("slurmstepd"):
            task = None
        f = self._files.get(task)
        if f is None:
            self.directory.mkdir(parents=True, exist_ok=True)
            path = self.directory / SRUN_LOG if task is None else task_file(self.directory, task)
            f = self._files[task] = open(path, "a", encoding="utf-8", errors="replace")  # noqa: SIM115 - end()
        f.write(text + "\n")
        f.flush()

    def end(self, status: int | None, task_nodes: Mapping[int, str] | None = None,
            exit_codes: Mapping[int, int] | None = None) -> None:
        """Close the task files and write ``end.json`` (``status`` ``None``: srun's output ended
        without its status: the job was cancelled, requeued or killed; ``exit_codes``: the tasks
        srun reported exited with a code, :meth:`launcher.tasklog.TaskOutput.exit_codes`)."""
        for f in self._files.values():
            f.close()
        self._files.clear()
        self.directory.mkdir(parents=True, exist_ok=True)
        write_json(self.directory / END, {"status": status, "time": time.time(),
                                          "task_nodes": {str(k): v for k, v in (task_nodes or {}).items()},
                                          "exit_codes": {str(k): v for k, v in (exit_codes or {}).items()}})


@dataclass(frozen=True)
class Attempt:
    """One attempt as read back: ``number`` (1-based), its directory, ``start.json`` and
    ``end.json`` (``None`` while absent)."""

    number: int
    directory: Path
    start: dict[str, Any] | None
    end: dict[str, Any] | None

    @property
    def tasks(self) -> list[int]:
        """The tasks with a log file, in order."""
        return sorted(int(p.stem.split("-", 1)[1]) for p in self.directory.glob("task-*.log")
                      if p.stem.split("-", 1)[1].isdigit())


def read_attempts(directory: Path) -> list[Attempt]:
    """The attempts under one job's directory (:func:`job_dir`), by number; ``[]`` when absent."""
    out = []
    try:
        dirs = [p for p in directory.iterdir() if p.name.startswith("attempt-") and p.name[8:].isdigit()]
    except OSError:
        return []
    for d in sorted(dirs, key=lambda p: int(p.name[8:])):
        out.append(Attempt(int(d.name[8:]), d, read_json(d / START), read_json(d / END)))
    return out
