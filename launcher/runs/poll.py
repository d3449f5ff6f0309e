"""Asking Slurm about recorded runs, with discipline (docs/RUNS.md "Polling"): every run watched
at once in one ``squeue``, and one ``sacct`` at most, only for the jobs squeue no longer knows;
a run whose end is recorded asks nothing; watching backs off from 2 s to 30 s between asks.

submitit polls with ``sacct`` alone and backs off to 600 s; with accounting off it warned on
every poll and kept a running job PENDING (facebookincubator/submitit#1720): here the state
comes from the attempts' markers then, with one warning per process."""
from __future__ import annotations

import sys
import time
from collections.abc import Iterator, Sequence

from .. import slurm
from . import states
from .record import RunRecord, RunStore
from .view import RunStatus, observe

#: Seconds between two asks while watching: the first, the factor after an ask without change,
#: the longest.
FIRST_INTERVAL_S, BACKOFF, MAX_INTERVAL_S = 2.0, 1.5, 30.0
_warned: list[str] = []


def _warn_once(text: str) -> None:
    if text not in _warned:
        _warned.append(text)
        print(f"csrun: warning: {text}", file=sys.stderr)


def _needs_slurm(rec: RunRecord) -> bool:
    return rec.end is None and bool(rec.jobs)


def refresh(store: RunStore, records: Sequence[RunRecord], light: bool = False) -> dict[str, RunStatus]:
    """The status of every run in ``records`` (by run id) with one ``squeue`` for all runs whose
    end is not recorded, then one ``sacct`` at most for the jobs squeue did not list; a run
    found terminal gets its end recorded (:attr:`RunRecord.end`), so later asks need no Slurm
    call. ``light`` (``csrun list``): a run whose end is recorded gets its state alone, no file
    read. Raises :class:`~csrun_common.errors.SlurmUnavailable` when slurmctld does not answer."""
    asking = [r for r in records if _needs_slurm(r)]
    rows = slurm.squeue_rows([r.jobs[-1] for r in asking]) if asking else []
    listed = {row.job for row in rows}
    gone = [r.jobs[-1] for r in asking if r.jobs[-1] not in listed]
    acct = None
    if gone:
        acct = slurm.sacct_rows(gone)
        if acct is None:
            _warn_once("sacct does not answer (job accounting is off here): the states of finished jobs come "
                       "from the runs' own markers")
    out: dict[str, RunStatus] = {}
    for rec in records:
        if light and rec.end:
            out[rec.run_id] = RunStatus(rec.run_id, rec.end["state"], rec.end.get("reason", ""),
                                        rec.jobs[-1] if rec.jobs else None, "record")
            continue
        status = observe(rec, rows, acct)
        if rec.end is None and status.state in states.TERMINAL and (rec.jobs or rec.path == "srun"):
            _record_end(store, rec, status)
        out[rec.run_id] = status
    return out


def _record_end(store: RunStore, rec: RunRecord, status: RunStatus) -> None:
    last = status.attempts[-1] if status.attempts else None
    end = {"state": status.state, "reason": status.reason, "time": time.time(), "source": status.source,
           "status": last.status if last else None}

    def change(r: RunRecord) -> None:
        if r.end is None:
            r.end = end

    try:
        rec.end = store.update(rec.run_id, change, rec.model_dir).end
    except OSError:
        rec.end = end


def intervals(first: float = FIRST_INTERVAL_S, factor: float = BACKOFF,
              longest: float = MAX_INTERVAL_S) -> Iterator[float]:
    """Seconds to sleep before each next ask: ``first``, then ``factor`` times longer each
    time, at most ``longest`` (2, 3, 4.5, ... 30 s). A caller that saw a change starts a new
    iterator."""
    wait = first
    while True:
        yield wait
        wait = min(longest, wait * factor)


def wait_all(store: RunStore, records: Sequence[RunRecord], timeout: float | None = None,
             first: float = FIRST_INTERVAL_S) -> dict[str, RunStatus]:
    """Watch ``records`` until every one is terminal or ``timeout`` seconds passed: one
    :func:`refresh` of all per interval (:func:`intervals`, restarted on a change); returns the
    last statuses."""
    deadline = None if timeout is None else time.monotonic() + timeout
    recs = {r.run_id: r for r in records}
    waits, seen = intervals(first), dict[str, str]()
    while True:
        last = refresh(store, list(recs.values()))
        now = {rid: s.state for rid, s in last.items()}
        if now != seen:
            waits, seen = intervals(first), now
        if all(s in states.TERMINAL for s in now.values()):
            return last
        sleep = next(waits)
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                return last
            sleep = min(sleep, left)
        time.sleep(sleep)
        for rid in list(recs):
            recs[rid] = store.load(rid, recs[rid].model_dir)
