"""``csrun_wse --requeue``: the warning signal, its lead time and the retry budget, as pure
data (the batch script renders it; :mod:`csrun_runtime.preemption` acts on it in the tasks).

How a requeue works (docs/REQUEUE.md):

1. Slurm signals the job's steps ``lead`` seconds before the time limit: sbatch(1)
   ``--signal=<sig>@<lead>`` ("When a job is within sig_time seconds of its end time, send
   it the signal sig_num. Due to the resolution of event handling by Slurm, the signal may
   be sent up to 60 seconds earlier than specified."). On preemption or ``scontrol
   requeue`` the tasks get SIGTERM and, ``KillWait`` seconds later, SIGKILL (slurm.conf(5)
   ``KillWait``), so the runtime treats SIGTERM the same way.
2. The chief (:mod:`csrun_runtime.preemption`) finishes its step, saves a checkpoint at that
   global step, tells the input workers it is done (they keep no state and merely leave),
   and exits with :data:`REQUEUE_EXIT`.
3. The batch script sees that status and runs ``scontrol requeue $SLURM_JOB_ID`` while the
   job has requeues left (scontrol(1) ``requeue``: "Requeue a running, suspended or
   finished Slurm batch job into pending state"); the script starts again from its
   beginning in the next allocation, and the chief restores the newest checkpoint
   (``runconfig.autoload_last_checkpoint``). On the srun path csrun_wse itself launches the
   same srun again (an interactive job cannot be requeued: only batch jobs can).

The signal: **SIGUSR2** by default, as submitit's (``JobEnvironment.USR_SIG``; its pull
request #1697 moved off SIGUSR1 because "NCCL catches it"), and like it a 90-second lead
(submitit's ``signal_delay_s``). SIGUSR2 has no default meaning to Python, TensorFlow,
gRPC or NCCL; SIGTERM cannot be the warning, because it is also what ``scancel`` and the
time limit itself send.
"""
from __future__ import annotations

import re
import signal
from dataclasses import dataclass

from csrun_common import env as env_codec
from csrun_common import exits
from csrun_common.errors import CsrunError

__all__ = ["RequeueSpec", "parse_signal_spec", "REQUEUE_EXIT", "DEFAULT_SIGNAL", "DEFAULT_MAX_REQUEUES",
           "STOP_SIGNALS_ENV", "REQUEUE_COUNT_ENV"]

#: Exit status of a chief that saved a checkpoint and stopped so that the job be requeued
#: (EX_TEMPFAIL), and the variables of ``--requeue``: declared in :mod:`csrun_common.exits` and
#: :mod:`csrun_common.env` (shared with ``csrun_runtime.preemption``; docs/ENV.md).
REQUEUE_EXIT = exits.REQUEUE
DEFAULT_SIGNAL = "USR2@90"
DEFAULT_MAX_REQUEUES = 3
#: Environment variable csrun_wse exports with ``--requeue``: the signals the tasks'
#: runtime turns into "checkpoint and stop" (docs/CONTRACT.md).
STOP_SIGNALS_ENV = env_codec.STOP_SIGNALS
#: Environment variable csrun_wse exports on the srun path: how many times it relaunched
#: (the batch path has Slurm's ``SLURM_RESTART_COUNT``).
REQUEUE_COUNT_ENV = env_codec.REQUEUE_COUNT

_SPEC_RE = re.compile(r"^(?:SIG)?(?P<sig>[A-Z0-9]+)(?:@(?P<lead>\d+))?$")

#: Signals a task may handle and Slurm can send; the others would stop or kill the task
#: whatever it does (SIGKILL, SIGSTOP) or mean a fault (SIGSEGV ...).
ALLOWED = ("USR1", "USR2", "HUP", "TERM", "INT", "QUIT", "ALRM", "URG", "WINCH", "XCPU", "PWR")


def parse_signal_spec(value: str, flag: str = "--requeue-signal") -> tuple[str, int]:
    """``"USR2@90"`` → ``("USR2", 90)``: a signal name (with or without ``SIG``) or number
    and the lead time in seconds (sbatch(1) ``--signal``: "sig_time must have an integer
    value between 0 and 65535 ... If a sig_num is specified without any sig_time, the
    default time will be 60 seconds").

    Raises :class:`CsrunError` naming ``flag`` and the value for an unknown or unusable
    signal or a lead time outside 1..65535.
    """
    text = value.strip().upper()
    m = _SPEC_RE.match(text)
    if not m:
        raise CsrunError(f"{flag} {value!r}: not SIGNAL@SECONDS (e.g. USR2@90)")
    sig = m.group("sig")
    if sig.isdigit():
        try:
            sig = signal.Signals(int(sig)).name[3:]
        except ValueError:
            raise CsrunError(f"{flag} {value!r}: no signal number {sig}") from None
    if sig not in ALLOWED:
        raise CsrunError(f"{flag} {value!r}: SIG{sig} cannot be the warning signal; "
                         f"use one of {', '.join(ALLOWED)} (default {DEFAULT_SIGNAL})")
    lead = int(m.group("lead")) if m.group("lead") is not None else 60
    if not 1 <= lead <= 65535:
        raise CsrunError(f"{flag} {value!r}: the lead time must be 1..65535 seconds")
    return sig, lead


@dataclass(frozen=True)
class RequeueSpec:
    """``--requeue`` of one launch.

    Attributes:
        signal: the warning signal's name without ``SIG`` (``"USR2"``).
        lead: seconds before the time limit at which Slurm sends it.
        max_requeues: requeues allowed (``--max-requeues``; 0: checkpoint and stop, never
            requeue). Counted by Slurm (``SLURM_RESTART_COUNT``, whatever requeued the job:
            csrun, preemption, ``scontrol requeue``, a node failure) on the batch path, by
            csrun_wse on the srun path.
    """

    signal: str = "USR2"
    lead: int = 90
    max_requeues: int = DEFAULT_MAX_REQUEUES

    @classmethod
    def parse(cls, spec: str, max_requeues: int, flag: str = "--requeue-signal",
              max_flag: str = "--max-requeues") -> RequeueSpec:
        """From ``"SIG@SECONDS"`` and the budget; raises :class:`CsrunError` (see
        :func:`parse_signal_spec`; a negative budget)."""
        if max_requeues < 0:
            raise CsrunError(f"{max_flag} {max_requeues}: must be 0 or more")
        sig, lead = parse_signal_spec(spec, flag)
        return cls(sig, lead, max_requeues)

    def check_time_limit(self, time_seconds: int | None, time_flag: str = "--time",
                         flag: str = "--requeue-signal") -> None:
        """Refuse a lead time not shorter than the time limit (``time_seconds``, seconds).

        Raises :class:`CsrunError` naming both values."""
        if time_seconds is not None and self.lead >= time_seconds:
            raise CsrunError(f"{flag} {self.spec}: the lead time {self.lead} s must be shorter than "
                             f"the time limit ({time_flag}: {time_seconds} s)")

    @property
    def spec(self) -> str:
        """``"USR2@90"``."""
        return f"{self.signal}@{self.lead}"

    def sbatch_option(self) -> str:
        """``--signal=USR2@90``: sbatch(1)/srun(1) ``--signal`` signals all job steps, not the batch shell."""
        return f"--signal={self.spec}"

    def stop_signals(self) -> str:
        """The value of :data:`STOP_SIGNALS_ENV`: the warning signal and SIGTERM, ``:``-separated."""
        return ":".join(dict.fromkeys([self.signal, "TERM"]))
