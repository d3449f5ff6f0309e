"""Every ``CSRUN_*`` environment variable, declared once, and the codec of the task contract.

Each variable is a :class:`Var`: a ``str`` (its name, usable wherever the name is) that also
carries its type (``kind``), its scope, who writes it and who reads it, and what it means.
No other module spells a ``CSRUN_*`` name: they import it from here
(``tests/unit/csrun_common/test_env.py`` fails on a second spelling and on a name not declared here).

The task contract of ``docs/CONTRACT.md`` ("What csrun_wse tells every task") is one value,
:class:`TaskEnv`: :meth:`TaskEnv.encode` is what ``csrun_wse`` exports to each het component
(:meth:`launcher.builders.WseRequest.component_env`) and :meth:`TaskEnv.decode` is what a task
reads back (:func:`csrun_common.roles.resolve_role`).

``python -m csrun_common.env`` prints ``docs/ENV.md`` (the variables and
:mod:`csrun_common.exits`' exit statuses).

Pure Python: imports nothing of ``launcher``, ``analyzer`` or ``csrun_runtime``.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from . import exits
from .layout import flag

__all__ = ["Var", "EnvError", "VARIABLES", "SCOPES", "ROLE_VALUES", "TaskEnv", "read_int", "render_markdown"]


class EnvError(ValueError):
    """A variable has a value the codec cannot decode, or a required one is missing (the
    message names the variable and the value)."""


class Var(str):
    """One ``CSRUN_*`` variable: the name (this string) and its declaration.

    Attributes:
        kind: the value's type as written in the environment (e.g. ``"int >= 0"``).
        scope: one of :data:`SCOPES`.
        writer: who sets it.
        reader: who reads it.
        meaning: one sentence.
    """

    kind: str
    scope: str
    writer: str
    reader: str
    meaning: str

    def __new__(cls, name: str, kind: str, scope: str, writer: str, reader: str, meaning: str) -> Var:
        if not (name.startswith("CSRUN_") or scope == "rank") or scope not in SCOPES:
            raise ValueError(f"bad variable declaration {name!r} ({scope!r})")
        obj = super().__new__(cls, name)
        obj.kind, obj.scope, obj.writer, obj.reader, obj.meaning = kind, scope, writer, reader, meaning
        return obj

    def __reduce__(self) -> tuple[Any, ...]:
        return (str, (self.name,))  # pickled (multiprocessing, deepcopy) as its plain name

    @property
    def name(self) -> str:
        """The variable's name, as a plain ``str``."""
        return str.__str__(self)

    def text(self, env: Mapping[str, str]) -> str | None:
        """The value in ``env``, stripped; ``None`` when unset or empty."""
        raw = env.get(self)
        return None if raw is None or str(raw).strip() == "" else str(raw).strip()

    def integer(self, env: Mapping[str, str], default: int | None = None, minimum: int = 0) -> int:
        """The value as an int (:func:`read_int`). Raises :class:`EnvError`."""
        return read_int(env, self.name, default, minimum)

    def flag(self, env: Mapping[str, str]) -> bool:
        """True when set to ``1`` / ``true`` / ``yes`` (any case)."""
        return (self.text(env) or "").lower() in ("1", "true", "yes")


#: Where a variable lives: ``task`` (csrun_wse exports it to each het component),
#: ``job`` (csrun_wse sets it in its own environment, every task inherits it), ``runtime``
#: (a task's runtime sets it for a process it starts), ``user`` (set by the user or the
#: site), ``analyzer`` (cs_input_analyzer's probe processes), ``development`` (the test
#: clusters, the test suite and the benchmarks; never read by an installed csrun), ``rank``
#: (not csrun's: torchrun's and TensorFlow's variables csrun_runtime.supervise sets for each
#: trainer rank of a job of several, docs/MULTI-RANK.md).
SCOPES = ("task", "job", "runtime", "user", "analyzer", "development", "rank")


