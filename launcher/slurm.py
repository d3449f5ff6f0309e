"""The one module of csrun that runs Slurm commands (sinfo, srun, sbatch, scancel, scontrol,
sacctmgr).

Everything else builds data; this module executes it. Commands are always run as
argv lists, never through a shell.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from csrun_common.errors import CsrunError, SlurmUnavailable

#: Seconds a Slurm query (sinfo, squeue, sacctmgr, scontrol show) may take before csrun
#: says slurmctld does not answer: a client retries a stopped controller for ~20 s here
#: (MessageTimeout), and a dry run must not hang on it.
QUERY_TIMEOUT_S = 5.0
#: Seconds an sbatch submission may take (a submission that timed out may still have
#: been accepted, so it gets longer than a query).
SUBMIT_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class NodeInfo:
    """One node as ``sinfo -N`` reports it: name, CPUs (count), GRES (``(null)`` → ""),
    state (``idle``, ``alloc``, ``down*`` ...) and partition."""

    name: str
    cpus: int
    gres: str
    state: str
    partition: str


def _require(binary: str) -> str:
    path = shutil.which(binary)
    if not path:
        raise SlurmUnavailable(f"{binary}: not found on PATH; is the Slurm client installed?")
    return path


def _check_conf() -> None:
    conf = os.environ.get("SLURM_CONF")
    if conf and not os.path.exists(conf):
        # sinfo would retry for 60 s on a missing file; fail at once instead.
        raise SlurmUnavailable(f"SLURM_CONF={conf}: no such file")


def _query(argv: list[str]) -> str:
    _check_conf()
    argv = [_require(argv[0]), *argv[1:]]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=QUERY_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise SlurmUnavailable(
            f"{argv[0]} did not answer in {QUERY_TIMEOUT_S:.0f} s: is slurmctld reachable?") from None
    if proc.returncode != 0:
        msg = (proc.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise SlurmUnavailable(f"cannot reach slurmctld ({os.path.basename(argv[0])}: {msg})")
    return proc.stdout


def list_nodes(partition: str = "", flag: str = "--partition") -> list[NodeInfo]:
    """Nodes of ``partition`` (all partitions when empty) from ``sinfo -N``.

    Raises :class:`SlurmUnavailable` when slurmctld cannot be reached, and
    :class:`CsrunError` naming the partition when it does not exist.
    """
    argv = ["sinfo", "--noheader", "--Node", "--format=%N|%c|%G|%t|%P"]
    if partition:
        argv.append(f"--partition={partition}")
    nodes = []
    for line in _query(argv).splitlines():
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


def cpu_node_cpus(nodes: Sequence[NodeInfo], exclude: str = "") -> int:
    """CPUs of one CPU node: the smallest CPU count over ``nodes`` other than ``exclude``
    (the GRES node), so that a per-node layout fits on any of them. Falls back to all
    nodes when only the excluded one exists."""
    cpus = [n.cpus for n in nodes if n.name != exclude] or [n.cpus for n in nodes]
    return min(cpus)


#: Seconds after the double SIGINT at which a still-running srun gets SIGTERM: srun's own
#: termination sequence after two SIGINTs took 2.5 s to empty the queue here, SIGTERM 0.2 s.
INTERRUPT_GRACE_S = 0.5


def _terminate_if_running(proc: subprocess.Popen) -> None:
    if proc.returncode is None:
        try:
            os.kill(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass


def _forward_signals(proc: subprocess.Popen, received: list[int]) -> dict:
    """Forward SIGINT/SIGTERM to ``proc`` and note each in ``received``. srun needs two
    SIGINTs within a second to cancel a step (srun(1), "SIGNALS AND ESCAPE SEQUENCES"), so
    one SIGINT to csrun is sent on as two (the tasks see SIGINT first), and srun gets SIGTERM
    :data:`INTERRUPT_GRACE_S` later if it still runs; SIGTERM is sent on as is."""
    old = {}

    def handler(signum, _frame):
        received.append(signum)
        if proc.poll() is not None:
            return
        try:
            if signum == signal.SIGINT:
                proc.send_signal(signal.SIGINT)
                time.sleep(0.2)
                proc.send_signal(signal.SIGINT)
                timer = threading.Timer(INTERRUPT_GRACE_S, _terminate_if_running, (proc,))
                timer.daemon = True
                timer.start()
            else:
                proc.send_signal(signum)
        except ProcessLookupError:
            pass

    for sig in (signal.SIGINT, signal.SIGTERM):
        old[sig] = signal.signal(sig, handler)
    return old


def exit_status(returncode: int, received: Sequence[int]) -> int:
    """The exit status of csrun after its srun child ended: ``128 + N`` for the first of
    SIGINT/SIGTERM the user sent csrun (130 for Ctrl-C, 143 for SIGTERM, as a shell reports
    a command killed by that signal), whatever srun's tasks died of (a cancelled step's
    tasks get SIGKILL: 137); else srun's status, ``128 + N`` when srun itself died of
    signal N."""
    if received:
        return 128 + int(received[0])
    return 128 - returncode if returncode < 0 else returncode


def run_foreground(argv: Sequence[str], env: dict | None = None) -> int:
    """Run ``argv`` (an srun line) as a child, forwarding SIGINT/SIGTERM; returns the exit
    status of :func:`exit_status` (130 / 143 when the user interrupted or terminated csrun)."""
    _check_conf()
    try:
        proc = subprocess.Popen([_require(argv[0]), *argv[1:]], env=env)
    except OSError as exc:
        raise CsrunError(f"cannot start {argv[0]}: {exc.strerror}") from None
    received: list[int] = []
    old = _forward_signals(proc, received)
    try:
        rc = proc.wait()
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)
    return exit_status(rc, received)


def stop_process_group(proc: subprocess.Popen, grace: float = 10.0) -> None:
    """Stop a child started with ``start_new_session=True`` (a csrun_wse or srun) and its
    whole process group: SIGINT twice (srun(1): two within a second cancel the step), then
    SIGKILL after ``grace`` seconds. Used by ``cs_input_analyzer verify`` and the benchmarks."""
    for sig in (signal.SIGINT, signal.SIGINT):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            break
        time.sleep(0.3)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait(timeout=10)


def submit_batch(script: str, env: dict | None = None) -> str:
    """Submit ``script`` with ``sbatch --parsable`` on stdin; returns the job id.

    Raises :class:`CsrunError` with sbatch's message when the submission is refused.
    """
    _check_conf()
    proc = subprocess.run([_require("sbatch"), "--parsable"], input=script, capture_output=True,
                          text=True, env=env, timeout=SUBMIT_TIMEOUT_S)
    if proc.returncode != 0:
        msg = (proc.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise CsrunError(f"sbatch refused the job: {msg}")
    return proc.stdout.strip().split(";")[0]


# --------------------------------------------------------------------------- production Slurm (issue 11)
# Preflight (--check), site-policy names, the Slurm version. Kept in one block; each query
# answers within QUERY_TIMEOUT_S or says that slurmctld (or slurmdbd) does not answer.

@dataclass(frozen=True)
class TestOnly:
    """Slurm's answer to ``sbatch --test-only`` / ``srun --test-only`` (sbatch(1): "Validate
    the batch script and return an estimate of when a job would be scheduled to run given
    the current job queue"; nothing is submitted).

    Attributes:
        ok: Slurm would accept the job.
        start: the expected start time Slurm printed (``2026-11-22T23:55:34``), ``None``
            when refused (one per het component for srun, which tests them one by one).
        lines: Slurm's own lines (the estimate, warnings, or the reason it cannot run).
    """

    ok: bool
    start: str | None
    lines: tuple[str, ...]

    @property
    def reason(self) -> str:
        """The last line of Slurm's answer (the refusal's reason when not ``ok``)."""
        return self.lines[-1] if self.lines else "(no message)"


_START_RE = re.compile(r"to start at (\S+)")
_VERSION_RE = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")


def _run_query(argv: list[str], input_text: str | None = None,
               env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run a Slurm client command with :data:`QUERY_TIMEOUT_S`, whatever its exit status.
    Raises :class:`SlurmUnavailable` when the binary is missing, ``SLURM_CONF`` names no
    file, or it does not answer in time."""
    _check_conf()
    argv = [_require(argv[0]), *argv[1:]]
    try:
        return subprocess.run(argv, input=input_text, capture_output=True, text=True,
                              timeout=QUERY_TIMEOUT_S, env=dict(env) if env is not None else None)
    except subprocess.TimeoutExpired:
        raise SlurmUnavailable(f"{os.path.basename(argv[0])} did not answer in {QUERY_TIMEOUT_S:.0f} s: "
                               "is slurmctld running and reachable?") from None


