"""Production Slurm (issue 11): ``--test-only`` (``--check``), the site-policy names Slurm
knows (accounts, QOS, reservations, node features), slurm.conf values and the client's release.
Each query answers within ``QUERY_TIMEOUT_S`` or says that slurmctld (or slurmdbd) does not
answer."""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from csrun_common.errors import SlurmUnavailable

from . import command
from .queries import version


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
    proc = command.run(["sbatch", "--test-only"], env, input_text=script)
    return parse_test_only(proc.returncode, proc.stderr)


def test_only_srun(argv: Sequence[str], env: Mapping[str, str] | None = None) -> TestOnly:
    """``srun --test-only`` of an srun argv (``argv[0] == "srun"``); srun tests each het
    component on its own. Raises :class:`SlurmUnavailable` when slurmctld does not answer."""
    proc = command.run(["srun", "--test-only", *argv[1:]], env)
    return parse_test_only(proc.returncode, proc.stderr)


def parse_slurm_version(text: str) -> tuple[int, int, int] | None:
    """``"slurm-wlm 22.05.8"`` / ``"slurm 23.11.4"`` → ``(22, 5, 8)``; ``None`` if absent."""
    m = _VERSION_RE.search(text or "")
    if not m:
        return None
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def slurm_release(env: Mapping[str, str] | None = None) -> tuple[int, int, int] | None:
    """The Slurm client's release from ``sinfo --version``, or ``None`` when no client answers."""
    return parse_slurm_version(version(env) or "")


def _sacctmgr_names(entity: str, env: Mapping[str, str] | None) -> list[str] | None:
    """Names of ``sacctmgr show <entity>`` (accounts or QOS); ``None`` when the cluster keeps
    no accounting ("You are not running a supported accounting_storage plugin") or slurmdbd
    does not answer: then Slurm does not check them either, and neither does csrun."""
    fields = {"account": "Account", "qos": "Name"}[entity]
    try:
        proc = command.run(["sacctmgr", "--noheader", "--parsable2", "show", entity, f"format={fields}"], env=env)
    except SlurmUnavailable:
        return None
    if proc.returncode != 0:
        return None
    return sorted({ln.strip() for ln in proc.stdout.splitlines() if ln.strip()})


def accounts(env: Mapping[str, str] | None = None) -> list[str] | None:
    """Accounts in Slurm's accounting (``sacctmgr show account``); ``None`` without accounting."""
    return _sacctmgr_names("account", env)


def qos_names(env: Mapping[str, str] | None = None) -> list[str] | None:
    """QOS names in Slurm's accounting (``sacctmgr show qos``); ``None`` without accounting."""
    return _sacctmgr_names("qos", env)


def reservations(env: Mapping[str, str] | None = None) -> list[str]:
    """Names of the current reservations (``scontrol -o show reservation``: one
    ``ReservationName=... ...`` line each; "No reservations in the system" → ``[]``).
    Raises :class:`SlurmUnavailable` when slurmctld does not answer."""
    proc = command.run(["scontrol", "--oneliner", "show", "reservation"], env=env)
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
    proc = command.run(argv, env=env)
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
    proc = command.run(["scontrol", "show", "config"], env=env)
    if proc.returncode != 0:
        msg = (proc.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise SlurmUnavailable(f"cannot reach slurmctld (scontrol: {msg})")
    out = {}
    for line in proc.stdout.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() in keys:
            out[key.strip()] = value.strip()
    return out