def read_int(env: Mapping[str, str], name: str, default: int | None = None, minimum: int = 0) -> int:
    """``int(env[name])`` (any variable, ``SLURM_*`` too), stripped.

    Returns ``default`` when unset or empty. Raises :class:`EnvError` naming the variable when
    it is missing and ``default`` is ``None``, not an integer, or below ``minimum``."""
    raw = env.get(name)
    if raw is None or str(raw).strip() == "":
        if default is None:
            raise EnvError(f"{name} is required when CSRUN_ROLE is set (docs/CONTRACT.md)")
        return default
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise EnvError(f"{name}={raw!r} is not an integer") from None
    if value < minimum:
        raise EnvError(f"{name}={value} must be >= {minimum}")
    return value


_CW = "csrun_wse (launcher.builders.WseRequest.component_env)"
_ROLES = "csrun_common.roles.resolve_role"

ROLE = Var("CSRUN_ROLE", "chief | single-task | worker | chief-input", "task",
           _CW + "; the chief for its own input worker (csrun_runtime.chief_input)",
           _ROLES + "; its presence marks a launched task (csrun_runtime.tensorflow.quiet, csrun_runtime.supervise)",
           "the role of the task's het component (docs/CONTRACT.md)")
HET_GROUP = Var("CSRUN_HET_GROUP", "int >= 0", "task", _CW, _ROLES, "the het group (component) of the task")
TASK_OFFSET = Var("CSRUN_TASK_OFFSET", "int >= 0", "task", _CW + "; csrun_runtime.chief_input", _ROLES,
                  "SLURM_PROCID of the component's first task (0 in the input workers' own job)")
WORKER_OFFSET = Var("CSRUN_WORKER_OFFSET", "int >= 0", "task", _CW + "; csrun_runtime.chief_input", _ROLES,
                    "input-worker index of the component's first input-worker task")
NUM_WORKERS = Var("CSRUN_NUM_WORKERS", "int >= 0", "task", _CW, _ROLES,
                  f"input workers in the whole job (the chief's own with {flag('chief_input_cpus')} counted)")
NUM_TASKS = Var("CSRUN_NUM_TASKS", "int >= 1", "task", _CW, _ROLES + " (TaskEnv.num_tasks)",
                "tasks in the whole het step")
CPUS_PER_TASK = Var("CSRUN_CPUS_PER_TASK", "int >= 1, empty: Slurm chose", "task",
                    _CW + "; csrun_runtime.chief_input", _ROLES,
                    "CPUs of each task of the component (Slurm 22.05 gives a het step no per-component value)")
EXECUTION_MODE = Var("CSRUN_EXECUTION_MODE", "weight_streaming | pytorch", "task", _CW + " (python-ws / python-pt)",
                     _ROLES, "the execution mode of the command's first word")
STOP_SIGNALS = Var("CSRUN_STOP_SIGNALS", "SIG[:SIG...] (names without SIG)", "task", _CW + " (--requeue)",
                   "csrun_runtime.preemption", "the signals the tasks turn into 'checkpoint and stop'")
AUTOSCALE = Var("CSRUN_AUTOSCALE", "initial:min:max:policy:window", "task", _CW + " (--autoscale)",
                "csrun_common.autoscale.parse_env (the chief, the input workers)",
                "the --autoscale bounds and policy")
CHIEF_INPUT_CPUS = Var("CSRUN_CHIEF_INPUT_CPUS", "int >= 0", "task",
                       _CW + f" ({flag('chief_input_cpus')}), chief component",
                       "csrun_runtime.chief_input.requested", "CPUs of the chief's task that run input worker 0")
WORLD_SIZE = Var("CSRUN_WORLD_SIZE", "int >= 1", "task", _CW + f" ({flag('chief_nodes')} × "
                 f"{flag('chief_tasks_per_node')}, set when above 1)", _ROLES,
                 "trainer ranks of the job: the chief's het group's tasks (docs/MULTI-RANK.md)")
LOCAL_WORLD_SIZE = Var("CSRUN_LOCAL_WORLD_SIZE", "int >= 1", "task", _CW + f" ({flag('chief_tasks_per_node')})",
                       _ROLES, "trainer ranks on each chief node")
MASTER_PORT = Var("CSRUN_MASTER_PORT", "int (port)", "task", _CW + " (site config ranks.master_port)",
                  "csrun_runtime.ranks", "rank 0's port for the trainer ranks' rendezvous; unset: "
                  "derived from SLURM_JOB_ID (csrun_common.ranks.master_port)")