def parse_test_only(returncode: int, stderr: str) -> TestOnly:
    """Read ``--test-only``'s answer (it is on stderr): ``sbatch: Job 12 to start at
    2026-11-22T23:55:42 using 6 processors on node[1-3]`` (exit 0), or ``allocation
    failure: Requested node configuration is not available`` / ``sbatch: error: ...``
    (exit 1)."""
    lines = tuple(ln.strip() for ln in stderr.splitlines() if ln.strip())
    starts = [m.group(1) for ln in lines for m in [_START_RE.search(ln)] if m]
    ok = returncode == 0 and bool(starts)
    return TestOnly(ok, max(starts) if ok else None, lines)


def test_only_batch(script: str, env: Mapping[str, str] | None = None) -> TestOnly:
    """``sbatch --test-only`` of ``script`` (on stdin): would Slurm run this batch het job,
    and when. Raises :class:`SlurmUnavailable` when slurmctld does not answer."""
    proc = _run_query(["sbatch", "--test-only"], input_text=script, env=env)
    return parse_test_only(proc.returncode, proc.stderr)


def test_only_srun(argv: Sequence[str], env: Mapping[str, str] | None = None) -> TestOnly:
    """``srun --test-only`` of an srun argv (``argv[0] == "srun"``); srun tests each het
    component on its own. Raises :class:`SlurmUnavailable` when slurmctld does not answer."""
    proc = _run_query(["srun", "--test-only", *argv[1:]], env=env)
    return parse_test_only(proc.returncode, proc.stderr)


