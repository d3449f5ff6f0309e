"""Python functions as Slurm jobs, through submitit's ``SlurmExecutor`` (the analyzer's
probe agents); submitit is imported only here, lazily, so that the CLIs' start-up does not pay
for it."""
from __future__ import annotations

import contextlib
import io
import shlex
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from csrun_common.errors import CsrunError, SlurmUnavailable

from . import command
from .queries import ACTIVE_STATES, accounting_enabled, job_state

if TYPE_CHECKING:
    import submitit

R = TypeVar("R")


@dataclass(frozen=True)
class FunctionJobSpec:
    """How :func:`submit_function` runs a Python function: one task on one node.

    Attributes:
        folder: submitit's directory (the pickled call, its result, the job's log
            ``<job id>_0_log.out``); it must be on a file system the node shares.
        job_name: ``--job-name``.
        cpus_per_task: CPUs of the task (``None``: Slurm's default); passed to the job and
            to its step (srun(1) of Slurm 22.05 no longer takes it from the job).
        exclusive: ``--exclusive`` (the node holds no other job).
        partition, account, exclude: ``--partition``, ``--account``, ``--exclude`` ("" : not given).
        time_min: ``--time`` in minutes (the job ends at the latest then).
        chdir: the job's working directory ("": the caller's).
        python: argv of the interpreter on the node (a container's ``exec`` prefix and its
            ``python``); empty: the interpreter running this code.
        srun_args: more options of the job's step (e.g. a Pyxis container's).
    """

    folder: Path
    job_name: str
    cpus_per_task: int | None = None
    exclusive: bool = True
    partition: str = ""
    account: str = ""
    exclude: str = ""
    time_min: int = 60
    chdir: str = ""
    python: tuple[str, ...] = ()
    srun_args: tuple[str, ...] = ()

    def executor_parameters(self) -> dict[str, object]:
        """The ``submitit.SlurmExecutor.update_parameters`` keywords of this spec."""
        srun_args = ["--cpu-bind=none", "--kill-on-bad-exit=1", *self.srun_args]
        if self.cpus_per_task:
            srun_args.insert(0, f"--cpus-per-task={self.cpus_per_task}")
        params: dict[str, object] = {
            "job_name": self.job_name, "nodes": 1, "ntasks_per_node": 1, "time": max(1, int(self.time_min)),
            "stderr_to_stdout": True, "srun_args": srun_args}
        if self.cpus_per_task:
            params["cpus_per_task"] = int(self.cpus_per_task)
        if self.exclusive:
            params["exclusive"] = True
        for key in ("partition", "account", "exclude"):
            if getattr(self, key):
                params[key] = getattr(self, key)
        if self.chdir:
            params["additional_parameters"] = {"chdir": self.chdir}
        return params


def function_executor(spec: FunctionJobSpec) -> submitit.SlurmExecutor:
    """A ``submitit.SlurmExecutor`` for ``spec``: its jobs are an sbatch script whose one
    srun step runs ``python -u -m submitit.core._submit FOLDER``, which unpickles the call,
    runs it and pickles its result (submitit's own design). Imports submitit.

    Raises :class:`SlurmUnavailable` when no Slurm client is installed.
    """
    submitit = _submitit()
    python = shlex.join(spec.python) if spec.python else None
    try:
        ex = submitit.SlurmExecutor(folder=spec.folder, python=python)
    except RuntimeError as exc:  # "Could not detect srun"
        raise SlurmUnavailable(f"srun: not found on PATH; is the Slurm client installed? ({exc})") from None
    ex.update_parameters(**spec.executor_parameters())
    return ex


def submit_function(spec: FunctionJobSpec, fn: Callable[..., R], *args: object) -> submitit.Job[R]:
    """Submit ``fn(*args)`` as a Slurm job (:func:`function_executor`); returns submitit's
    job (``job_id``, ``result()``, ``paths.stdout``). The call and its arguments are pickled
    into ``spec.folder``.

    Raises :class:`SlurmUnavailable` as :func:`function_executor`, :class:`CsrunError` with
    sbatch's last line when sbatch refuses the job.
    """
    command.check_conf()
    ex = function_executor(spec)
    submitit = _submitit()
    quiet = io.StringIO()  # submitit prints sbatch's stderr on a failure: one line is ours to print
    try:
        with contextlib.redirect_stderr(quiet):
            return ex.submit(fn, *args)
    except (submitit.core.utils.FailedJobError, submitit.core.utils.FailedSubmissionError) as exc:
        msg = (str(exc).strip().splitlines() or ["(no message)"])[-1]
        raise CsrunError(f"sbatch refused the job {spec.job_name}: {msg}") from None


def job_returned(job: submitit.Job[object]) -> bool:
    """Whether a submitted function has returned or raised: submitit's result file exists."""
    return bool(job.paths.result_pickle.exists())


def job_active(job: submitit.Job[object], env: Mapping[str, str] | None = None) -> bool:
    """True while a submitted function's job is pending or running.

    False once the function returned or raised (:func:`job_returned`), or when the job's
    state is final: with job accounting, submitit's own state (``Job.done``, from ``sacct``);
    without it (``sacct`` cannot answer: submitit's state would stay ``UNKNOWN``) and while
    the job runs, :func:`job_state` (``squeue``, which knows a job until ``MinJobAge``
    seconds after it ended). A job neither knows any more has ended. When slurmctld does not
    answer, the job counts as active (the caller's own timeout decides).
    """
    if job_returned(job):
        return False
    if accounting_enabled(env) and job.done():
        return False
    try:
        state = job_state(str(job.job_id), env)
    except SlurmUnavailable:
        return True
    return state in ACTIVE_STATES


def cancel_job(job: submitit.Job[object]) -> None:
    """Cancel a submitted function's job that has not returned (submitit's ``Job.cancel``:
    ``scancel JOBID``, which signals every step and ends the job)."""
    if job_returned(job):
        return
    try:
        job.cancel(check=False)
    except OSError:
        pass



def _submitit() -> types.ModuleType:
    """Import submitit (lazily: ~70 ms that ``csrun_wse --help`` does not need) and quiet its
    logger in this process: its ``sacct`` watcher warns on every poll on a cluster without
    job accounting, where :func:`job_active` asks ``squeue`` instead."""
    import logging  # with submitit: not at the CLI's start-up

    import submitit  # lazy: only the analyzer's probe jobs use it

    logging.getLogger("submitit").setLevel(logging.ERROR)
    return submitit