_RANK = "csrun_runtime.ranks (csrun_runtime.supervise, before a trainer rank's run.py starts)"
RANK_VARS = (
    Var("RANK", "int >= 0", "rank", _RANK, "torch.distributed, the user", "the trainer rank (torchrun's)"),
    Var("LOCAL_RANK", "int >= 0", "rank", _RANK, "csrun_runtime.pytorch (its device), the user",
        "the rank on its node; the index of its accelerator among the node's GRES devices"),
    Var("WORLD_SIZE", "int >= 1", "rank", _RANK, "torch.distributed, the user", "trainer ranks in the job"),
    Var("LOCAL_WORLD_SIZE", "int >= 1", "rank", _RANK, "the user", "trainer ranks on the node"),
    Var("MASTER_ADDR", "host", "rank", _RANK, "torch.distributed",
        "the first node of the chief's het group (SLURM_JOB_NODELIST_HET_GROUP_0), as an address"),
    Var("MASTER_PORT", "int", "rank", _RANK, "torch.distributed", "rank 0's port (CSRUN_MASTER_PORT)"),
    Var("TF_CONFIG", "JSON", "rank", _RANK, "tf.distribute.MultiWorkerMirroredStrategy",
        "the cluster of the trainer ranks (worker i at MASTER_PORT + 1 + i) and this rank's task"),
)
WORKER_JOB = Var("CSRUN_WORKER_JOB", "1", "task", _CW + " (--survive-node-loss)",
                 "csrun_runtime.elastic, csrun_runtime.supervise",
                 "the input workers run as a job of their own: lost workers are adopted on surviving nodes")
SHARD_PLAN = Var("CSRUN_SHARD_PLAN", "absolute path", "job", "csrun_wse (WseRequest.job_env, --shard-plan)",
                 _ROLES, "the shard plan JSON: each input worker reads only its files")
RENDEZVOUS_KEY = Var("CSRUN_RENDEZVOUS_KEY", "str", "job",
                     "csrun_wse (WseRequest.job_env, launcher.cli; --survive-node-loss)", _ROLES,
                     "names the rendezvous directory shared by the chief's job and the input workers' job")
REQUEUE_COUNT = Var("CSRUN_REQUEUE_COUNT", "int >= 0", "job", "csrun_wse (launcher.cli, srun path of --requeue)",
                    "csrun_runtime.preemption", "how many times csrun_wse relaunched the srun (the batch path has "
                    "SLURM_RESTART_COUNT)")
JOB_SECRET = Var("CSRUN_JOB_SECRET", "64 hex digits", "job",
                 "csrun_wse (launcher.cli through csrun_common.jobsecret: in its own environment, never in argv, "
                 "the sbatch script or the Launching line); a process without it makes its own",
                 "csrun_runtime.dataplane (Sender, Receiver, the bulk channel: docs/SECURITY.md)",
                 "the job's secret: every data-plane and bulk-channel connection proves knowledge of it both ways")
WORKER_INDEX = Var("CSRUN_WORKER_INDEX", "int >= 0", "runtime", "csrun_runtime.supervise (Adopter)", _ROLES,
                   "the input-worker index of a worker adopted after its node was lost (replaces the task's own)")
WORKER_ATTEMPT = Var("CSRUN_WORKER_ATTEMPT", "int >= 0", "runtime", "csrun_runtime.supervise",
                     "csrun_runtime.tensorflow.worker",
                     "how many times this input worker died before (0: the first start)")
SUPERVISOR_STATE = Var("CSRUN_SUPERVISOR_STATE", "path", "runtime", "csrun_runtime.supervise",
                       "csrun_runtime.elastic.tell_supervisor", "file where a worker tells its supervisor its "
                       "rendezvous directory and index")
PIN_CPUS = Var("CSRUN_PIN_CPUS", "CPU ids, comma-separated", "runtime", "csrun_runtime.chief_input.worker_env",
               "csrun_runtime.chief_input.apply_placement", "CPUs the chief's input worker is pinned to")
NICE = Var("CSRUN_NICE", "int", "runtime", "csrun_runtime.chief_input.worker_env",
           "csrun_runtime.chief_input.apply_placement", "niceness added to the chief's input worker")
