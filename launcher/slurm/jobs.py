"""The jobs of recorded runs (``csrun status | list | cancel``): many jobs' states in one
``squeue`` and at most one ``sacct``, and signals or cancellation with ``scancel``."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from csrun_common.errors import SlurmUnavailable

from . import command


@dataclass(frozen=True)
class JobRow:
    """One row of ``squeue`` or ``sacct -X``: a job, or one het component of it (``57+1``).

    Attributes:
        job_id: Slurm's id of the row (``57``, ``57+1``); ``state``: its state word
            (``CANCELLED by 0`` → ``CANCELLED``); ``reason``: squeue's reason (``BeginTime``);
        nodes: its node list (``node[2-3]``, ``""`` while pending); ``exit_code``: sacct's
            ``status:signal`` (``""`` from squeue); ``start``, ``end``: sacct's times
            (``2026-11-28T07:13:30``, ``Unknown``).
    """

    job_id: str
    state: str
    reason: str = ""
    nodes: str = ""
    exit_code: str = ""
    start: str = ""
    end: str = ""

    @property
    def job(self) -> str:
        """The job's own id, without its het component (``57+1`` → ``57``)."""
        return self.job_id.split("+", 1)[0].split(".", 1)[0]

    @property
    def component(self) -> int:
        """The het component (0 for a job of one component)."""
        _, plus, rest = self.job_id.partition("+")
        return int(rest.split(".")[0]) if plus and rest.split(".")[0].isdigit() else 0


def _ids(job_ids: Sequence[str]) -> str:
    return ",".join(sorted({str(j).split("+")[0] for j in job_ids}, key=lambda j: (len(j), j)))


def squeue_rows(job_ids: Sequence[str], env: Mapping[str, str] | None = None) -> list[JobRow]:
    """Every row squeue has of ``job_ids`` (one call, ``--states=all``: slurmctld keeps a
    finished job ``MinJobAge`` seconds); ``[]`` when it knows none of them. Raises
    :class:`SlurmUnavailable` when slurmctld does not answer."""
    if not job_ids:
        return []
    proc = command.run(["squeue", "--noheader", "--states=all", f"--jobs={_ids(job_ids)}",
                        "--format=%i|%T|%r|%N"], env)
    if proc.returncode != 0:
        if "invalid job id" in proc.stderr.lower():
            return []
        msg = (proc.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise SlurmUnavailable(f"cannot reach slurmctld (squeue: {msg})")
    rows = []
    for line in proc.stdout.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 4 and parts[0]:
            rows.append(JobRow(parts[0], parts[1].split()[0] if parts[1] else "", parts[2], parts[3]))
    return rows


def sacct_rows(job_ids: Sequence[str], env: Mapping[str, str] | None = None) -> list[JobRow] | None:
    """Every allocation sacct holds of ``job_ids``, each requeued one too (one call,
    ``--allocations --duplicates``: a requeued job's earlier allocations are rows in state
    ``REQUEUED``), oldest first; ``None`` when the cluster keeps no accounting or slurmdbd does
    not answer ("Slurm accounting storage is disabled")."""
    if not job_ids:
        return []
    try:
        proc = command.run(["sacct", "--noheader", "--parsable2", "--allocations", "--duplicates",
                            f"--jobs={_ids(job_ids)}", "--format=JobID,State,ExitCode,NodeList,Start,End"], env)
    except SlurmUnavailable:
        return None
    if proc.returncode != 0:
        return None
    rows = []
    for line in proc.stdout.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 6 and parts[0]:
            jid, state, code, nodes, start, end = parts
            rows.append(JobRow(jid, state.split()[0] if state else "", "", "" if nodes == "None assigned" else nodes,
                               code, start, end))
    return rows


def signal_job(job_id: str, signal: str | None = None, env: Mapping[str, str] | None = None) -> str:
    """``scancel JOB`` (the job ends), or with ``signal`` (``INT``) ``scancel --signal=INT JOB``:
    the signal goes to the tasks of every step, not to the batch script (scancel(1)). Returns
    scancel's message, ``""`` when it said nothing. Raises :class:`SlurmUnavailable` when
    slurmctld does not answer."""
    argv = ["scancel", *([f"--signal={signal}"] if signal else []), str(job_id).split("+")[0]]
    proc = command.run(argv, env)
    msg = (proc.stderr.strip().splitlines() or [""])[-1]
    if proc.returncode != 0 and "invalid job id" not in msg.lower() and "already completing" not in msg.lower():
        raise SlurmUnavailable(f"cannot reach slurmctld (scancel: {msg})")
    return msg

