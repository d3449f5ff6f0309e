"""A run's status as ``csrun status`` shows it, from its record, what Slurm said of its jobs
(rows of one ``squeue`` and at most one ``sacct``, :mod:`launcher.runs.poll`) and its attempts'
files: one state for the run, every attempt (job, nodes, exit status), every het group, the live
figures of the chief's log and, once written, performance.json."""
from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from csrun_common import exits
from csrun_common.atomic import read_json

from ..attempts import Attempt, read_attempts, task_file
from ..slurm import JobRow
from . import live, states
from .record import RunRecord


@dataclass
class AttemptView:
    """One attempt: ``number`` (1-based), ``job_id``, ``nodes`` (het group → node list),
    ``status`` (srun's exit status, else the chief's exit code srun reported; ``None`` while
    running or when neither is known),
    ``state`` (a run state), ``started``/``ended`` (``time.time()`` s) and its log directory."""

    number: int
    job_id: str
    nodes: dict[str, str]
    status: int | None
    state: str
    started: float | None
    ended: float | None
    directory: str


@dataclass
class GroupView:
    """One het group: its role, task count, nodes and state (a run state; ``""`` unknown)."""

    het_group: int
    role: str
    ntasks: int
    nodes: str
    state: str


@dataclass
class RunStatus:
    """What ``csrun status`` prints, and ``--json`` writes (:meth:`to_json`)."""

    run_id: str
    state: str
    reason: str
    job_id: str | None
    source: str
    attempts: list[AttemptView] = field(default_factory=list)
    groups: list[GroupView] = field(default_factory=list)
    live: live.Live = field(default_factory=live.Live)
    performance: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        """Plain JSON values; ``live`` with its verdict."""
        out = asdict(self)
        out["live"]["verdict"] = self.live.verdict
        return out


def attempts_of(rec: RunRecord) -> list[tuple[str, Attempt]]:
    """Every attempt of every job of the run, with its job id, in order."""
    return [(job, a) for job, d in zip(rec.jobs, rec.job_dirs(), strict=False) for a in read_attempts(d)]


def _attempt_views(rec: RunRecord, found: list[tuple[str, Attempt]], run_state: str) -> list[AttemptView]:
    views = []
    for i, (job, a) in enumerate(found):
        last = i == len(found) - 1
        status = (a.end or {}).get("status")
        if a.end is not None and status == 0:
            state = states.SUCCEEDED
        elif not last or (a.end is not None and run_state in (states.REQUEUED, states.PENDING)):
            state = states.REQUEUED  # a later attempt began, or the job waits for its next one
        elif a.end is None or run_state in states.TERMINAL:
            state = run_state
        else:
            state = states.FAILED
        if status is None:  # the output ended without srun's status: the chief's own, as srun reported it
            status = ((a.end or {}).get("exit_codes") or {}).get("0")
        views.append(AttemptView(a.number, job, _nodes(rec, a), status, state,
                                 (a.start or {}).get("time"), (a.end or {}).get("time"), str(a.directory)))
    return views


def _nodes(rec: RunRecord, a: Attempt) -> dict[str, str]:
    """Each het group's nodes in attempt ``a``: its start marker's (the job's node lists), else
    the nodes srun named for the group's tasks (the srun path: ``end.json``'s ``task_nodes``)."""
    nodes = dict((a.start or {}).get("nodes") or {})
    if nodes:
        return nodes
    by_task = (a.end or {}).get("task_nodes") or {}
    for g in rec.groups:
        first = int(g.get("first_task", 0))
        seen = sorted({by_task[str(t)] for t in range(first, first + int(g.get("ntasks", 0))) if str(t) in by_task})
        if seen:
            nodes[str(g.get("het_group", 0))] = ",".join(seen)
    return nodes


def _group_views(rec: RunRecord, rows: Sequence[JobRow], attempt: AttemptView | None) -> list[GroupView]:
    by_comp = {r.component: r for r in rows}
    out = []
    for g in rec.groups:
        k = int(g.get("het_group", 0))
        row = by_comp.get(k) or (by_comp.get(0) if len(rec.groups) == 1 else None)
        nodes = (row.nodes if row and row.nodes else "") or (attempt.nodes.get(str(k), "") if attempt else "")
        out.append(GroupView(k, str(g.get("role", "")), int(g.get("ntasks", 0)), nodes,
                             states.from_slurm(row.state) if row else ""))
    return out