CONFIG = Var("CSRUN_CONFIG", "path", "user", "the user", "launcher.config", "the site config file to read first")
VERBOSE = Var("CSRUN_VERBOSE", "1 | true | yes", "user", "the user", "launcher.resolve, csrun_runtime.tensorflow.quiet",
              "let the tasks print every TensorFlow C++ log line (as --verbose)")
NO_PATH_CHECKS = Var("CSRUN_NO_PATH_CHECKS", "1 | true | yes", "user", "the user", "launcher.cli (click envvar)",
                     "skip the path checks of every launch (as --no-path-checks)")
BATCH_CHECK_SECS = Var("CSRUN_BATCH_CHECK_SECS", "int >= 0 (seconds)", "user", "the user, tests/conftest.py",
                       "launcher.batchcheck", "bound of the one-batch check before queueing, over checks.batch_secs "
                       "(0: off)")
DATAPLANE_KEEP_MEMORY = Var("CSRUN_DATAPLANE_KEEP_MEMORY", "0 | 1", "user", "the user or site",
                            "csrun_runtime.dataplane.receive.keep_receive_memory",
                            "0: the data plane leaves glibc's malloc settings alone in this process (default 1: "
                            "received frames reuse pages already mapped)")
DATAPLANE_MAX_MESSAGE = Var("CSRUN_DATAPLANE_MAX_MESSAGE_BYTES", "int >= 1 (bytes)", "user", "the user or site",
                            "csrun_runtime.dataplane (Receiver)",
                            "the site bound on one data message's bytes: a header declaring more is refused before "
                            "anything is allocated (default 1 GiB)")
LOG_DIR = Var("CSRUN_LOG_DIR", "path", "user", "the user", "launcher.slurm.task_log",
              "where csrun_wse writes its task logs (default ./csrun_logs)")
RUN_ID = Var("CSRUN_RUN_ID", "run id", "user", "launcher.runs.api.launch", "launcher.runs.recorder",
             "the run id csrun_wse / csrun_cpu records the launch under (default: a new one)")
ADVERTISE_HOST = Var("CSRUN_ADVERTISE_HOST", "host name or address", "user", "the user or site", _ROLES,
                     "the address a task's servers advertise (default: the host name)")
PROBE_INDEX = Var("CSRUN_PROBE_INDEX", "int >= 0", "analyzer", "analyzer.probe_agent", "analyzer.probe_worker",
                  "the index of a probe process on its node")
PROBE_PARENT = Var("CSRUN_PROBE_PARENT", "pid", "analyzer", "analyzer.probe_agent", "analyzer.probe_worker",
                   "the probe agent's pid: a probe process leaves when it is gone")
_DEV = (
    ("CSRUN_CLUSTER_DIR", "path", "the state directory of a test cluster"),
    ("CSRUN_CLUSTER_PORT", "int", "the first port of a test cluster (slurmctld)"),
    ("CSRUN_CLUSTER_NODES", "int", "nodes of the native test cluster (default 5)"),
    ("CSRUN_CLUSTER_CPUS", "int", "CPUs each node of the native test cluster declares"),
    ("CSRUN_CLUSTER_PIN", "auto | yes", "pin the native test cluster's nodes to host CPUs"),
    ("CSRUN_CLUSTER_ACCOUNTING", "0 | 1", "0: the test cluster runs without MariaDB and slurmdbd"),
    ("CSRUN_CLUSTER_UP_TIMEOUT", "seconds", "how long `cluster up` waits for the nodes"),
    ("CSRUN_COMPOSE_SUBNET", "CIDR", "the network of the compose test cluster"),
    ("CSRUN_COMPOSE_SHARED", "paths, :-separated", "host directories the compose cluster shares (default /tmp)"),
    ("CSRUN_CONTAINERS_CONF", "path", "the containers.conf the compose cluster's engine reads"),
    ("CSRUN_TEST_ENGINE", "native | podman | docker", "the test cluster the test suite and demo run on"),
    ("CSRUN_TEST_COMPOSE", "0 | 1", "scripts/test.sh: run the compose stage"),
    ("CSRUN_PINNED_PORT", "int", "the port of the pinned test cluster (benchmarks, tests)"),
    ("CSRUN_UPDATE_GOLDEN", "1", "rewrite the golden files of tests/golden/"),
)
DEVELOPMENT = tuple(Var(name, kind, "development", "the developer", "slurm-test-cluster/, tests/, bench/, scripts/",
                        meaning) for name, kind, meaning in _DEV)

