"""A trainer rank's environment, set in its task before its ``run.py`` starts.

:mod:`csrun_runtime.supervise` calls :func:`rank_environment` for every task of a job of several
trainer ranks (``CSRUN_WORLD_SIZE > 1``, docs/MULTI-RANK.md) and ``exec``-s the rank's command
with torchrun's variables and ``TF_CONFIG`` added (:func:`csrun_common.ranks.trainer_env`). The
chief nodes come from Slurm: ``SLURM_JOB_NODELIST_HET_GROUP_0`` (the chief's het group; srun(1)
and sbatch(1) "OUTPUT ENVIRONMENT VARIABLES"), else its older name
``SLURM_JOB_NODELIST_PACK_GROUP_0`` (srun 22.05 sets only that one on csrun_wse's srun path,
measured: docs/MULTI-RANK.md), else ``SLURM_JOB_NODELIST`` (outside a het job), expanded
by :func:`csrun_common.hostlist.expand_hostlist` (scontrol(1) ``show hostnames``' syntax); a
node name that does not resolve (a test
cluster's) is replaced by its ``NodeAddr`` (``scontrol show node``). The user's own
``RANK``/``MASTER_ADDR``/... already in the environment are replaced: the job's layout decides.
"""
from __future__ import annotations

import logging
import socket
import subprocess
from collections.abc import Mapping

from csrun_common.env import MASTER_PORT, WORLD_SIZE
from csrun_common.hostlist import expand_hostlist
from csrun_common.ranks import master_port, trainer_env
from csrun_common.roles import resolve_role

__all__ = ["rank_environment", "chief_hosts", "chief_nodelist", "node_address", "RankEnvError", "NODELISTS"]

log = logging.getLogger("csrun.runtime")

#: Where the chief's het group's nodes are read, in this order (the module docstring).
NODELISTS = ("SLURM_JOB_NODELIST_HET_GROUP_0", "SLURM_JOB_NODELIST_PACK_GROUP_0", "SLURM_JOB_NODELIST")
#: Seconds one ``scontrol`` call may take.
SCONTROL_SECS = 20.0


class RankEnvError(RuntimeError):
    """The chief nodes could not be found or named (the message names the variable or command)."""


def _scontrol(*args: str) -> str:
    try:
        out = subprocess.run(["scontrol", *args], capture_output=True, text=True, timeout=SCONTROL_SECS, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise RankEnvError(f"scontrol {' '.join(args)}: {e}") from None
    if out.returncode != 0:
        raise RankEnvError(f"scontrol {' '.join(args)}: exit {out.returncode}: {out.stderr.strip()[:200]}")
    return out.stdout


def node_address(name: str) -> str:
    """``name`` when the host name resolves, else the node's ``NodeAddr`` from ``scontrol show
    node -o NAME`` (``name`` when Slurm gives none). Raises :class:`RankEnvError` when scontrol
    fails."""
    try:
        socket.getaddrinfo(name, None)
        return name
    except OSError:
        pass
    for word in _scontrol("show", "node", "-o", name).split():
        if word.startswith("NodeAddr="):
            return word.split("=", 1)[1] or name
    return name


def chief_hosts(env: Mapping[str, str]) -> list[str]:
    """The addresses of the chief's het group's nodes, in Slurm's order (rules: the module
    docstring). Raises :class:`RankEnvError` naming the variable when no nodelist is set, or the
    nodelist when it does not parse."""
    nodelist = chief_nodelist(env)
    try:
        names = expand_hostlist(nodelist)
    except ValueError as e:
        raise RankEnvError(f"the chief nodes {nodelist!r}: {e}") from None
    return [node_address(n) for n in names]


def chief_nodelist(env: Mapping[str, str]) -> str:
    """The Slurm hostlist of the chief's het group: the first of :data:`NODELISTS` set in
    ``env``. Raises :class:`RankEnvError` naming the variable when none is."""
    nodelist = next((env[k] for k in NODELISTS if env.get(k)), None)
    if not nodelist:
        raise RankEnvError("SLURM_JOB_NODELIST_HET_GROUP_0 is not set: cannot name the chief nodes")
    return nodelist


def rank_environment(env: Mapping[str, str]) -> dict[str, str]:
    """The variables a trainer rank's command gets (:func:`csrun_common.ranks.trainer_env`);
    ``{}`` for a task that is not a trainer rank of a job of several. Raises
    :class:`RankEnvError` when the chief nodes cannot be named, and
    :class:`csrun_common.roles.RoleError` for an environment that does not resolve."""
    if WORLD_SIZE.integer(env, 1, 1) <= 1:
        return {}
    role = resolve_role(env)
    if not role.is_chief:
        return {}
    port = master_port(role.job_id, MASTER_PORT.integer(env, 0) or None)
    return trainer_env(role.rank, role.local_rank, role.world_size, role.local_world_size, chief_hosts(env), port)

