"""The role of a launched task, resolved from the environment csrun_wse sets.

Pure Python (no TensorFlow): the CLIs and unit tests import it.

The rules are those of ``docs/CONTRACT.md`` ("What csrun_wse tells every task"):

- no ``CSRUN_ROLE``: **single-process mode**, the chief with its input pipeline in-process;
- component ``chief`` (het group 0): local index ``i = SLURM_PROCID - CSRUN_TASK_OFFSET``;
  ``i == 0`` is the chief (hosts the tf.data service dispatchers and trains), ``i > 0`` is an
  input worker with index ``CSRUN_WORKER_OFFSET + i - 1``;
- component ``single-task``: one task, the input worker ``CSRUN_WORKER_OFFSET``;
- component ``worker``: the input worker ``CSRUN_WORKER_OFFSET + (SLURM_PROCID - CSRUN_TASK_OFFSET)``;
- component ``chief-input``: the input worker the chief starts in its own task with
  ``CSRUN_CHIEF_INPUT_CPUS`` (csrun_wse's chief input CPUs): index ``CSRUN_WORKER_OFFSET``
  (0), one process, never set by csrun_wse on a het component.

With ``CSRUN_NUM_WORKERS == 0`` the chief runs the input pipeline in-process as well.

Several trainer ranks (``CSRUN_WORLD_SIZE > 1``, docs/MULTI-RANK.md): every task of the
``chief`` component is a chief, rank ``i = SLURM_PROCID - CSRUN_TASK_OFFSET``; input worker
``g`` feeds rank ``g % world_size`` as its slot ``g // world_size``
(:func:`csrun_common.ranks.worker_rank`). Each rank and its
input workers then run as a job of their own: the :class:`Role`'s ``worker_index`` and
``num_input_workers`` are the rank's view (the worker's slot among its rank's workers, and
``W / world_size``) and its rendezvous key names the rank's directory, while
``streamer_index`` / ``num_streamers`` keep the job-wide position that shards the data.
"""
from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from . import env as codec
from .env import ADVERTISE_HOST, RENDEZVOUS_KEY, SHARD_PLAN, WORKER_INDEX, WORKER_JOB, EnvError, TaskEnv
from .ranks import rank_key, worker_rank

__all__ = ["Role", "RoleError", "resolve_role", "COMPONENTS", "CHIEF_INPUT", "CHIEF_INPUT_ENV",
           "RENDEZVOUS_ENV", "ADOPT_ENV", "WORKER_JOB_ENV"]

#: The component of the input worker a chief starts in its own task (``CSRUN_CHIEF_INPUT_CPUS``).
CHIEF_INPUT = "chief-input"
#: Values of ``CSRUN_ROLE`` (the role of a het *component*, docs/CONTRACT.md; ``chief-input``
#: is set by the chief for its own input worker, not by csrun_wse): :data:`csrun_common.env.ROLE_VALUES`.
COMPONENTS = codec.ROLE_VALUES
# The variables below are declared in csrun_common.env (docs/ENV.md); these names are kept
# for the modules that import them from here.
#: The chief's component: CPUs of its task that run input worker 0 (``CSRUN_CHIEF_INPUT_CPUS``).
CHIEF_INPUT_ENV = codec.CHIEF_INPUT_CPUS
#: The rendezvous key shared by the chief's job and the input workers' own job
#: (``csrun_wse --survive-node-loss``: two Slurm jobs, so no job id names it for both).
RENDEZVOUS_ENV = RENDEZVOUS_KEY
#: The input-worker index a worker task's supervisor gives a process it starts for a worker
#: lost with its node (``--survive-node-loss``; :mod:`csrun_runtime.supervise`): it replaces the
#: index of the task's own position.
ADOPT_ENV = WORKER_INDEX
#: Set (``1``) by csrun_wse on every task of a ``--survive-node-loss`` run: the chief orders
#: adoptions of workers lost with their node, and the supervisors of the input workers' job
#: carry them out (csrun_runtime.elastic, csrun_runtime.supervise).
WORKER_JOB_ENV = WORKER_JOB


class RoleError(EnvError):
    """The environment does not describe a valid task (names the offending variable)."""


