"""srun in the foreground: the child csrun_wse / csrun_cpu waits on, SIGINT/SIGTERM
forwarded so the tasks stop cleanly, its labelled output through :mod:`launcher.tasklog`; the
input workers' own job beside it (``--survive-node-loss``); stopping a process group."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence

from csrun_common.errors import CsrunError

from ..tasklog import TaskOutput
from . import command
from .logfile import TaskLogFile, pump, pump_plain, show, task_log

#: Seconds the tasks get to stop by themselves after csrun passed them a SIGINT (the runtime's
#: chief saves a checkpoint and writes its verdict, README "Ctrl-C"); a still-running srun then
#: gets SIGTERM, on which srun SIGKILLs its tasks (srun's signal handling: SIGTERM and SIGHUP
#: "force job termination"). A task that dies of SIGINT (``sleep``) ends the step at once.
INTERRUPT_GRACE_S = 30.0
#: srun's input variable for ``-X, --disable-status`` (srun(1)): a single SIGINT is passed on
#: to the tasks at once and the step goes on, instead of srun's "one more within 1 sec to
#: abort", whose second SIGINT SIGKILLs the tasks ~50 ms after their SIGINT (measured here:
#: no time to save a checkpoint).
DISABLE_STATUS_ENV = "SLURM_DISABLE_STATUS"
#: Seconds csrun waits before passing a SIGINT on to srun: a terminal's Ctrl-C reaches srun
#: itself too, and two SIGINTs within srun's one-second window (counted in whole seconds)
#: make srun SIGKILL the tasks even with --disable-status (measured); 2 s apart they are two
#: Ctrl-Cs the tasks see.
FORWARD_DELAY_S = 2.1


def _terminate_if_running(proc: subprocess.Popen) -> None:
    if proc.returncode is None:
        try:
            os.kill(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass


def _interrupt_if_running(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.kill(proc.pid, signal.SIGINT)
        except ProcessLookupError:
            pass


def _forward_signals(proc: subprocess.Popen, received: list[int]) -> dict:
    """Forward SIGINT/SIGTERM to ``proc`` (an srun started with :data:`DISABLE_STATUS_ENV`)
    and note each in ``received``. The first of either is sent on as one SIGINT,
    :data:`FORWARD_DELAY_S` later, which srun passes to every task at once without ending the
    step (SIGTERM is not sent on as is: srun answers it by SIGKILLing its tasks), so that the
    tasks stop cleanly; srun gets SIGTERM :data:`INTERRUPT_GRACE_S` later if it still runs, or
    at once on a second signal to csrun a second or more after the first."""
    old = {}
    first: list[float] = []

    def handler(signum, _frame):
        received.append(signum)
        if proc.poll() is not None:
            return
        try:
            if not first:
                first.append(time.monotonic())
                later = threading.Timer(FORWARD_DELAY_S, _interrupt_if_running, (proc,))
                later.daemon = True
                later.start()
                timer = threading.Timer(INTERRUPT_GRACE_S, _terminate_if_running, (proc,))
                timer.daemon = True
                timer.start()
                try:
                    os.write(2, f"csrun: {signal.Signals(signum).name}: the tasks got SIGINT and stop cleanly "
                                f"(up to {INTERRUPT_GRACE_S:.0f} s); send it again to end them now\n".encode())
                except OSError:
                    pass
            elif time.monotonic() - first[0] >= 1.0:
                _terminate_if_running(proc)
        except ProcessLookupError:
            pass

    for sig in (signal.SIGINT, signal.SIGTERM):
        old[sig] = signal.signal(sig, handler)
    return old


def exit_status(returncode: int, received: Sequence[int]) -> int:
    """csrun's exit status after srun ended: ``128 + N`` for the first SIGINT/SIGTERM ``N`` the user
    sent csrun (130, 143); else srun's status, ``128 + N`` when srun died of signal ``N``."""
    if received:
        return 128 + int(received[0])
    return 128 - returncode if returncode < 0 else returncode


#: How long csrun_wse waits, after srun ended, for its pipes' last lines before the summary
#: (seconds); lines later still go to the task log only (:attr:`launcher.tasklog.TaskOutput.finished`).
PUMP_DRAIN_S = 60.0