#: Every declared variable, by name.
VARIABLES: dict[str, Var] = {v.name: v for v in (
    ROLE, HET_GROUP, TASK_OFFSET, WORKER_OFFSET, NUM_WORKERS, NUM_TASKS, CPUS_PER_TASK, EXECUTION_MODE,
    STOP_SIGNALS, AUTOSCALE, CHIEF_INPUT_CPUS, WORKER_JOB, SHARD_PLAN, RENDEZVOUS_KEY, REQUEUE_COUNT, JOB_SECRET,
    WORKER_INDEX, WORKER_ATTEMPT, SUPERVISOR_STATE, PIN_CPUS, NICE, CONFIG, VERBOSE, NO_PATH_CHECKS, LOG_DIR, RUN_ID,
    BATCH_CHECK_SECS, DATAPLANE_KEEP_MEMORY, DATAPLANE_MAX_MESSAGE, ADVERTISE_HOST, WORLD_SIZE, LOCAL_WORLD_SIZE,
    MASTER_PORT, PROBE_INDEX, PROBE_PARENT, *DEVELOPMENT, *RANK_VARS)}

#: Values of :data:`ROLE` (docs/CONTRACT.md): the three het-component roles csrun_wse sets,
#: and ``chief-input``, set by the chief for the input worker it runs in its own task.
ROLE_VALUES = ("chief", "single-task", "worker", "chief-input")


@dataclass(frozen=True)
class TaskEnv:
    """The task contract of one het component (docs/CONTRACT.md), as values.

    ``role`` ``None``: no contract (single-process mode: ``python run.py``); the numbers are
    then 0. ``cpus_per_task`` ``None``: Slurm chose. ``stop_signals`` and ``autoscale`` are the
    encoded values of :meth:`launcher.requeue.RequeueSpec.stop_signals` and
    :meth:`csrun_common.autoscale.AutoscaleSpec.to_env`.
    """

    role: str | None
    het_group: int = 0
    task_offset: int = 0
    worker_offset: int = 0
    num_input_workers: int = 0
    num_tasks: int = 0
    cpus_per_task: int | None = None
    execution_mode: str | None = None
    stop_signals: str | None = None
    autoscale: str | None = None
    chief_input_cpus: int = 0
    worker_job: bool = False
    world_size: int = 1
    local_world_size: int = 1
    master_port: int | None = None

    def encode(self) -> list[tuple[str, str]]:
        """``[(name, value)]`` for srun's ``--export``, in the contract's order: role, het
        group, offsets, counts, CPUs (empty when Slurm chose), ``PYTHONUNBUFFERED=1``, then the
        optional ones only when set. Raises :class:`EnvError` for ``role`` ``None`` or not one
        of :data:`ROLE_VALUES`."""
        if self.role not in ROLE_VALUES:
            raise EnvError(f"{ROLE}={self.role!r} is not one of {', '.join(ROLE_VALUES)}")
        env = [(ROLE.name, self.role), (HET_GROUP.name, str(self.het_group)),
               (TASK_OFFSET.name, str(self.task_offset)), (WORKER_OFFSET.name, str(self.worker_offset)),
               (NUM_WORKERS.name, str(self.num_input_workers)), (NUM_TASKS.name, str(self.num_tasks)),
               (CPUS_PER_TASK.name, str(self.cpus_per_task or "")), ("PYTHONUNBUFFERED", "1")]
        optional = [(EXECUTION_MODE, self.execution_mode), (STOP_SIGNALS, self.stop_signals),
                    (AUTOSCALE, self.autoscale), (CHIEF_INPUT_CPUS, str(self.chief_input_cpus or "")),
                    (WORKER_JOB, "1" if self.worker_job else ""),
                    (WORLD_SIZE, str(self.world_size) if self.world_size > 1 else ""),
                    (LOCAL_WORLD_SIZE, str(self.local_world_size) if self.world_size > 1 else ""),
                    (MASTER_PORT, str(self.master_port or ""))]
        return env + [(var.name, value) for var, value in optional if value]

    @classmethod
    def decode(cls, env: Mapping[str, str]) -> TaskEnv:
        """The contract in ``env`` (checks in this order: ``CSRUN_CPUS_PER_TASK``, ``CSRUN_ROLE``,
        ``CSRUN_NUM_WORKERS`` (required with a role), the offsets and the het group, the rest).
        Raises :class:`EnvError` naming the variable and its value."""
        cpus_raw = CPUS_PER_TASK.text(env)
        cpus = CPUS_PER_TASK.integer(env, minimum=1) if cpus_raw is not None else None
        common: dict[str, Any] = {"cpus_per_task": cpus, "execution_mode": EXECUTION_MODE.text(env)}
        role = ROLE.text(env)
        if role is None:
            return cls(None, **common)
        if role not in ROLE_VALUES:
            raise EnvError(f"{ROLE}={role!r} is not one of {', '.join(ROLE_VALUES)}")
        return cls(role, num_input_workers=NUM_WORKERS.integer(env), task_offset=TASK_OFFSET.integer(env, 0),
                   worker_offset=WORKER_OFFSET.integer(env, 0), het_group=HET_GROUP.integer(env, 0),
                   num_tasks=NUM_TASKS.integer(env, 0), stop_signals=STOP_SIGNALS.text(env),
                   autoscale=AUTOSCALE.text(env), chief_input_cpus=CHIEF_INPUT_CPUS.integer(env, 0),
                   worker_job=WORKER_JOB.text(env) == "1", world_size=WORLD_SIZE.integer(env, 1, 1),
                   local_world_size=LOCAL_WORLD_SIZE.integer(env, 1, 1),
                   master_port=MASTER_PORT.integer(env, 0) or None, **common)

    def with_(self, **changes: Any) -> TaskEnv:
        """A copy with ``changes`` (field names)."""
        return replace(self, **changes)


