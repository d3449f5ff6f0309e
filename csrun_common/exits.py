"""csrun's exit statuses, declared once for both sides (the CLIs, the batch script, the tasks).

``docs/ENV.md`` lists them (generated from :data:`STATUSES` by ``python -m csrun_common.env``;
``tests/unit/csrun_common/test_exits.py`` checks it and that no module writes these numbers itself).
"""
from __future__ import annotations

from typing import NamedTuple

__all__ = ["Status", "STATUSES", "OK", "FAILED", "USAGE", "REQUEUE", "TIMEOUT", "EXEC_FAILED", "INTERRUPTED",
           "TERMINATED"]


class Status(NamedTuple):
    """One exit status: ``code`` (0..255), ``name`` (its constant here), who exits with it
    (``who``) and what it means (``meaning``)."""

    code: int
    name: str
    who: str
    meaning: str


#: Success.
OK = 0
#: A run that failed (a task, a probe, a drain that measured nothing).
FAILED = 1
#: Bad input: a one-line ``<prog>: error: ...`` (:class:`csrun_common.errors.CsrunError`, click's
#: usage errors); nothing has been submitted. The convention of argparse and click. Also the
#: chief's status for a mistake the runtime names in the job (a contract violation, an
#: exception of the user's Dataset on an input worker), which csrun_wse's srun path returns as
#: the first failing task's own status (launcher/tasklog.py ``TaskOutput.exit_status``).
USAGE = 2
#: The chief saved a checkpoint and stopped on ``--requeue``'s signal so that the job be
#: requeued: EX_TEMPFAIL of sysexits.h ("temporary failure, indicating something that is not
#: really an error ... the user is invited to retry the operation later").
REQUEUE = 75
#: A launch stopped at its time limit by csrun itself (``cs_input_analyzer verify --timeout``,
#: a probe's deadline): the status timeout(1) reports.
TIMEOUT = 124
#: The command could not be executed (POSIX shells' "command not found or not executable").
EXEC_FAILED = 127
#: Interrupted (Ctrl-C): 128 + SIGINT, as a shell reports it.
INTERRUPTED = 130
#: Terminated (``scancel``, SIGTERM): 128 + SIGTERM, as a shell reports it.
TERMINATED = 143

#: Every status, by code.
STATUSES: tuple[Status, ...] = (
    Status(OK, "OK", "every command", "success"),
    Status(FAILED, "FAILED", "every command", "the run failed (a task, a probe, a drain that measured nothing)"),
    Status(USAGE, "USAGE", "csrun_wse, csrun_cpu, cs_input_analyzer, probe processes; the chief",
           "bad input: one line `<prog>: error: <flag> <value>: why`, nothing submitted; from a job "
           "(csrun_wse's srun path: the first failing task's own status), a mistake the runtime named: "
           "a contract violation, a user's exception on an input worker (docs/ERRORS.md)"),
    Status(REQUEUE, "REQUEUE", "the chief (csrun_runtime.preemption); csrun_wse's srun path and batch script read it",
           "checkpoint saved on --requeue's signal: requeue the job (EX_TEMPFAIL of sysexits.h)"),
    Status(TIMEOUT, "TIMEOUT", "cs_input_analyzer (verify --timeout, a probe past its deadline)",
           "stopped by csrun at its time limit (timeout(1)'s status)"),
    Status(EXEC_FAILED, "EXEC_FAILED", "csrun_runtime.supervise, launcher.argv_exec",
           "the command cannot be executed (the shells' 127)"),
    Status(INTERRUPTED, "INTERRUPTED", "csrun_wse, csrun_cpu, cs_input_analyzer", "Ctrl-C (128 + SIGINT)"),
    Status(TERMINATED, "TERMINATED", "csrun_wse (srun path), the probe agent",
           "SIGTERM, e.g. scancel (128 + SIGTERM)"),
)
