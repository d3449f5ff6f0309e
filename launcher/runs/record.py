"""The run record: one JSON file per launch, written by csrun_wse / csrun_cpu (not for
``--dry-run``) and kept up to date by the launcher and by ``csrun status``.

It lives in two places, the same text in both (:mod:`csrun_common.atomic` writes, under a lock):
with the run, ``<model_dir>/.csrun-runs/<run id>.json`` when the run has a model_dir, and in the
index, ``<state dir>/runs/<run id>.json``, so that any directory and any process finds it. The
state directory is ``runs.state_dir`` of the site config, else ``$XDG_STATE_HOME/csrun``, else
``~/.local/state/csrun`` (the XDG Base Directory Specification's state home). docs/RUNS.md.
"""
from __future__ import annotations

import difflib
import fcntl
import json
import os
import secrets
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from csrun_common.atomic import read_json, write_json
from csrun_common.errors import CsrunError

#: Letters of a run id's random part: no 0/o, 1/l/i, so that it reads back as typed.
ALPHABET = "abcdefghjkmnpqrstuvwxyz23456789"
RECORD_VERSION = 1
#: The folder of a run's record beside its model_dir's other files (``.csrun/`` holds the job steps'
#: rendezvous folders, one per step, and nothing else).
RUNS_BESIDE = ".csrun-runs"


def state_dir(configured: str = "", env: Any = None) -> Path:
    """The state directory: ``configured`` (the site key ``runs.state_dir``; ``~`` expanded),
    else ``$XDG_STATE_HOME/csrun``, else ``~/.local/state/csrun``."""
    env = os.environ if env is None else env
    if configured:
        return Path(os.path.expanduser(configured))
    base = env.get("XDG_STATE_HOME") or os.path.join(env.get("HOME") or str(Path.home()), ".local", "state")
    return Path(base) / "csrun"


def new_run_id(kind: str, taken: Callable[[str], bool], now: float | None = None) -> str:
    """A run id a person can type: ``<wse|cpu>-<MMDD>-<4 letters>`` (``wse-1128-k3m9``), not
    ``taken``."""
    stamp = time.strftime("%m%d", time.localtime(now))
    prefix = kind.split("_")[-1]
    while True:
        rid = f"{prefix}-{stamp}-{''.join(secrets.choice(ALPHABET) for _ in range(4))}"
        if not taken(rid):
            return rid


@dataclass
class RunRecord:
    """One run (see the module docstring; every field is in the JSON file).

    Attributes:
        run_id, kind (``csrun_wse``/``csrun_cpu``), argv (the launcher's command line as typed),
            command (what the tasks run), submit_dir, model_dir (absolute, ``None``: none),
            path (``sbatch``/``srun``), submitted_at (``time.time()`` s).
        job_name, log_root: the tasks' logs are under ``<log_root>/<job_name>-<job id>/``
            (:mod:`launcher.attempts`).
        groups: the het components: ``het_group``, ``role``, ``first_task``, ``ntasks``,
            ``nodes`` (a count), ``cpus_per_task``; layout: the layout flags' values.
        script: the sbatch script that ran; srun_line: the srun line (both as printed).
        time_limit_s: ``--time`` in seconds (``None``: the partition's); requeue_exit: the
            chief's "stopped at a checkpoint" status when ``--requeue`` is on.
        jobs: the Slurm job ids, in order (sbatch: one; srun: one per launch of --requeue's loop).
        launcher: ``{"host", "pid"}`` of csrun_wse/csrun_cpu on the srun path.
        cancel: ``{"time", "checkpoint"}`` once ``csrun cancel`` asked; end: the terminal
            ``{"state", "reason", "time", "status"}`` once known (then no Slurm call is needed).
    """

    run_id: str
    kind: str
    argv: list[str]
    command: list[str]
    submit_dir: str
    path: str
    submitted_at: float
    job_name: str
    log_root: str
    model_dir: str | None = None
    groups: list[dict[str, Any]] = field(default_factory=list)
    layout: dict[str, Any] = field(default_factory=dict)
    script: str | None = None
    srun_line: str | None = None
    time_limit_s: float | None = None
    requeue_exit: int | None = None
    jobs: list[str] = field(default_factory=list)
    launcher: dict[str, Any] | None = None
    cancel: dict[str, Any] | None = None
    end: dict[str, Any] | None = None
    version: int = RECORD_VERSION

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunRecord:
        """The record of a JSON object (unknown keys, of a later version, ignored)."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def job_dirs(self) -> list[Path]:
        """Each job's log directory (:func:`launcher.attempts.job_dir`), in order."""
        return [Path(self.log_root) / f"{self.job_name}-{j}" for j in self.jobs]