def render_markdown() -> str:
    """The text of ``docs/ENV.md``: every variable (by scope) and every exit status."""
    lines = ["# csrun's environment variables and exit statuses", "",
             "Generated by `python -m csrun_common.env > docs/ENV.md` from `csrun_common/env.py` and",
             "`csrun_common/exits.py`, where each is declared once; `tests/unit/csrun_common/test_env.py` checks",
             "that this file is current, that no other module spells a `CSRUN_*` name or an exit status,",
             "and that every `CSRUN_*` name in the tree is declared. How a task's role follows from the",
             "`task` variables: [CONTRACT.md](CONTRACT.md).", "",
             "Scopes: `task`: csrun_wse exports it to each het component (`TaskEnv.encode`, read back by",
             "`TaskEnv.decode`); `job`: csrun_wse sets it in its own environment and every task inherits",
             "it; `runtime`: a task sets it for a process it starts; `user`: set by the user or site;",
             "`analyzer`: cs_input_analyzer's probe processes; `development`: test clusters, tests,",
             "benchmarks; `rank`: not csrun's own (torchrun's, TensorFlow's), set for each trainer rank",
             "of a job of several ([MULTI-RANK.md](MULTI-RANK.md)).", "",
             "To add a variable: declare it in `csrun_common/env.py` (a `Var`), import it where it is",
             "written and read (never spell its name), make a `task` variable a `TaskEnv` field (its",
             "`encode` and `decode`), then regenerate this file. A new exit status: `csrun_common/exits.py`.",
             "", "## Variables", "",
             "| variable | scope | value | written by | read by | meaning |", "|---|---|---|---|---|---|"]
    for scope in SCOPES:
        for v in VARIABLES.values():
            if v.scope == scope:
                lines.append(_row(f"`{v.name}`", v.scope, v.kind, v.writer, v.reader, v.meaning))
    lines += ["", "## Exit statuses", "", "| status | name | exits with it | meaning |", "|---|---|---|---|"]
    for s in exits.STATUSES:
        lines.append(_row(str(s.code), f"`{s.name}`", s.who, s.meaning))
    return "\n".join(lines) + "\n"


def _row(*cells: str) -> str:
    """One Markdown table row (``|`` in a cell escaped)."""
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


if __name__ == "__main__":
    print(render_markdown(), end="")
