"""The one module of csrun that runs Slurm commands (sinfo, squeue, sacct, sacctmgr,
scontrol, srun, sbatch, scancel), directly or through submitit.

Everything else builds data; this module executes it. Commands are always run as
argv lists, never through a shell. The analyzer's probe jobs are Python functions run
through ``submitit.SlurmExecutor`` (:func:`submit_function`); submitit is imported only
there, so that the CLIs' start-up does not pay for it.
"""
from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import types
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from csrun_common.env import LOG_DIR
from csrun_common.errors import CsrunError, SlurmUnavailable

from .builders import WORKER_JOB_GRACE_S
from .tasklog import TaskOutput, is_supervisor_notice, parse_label

if TYPE_CHECKING:
    import submitit

#: Seconds a Slurm query (sinfo, squeue, sacct, sacctmgr, scontrol show) may take before
#: csrun says slurmctld does not answer: a client retries a stopped controller for ~20 s
#: here (MessageTimeout), and a dry run must not hang on it.
QUERY_TIMEOUT_S = 5.0
#: Seconds an sbatch submission may take (a submission that timed out may still have
#: been accepted, so it gets longer than a query).
SUBMIT_TIMEOUT_S = 30.0
R = TypeVar("R")


@dataclass(frozen=True)
class NodeInfo:
    """One node as ``sinfo -N`` reports it: name, CPUs (count), GRES (``(null)`` → ""),
    state (``idle``, ``alloc``, ``down*`` ...) and partition."""

    name: str
    cpus: int
    gres: str
    state: str
    partition: str


def _require(binary: str) -> str:
    path = shutil.which(binary)
    if not path:
        raise SlurmUnavailable(f"{binary}: not found on PATH; is the Slurm client installed?")
    return path


def _check_conf(env: Mapping[str, str] | None = None) -> None:
    conf = (os.environ if env is None else env).get("SLURM_CONF")
    if conf and not os.path.exists(conf):
        # sinfo would retry for 60 s on a missing file; fail at once instead.
        raise SlurmUnavailable(f"SLURM_CONF={conf}: no such file")


def _run(argv: list[str], env: Mapping[str, str] | None = None, timeout: float = QUERY_TIMEOUT_S,
         input_text: str | None = None) -> subprocess.CompletedProcess:
    """Run a Slurm client command (``argv[0]`` looked up on PATH; ``input_text`` on its
    stdin) and capture its text output, whatever its exit status. Raises
    :class:`SlurmUnavailable` when the binary is missing, ``SLURM_CONF`` (of ``env``, else
    this process) names no file, or the command does not answer within ``timeout`` seconds."""
    _check_conf(env)
    argv = [_require(argv[0]), *argv[1:]]
    try:
        return subprocess.run(argv, input=input_text, capture_output=True, text=True, timeout=timeout,
                              env=dict(env) if env is not None else None)
    except subprocess.TimeoutExpired:
        raise SlurmUnavailable(f"{os.path.basename(argv[0])} did not answer in {timeout:.0f} s: "
                               "is slurmctld running and reachable?") from None


