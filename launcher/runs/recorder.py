"""csrun_wse's and csrun_cpu's side of the run record: the record written before the job is
submitted, its job id once Slurm gives it, and, on the srun path, each launch's attempt and the
launcher's exit status. A record that cannot be written costs the launch one warning line, never
the launch itself."""
from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from csrun_common.env import LOG_DIR, RUN_ID
from csrun_common.flagspec import FlagSpec

from ..builders import CpuRequest, WseRequest
from ..policy import parse_time
from ..preflight import model_dir_of
from ..requeue import REQUEUE_EXIT
from .record import RunRecord, RunStore, state_dir


def flag_argv(specs: Sequence[FlagSpec], flags: object) -> list[str]:
    """The options of ``flags`` (a :class:`launcher.flags.WseFlags` or ``CpuFlags``) that differ
    from their declared default, as a command line (``["--use-sbatch", "--time", "30"]``)."""
    grouped: dict[str, Any] = {**getattr(flags, "layout", {}), **getattr(flags, "policy", {})}
    argv: list[str] = []
    for spec in specs:
        value = grouped[spec.name] if spec.name in grouped else getattr(flags, spec.name, spec.default)
        if value == spec.default or value is None or value == ():
            continue
        if spec.type is bool:
            argv.append(spec.flag if value else spec.off_flag or "")
        elif spec.multiple:
            argv += [f"{spec.flag}={v}" for v in value]
        else:
            argv += [spec.flag, str(value)]
    return [a for a in argv if a]


def _groups(req: WseRequest | CpuRequest) -> list[dict[str, object]]:
    if isinstance(req, CpuRequest):
        return [{"het_group": 0, "role": "task", "first_task": 0, "ntasks": 1, "nodes": 1}]
    comps = {c.het_group: c for c in req.chief_components()}
    return [{"het_group": g.het_group, "role": g.role, "first_task": g.first_task, "ntasks": g.ntasks,
             "nodes": comps[g.het_group].nodes if g.het_group in comps else None,
             "cpus_per_task": comps[g.het_group].cpus_per_task if g.het_group in comps else None}
            for g in req.task_output().groups]


def new_record(store: RunStore, kind: str, argv: Sequence[str], req: WseRequest | CpuRequest,
               use_sbatch: bool) -> RunRecord:
    """The record of a launch about to be submitted (its id from ``$CSRUN_RUN_ID`` when
    :func:`launcher.runs.api.launch` chose it, else a new one)."""
    cwd = Path.cwd()
    wse = isinstance(req, WseRequest)
    model_dir = model_dir_of(req.command, cwd) if wse else None
    limit = parse_time(req.policy.time) if req.policy.time else None
    spec = req.layout.spec if isinstance(req, WseRequest) else None
    requeue = req.requeue if isinstance(req, WseRequest) else None
    return RunRecord(
        run_id=os.environ.get(RUN_ID.name) or store.new_id(kind), kind=kind, argv=[kind, *argv],
        command=list(req.command), submit_dir=str(cwd), path="sbatch" if use_sbatch else "srun",
        submitted_at=time.time(), job_name=req.job_name,
        log_root=str((cwd / (os.environ.get(LOG_DIR.name) or "csrun_logs")).resolve()),
        model_dir=str(model_dir) if model_dir else None, groups=_groups(req),
        layout=asdict(spec) if spec is not None else {},
        script=req.materialize_sbatch() if use_sbatch else None, srun_line=None if use_sbatch else req.srun_line(),
        time_limit_s=float(limit) if limit else None,
        requeue_exit=REQUEUE_EXIT if requeue is not None else None,
        launcher=None if use_sbatch else {"host": os.uname().nodename, "pid": os.getpid()})


class Recorder:
    """The record of one launch, as the launcher updates it (:meth:`start`, then
    :meth:`submitted` or :meth:`on_job` and :meth:`exited`)."""

    def __init__(self, store: RunStore, rec: RunRecord):
        self.store, self.rec = store, rec

    @classmethod
    def start(cls, state: str, kind: str, argv: Sequence[str], req: WseRequest | CpuRequest,
              use_sbatch: bool) -> Recorder | None:
        """Write the new record under the state directory ``state`` (:func:`state_dir`'s
        configured value); ``None`` (and one warning line) when it cannot be written."""
        store = RunStore(state_dir(state))
        try:
            rec = new_record(store, kind, argv, req, use_sbatch)
            store.save(rec)
        except OSError as exc:
            print(f"{kind}: warning: the run is not recorded ({store.index}: {exc.strerror}); "
                  "csrun status/logs will not know it", file=sys.stderr)
            return None
        return cls(store, rec)

    def _update(self, change: Callable[[RunRecord], object]) -> None:
        try:
            self.rec = self.store.update(self.rec.run_id, change, self.rec.model_dir)
        except OSError:
            pass

    def submitted(self, job_id: str) -> None:
        """sbatch accepted the job."""
        self._update(lambda r: r.jobs.append(str(job_id)))

    def on_job(self, job_id: str, _attempt_dir: Path) -> None:
        """The srun path: a launch's job is known (:class:`launcher.slurm.TaskLogFile`'s callback)."""
        self._update(lambda r: r.jobs.append(str(job_id)) if str(job_id) not in r.jobs else None)

    def exited(self, status: int) -> None:
        """The srun path: csrun_wse/csrun_cpu ends with ``status``."""
        def change(r: RunRecord) -> None:
            r.launcher = {**(r.launcher or {}), "exit": int(status), "ended": time.time()}

        self._update(change)
