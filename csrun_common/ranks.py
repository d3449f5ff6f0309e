"""Several trainer ranks: which rank an input worker feeds, and each rank's environment.

Pure Python (no Slurm call, no framework). A job of ``C`` chief nodes with ``R``
trainer ranks each (the layout's chief nodes and trainer ranks per chief node) trains in
``world_size = C × R`` ranks, the tasks of its chief's het
group (docs/MULTI-RANK.md):

* rank ``r`` is the task ``SLURM_PROCID = r`` (het group 0 comes first), on chief node
  ``r // R`` (Slurm's block distribution), with ``LOCAL_RANK = SLURM_LOCALID``;
* input worker ``g`` of the job's ``W`` feeds rank ``g % world_size`` as its slot
  ``g // world_size`` (:func:`worker_rank`): each rank reads ``W / world_size`` workers spread
  over the input-worker nodes, and the data's sharding stays job-wide (``g`` of ``W``);
* each rank gets torchrun's variables and a ``TF_CONFIG`` (:func:`trainer_env`), the names of
  torchrun ("torchrun (Elastic Launch)", its environment variables: ``RANK``, ``LOCAL_RANK``,
  ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``) and of TensorFlow's
  multi-worker training (``TF_CONFIG``: ``{"cluster": {"worker": [...]}, "task": {"type":
  "worker", "index": i}}``).
"""
from __future__ import annotations

import json
from collections.abc import Sequence

__all__ = ["worker_rank", "master_port", "trainer_env", "BASE_PORT", "PORT_SPAN", "rank_key"]

#: :func:`master_port`'s range: ``BASE_PORT + SLURM_JOB_ID % PORT_SPAN`` (torchrun's default
#: port 29500 is the base; jobs sharing a node get different ports).
BASE_PORT, PORT_SPAN = 29500, 2000


def worker_rank(index: int, world_size: int) -> tuple[int, int]:
    """``(index % world_size, index // world_size)``: the rank and slot among its workers of
    job-wide input worker ``index``. Raises ``ValueError`` for ``index < 0`` or ``world_size < 1``."""
    if index < 0 or world_size < 1:
        raise ValueError(f"input worker {index} of a world of {world_size}: not a worker of a rank")
    return index % world_size, index // world_size


def rank_key(key: str, rank: int, world_size: int) -> str:
    """Rendezvous key of ``rank``'s input: ``key`` with one rank, else ``"<key>.rank<r>"``."""
    return key if world_size <= 1 else f"{key}.rank{rank}"


def master_port(job_id: str | int | None, configured: int | None = None) -> int:
    """Rank 0's port: ``configured`` (the site's ``CSRUN_MASTER_PORT``) when given, else
    :data:`BASE_PORT` ``+ job_id %`` :data:`PORT_SPAN` (``BASE_PORT`` without a job id).
    Raises ``ValueError`` for a job id that is not an integer."""
    if configured:
        return int(configured)
    return BASE_PORT + (int(str(job_id).split("+")[0]) % PORT_SPAN if job_id not in (None, "") else 0)


def trainer_env(rank: int, local_rank: int, world_size: int, local_world_size: int,
                hosts: Sequence[str], port: int) -> dict[str, str]:
    """The variables of trainer ``rank``: torchrun's (``MASTER_ADDR`` = ``hosts[0]``, the chief
    het group's first node) and ``TF_CONFIG`` (worker ``i`` at ``hosts[i // local_world_size]``,
    port ``port + 1 + i``). ``hosts``: the chief nodes' addresses, in Slurm's order (at least
    ``world_size / local_world_size`` of them). Raises ``ValueError`` when the ranks do not fit
    the hosts or ``rank`` is outside the world."""
    if not 0 <= rank < world_size or not 0 <= local_rank < local_world_size:
        raise ValueError(f"rank {rank} (local {local_rank}) outside a world of {world_size} "
                         f"({local_world_size} per node)")
    nodes = -(-world_size // local_world_size)
    if len(hosts) < nodes:
        raise ValueError(f"{world_size} ranks, {local_world_size} per node, need {nodes} node(s): "
                         f"given {list(hosts)}")
    workers = [f"{hosts[i // local_world_size]}:{port + 1 + i}" for i in range(world_size)]
    tf_config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": rank}}
    return {"RANK": str(rank), "LOCAL_RANK": str(local_rank), "WORLD_SIZE": str(world_size),
            "LOCAL_WORLD_SIZE": str(local_world_size), "MASTER_ADDR": hosts[0], "MASTER_PORT": str(port),
            "TF_CONFIG": json.dumps(tf_config, separators=(",", ":"))}