def _query(argv: list[str], env: Mapping[str, str] | None = None) -> str:
    proc = _run(argv, env)
    if proc.returncode != 0:
        msg = (proc.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise SlurmUnavailable(f"cannot reach slurmctld ({os.path.basename(argv[0])}: {msg})")
    return proc.stdout


def list_nodes(partition: str = "", flag: str = "--partition") -> list[NodeInfo]:
    """Nodes of ``partition`` (all partitions when empty) from ``sinfo -N``.

    Raises :class:`SlurmUnavailable` when slurmctld cannot be reached, and
    :class:`CsrunError` naming the partition when it does not exist.
    """
    argv = ["sinfo", "--noheader", "--Node", "--format=%N|%c|%G|%t|%P"]
    if partition:
        argv.append(f"--partition={partition}")
    nodes = []
    for line in _query(argv).splitlines():
        parts = line.strip().split("|")
        if len(parts) != 5:
            continue
        name, cpus, gres, state, part = parts
        nodes.append(NodeInfo(name, int(cpus), "" if gres == "(null)" else gres, state, part.rstrip("*")))
    if partition and not nodes:
        known = sorted({n.partition for n in list_nodes("")})
        raise CsrunError(f"{flag} {partition!r}: no such partition in Slurm (partitions: {', '.join(known) or 'none'})")
    if not nodes:
        raise CsrunError("sinfo reports no nodes: the cluster has no usable partition")
    return nodes


#: Seconds ``scontrol ping`` may take before a ``--dry-run`` takes slurmctld for absent: a
#: controller that answers nothing in that time would make every query wait out
#: :data:`QUERY_TIMEOUT_S`.
PING_TIMEOUT_S = 1.0


def parse_ping(stdout: str) -> str:
    """``scontrol ping``'s answer: ``"up"`` when a controller (primary or backup) says
    ``UP``, ``"down"`` when every one says ``DOWN``, else ``"unknown"``."""
    states = re.findall(r"\bis (UP|DOWN)\b", stdout)
    if "UP" in states:
        return "up"
    return "down" if states else "unknown"


def ping(timeout: float = PING_TIMEOUT_S, env: Mapping[str, str] | None = None) -> tuple[str, str]:
    """Whether slurmctld answers, asked with ``scontrol ping`` (one connection attempt per
    controller: 0.04 s when the controller is down here, where ``sinfo`` retries for
    MessageTimeout, ~19 s). Returns ``(state, message)``: ``state`` is ``"up"``, ``"down"``
    (its message says why), ``"timeout"`` (no answer within ``timeout`` seconds) or
    ``"unknown"`` (no Slurm client, no configuration, an answer not understood: the caller
    asks its real question and gets the real error). Never raises."""
    try:
        proc = _run(["scontrol", "ping"], env, timeout=timeout)
    except SlurmUnavailable as exc:
        return ("timeout" if "did not answer" in str(exc) else "unknown"), str(exc)
    state = parse_ping(proc.stdout)
    first = (proc.stdout.strip().splitlines() or [""])[0]
    return state, f"slurmctld does not answer (scontrol ping: {first})" if state == "down" else first


def cpu_node_cpus(nodes: Sequence[NodeInfo], exclude: str | Collection[str] = "") -> int:
    """CPUs of one CPU node: the smallest CPU count over ``nodes`` other than ``exclude``
    (the GRES node(s): one name, or a collection of names), so that a per-node layout fits on
    any of them. Falls back to all nodes when only excluded ones exist."""
    skip = {exclude} if isinstance(exclude, str) else set(exclude)
    cpus = [n.cpus for n in nodes if n.name not in skip] or [n.cpus for n in nodes]
    return min(cpus)


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
    """The exit status of csrun after its srun child ended: ``128 + N`` for the first of
    SIGINT/SIGTERM the user sent csrun (130 for Ctrl-C, 143 for SIGTERM, as a shell reports
    a command killed by that signal), whatever srun's tasks died of (a cancelled step's
    tasks get SIGKILL: 137); else srun's status, ``128 + N`` when srun itself died of
    signal N."""
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
    _check_conf()
    env = {**(os.environ if env is None else env), DISABLE_STATUS_ENV: "1"}  # see _forward_signals
    if output is None:
        try:
            proc = subprocess.Popen([_require(argv[0]), *argv[1:]], env=env)
        except OSError as exc:
            raise CsrunError(f"cannot start {argv[0]}: {exc.strerror}") from None
        return _wait_forwarding(proc)[0]
    own_log = log is None
    log = log or task_log()
    try:
        proc = subprocess.Popen([_require(argv[0]), *argv[1:]], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
    except OSError as exc:
        if own_log:
            log.close()
        raise CsrunError(f"cannot start {argv[0]}: {exc.strerror}") from None
    lock = threading.Lock()
    pumps = [threading.Thread(target=_pump, args=(pipe, name, output, log, lock), daemon=True)
             for pipe, name in ((proc.stdout, "out"), (proc.stderr, "err"))]
    for t in pumps:
        t.start()
    try:
        status, received = _wait_forwarding(proc)
        for t in pumps:  # every line srun printed is read before the summary (a loaded host can lag)
            t.join(timeout=PUMP_DRAIN_S)
        with lock:  # the first failing task's own status, not srun's highest (launcher/tasklog.py)
            status = output.exit_status(status, interrupted=bool(received))
            _show(output.finish(status, log.shown_path(), interrupted=bool(received)))
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


class TaskLogFile:
    """The log of one csrun_wse launch (srun path): every line its srun printed, as srun printed
    it (each task's lines under srun's ``--label``), and the input workers' own job's lines
    under ``[workers' job]``. Written to ``<dir>/csrun_wse-<pid>.log`` from the start, renamed
    ``csrun_wse-<job id>.log`` once srun names the job. Thread-safe."""

    def __init__(self, directory: Path):
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / f"csrun_wse-{os.getpid()}-{int(time.time())}.log"
        self._file = open(self.path, "w", encoding="utf-8", errors="replace")  # noqa: SIM115 - closed by close()
        self._lock = threading.Lock()

    def write(self, line: str, job_id: str | None = None) -> None:
        """Append one line; with ``job_id`` (the job is known), rename the file after it once."""
        with self._lock:
            if self._file.closed:  # the input workers' job may outlive the launch by a line
                return
            self._file.write(line + "\n")
            self._file.flush()
            if job_id and not self.path.name.startswith(f"csrun_wse-{job_id}."):
                target = self.path.with_name(f"csrun_wse-{job_id}.log")
                if not target.exists():
                    os.replace(self.path, target)
                    self.path = target

    def shown_path(self) -> str:
        """The log's path as shown to the user (relative to the working directory when under it)."""
        try:
            return str(self.path.relative_to(Path.cwd()))
        except ValueError:
            return str(self.path)

    def close(self) -> None:
        """Close the file (idempotent)."""
        with self._lock:
            self._file.close()


#: Where csrun_wse writes its task logs: ``$CSRUN_LOG_DIR``, else ``csrun_logs`` in the working
#: directory (beside where ``--use-sbatch`` writes the job's output file).
LOG_DIR_ENV = LOG_DIR


def task_log() -> TaskLogFile:
    """A new :class:`TaskLogFile` in ``$CSRUN_LOG_DIR`` or ``./csrun_logs``; in the temporary
    directory when that cannot be created."""
    directory = Path(os.environ.get(LOG_DIR_ENV) or "csrun_logs")
    try:
        return TaskLogFile(directory)
    except OSError:
        return TaskLogFile(Path(tempfile.gettempdir()) / f"csrun_logs-{os.getuid()}")


def _pump(pipe: io.BufferedReader, stream: str, output: TaskOutput, log: TaskLogFile,
          lock: threading.Lock) -> None:
    """Read one of srun's pipes to its end: each line to the log and through ``output``."""
    for raw in iter(pipe.readline, b""):
        line = raw.decode("utf-8", "replace").rstrip("\r\n")
        with lock:
            shown = output.line(stream, line)
            log.write(line, output.job_id)
            _show(shown)
    pipe.close()


def _show(lines: Sequence[tuple[str, str]]) -> None:
    for stream, text in lines:
        out = sys.stdout if stream == "out" else sys.stderr
        try:
            out.write(text + "\n")
            out.flush()
        except (BrokenPipeError, ValueError):
            pass


def _pump_plain(pipe: io.BufferedReader, log: TaskLogFile, prefix: str) -> None:
    """The input workers' own job's lines (``--survive-node-loss``): to the task log, and its
    supervisors' notices (a worker started again on a surviving node:
    :func:`launcher.tasklog.is_supervisor_notice`) to the terminal too."""
    for raw in iter(pipe.readline, b""):
        line = raw.decode("utf-8", "replace").rstrip("\r\n")
        log.write(prefix + line)
        _task, text = parse_label(line)
        if is_supervisor_notice(text):
            _show([("err", prefix + text)])
    pipe.close()


def run_with_worker_job(chief_argv: Sequence[str], worker_argv: Sequence[str], env: dict | None = None,
                        grace: float = WORKER_JOB_GRACE_S, output: TaskOutput | None = None) -> int:
    """Run the chief's job (``chief_argv``, an srun line) in the foreground, as
    :func:`run_foreground` does, and the input workers' own job (``worker_argv``) beside it in a
    session of its own. Once the chief's srun has ended, the workers' srun gets ``grace``
    seconds to end by itself, then is stopped (:func:`stop_process_group`: a step still
    pending or running is cancelled). Returns the chief's status (:func:`exit_status`): the
    chief decides the job; a worker job that ended early is reported on stderr. With
    ``output``, the workers' job's lines go to the chief's job's task log only."""
    _check_conf()
    log = task_log() if output is not None else None
    try:
        workers = subprocess.Popen([_require(worker_argv[0]), *worker_argv[1:]], env=env,
                                   start_new_session=True, stdout=subprocess.PIPE if log else None,
                                   stderr=subprocess.STDOUT if log else None)
    except OSError as exc:
        if log:
            log.close()
        raise CsrunError(f"cannot start {worker_argv[0]}: {exc.strerror}") from None
    if log and workers.stdout:
        threading.Thread(target=_pump_plain, args=(workers.stdout, log, "[workers' job] "), daemon=True).start()
    try:
        rc = run_foreground(chief_argv, env=env, output=output, log=log)
    finally:
        try:
            workers.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            stop_process_group(workers)
        if log:
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


def submit_batch(script: str, env: dict | None = None) -> str:
    """Submit ``script`` with ``sbatch --parsable`` on stdin; returns the job id.

    Raises :class:`CsrunError` with sbatch's message when the submission is refused.
    """
    _check_conf()
    proc = subprocess.run([_require("sbatch"), "--parsable"], input=script, capture_output=True,
                          text=True, env=env, timeout=SUBMIT_TIMEOUT_S)
    if proc.returncode != 0:
        msg = (proc.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise CsrunError(f"sbatch refused the job: {msg}")
    return proc.stdout.strip().split(";")[0]


# --------------------------------------------------------------------------- queries (analyzer, benchmarks)
#: Job states (squeue(1), "JOB STATE CODES") in which a job still holds or waits for its
#: nodes and its processes may run. Every other state is final, and so is COMPLETING (the
#: job's processes are leaving).
ACTIVE_STATES = frozenset({"PENDING", "CONFIGURING", "RUNNING", "SUSPENDED", "STOPPED", "REQUEUED",
                           "REQUEUE_FED", "REQUEUE_HOLD", "RESIZING", "RESV_DEL_HOLD", "SIGNALING",
                           "STAGE_OUT"})


def node_hosts(partition: str = "", env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Host name of every node of ``partition`` (all partitions when empty): node name →
    ``NodeHostname`` from ``sinfo --Node --format=%N|%n``. Several nodes may share one host
    (the Slurm test cluster runs five slurmd on one machine).

    Raises :class:`SlurmUnavailable` when slurmctld cannot be reached.
    """
    argv = ["sinfo", "--noheader", "--Node", "--format=%N|%n"]
    if partition:
        argv.append(f"--partition={partition}")
    hosts: dict[str, str] = {}
    for line in _query(argv, env).splitlines():
        parts = line.strip().split("|")
        if len(parts) == 2 and parts[0]:
            hosts[parts[0]] = parts[1] or parts[0]
    return hosts


def job_state(job_id: str, env: Mapping[str, str] | None = None) -> str | None:
    """State of job ``job_id`` (``RUNNING``, ``PENDING``, ``COMPLETED``, ``CANCELLED`` ...):
    from ``squeue`` while slurmctld remembers the job (``MinJobAge`` seconds after it ends),
    else from ``sacct`` when the cluster keeps job accounting. ``None`` when neither knows
    the job (an unknown id, or an old job on a cluster without accounting).

    Raises :class:`SlurmUnavailable` when squeue cannot reach slurmctld.
    """
    proc = _run(["squeue", "--noheader", f"--jobs={job_id}", "--states=all", "--format=%i|%T"], env)
    if proc.returncode == 0:
        for line in proc.stdout.splitlines():
            jid, _, state = line.strip().partition("|")
            if jid == str(job_id) and state:
                return state
    elif "invalid job id" not in proc.stderr.lower():
        msg = (proc.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise SlurmUnavailable(f"cannot reach slurmctld (squeue: {msg})")
    return _sacct_state(job_id, env)


def _sacct_state(job_id: str, env: Mapping[str, str] | None) -> str | None:
    """The job's state from ``sacct`` (``CANCELLED by 0`` → ``CANCELLED``); ``None`` when
    accounting is off ("Slurm accounting storage is disabled") or the job is unknown."""
    try:
        proc = _run(["sacct", "--noheader", "--parsable2", f"--jobs={job_id}", "--format=JobID,State"], env)
    except SlurmUnavailable:
        return None
    if proc.returncode != 0:
        return None
    for line in proc.stdout.splitlines():
        jid, _, state = line.strip().partition("|")
        if jid == str(job_id) and state:
            return state.split()[0]
    return None


def queued_jobs(env: Mapping[str, str] | None = None) -> int:
    """Jobs in the Slurm queue now (any user, pending or running), from ``squeue``.

    Raises :class:`SlurmUnavailable` when slurmctld cannot be reached.
    """
    return len(queued_job_ids(env))


def queued_job_ids(env: Mapping[str, str] | None = None, running_only: bool = False) -> set[str]:
    """Ids of the jobs in the Slurm queue now (any user; only ``RUNNING`` ones with
    ``running_only``), from ``squeue``. A heterogeneous job is listed once per het component
    (``123+0``, ``123+1``).

    Raises :class:`SlurmUnavailable` when slurmctld cannot be reached.
    """
    argv = ["squeue", "--noheader", "--format=%i"] + (["--states=RUNNING"] if running_only else [])
    out = _query(argv, env)
    return {ln.strip() for ln in out.splitlines() if ln.strip()}


def version(env: Mapping[str, str] | None = None) -> str | None:
    """The Slurm client's version line (``sinfo --version``, e.g. ``slurm-wlm 22.05.8``), or
    ``None`` when no Slurm client is installed or it does not answer."""
    try:
        proc = _run(["sinfo", "--version"], env)
    except SlurmUnavailable:
        return None
    return proc.stdout.strip() or None


# --------------------------------------------------------------------------- Python functions as jobs (submitit)
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
    _check_conf()
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


_ACCOUNTING: dict[str, bool] = {}


def accounting_enabled(env: Mapping[str, str] | None = None) -> bool:
    """Whether the cluster keeps job accounting (``sacct`` answers): its
    ``AccountingStorageType`` (``scontrol show config``) is not ``accounting_storage/none``.
    Asked once per ``SLURM_CONF``; False when scontrol cannot answer."""
    key = (os.environ if env is None else env).get("SLURM_CONF", "")
    if key not in _ACCOUNTING:
        try:
            proc = _run(["scontrol", "show", "config"], env)
        except SlurmUnavailable:
            return False
        storage = ""
        for line in proc.stdout.splitlines():
            name, _, value = line.partition("=")
            if name.strip() == "AccountingStorageType":
                storage = value.strip()
        _ACCOUNTING[key] = proc.returncode == 0 and storage not in ("", "accounting_storage/none")
    return _ACCOUNTING[key]


def _submitit() -> types.ModuleType:
    """Import submitit (lazily: ~70 ms that ``csrun_wse --help`` does not need) and quiet its
    logger in this process: its ``sacct`` watcher warns on every poll on a cluster without
    job accounting, where :func:`job_active` asks ``squeue`` instead."""
    import logging  # with submitit: not at the CLI's start-up

    import submitit  # lazy: only the analyzer's probe jobs use it

    logging.getLogger("submitit").setLevel(logging.ERROR)
    return submitit


# --------------------------------------------------------------------------- production Slurm (issue 11)
# Preflight (--check), site-policy names, the Slurm version. Kept in one block; each query
# answers within QUERY_TIMEOUT_S or says that slurmctld (or slurmdbd) does not answer.

@dataclass(frozen=True)
class TestOnly:
    """Slurm's answer to ``sbatch --test-only`` / ``srun --test-only`` (sbatch(1): "Validate
    the batch script and return an estimate of when a job would be scheduled to run given
    the current job queue"; nothing is submitted).

    Attributes:
        ok: Slurm would accept the job.
        start: the expected start time Slurm printed (``2026-11-22T23:55:34``), ``None``
            when refused (one per het component for srun, which tests them one by one).
        lines: Slurm's own lines (the estimate, warnings, or the reason it cannot run).
    """

    ok: bool
    start: str | None
    lines: tuple[str, ...]

    @property
    def reason(self) -> str:
        """The last line of Slurm's answer (the refusal's reason when not ``ok``)."""
        return self.lines[-1] if self.lines else "(no message)"


_START_RE = re.compile(r"to start at (\S+)")
_VERSION_RE = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")


def parse_test_only(returncode: int, stderr: str) -> TestOnly:
    """Read ``--test-only``'s answer (it is on stderr): ``sbatch: Job 12 to start at
    2026-11-22T23:55:42 using 6 processors on node[1-3]`` (exit 0), or ``allocation
    failure: Requested node configuration is not available`` / ``sbatch: error: ...``
    (exit 1)."""
    lines = tuple(ln.strip() for ln in stderr.splitlines() if ln.strip())
    starts = [m.group(1) for ln in lines for m in [_START_RE.search(ln)] if m]
    ok = returncode == 0 and bool(starts)
    return TestOnly(ok, max(starts) if ok else None, lines)


def test_only_batch(script: str, env: Mapping[str, str] | None = None) -> TestOnly:
    """``sbatch --test-only`` of ``script`` (on stdin): would Slurm run this batch het job,
    and when. Raises :class:`SlurmUnavailable` when slurmctld does not answer."""
    proc = _run(["sbatch", "--test-only"], env, input_text=script)
    return parse_test_only(proc.returncode, proc.stderr)


def test_only_srun(argv: Sequence[str], env: Mapping[str, str] | None = None) -> TestOnly:
    """``srun --test-only`` of an srun argv (``argv[0] == "srun"``); srun tests each het
    component on its own. Raises :class:`SlurmUnavailable` when slurmctld does not answer."""
    proc = _run(["srun", "--test-only", *argv[1:]], env)
    return parse_test_only(proc.returncode, proc.stderr)


def parse_slurm_version(text: str) -> tuple[int, int, int] | None:
    """``"slurm-wlm 22.05.8"`` / ``"slurm 23.11.4"`` → ``(22, 5, 8)``; ``None`` if absent."""
    m = _VERSION_RE.search(text or "")
    if not m:
        return None
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def slurm_release(env: Mapping[str, str] | None = None) -> tuple[int, int, int] | None:
    """The Slurm client's release from ``sinfo --version`` (no controller needed), or
    ``None`` when no Slurm client is installed or it does not answer."""
    return parse_slurm_version(version(env) or "")


def _sacctmgr_names(entity: str, env: Mapping[str, str] | None) -> list[str] | None:
    """Names of ``sacctmgr show <entity>`` (accounts or QOS); ``None`` when the cluster keeps
    no accounting ("You are not running a supported accounting_storage plugin") or slurmdbd
    does not answer: then Slurm does not check them either, and neither does csrun."""
    fields = {"account": "Account", "qos": "Name"}[entity]
    try:
        proc = _run(["sacctmgr", "--noheader", "--parsable2", "show", entity, f"format={fields}"], env=env)
    except SlurmUnavailable:
        return None
    if proc.returncode != 0:
        return None
    return sorted({ln.strip() for ln in proc.stdout.splitlines() if ln.strip()})


def accounts(env: Mapping[str, str] | None = None) -> list[str] | None:
    """Accounts Slurm's accounting knows (``sacctmgr show account``); ``None`` without
    accounting (see :func:`_sacctmgr_names`)."""
    return _sacctmgr_names("account", env)


def qos_names(env: Mapping[str, str] | None = None) -> list[str] | None:
    """QOS names Slurm's accounting knows (``sacctmgr show qos``); ``None`` without
    accounting."""
    return _sacctmgr_names("qos", env)


def reservations(env: Mapping[str, str] | None = None) -> list[str]:
    """Names of the current reservations (``scontrol -o show reservation``: one
    ``ReservationName=... ...`` line each; "No reservations in the system" → ``[]``).
    Raises :class:`SlurmUnavailable` when slurmctld does not answer."""
    proc = _run(["scontrol", "--oneliner", "show", "reservation"], env=env)
    if proc.returncode != 0:
        msg = (proc.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise SlurmUnavailable(f"cannot reach slurmctld (scontrol: {msg})")
    names = re.findall(r"ReservationName=(\S+)", proc.stdout)
    return sorted(set(names))


def node_features(partition: str = "", env: Mapping[str, str] | None = None) -> list[str]:
    """Features of the nodes of ``partition`` (all when empty) that ``--constraint`` may
    name (``sinfo --Node --format=%f``: ``AVAIL_FEATURES``, comma-separated, ``(null)`` for
    none). Raises :class:`SlurmUnavailable` when slurmctld does not answer."""
    argv = ["sinfo", "--noheader", "--Node", "--format=%f"]
    if partition:
        argv.append(f"--partition={partition}")
    proc = _run(argv, env=env)
    if proc.returncode != 0:
        msg = (proc.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise SlurmUnavailable(f"cannot reach slurmctld (sinfo: {msg})")
    feats: set[str] = set()
    for line in proc.stdout.splitlines():
        for f in line.strip().split(","):
            if f and f != "(null)":
                feats.add(f)
    return sorted(feats)


def config_values(keys: Sequence[str], env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Values of slurm.conf parameters as slurmctld runs them (``scontrol show config``:
    ``KillWait = 5 sec``) for ``keys`` present; raises :class:`SlurmUnavailable` when
    slurmctld does not answer."""
    proc = _run(["scontrol", "show", "config"], env=env)
    if proc.returncode != 0:
        msg = (proc.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise SlurmUnavailable(f"cannot reach slurmctld (scontrol: {msg})")
    out = {}
    for line in proc.stdout.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() in keys:
            out[key.strip()] = value.strip()
    return out