def _launcher_alive(rec: RunRecord) -> bool:
    """Whether the srun path's csrun_wse/csrun_cpu still runs (on this host: its pid exists)."""
    info = rec.launcher or {}
    if info.get("host") != os.uname().nodename:
        return True  # another host: Slurm and the markers decide
    try:
        os.kill(int(info.get("pid", 0)), 0)
    except (ProcessLookupError, ValueError):
        return False
    except PermissionError:
        return True
    return True


def _by_launcher(rec: RunRecord) -> tuple[str, str, str]:
    """A run with no job id known: an sbatch run not submitted yet, or an srun run whose
    launcher shows no job id (csrun_cpu): its launcher's exit status decides."""
    if rec.path != "srun":
        return states.PENDING, "", "record"
    code = (rec.launcher or {}).get("exit")
    if code is None:
        alive = _launcher_alive(rec)
        return (states.RUNNING, "", "record") if alive else \
            (states.FAILED, "its launcher ended without a status", "record")
    if code == 0:
        return states.SUCCEEDED, "exit 0", "record"
    if code in (exits.INTERRUPTED, exits.TERMINATED) or rec.cancel is not None:
        return states.CANCELLED, f"exit {code}", "record"
    return states.FAILED, f"exit {code}", "record"


def decide(rec: RunRecord, rows: Sequence[JobRow], acct: Sequence[JobRow] | None,
           found: list[tuple[str, Attempt]]) -> tuple[str, str, str]:
    """``(state, reason, source)`` of the run: its recorded end; else Slurm's rows of the
    current job (squeue's, else sacct's last allocation); else the last attempt's markers
    (:func:`launcher.runs.states.from_markers`). ``source`` says which."""
    if rec.end:
        return rec.end["state"], rec.end.get("reason", ""), "record"
    cancel = rec.cancel is not None
    ended = sum(1 for _, a in found if a.end is not None)
    if rows:
        return states.run_state([r.state for r in rows], ended, cancel), "", "squeue"
    if not rec.jobs:
        return _by_launcher(rec)
    mine = [r for r in acct or [] if r.job == rec.jobs[-1]]
    if mine:
        last = [r for r in mine if r.start == mine[-1].start] or mine[-1:]
        code = last[0].exit_code
        return states.run_state([r.state for r in last], ended, cancel), f"exit {code}" if code else "", "sacct"
    if rec.path == "srun" and _launcher_alive(rec):
        return states.RUNNING, "", "record"
    end = found[-1][1].end if found else None
    started = (found[-1][1].start or {}).get("time") if found else None
    elapsed = ((end or {}).get("time") or time.time()) - started if started else None
    state, reason = states.from_markers(end, cancel_requested=cancel, elapsed_s=elapsed,
                                        time_limit_s=rec.time_limit_s)
    return state, reason, "markers"


def performance(rec: RunRecord) -> dict[str, Any] | None:
    """The run's ``performance/performance.json``, when written after its submission."""
    if not rec.model_dir:
        return None
    path = Path(rec.model_dir) / "performance" / "performance.json"
    try:
        if path.stat().st_mtime < rec.submitted_at:
            return None
    except OSError:
        return None
    data = read_json(path)
    return data if isinstance(data, dict) else None


def observe(rec: RunRecord, rows: Sequence[JobRow], acct: Sequence[JobRow] | None) -> RunStatus:
    """The run's status (see the module docstring); ``rows``/``acct``: Slurm's rows of its jobs
    (``acct`` ``None``: sacct not asked or not answering)."""
    found = attempts_of(rec)
    current = [r for r in rows if rec.jobs and r.job == rec.jobs[-1]]
    state, reason, source = decide(rec, current, acct, found)
    attempts = _attempt_views(rec, found, state)
    last = attempts[-1] if attempts else None
    figures = live.read(task_file(Path(last.directory), 0)) if last else live.Live()
    return RunStatus(rec.run_id, state, reason, rec.jobs[-1] if rec.jobs else None, source, attempts,
                     _group_views(rec, current, last), figures, performance(rec))