@dataclass(frozen=True)
class Role:
    """What one task is in the job.

    Attributes:
        kind: ``"chief"`` or ``"worker"`` (an input worker).
        worker_index: input-worker index in ``[0, num_input_workers)``; ``None`` for the chief.
        num_input_workers: number of input-worker tasks in the whole job (``CSRUN_NUM_WORKERS``;
            0 in single-process mode).
        component: ``CSRUN_ROLE`` of the task's het component, ``None`` in single-process mode.
        het_group: ``CSRUN_HET_GROUP`` (0-based) or ``None``.
        procid: global ``SLURM_PROCID`` or ``None``.
        job_id: ``SLURM_JOB_ID`` (the het leader's id) or ``None``.
        step_id: ``SLURM_STEP_ID`` (``"0"`` when unset) or ``None`` in single-process mode.
        restart: ``SLURM_RESTART_COUNT`` (requeues of the batch job so far; 0 when unset).
        rendezvous: ``CSRUN_RENDEZVOUS_KEY`` (the key csrun_wse gives both jobs of a
            ``--survive-node-loss`` run) or ``None``.
        node: Slurm node name of the task (``SLURMD_NODENAME``, else the host name).
        host: address the task's servers advertise (``CSRUN_ADVERTISE_HOST``, else the host name).
        cpus_per_task: ``CSRUN_CPUS_PER_TASK`` as an int, ``None`` when empty/unset.
        shard_plan: ``CSRUN_SHARD_PLAN`` (absolute path of a shard-plan JSON) or ``None``.
        execution_mode: ``CSRUN_EXECUTION_MODE`` or ``None``.
        rank: the trainer rank of a chief, or the rank an input worker feeds (0 with one).
        world_size: trainer ranks of the job (``CSRUN_WORLD_SIZE``, 1: one chief).
        local_rank: a chief's rank on its node (``SLURM_LOCALID``; 0 with one chief, and for
            input workers).
        local_world_size: trainer ranks per chief node (``CSRUN_LOCAL_WORLD_SIZE``).
        streamer_index: the input worker's job-wide index ``g`` (its data shard: ``g`` of
            ``num_streamers``); ``worker_index`` when ``world_size`` is 1.
        num_streamers: the job's input workers ``W`` (``CSRUN_NUM_WORKERS``).
    """

    kind: str
    worker_index: int | None
    num_input_workers: int
    component: str | None = None
    het_group: int | None = None
    procid: int | None = None
    job_id: str | None = None
    step_id: str | None = None
    node: str = ""
    host: str = ""
    cpus_per_task: int | None = None
    shard_plan: str | None = None
    execution_mode: str | None = None
    restart: int = 0
    rendezvous: str | None = None
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    streamer_index: int | None = None
    num_streamers: int = 0

    def __post_init__(self) -> None:
        if self.streamer_index is None and self.worker_index is not None:
            object.__setattr__(self, "streamer_index", self.worker_index)
        if not self.num_streamers:
            object.__setattr__(self, "num_streamers", self.num_input_workers)

    @property
    def is_rank_zero(self) -> bool:
        """True for the chief that writes the job's artifacts (rank 0)."""
        return self.is_chief and self.rank == 0

    @property
    def is_chief(self) -> bool:
        """True for the chief (in single-process mode too)."""
        return self.kind == "chief"

    @property
    def single_process(self) -> bool:
        """True when no csrun environment is present (``python run.py ...``)."""
        return self.component is None

    @property
    def chief_input(self) -> bool:
        """True for the input worker a chief runs in its own task (``CSRUN_CHIEF_INPUT_CPUS``)."""
        return self.component == CHIEF_INPUT

    @property
    def in_process_input(self) -> bool:
        """True when the chief runs the input pipeline itself (no input-worker tasks)."""
        return self.is_chief and self.num_input_workers == 0

    @property
    def rendezvous_key(self) -> str | None:
        """``"<SLURM_JOB_ID>.<SLURM_STEP_ID>"``: names the rendezvous directory of the step;
        ``".r<SLURM_RESTART_COUNT>"`` is appended in a requeued job, whose steps have the same
        ids in every allocation (an input worker must not read the last allocation's files).
        ``CSRUN_RENDEZVOUS_KEY`` replaces it when set (the chief's job and the input workers' job
        of ``--survive-node-loss`` have different ids). With several trainer ranks ``".rank<r>"``
        ends it: each rank's input has its own directory (:func:`csrun_common.ranks.rank_key`)."""
        if self.rendezvous:
            return rank_key(self.rendezvous, self.rank, self.world_size)
        if self.job_id is None:
            return None
        key = f"{self.job_id}.{self.step_id or '0'}"
        return rank_key(f"{key}.r{self.restart}" if self.restart else key, self.rank, self.world_size)

    def describe(self) -> str:
        """One-line human description, e.g. ``"input worker 3 on node2"``."""
        if self.kind == "chief":
            where = f" on {self.node}" if self.node else ""
            if self.single_process:
                return f"chief (single-process mode){where}"
            if self.world_size > 1:
                where = f" rank {self.rank} of {self.world_size}{where}"
            return f"chief{where} with {self.num_input_workers} input worker(s)"
        where = " in the chief's task" if self.component == CHIEF_INPUT else ""
        if self.world_size > 1:
            where += f" of rank {self.rank}"
        return f"input worker {self.streamer_index}{where} on {self.node}"


def _int(env: Mapping[str, str], name: str, default: int | None = None, minimum: int = 0) -> int:
    try:
        return codec.read_int(env, name, default, minimum)
    except EnvError as exc:
        raise RoleError(str(exc)) from None


def _decode(env: Mapping[str, str]) -> TaskEnv:
    try:
        return TaskEnv.decode(env)
    except EnvError as exc:
        raise RoleError(str(exc)) from None