def run_foreground(argv: Sequence[str], env: dict | None = None, output: TaskOutput | None = None,
                   log: TaskLogFile | None = None) -> int:
    """Run ``argv`` (an srun line) as a child, forwarding SIGINT/SIGTERM; returns the exit
    status of :func:`exit_status` (130 / 143 when the user interrupted or terminated csrun).

    With ``output`` (a csrun_wse launch: srun with ``--label --verbose``), srun's stdout and
    stderr pass through it (:mod:`launcher.tasklog`): the chief's lines reach this process's
    stdout/stderr live, every line goes to ``log`` (default: a new :func:`task_log`, closed at
    the end), and a failed job ends on its first failing task's first error, once, and the exit
    status, which is then that task's own exit code when it exited with one
    (:meth:`launcher.tasklog.TaskOutput.exit_status`: 2 for a mistake the runtime named, not the
    143 of the tasks srun ended after it)."""
    command.check_conf()
    env = {**(os.environ if env is None else env), DISABLE_STATUS_ENV: "1"}  # see _forward_signals
    if output is None:
        try:
            proc = subprocess.Popen([command.require(argv[0]), *argv[1:]], env=env)
        except OSError as exc:
            raise CsrunError(f"cannot start {argv[0]}: {exc.strerror}") from None
        return _wait_forwarding(proc)[0]
    own_log = log is None
    log = log or task_log()
    try:
        proc = subprocess.Popen([command.require(argv[0]), *argv[1:]], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
    except OSError as exc:
        if own_log:
            log.close()
        raise CsrunError(f"cannot start {argv[0]}: {exc.strerror}") from None
    lock = threading.Lock()
    pumps = [threading.Thread(target=pump, args=(pipe, name, output, log, lock), daemon=True)
             for pipe, name in ((proc.stdout, "out"), (proc.stderr, "err"))]
    for t in pumps:
        t.start()
    try:
        status, received = _wait_forwarding(proc)
        for t in pumps:  # every line srun printed is read before the summary (a loaded host can lag)
            t.join(timeout=PUMP_DRAIN_S)
        log.finish(status, output)
        with lock:  # the first failing task's own status, not srun's highest (launcher/tasklog.py)
            status = output.exit_status(status, interrupted=bool(received))
            show(output.finish(status, log.shown_path(), interrupted=bool(received)))
    finally:
        if own_log:
            log.close()
    return status


def _wait_forwarding(proc: subprocess.Popen) -> tuple[int, list[int]]:
    received: list[int] = []
    old = _forward_signals(proc, received)
    try:
        rc = proc.wait()
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)
    return exit_status(rc, received), received



def run_with_worker_job(chief_argv: Sequence[str], worker_argv: Sequence[str], env: dict | None = None,
                        grace: float | None = None, output: TaskOutput | None = None,
                        log: TaskLogFile | None = None) -> int:
    """Run the chief's job (``chief_argv``, an srun line) in the foreground, as :func:`run_foreground`
    does, and the input workers' own job (``worker_argv``) beside it in a session of its own.
    Once the chief's srun has ended, the workers' srun gets ``grace`` seconds (default
    :data:`launcher.builders.WORKER_JOB_GRACE_S`) to end by itself, then is stopped
    (:func:`stop_process_group`: a step still pending or running is cancelled). Returns the
    chief's status (:func:`exit_status`): the chief decides the job; a worker job that ended
    early is reported on stderr. With ``output``, the workers' job's lines go to the chief's
    job's task log only (``log``, default: a new :func:`task_log`, closed at the end)."""
    command.check_conf()
    if grace is None:
        from ..builders import WORKER_JOB_GRACE_S  # lazy: csrun status/list need no builder

        grace = WORKER_JOB_GRACE_S
    own_log = log is None
    log = (log or task_log()) if output is not None else None
    try:
        workers = subprocess.Popen([command.require(worker_argv[0]), *worker_argv[1:]], env=env,
                                   start_new_session=True, stdout=subprocess.PIPE if log else None,
                                   stderr=subprocess.STDOUT if log else None)
    except OSError as exc:
        if log and own_log:
            log.close()
        raise CsrunError(f"cannot start {worker_argv[0]}: {exc.strerror}") from None
    if log and workers.stdout:
        threading.Thread(target=pump_plain, args=(workers.stdout, log, "[workers' job] "), daemon=True).start()
    try:
        rc = run_foreground(chief_argv, env=env, output=output, log=log)
    finally:
        try:
            workers.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            stop_process_group(workers)
        if log and own_log:
            log.close()
    if workers.returncode not in (0, None) and rc == 0:
        print(f"csrun_wse: the input workers' job ended with status {workers.returncode}", file=sys.stderr)
    return rc


def stop_process_group(proc: subprocess.Popen, grace: float = 10.0) -> None:
    """Stop a child started with ``start_new_session=True`` (a csrun_wse or srun) and its
    whole process group: SIGINT twice (srun(1): two within a second cancel the step), then
    SIGKILL after ``grace`` seconds. Used by ``cs_input_analyzer verify`` and the benchmarks."""
    for sig in (signal.SIGINT, signal.SIGINT):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            break
        time.sleep(0.3)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait(timeout=10)

