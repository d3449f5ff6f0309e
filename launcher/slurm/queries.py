"""Queries of the cluster and its jobs (sinfo, squeue, sacct, scontrol): nodes, the
controller's answer, job states, the queue, the client's version, whether accounting is kept."""
from __future__ import annotations

import os
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from csrun_common.errors import CsrunError, SlurmUnavailable

from . import command


@dataclass(frozen=True)
class NodeInfo:
    """One node as ``sinfo -N`` reports it: name, CPUs (count), GRES (``(null)`` → ""),
    state (``idle``, ``alloc``, ``down*`` ...) and partition."""

    name: str
    cpus: int
    gres: str
    state: str
    partition: str



def list_nodes(partition: str = "", flag: str = "--partition") -> list[NodeInfo]:
    """Nodes of ``partition`` (all partitions when empty) from ``sinfo -N``.

    Raises :class:`SlurmUnavailable` when slurmctld cannot be reached, and
    :class:`CsrunError` naming the partition when it does not exist.
    """
    argv = ["sinfo", "--noheader", "--Node", "--format=%N|%c|%G|%t|%P"]
    if partition:
        argv.append(f"--partition={partition}")
    nodes = []
    for line in command.query(argv).splitlines():
        parts = line.strip().split("|")
        if len(parts) != 5:
            continue
        name, cpus, gres, state, part = parts
        nodes.append(NodeInfo(name, int(cpus), "" if gres == "(null)" else gres, state, part.rstrip("*")))
    if partition and not nodes:
        known = sorted({n.partition for n in list_nodes("")})
        raise CsrunError(f"{flag} {partition!r}: no such partition in Slurm (partitions: {', '.join(known) or 'none'})")
    if not nodes:
        raise CsrunError("sinfo reports no nodes: the cluster has no usable partition")
    return nodes


#: Seconds ``scontrol ping`` may take before a ``--dry-run`` takes slurmctld for absent: a
#: controller that answers nothing in that time would make every query wait out
#: :data:`launcher.slurm.command.QUERY_TIMEOUT_S`.
PING_TIMEOUT_S = 1.0


def parse_ping(stdout: str) -> str:
    """``scontrol ping``'s answer: ``"up"`` when a controller (primary or backup) says
    ``UP``, ``"down"`` when every one says ``DOWN``, else ``"unknown"``."""
    states = re.findall(r"\bis (UP|DOWN)\b", stdout)
    if "UP" in states:
        return "up"
    return "down" if states else "unknown"


def ping(timeout: float = PING_TIMEOUT_S, env: Mapping[str, str] | None = None) -> tuple[str, str]:
    """Whether slurmctld answers, asked with ``scontrol ping`` (one connection attempt per
    controller: 0.04 s when the controller is down here, where ``sinfo`` retries for
    MessageTimeout, ~19 s). Returns ``(state, message)``: ``state`` is ``"up"``, ``"down"``
    (its message says why), ``"timeout"`` (no answer within ``timeout`` seconds) or
    ``"unknown"`` (no Slurm client, no configuration, an answer not understood: the caller
    asks its real question and gets the real error). Never raises."""
    try:
        proc = command.run(["scontrol", "ping"], env, timeout=timeout)
    except SlurmUnavailable as exc:
        return ("timeout" if "did not answer" in str(exc) else "unknown"), str(exc)
    state = parse_ping(proc.stdout)
    first = (proc.stdout.strip().splitlines() or [""])[0]
    return state, f"slurmctld does not answer (scontrol ping: {first})" if state == "down" else first


def cpu_node_cpus(nodes: Sequence[NodeInfo], exclude: str | Collection[str] = "") -> int:
    """CPUs of one CPU node: the smallest CPU count over ``nodes`` other than ``exclude``
    (the GRES node(s): one name, or a collection of names), so that a per-node layout fits on
    any of them. Falls back to all nodes when only excluded ones exist."""
    skip = {exclude} if isinstance(exclude, str) else set(exclude)
    cpus = [n.cpus for n in nodes if n.name not in skip] or [n.cpus for n in nodes]
    return min(cpus)


#: Seconds the tasks get to stop by themselves after csrun passed them a SIGINT (the runtime's
#: chief saves a checkpoint and writes its verdict, README "Ctrl-C"); a still-running srun then


#: Job states (squeue(1), "JOB STATE CODES") in which a job still holds or waits for its
#: nodes and its processes may run. Every other state is final, and so is COMPLETING (the
#: job's processes are leaving).
ACTIVE_STATES = frozenset({"PENDING", "CONFIGURING", "RUNNING", "SUSPENDED", "STOPPED", "REQUEUED",
                           "REQUEUE_FED", "REQUEUE_HOLD", "RESIZING", "RESV_DEL_HOLD", "SIGNALING",
                           "STAGE_OUT"})


