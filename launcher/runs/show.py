"""The text ``csrun list``, ``status`` and ``describe`` print. Pure: records and statuses in,
lines out."""
from __future__ import annotations

import shlex
import time
from collections.abc import Mapping, Sequence
from typing import Any

from .live import Live
from .record import RunRecord
from .view import AttemptView, RunStatus


def when(t: float | None) -> str:
    """``2026-11-28 07:13:30`` in local time, ``-`` for none."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "-"


def list_lines(rows: Sequence[tuple[RunRecord, str]]) -> list[str]:
    """``csrun list``: one line per run (newest first): id, state, job, submitted, command."""
    out = [f"{'RUN':<15} {'STATE':<10} {'JOB':<8} {'SUBMITTED':<19}  COMMAND"]
    for rec, state in rows:
        job = rec.jobs[-1] if rec.jobs else "-"
        out.append(f"{rec.run_id:<15} {state:<10} {job:<8} {when(rec.submitted_at):<19}  "
                   f"{shlex.join(rec.argv)[:100]}")
    return out


def _attempt_line(a: AttemptView) -> str:
    nodes = " ".join(f"{k}={v}" for k, v in a.nodes.items()) or "-"
    status = "-" if a.status is None else str(a.status)
    return (f"    {a.number:<3} job {a.job_id:<7} {a.state:<10} exit {status:<4} nodes {nodes}  "
            f"started {when(a.started)}")


def _workers(rec: RunRecord, live: Live, running: bool) -> str:
    total = sum(int(g.get("ntasks") or 0) - (1 if g.get("role") == "chief" else 0) for g in rec.groups
                if g.get("role") in ("worker", "chief"))
    w = live.workers
    out = [f"{max(0, total - len(w['given_up']) - len(w['paused']))} of {total} running" if running
           else f"{total} task(s)"]
    out += [f"{k.replace('_', ' ')} {', '.join(map(str, w[k]))}" for k in ("lost", "replaced", "paused", "given_up")
            if w[k]]
    return "; ".join(out)


def _trainer(live: Live) -> str:
    if live.step is None:
        return "no step logged yet"
    parts = [f"global step {live.step}"]
    if live.samples_per_sec is not None and live.input_wait is not None:
        parts.append(f"{live.samples_per_sec:.1f} samples/s, input wait {100 * live.input_wait:.1f} % "
                     f"({live.verdict}, from the last rate window)")
    return ", ".join(parts)


def status_lines(rec: RunRecord, st: RunStatus) -> list[str]:
    """``csrun status``: the run's one state, then each het group, the trainer's and the input
    workers' live figures, every attempt and the performance summary once written."""
    job = f"job {st.job_id}" if st.job_id else "no job yet"
    out = [f"{rec.run_id}: {st.state}" + (f" ({st.reason})" if st.reason else "")
           + f"  [{job}, attempt {len(st.attempts) or '-'}, from {st.source}]"]
    for g in st.groups:
        out.append(f"  het group {g.het_group}: {g.role:<11} {g.ntasks} task(s) on {g.nodes or '-':<12} "
                   f"{g.state or '-'}")
    if any(g.get("role") in ("chief", "rank") for g in rec.groups):
        out.append(f"  trainer: {_trainer(st.live)}")
    if any(g.get("role") == "worker" or (g.get("role") == "chief" and int(g.get("ntasks") or 0) > 1)
           for g in rec.groups):
        out.append(f"  input workers: {_workers(rec, st.live, st.state == 'RUNNING')}")
    if st.attempts:
        out.append("  attempts:")
        out += [_attempt_line(a) for a in st.attempts]
    if st.performance:
        out.append(f"  performance: {performance_line(st.performance)}")
    return out


def performance_line(perf: Mapping[str, Any]) -> str:
    """The performance.json summary on one line: steps, rate, input wait, verdict."""
    verdict = perf.get("verdict") or {}
    wait = perf.get("input_wait_fraction")
    rate = perf.get("steady_samples_per_sec") or perf.get("samples_per_sec") or "-"
    waited = "-" if wait is None else f"{100 * float(wait):.1f} %"
    return (f"{perf.get('steps', '-')} steps, {rate} samples/s, input wait {waited}, "
            f"{verdict.get('bound', 'unknown')}-bound; ended: {perf.get('ended', '-')}")


def _indices(items: Sequence[Any]) -> str:
    """Input worker indices of performance.json's ``workers_*`` lists (records or plain indices)."""
    return ", ".join(str(i.get("index") if isinstance(i, Mapping) else i) for i in items)


def allocation_lines(perf: Mapping[str, Any]) -> list[str]:
    """Every allocation's steps and lost, replaced and paused input workers (performance.json's
    ``allocation_history``)."""
    out = []
    for a in perf.get("allocation_history") or []:
        workers = "; ".join(f"{k.replace('workers_', '').replace('_', ' ')} {_indices(a.get(k) or [])}"
                            for k in ("workers_lost", "workers_replaced", "workers_paused", "workers_given_up")
                            if a.get(k)) or "no worker lost, replaced or paused"
        out.append(f"    allocation {a.get('allocation')} (job {a.get('job_id')}, requeue {a.get('requeue')}): "
                   f"steps {a.get('start_step')}..{a.get('end_step')}, stopped by {a.get('stopped_by') or '-'}; "
                   f"{workers}")
    return out


def describe_lines(rec: RunRecord, st: RunStatus) -> list[str]:
    """``csrun describe``: what ran (the sbatch script or srun line), the layout, the status
    and every attempt, the performance summary with every allocation's workers."""
    out = [f"run {rec.run_id} ({rec.kind}, {rec.path}), submitted {when(rec.submitted_at)} from {rec.submit_dir}",
           f"  command: {shlex.join(rec.argv)}", f"  model_dir: {rec.model_dir or '-'}",
           f"  logs: {rec.log_root}/{rec.job_name}-<job id>/attempt-<K>/",
           "  layout: " + (", ".join(f"{k}={v}" for k, v in rec.layout.items() if v is not None) or "-")]
    out += status_lines(rec, st)[1:]
    if st.performance:
        out += allocation_lines(st.performance)
    out.append("  the sbatch script that ran:" if rec.script else "  the srun line that ran:")
    out += ["    " + line for line in (rec.script or rec.srun_line or "").splitlines()]
    return out
