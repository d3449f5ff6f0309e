"""Submitting a batch job (``sbatch --parsable``)."""
from __future__ import annotations

import subprocess

from csrun_common.errors import CsrunError

from . import command


def submit_batch(script: str, env: dict | None = None) -> str:
    """Submit ``script`` with ``sbatch --parsable`` on stdin; returns the job id.

    Raises :class:`CsrunError` with sbatch's message when the submission is refused.
    """
    command.check_conf()
    proc = subprocess.run([command.require("sbatch"), "--parsable"], input=script, capture_output=True,
                          text=True, env=env, timeout=command.SUBMIT_TIMEOUT_S)
    if proc.returncode != 0:
        msg = (proc.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise CsrunError(f"sbatch refused the job: {msg}")
    return proc.stdout.strip().split(";")[0]

