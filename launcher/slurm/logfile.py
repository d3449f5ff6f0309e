"""The task log of a csrun_wse launch on the srun path: every line srun printed, in a file of
its own named after the job, and the pumps that read srun's pipes into it."""
from __future__ import annotations

import io
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from csrun_common.env import LOG_DIR

from ..attempts import AttemptLog, job_dir
from ..tasklog import TaskOutput, is_supervisor_notice, parse_label


class TaskLogFile:
    """The log of one csrun_wse launch (srun path): every line its srun printed, as srun printed
    it (each task's lines under srun's ``--label``), and the input workers' own job's lines
    under ``[workers' job]``. Written to ``<dir>/csrun_wse-<pid>.log`` from the start, renamed
    ``csrun_wse-<job id>.log`` once srun names the job. With ``attempt`` (a recorded run's launch
    number, 1-based), each task's lines also go to that attempt's directory
    (:class:`launcher.attempts.AttemptLog`, under ``<dir>/csrun_wse-<job id>/``), and
    ``on_job(job_id, attempt_dir)`` is called once the job is known. Thread-safe."""

    def __init__(self, directory: Path, attempt: int = 0,
                 on_job: Callable[[str, Path], None] | None = None):
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / f"csrun_wse-{os.getpid()}-{int(time.time())}.log"
        self._file = open(self.path, "w", encoding="utf-8", errors="replace")  # noqa: SIM115 - closed by close()
        self._lock = threading.Lock()
        self.attempt, self._on_job = attempt, on_job
        self._attempt_log: AttemptLog | None = None

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
            if job_id and self.attempt and self._attempt_log is None:
                self._start_attempt(job_id)
            if self._attempt_log is not None:
                self._attempt_log.line(*parse_label(line))

    def _start_attempt(self, job_id: str) -> None:
        where = job_dir(self.path.parent, "csrun_wse", job_id) / f"attempt-{self.attempt}"
        self._attempt_log = AttemptLog(where)
        self._attempt_log.start(job_id, self.attempt, {})
        if self._on_job is not None:
            self._on_job(job_id, where)

    def finish(self, status: int | None, output: TaskOutput) -> None:
        """The attempt's end marker (:meth:`launcher.attempts.AttemptLog.end`: ``status``, the
        tasks' nodes and exit codes ``output`` saw), when it has one."""
        with self._lock:
            if self._attempt_log is not None:
                self._attempt_log.end(status, output.tasks.nodes, output.exit_codes())

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


def task_log(attempt: int = 0, on_job: Callable[[str, Path], None] | None = None) -> TaskLogFile:
    """A new :class:`TaskLogFile` (``attempt``, ``on_job``: as it takes them) in ``$CSRUN_LOG_DIR``
    or ``./csrun_logs``; in the temporary directory when that cannot be created."""
    directory = Path(os.environ.get(LOG_DIR_ENV) or "csrun_logs")
    try:
        return TaskLogFile(directory, attempt, on_job)
    except OSError:
        return TaskLogFile(Path(tempfile.gettempdir()) / f"csrun_logs-{os.getuid()}", attempt, on_job)


def pump(pipe: io.BufferedReader, stream: str, output: TaskOutput, log: TaskLogFile,
         lock: threading.Lock) -> None:
    """Read one of srun's pipes to its end: each line to the log and through ``output``."""
    for raw in iter(pipe.readline, b""):
        line = raw.decode("utf-8", "replace").rstrip("\r\n")
        with lock:
            shown = output.line(stream, line)
            log.write(line, output.job_id)
            show(shown)
    pipe.close()


def show(lines: Sequence[tuple[str, str]]) -> None:
    for stream, text in lines:
        out = sys.stdout if stream == "out" else sys.stderr
        try:
            out.write(text + "\n")
            out.flush()
        except (BrokenPipeError, ValueError):
            pass


def pump_plain(pipe: io.BufferedReader, log: TaskLogFile, prefix: str) -> None:
    """The input workers' own job's lines (``--survive-node-loss``): to the task log, and its
    supervisors' notices (a worker started again on a surviving node:
    :func:`launcher.tasklog.is_supervisor_notice`) to the terminal too."""
    for raw in iter(pipe.readline, b""):
        line = raw.decode("utf-8", "replace").rstrip("\r\n")
        log.write(prefix + line)
        _task, text = parse_label(line)
        if is_supervisor_notice(text):
            show([("err", prefix + text)])
    pipe.close()

