"""Running one Slurm client command: argv lists (never a shell), the binary looked up on PATH,
``SLURM_CONF`` checked first, a timeout that becomes one line. Every module of
:mod:`launcher.slurm` runs its commands through :func:`run` / :func:`query`."""
from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping

from csrun_common.errors import SlurmUnavailable

#: Seconds a Slurm query (sinfo, squeue, sacct, sacctmgr, scontrol show) may take before
#: csrun says slurmctld does not answer: a client retries a stopped controller for ~20 s
#: here (MessageTimeout), and a dry run must not hang on it.
QUERY_TIMEOUT_S = 5.0
#: Seconds an sbatch submission may take (a submission that timed out may still have
#: been accepted, so it gets longer than a query).
SUBMIT_TIMEOUT_S = 30.0


def require(binary: str) -> str:
    """The path of Slurm client ``binary`` on PATH; raises :class:`SlurmUnavailable` when absent."""
    path = shutil.which(binary)
    if not path:
        raise SlurmUnavailable(f"{binary}: not found on PATH; is the Slurm client installed?")
    return path


def check_conf(env: Mapping[str, str] | None = None) -> None:
    """Raise :class:`SlurmUnavailable` when ``SLURM_CONF`` (of ``env``, else this process) names no file."""
    conf = (os.environ if env is None else env).get("SLURM_CONF")
    if conf and not os.path.exists(conf):
        # sinfo would retry for 60 s on a missing file; fail at once instead.
        raise SlurmUnavailable(f"SLURM_CONF={conf}: no such file")


def run(argv: list[str], env: Mapping[str, str] | None = None, timeout: float = QUERY_TIMEOUT_S,
        input_text: str | None = None) -> subprocess.CompletedProcess:
    """Run a Slurm client command (``argv[0]`` looked up on PATH; ``input_text`` on its
    stdin) and capture its text output, whatever its exit status. Raises
    :class:`SlurmUnavailable` when the binary is missing, ``SLURM_CONF`` (of ``env``, else
    this process) names no file, or the command does not answer within ``timeout`` seconds."""
    check_conf(env)
    argv = [require(argv[0]), *argv[1:]]
    try:
        return subprocess.run(argv, input=input_text, capture_output=True, text=True, timeout=timeout,
                              env=dict(env) if env is not None else None)
    except subprocess.TimeoutExpired:
        raise SlurmUnavailable(f"{os.path.basename(argv[0])} did not answer in {timeout:.0f} s: "
                               "is slurmctld running and reachable?") from None


def query(argv: list[str], env: Mapping[str, str] | None = None) -> str:
    """stdout of :func:`run`; raises :class:`SlurmUnavailable` with the command's last line when it fails."""
    proc = run(argv, env)
    if proc.returncode != 0:
        msg = (proc.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise SlurmUnavailable(f"cannot reach slurmctld ({os.path.basename(argv[0])}: {msg})")
    return proc.stdout