class RunStore:
    """The records under one state directory (the index) and beside each run's model_dir."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.index = self.root / "runs"

    def index_path(self, run_id: str) -> Path:
        """The index's copy of ``run_id``'s record."""
        return self.index / f"{run_id}.json"

    @staticmethod
    def model_dir_path(model_dir: str, run_id: str) -> Path:
        """The copy of ``run_id``'s record beside its model_dir."""
        return Path(model_dir) / RUNS_BESIDE / f"{run_id}.json"

    def new_id(self, kind: str) -> str:
        """A fresh run id (:func:`new_run_id`) not in the index."""
        return new_run_id(kind, lambda rid: self.index_path(rid).exists())

    def save(self, rec: RunRecord) -> None:
        """Write both copies; the model_dir's only once the model_dir exists (the run makes it:
        a launch never creates a directory its job would not)."""
        data = asdict(rec)
        write_json(self.index_path(rec.run_id), data)
        if rec.model_dir and Path(rec.model_dir).is_dir():
            try:
                write_json(self.model_dir_path(rec.model_dir, rec.run_id), data)
            except OSError:
                pass

    @contextmanager
    def locked(self, run_id: str) -> Iterator[None]:
        """An exclusive lock on ``run_id``'s record (``flock`` of ``<index>/.<run id>.lock``)."""
        self.index.mkdir(parents=True, exist_ok=True)
        with open(self.index / f".{run_id}.lock", "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def update(self, run_id: str, change: Callable[[RunRecord], object], model_dir: str | None = None) -> RunRecord:
        """Read ``run_id``'s record (:meth:`load`), ``change`` it and write it back, under :meth:`locked`."""
        with self.locked(run_id):
            rec = self.load(run_id, model_dir)
            change(rec)
            self.save(rec)
        return rec

    def load(self, run_id: str, model_dir: str | None = None) -> RunRecord:
        """The index's record of ``run_id``, else the copy beside ``model_dir``; raises
        :class:`CsrunError` when there is neither."""
        data = read_json(self.index_path(run_id))
        if not isinstance(data, dict) and model_dir:
            data = read_json(self.model_dir_path(model_dir, run_id))
        if not isinstance(data, dict):
            raise CsrunError(f"RUN {run_id!r}: no such run in {self.index}")
        return RunRecord.from_json(data)

    def all(self) -> list[RunRecord]:
        """Every record of the index, newest first."""
        out = []
        try:
            paths = list(self.index.glob("*.json"))
        except OSError:
            return []
        for p in paths:
            try:
                out.append(RunRecord.from_json(json.loads(p.read_text())))
            except (OSError, ValueError, TypeError):
                continue
        return sorted(out, key=lambda r: r.submitted_at, reverse=True)

    def find(self, ref: str) -> RunRecord:
        """The record ``ref`` names: a run id, a Slurm job id (``57``, ``57+1``) or a model_dir
        (its newest run, recorded beside it or in the index). Raises :class:`CsrunError` naming
        the closest known run ids."""
        ref = str(ref).strip()
        if ref and "/" not in ref and self.index_path(ref).exists():
            return self.load(ref)
        if ref and (Path(ref) / RUNS_BESIDE).is_dir():
            return self._newest_in(Path(ref))
        records = self.all()
        job, where = ref.split("+")[0], str(Path(ref).resolve()) if ref else ""
        for rec in records:  # newest first
            if (job.isdigit() and job in rec.jobs) or (rec.model_dir and rec.model_dir == where):
                return rec
        known = [r.run_id for r in records]
        close = difflib.get_close_matches(ref, known, n=3, cutoff=0.5) or known[:3]
        hint = f"closest: {', '.join(close)}" if close else f"no runs recorded in {self.index}"
        raise CsrunError(f"RUN {ref!r}: no such run id, job id or model_dir ({hint})")

    def _newest_in(self, model_dir: Path) -> RunRecord:
        """The newest run recorded beside ``model_dir`` (the index's copy when it has one)."""
        recs = []
        for p in (model_dir / RUNS_BESIDE).glob("*.json"):
            data = read_json(p)
            if isinstance(data, dict):
                recs.append(RunRecord.from_json(data))
        if not recs:
            raise CsrunError(f"RUN {str(model_dir)!r}: no run recorded in this model_dir")
        newest = max(recs, key=lambda r: r.submitted_at)
        return self.load(newest.run_id) if self.index_path(newest.run_id).exists() else newest
