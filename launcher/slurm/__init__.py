"""The one package of csrun that runs Slurm commands (sinfo, squeue, sacct, sacctmgr,
scontrol, srun, sbatch, scancel), directly or through submitit.

Everything else builds data; this package executes it. Commands are always run as argv lists,
never through a shell (:mod:`.command`). Its modules, along their seams: :mod:`.queries` (nodes,
job states, the queue, accounting), :mod:`.foreground` (srun as a child with signals forwarded),
:mod:`.logfile` (the srun path's task log), :mod:`.batch` (sbatch), :mod:`.jobs` (recorded runs'
jobs: squeue, sacct, scancel), :mod:`.functions` (Python functions as jobs through submitit,
imported lazily), :mod:`.site` (``--test-only``, sacctmgr, site-policy names). Callers use the
names re-exported here.
"""
from .batch import submit_batch
from .command import QUERY_TIMEOUT_S, SUBMIT_TIMEOUT_S
from .foreground import (
    DISABLE_STATUS_ENV,
    FORWARD_DELAY_S,
    INTERRUPT_GRACE_S,
    exit_status,
    run_foreground,
    run_with_worker_job,
    stop_process_group,
)
from .functions import FunctionJobSpec, cancel_job, function_executor, job_active, job_returned, submit_function
from .jobs import JobRow, sacct_rows, signal_job, squeue_rows
from .logfile import LOG_DIR_ENV, TaskLogFile, task_log
from .queries import (
    ACTIVE_STATES,
    PING_TIMEOUT_S,
    NodeInfo,
    accounting_enabled,
    cpu_node_cpus,
    job_state,
    list_nodes,
    node_hosts,
    parse_ping,
    ping,
    queued_job_ids,
    queued_jobs,
    version,
)
from .site import (
    TestOnly,
    accounts,
    config_values,
    node_features,
    parse_slurm_version,
    parse_test_only,
    qos_names,
    reservations,
    slurm_release,
    test_only_batch,
    test_only_srun,
)

__all__ = [
    "ACTIVE_STATES", "DISABLE_STATUS_ENV", "FORWARD_DELAY_S", "INTERRUPT_GRACE_S", "LOG_DIR_ENV", "PING_TIMEOUT_S",
    "QUERY_TIMEOUT_S", "SUBMIT_TIMEOUT_S", "FunctionJobSpec", "JobRow", "NodeInfo", "TaskLogFile", "TestOnly",
    "accounting_enabled", "accounts", "cancel_job", "config_values", "cpu_node_cpus", "exit_status",
    "function_executor", "job_active", "job_returned", "job_state", "list_nodes", "node_features", "node_hosts",
    "parse_ping", "parse_slurm_version", "parse_test_only", "ping", "qos_names", "queued_job_ids", "queued_jobs",
    "reservations", "run_foreground", "run_with_worker_job", "sacct_rows", "signal_job", "slurm_release",
    "squeue_rows", "stop_process_group", "submit_batch", "submit_function", "task_log", "test_only_batch",
    "test_only_srun", "version",
]