def resolve_role(env: Mapping[str, str] | None = None) -> Role:
    """Resolve the role of this task from an environment mapping.

    Args:
        env: the environment (``os.environ`` when ``None``); only string values are read.

    Returns:
        A :class:`Role`.

    Raises:
        RoleError: ``CSRUN_ROLE`` has an unknown value, a required variable is missing
            (``SLURM_PROCID``, ``CSRUN_NUM_WORKERS``, ``SLURM_JOB_ID`` when there are input
            workers), a value is not an integer, or the resulting worker index is outside
            ``[0, CSRUN_NUM_WORKERS)``. The message names the variable.

    Rules: docs/CONTRACT.md ("Role of a task"); the variables: :class:`csrun_common.env.TaskEnv`.
    """
    env = os.environ if env is None else env
    task = _decode(env)
    where: dict[str, Any] = {"node": env.get("SLURMD_NODENAME") or socket.gethostname(),
             "host": ADVERTISE_HOST.text(env) or socket.gethostname(), "cpus_per_task": task.cpus_per_task,
             "shard_plan": SHARD_PLAN.text(env), "execution_mode": task.execution_mode}
    if task.role is None:
        return Role(kind="chief", worker_index=None, num_input_workers=0, job_id=env.get("SLURM_JOB_ID") or None,
                    step_id=(env.get("SLURM_STEP_ID") or "0") if env.get("SLURM_JOB_ID") else None, **where)
    procid = _int(env, "SLURM_PROCID")
    kind, index = _task_index(env, task, procid)
    job_id = env.get("SLURM_JOB_ID") or None
    if job_id is None and task.num_input_workers > 0:
        raise RoleError("SLURM_JOB_ID is required when CSRUN_NUM_WORKERS > 0 "
                        "(it names the rendezvous directory)")
    fields: dict[str, Any] = {"worker_index": index, "num_input_workers": task.num_input_workers,
                              **_rank_view(env, task, kind, procid, index)}
    return Role(kind=kind, component=task.role, het_group=task.het_group, procid=procid, job_id=job_id,
                step_id=(env.get("SLURM_STEP_ID") or "0") if job_id else None,
                restart=_int(env, "SLURM_RESTART_COUNT", default=0), rendezvous=RENDEZVOUS_KEY.text(env),
                **fields, **where)


def _rank_view(env: Mapping[str, str], task: TaskEnv, kind: str, procid: int, index: int | None) -> dict[str, Any]:
    """The :class:`Role` fields of several trainer ranks (``CSRUN_WORLD_SIZE > 1``): a chief's
    rank and local rank, an input worker's rank and slot (:func:`csrun_common.ranks.worker_rank`),
    the rank's share of the input workers. Empty with one rank. Raises :class:`RoleError` when
    the input workers are not a multiple of the world size."""
    world, w = task.world_size, task.num_input_workers
    if world <= 1:
        return {}
    if w % world:
        raise RoleError(f"CSRUN_NUM_WORKERS={w} is not a multiple of CSRUN_WORLD_SIZE={world}")
    out: dict[str, Any] = {"world_size": world, "local_world_size": task.local_world_size,
                           "num_input_workers": w // world, "num_streamers": w}
    if kind == "chief":
        out.update(rank=procid - task.task_offset, local_rank=_int(env, "SLURM_LOCALID", default=0))
    elif index is not None:
        rank, slot = worker_rank(index, world)
        out.update(rank=rank, worker_index=slot, streamer_index=index)
    return out


def _task_index(env: Mapping[str, str], task: TaskEnv, procid: int) -> tuple[str, int | None]:
    """``(kind, input-worker index)`` of task ``procid`` (``SLURM_PROCID``) of ``task``'s
    component (rules: the module docstring). Raises :class:`RoleError`."""
    local = procid - task.task_offset
    if local < 0:
        raise RoleError(f"SLURM_PROCID={procid} is below CSRUN_TASK_OFFSET={task.task_offset}")
    kind: str = "worker"
    index: int | None = task.worker_offset + local
    if task.role == "chief" and task.world_size > 1:  # every task of the chief's group is a rank
        kind, index = "chief", None
    elif task.role == "chief":
        kind, index = ("chief", None) if local == 0 else ("worker", task.worker_offset + local - 1)
    elif task.role in ("single-task", CHIEF_INPUT):
        if local != 0:
            raise RoleError(f"a {task.role} component has one task, but SLURM_PROCID={procid} "
                            f"- CSRUN_TASK_OFFSET={task.task_offset} = {local}")
        index = task.worker_offset
    if env.get(WORKER_INDEX) and kind == "worker":
        index = _int(env, WORKER_INDEX)
    if index is not None and not 0 <= index < task.num_input_workers:
        raise RoleError(f"input-worker index {index} (from SLURM_PROCID={procid}, "
                        f"CSRUN_TASK_OFFSET={task.task_offset}, CSRUN_WORKER_OFFSET={task.worker_offset}) "
                        f"is outside [0, CSRUN_NUM_WORKERS={task.num_input_workers})")
    return kind, index