def node_hosts(partition: str = "", env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Host name of every node of ``partition`` (all partitions when empty): node name →
    ``NodeHostname`` from ``sinfo --Node --format=%N|%n``. Several nodes may share one host
    (the Slurm test cluster runs five slurmd on one machine).

    Raises :class:`SlurmUnavailable` when slurmctld cannot be reached.
    """
    argv = ["sinfo", "--noheader", "--Node", "--format=%N|%n"]
    if partition:
        argv.append(f"--partition={partition}")
    hosts: dict[str, str] = {}
    for line in command.query(argv, env).splitlines():
        parts = line.strip().split("|")
        if len(parts) == 2 and parts[0]:
            hosts[parts[0]] = parts[1] or parts[0]
    return hosts


def job_state(job_id: str, env: Mapping[str, str] | None = None) -> str | None:
    """State of job ``job_id`` (``RUNNING``, ``PENDING``, ``COMPLETED``, ``CANCELLED`` ...):
    from ``squeue`` while slurmctld remembers the job (``MinJobAge`` seconds after it ends),
    else from ``sacct`` when the cluster keeps job accounting. ``None`` when neither knows
    the job (an unknown id, or an old job on a cluster without accounting).

    Raises :class:`SlurmUnavailable` when squeue cannot reach slurmctld.
    """
    proc = command.run(["squeue", "--noheader", f"--jobs={job_id}", "--states=all", "--format=%i|%T"], env)
    if proc.returncode == 0:
        for line in proc.stdout.splitlines():
            jid, _, state = line.strip().partition("|")
            if jid == str(job_id) and state:
                return state
    elif "invalid job id" not in proc.stderr.lower():
        msg = (proc.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise SlurmUnavailable(f"cannot reach slurmctld (squeue: {msg})")
    return _sacct_state(job_id, env)


def _sacct_state(job_id: str, env: Mapping[str, str] | None) -> str | None:
    """The job's state from ``sacct`` (``CANCELLED by 0`` → ``CANCELLED``); ``None`` when
    accounting is off ("Slurm accounting storage is disabled") or the job is unknown."""
    try:
        proc = command.run(["sacct", "--noheader", "--parsable2", f"--jobs={job_id}", "--format=JobID,State"], env)
    except SlurmUnavailable:
        return None
    if proc.returncode != 0:
        return None
    for line in proc.stdout.splitlines():
        jid, _, state = line.strip().partition("|")
        if jid == str(job_id) and state:
            return state.split()[0]
    return None


def queued_jobs(env: Mapping[str, str] | None = None) -> int:
    """Jobs in ``squeue`` now (any user); raises :class:`SlurmUnavailable` without slurmctld."""
    return len(queued_job_ids(env))


def queued_job_ids(env: Mapping[str, str] | None = None, running_only: bool = False) -> set[str]:
    """Ids of the jobs in ``squeue`` now (any user; ``RUNNING`` only with ``running_only``), a het
    job once per component (``123+0``, ``123+1``). Raises :class:`SlurmUnavailable` when
    slurmctld cannot be reached."""
    argv = ["squeue", "--noheader", "--format=%i"] + (["--states=RUNNING"] if running_only else [])
    out = command.query(argv, env)
    return {ln.strip() for ln in out.splitlines() if ln.strip()}


def version(env: Mapping[str, str] | None = None) -> str | None:
    """The Slurm client's version line (``sinfo --version``, e.g. ``slurm-wlm 22.05.8``), or
    ``None`` when no Slurm client is installed or it does not answer."""
    try:
        proc = command.run(["sinfo", "--version"], env)
    except SlurmUnavailable:
        return None
    return proc.stdout.strip() or None



_ACCOUNTING: dict[str, bool] = {}


def accounting_enabled(env: Mapping[str, str] | None = None) -> bool:
    """Whether the cluster keeps job accounting (``sacct`` answers): its
    ``AccountingStorageType`` (``scontrol show config``) is not ``accounting_storage/none``.
    Asked once per ``SLURM_CONF``; False when scontrol cannot answer."""
    key = (os.environ if env is None else env).get("SLURM_CONF", "")
    if key not in _ACCOUNTING:
        try:
            proc = command.run(["scontrol", "show", "config"], env)
        except SlurmUnavailable:
            return False
        storage = ""
        for line in proc.stdout.splitlines():
            name, _, value = line.partition("=")
            if name.strip() == "AccountingStorageType":
                storage = value.strip()
        _ACCOUNTING[key] = proc.returncode == 0 and storage not in ("", "accounting_storage/none")
    return _ACCOUNTING[key]

