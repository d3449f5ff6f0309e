"""``csrun``: the runs csrun_wse and csrun_cpu recorded, held after the launch
(docs/RUNS.md): ``list``, ``status``, ``logs``, ``cancel``, ``describe``. RUN is a run id, a
Slurm job id or a model_dir. Built on the Python API (:mod:`launcher.runs.api`); bad input is
one line, exit 2."""
from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Sequence
from typing import Any

import click

from csrun_common.cli import one_line_main
from csrun_common.errors import CsrunError

from ..version import version_option
from . import poll, show, states
from .api import Run, attach, store

SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 100}
_SINCE = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


class RunsGroup(click.Group):
    """The ``csrun`` group: one-line errors, exit 2 for bad input."""

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,  # type: ignore[override]
             **extra: Any) -> None:  # noqa: D102
        return one_line_main(super().main, prog_name or "csrun", args, prog_name, **extra)


@click.group("csrun", cls=RunsGroup, context_settings=SETTINGS)
@version_option("csrun")
def csrun() -> None:
    """Hold the runs csrun_wse and csrun_cpu launched: list them, see one's state, follow its
    logs, cancel it (with a checkpoint first), describe what ran.

    \b
    csrun list [--state S] [--since 2h] [--json]
    csrun status RUN [--json] [--watch]
    csrun logs RUN [--role chief|rank|worker|srun] [--task I] [--attempt K] [--follow] [--tail N] [--grep RE]
    csrun cancel RUN [--checkpoint]
    csrun describe RUN
    RUN: a run id (wse-1128-k3m9), a Slurm job id or a model_dir.
    """


def since_time(text: str, now: float | None = None) -> float:
    """``--since``: ``30m``, ``2h``, ``1d``, ``1w`` ago, or a date ``2026-11-28`` (``T07:00`` too),
    as ``time.time()`` seconds. Raises :class:`CsrunError` naming the flag and the value."""
    now = time.time() if now is None else now
    m = _SINCE.match(text.strip())
    if m:
        return now - float(m.group(1)) * _UNIT_S[m.group(2)]
    for fmt in ("%Y-%m-%d", "%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M"):
        try:
            return time.mktime(time.strptime(text.strip(), fmt))
        except ValueError:
            continue
    raise CsrunError(f"--since {text!r}: neither an age (30m, 2h, 1d, 1w) nor a date (2026-11-28[T07:00])")


@csrun.command("list")
@click.option("--state", "state", type=click.Choice(states.STATES, case_sensitive=False), default=None,
              help="Only runs in this state.")
@click.option("--since", default=None, metavar="T", help="Only runs submitted since T: an age (30m, 2h, 1d) or a date.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per run, one per line.")
def list_runs(state: str | None, since: str | None, as_json: bool) -> None:
    """Every recorded run, newest first. A run whose end is recorded asks Slurm nothing; the
    others together take one squeue (and one sacct at most)."""
    t0 = since_time(since) if since else None
    st = store()
    records = [r for r in st.all() if t0 is None or r.submitted_at >= t0]
    found = poll.refresh(store=st, records=records, light=True)
    rows = [(r, found[r.run_id].state) for r in records]
    if state:
        rows = [(r, s) for r, s in rows if s == state.upper()]
    if as_json:
        for r, s in rows:
            click.echo(json.dumps({"run_id": r.run_id, "state": s, "jobs": r.jobs, "submitted_at": r.submitted_at,
                                   "kind": r.kind, "argv": r.argv, "model_dir": r.model_dir}))
        return
    for line in show.list_lines(rows):
        click.echo(line)


@csrun.command("status")
@click.argument("run")
@click.option("--json", "as_json", is_flag=True, help="The status as one JSON object.")
@click.option("--watch", is_flag=True, help="Print it again on every change until the run ends (asks Slurm every "
              "2 s, backing off to 30 s).")
def status(run: str, as_json: bool, watch: bool) -> None:
    """The run's one state (its het components combined), its het groups, the trainer's step,
    samples/s and input wait, the input workers (running, lost, replaced, paused), every
    attempt with its nodes and exit status, and the performance summary once written."""
    r = attach(run)
    last: list[str] = []
    waits = poll.intervals()
    while True:
        st = r.status()
        lines = [json.dumps(st.to_json())] if as_json else show.status_lines(r.record(), st)
        if lines != last:
            click.echo("\n".join(lines))
            last, waits = lines, poll.intervals()
        if not watch or st.state in states.TERMINAL:
            return
        time.sleep(next(waits))


@csrun.command("logs")
@click.argument("run")
@click.option("--role", type=click.Choice(["chief", "rank", "worker", "single", "srun"]), default=None,
              help="Only this role's tasks (srun: srun's and slurmstepd's own lines).")
@click.option("--task", type=click.IntRange(min=0), default=None, help="Only this task: its index within --role, or "
              "srun's task number without --role.")
@click.option("--attempt", type=click.IntRange(min=1), default=None, help="This attempt (1 = the first allocation) "
              "[default: the latest].")
@click.option("--follow", "-f", is_flag=True, help="Print lines as they are written until the run ends.")
@click.option("--tail", type=click.IntRange(min=1), default=None, help="Only the last N lines of each task.")
@click.option("--grep", default=None, metavar="RE", help="Only lines matching this regular expression.")
def logs_cmd(run: str, role: str | None, task: int | None, attempt: int | None, follow: bool, tail: int | None,
             grep: str | None) -> None:
    """One attempt's task logs, each line labelled with its role and task ([worker 3] ...)."""
    r = attach(run)
    try:
        for line in r.logs(role, task, attempt, tail, grep, follow):
            click.echo(line.labelled())
            sys.stdout.flush()
    except KeyboardInterrupt:
        return


@csrun.command("cancel")
@click.argument("run")
@click.option("--checkpoint", is_flag=True, help="Send the tasks the stop signal first (SIGINT: the run saves a "
              "checkpoint at its step and leaves), then cancel the job.")
def cancel(run: str, checkpoint: bool) -> None:
    """Cancel the run (idempotent: a run that already ended is left as it is, exit 0)."""
    click.echo(attach(run).cancel(checkpoint=checkpoint))


@csrun.command("describe")
@click.argument("run")
def describe(run: str) -> None:
    """What ran (the exact sbatch script or srun line), the layout, every attempt and the
    performance summary with every allocation's lost, replaced and paused input workers."""
    r: Run = attach(run)
    for line in show.describe_lines(r.record(), r.status()):
        click.echo(line)


__all__ = ["csrun", "since_time"]


if __name__ == "__main__":
    csrun()
