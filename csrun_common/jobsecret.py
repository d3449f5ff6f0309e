"""The job's secret (docs/SECURITY.md): 32 random bytes from :mod:`secrets`, written as 64 hex
digits in :data:`csrun_common.env.JOB_SECRET`. ``csrun_wse`` makes a fresh one for every launch
and puts it only in the environment it gives srun or sbatch (:func:`with_new_secret`), which
Slurm hands to every task; the data plane's connections prove knowledge of it both ways
(:mod:`csrun_runtime.dataplane.auth`). A process that finds none (``python run.py`` alone, a
test building a receiver) makes its own and exports it to the processes it starts
(:func:`job_secret`). Pure standard library."""
from __future__ import annotations

import os
import secrets
from collections.abc import Mapping, MutableMapping

from .env import JOB_SECRET, EnvError

__all__ = ["SECRET_BYTES", "new_secret", "with_new_secret", "job_secret"]

#: Bytes of entropy of a secret (HMAC-SHA256's block of key strength; RFC 2104 "keys longer
#: than L bytes ... do not significantly increase the function strength").
SECRET_BYTES = 32


def new_secret() -> str:
    """A fresh secret: :data:`SECRET_BYTES` random bytes as hex digits."""
    return secrets.token_hex(SECRET_BYTES)


def with_new_secret(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with a fresh :data:`~csrun_common.env.JOB_SECRET` (an inherited one replaced)."""
    return {**env, JOB_SECRET.name: new_secret()}


def job_secret(env: MutableMapping[str, str] | None = None) -> bytes:
    """The secret in ``env`` (default ``os.environ``) as bytes; when there is none, a fresh one
    set into ``env`` first (in ``os.environ``: this process and every process it starts later
    share it). Raises :class:`~csrun_common.env.EnvError` naming the variable for a value that
    is not :data:`SECRET_BYTES` bytes of hex digits (the value itself is not shown)."""
    env = os.environ if env is None else env
    raw = JOB_SECRET.text(env)
    if raw is None:
        raw = env[JOB_SECRET.name] = new_secret()
    try:
        key = bytes.fromhex(raw)
    except ValueError:
        key = b""
    if len(key) != SECRET_BYTES:
        raise EnvError(f"{JOB_SECRET.name} must be {2 * SECRET_BYTES} hex digits (it has {len(raw)} characters)")
    return key