def parse_slurm_version(text: str) -> tuple[int, int, int] | None:
    """``"slurm-wlm 22.05.8"`` / ``"slurm 23.11.4"`` → ``(22, 5, 8)``; ``None`` if absent."""
    m = _VERSION_RE.search(text or "")
    if not m:
        return None
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def slurm_release(env: Mapping[str, str] | None = None) -> tuple[int, int, int] | None:
    """The Slurm client's release from ``sinfo --version`` (no controller needed), or
    ``None`` when no Slurm client is installed or it does not answer."""
    try:
        proc = _run_query(["sinfo", "--version"], env=env)
    except SlurmUnavailable:
        return None
    return parse_slurm_version(proc.stdout) if proc.returncode == 0 else None


def _sacctmgr_names(entity: str, env: Mapping[str, str] | None) -> list[str] | None:
    """Names of ``sacctmgr show <entity>`` (accounts or QOS); ``None`` when the cluster keeps
    no accounting ("You are not running a supported accounting_storage plugin") or slurmdbd
    does not answer: then Slurm does not check them either, and neither does csrun."""
    fields = {"account": "Account", "qos": "Name"}[entity]
    try:
        proc = _run_query(["sacctmgr", "--noheader", "--parsable2", "show", entity, f"format={fields}"], env=env)
    except SlurmUnavailable:
        return None
    if proc.returncode != 0:
        return None
    return sorted({ln.strip() for ln in proc.stdout.splitlines() if ln.strip()})


def accounts(env: Mapping[str, str] | None = None) -> list[str] | None:
    """Accounts Slurm's accounting knows (``sacctmgr show account``); ``None`` without
    accounting (see :func:`_sacctmgr_names`)."""
    return _sacctmgr_names("account", env)


def qos_names(env: Mapping[str, str] | None = None) -> list[str] | None:
    """QOS names Slurm's accounting knows (``sacctmgr show qos``); ``None`` without
    accounting."""
    return _sacctmgr_names("qos", env)


def reservations(env: Mapping[str, str] | None = None) -> list[str]:
    """Names of the current reservations (``scontrol -o show reservation``: one
    ``ReservationName=... ...`` line each; "No reservations in the system" → ``[]``).
    Raises :class:`SlurmUnavailable` when slurmctld does not answer."""
    proc = _run_query(["scontrol", "--oneliner", "show", "reservation"], env=env)
    if proc.returncode != 0:
        msg = (proc.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise SlurmUnavailable(f"cannot reach slurmctld (scontrol: {msg})")
    names = re.findall(r"ReservationName=(\S+)", proc.stdout)
    return sorted(set(names))


def node_features(partition: str = "", env: Mapping[str, str] | None = None) -> list[str]:
    """Features of the nodes of ``partition`` (all when empty) that ``--constraint`` may
    name (``sinfo --Node --format=%f``: ``AVAIL_FEATURES``, comma-separated, ``(null)`` for
    none). Raises :class:`SlurmUnavailable` when slurmctld does not answer."""
    argv = ["sinfo", "--noheader", "--Node", "--format=%f"]
    if partition:
        argv.append(f"--partition={partition}")
    proc = _run_query(argv, env=env)
    if proc.returncode != 0:
        msg = (proc.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise SlurmUnavailable(f"cannot reach slurmctld (sinfo: {msg})")
    feats: set[str] = set()
    for line in proc.stdout.splitlines():
        for f in line.strip().split(","):
            if f and f != "(null)":
                feats.add(f)
    return sorted(feats)


def config_values(keys: Sequence[str], env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Values of slurm.conf parameters as slurmctld runs them (``scontrol show config``:
    ``KillWait = 5 sec``) for ``keys`` present; raises :class:`SlurmUnavailable` when
    slurmctld does not answer."""
    proc = _run_query(["scontrol", "show", "config"], env=env)
    if proc.returncode != 0:
        msg = (proc.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise SlurmUnavailable(f"cannot reach slurmctld (scontrol: {msg})")
    out = {}
    for line in proc.stdout.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() in keys:
            out[key.strip()] = value.strip()
    return out
