"""One batch before queueing (issue 33 item 9; docs/CHECKS.md "One batch before queueing").

A bug in the user's input code (the data function, a ``Dataset.__getitem__``, a ``map`` or
collate function) otherwise shows only after the job waited in the queue and started. Before
queueing a training run, ``csrun_wse`` runs ``python -m csrun_runtime.first_batch`` on this host
(a child process in a session of its own: TensorFlow and torch never enter the CLI's process),
which loads the run.py in capture mode and pulls ONE batch of input worker 0 of W's training
input. Its exit status decides: 0 go on; 2 refuse the launch with the worker's lines (exit 2,
nothing submitted); anything else, or over the bound (the process group is killed), one note line
and the job is queued.

:func:`plan` is the pure decision (when it runs, and its argv); :func:`run` runs it. The bound:
``$CSRUN_BATCH_CHECK_SECS`` if set, else the site key ``checks.batch_secs`` (0: off).
"""
from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from csrun_common.env import BATCH_CHECK_SECS
from csrun_common.errors import CsrunError
from csrun_common.modes import TRAIN_MODES

from .preflight import script_of

__all__ = ["BatchCheck", "Outcome", "HINT", "bound", "plan", "run", "note"]

#: The last line of a refusal.
HINT = "  (one batch pulled on this host before queueing: nothing submitted; --no-batch-check skips this check)"
#: csrun_runtime.first_batch's statuses: a batch came; the user's input code raised.
_OK, _USER_ERROR = 0, 2


@dataclass(frozen=True)
class BatchCheck:
    """The check to run: ``argv`` (without ``--report``), ``secs`` its wall-clock bound (> 0)."""

    argv: tuple[str, ...]
    secs: int


@dataclass(frozen=True)
class Outcome:
    """What the check found: ``status`` ``"ok"``, ``"user_error"`` (``text``: the worker's
    lines), ``"timeout"`` or ``"not_checked"`` (``text``: why, one line); ``seconds`` it took."""

    status: str
    text: str
    seconds: float


def bound(site_secs: int, env: Mapping[str, str] | None = None) -> int:
    """The bound in seconds: ``$CSRUN_BATCH_CHECK_SECS`` when set, else ``site_secs``
    (``checks.batch_secs``). Raises :class:`CsrunError` for a value that is not an int >= 0."""
    env = os.environ if env is None else env
    raw = env.get(BATCH_CHECK_SECS)
    if raw is None or raw.strip() == "":
        return site_secs
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise CsrunError(f"{BATCH_CHECK_SECS}={raw!r}: must be a whole number of seconds >= 0 (0: no batch check)")
    return value


def _mode(args: Sequence[str]) -> str | None:
    """The run.py command line's mode: ``--mode X`` / ``--mode=X``, the older ``--validate_only``
    / ``--compile_only`` switches; ``None`` when not given (the params' ``runconfig.mode``)."""
    mode = None
    for i, word in enumerate(args):
        if word == "--mode" and i + 1 < len(args):
            mode = args[i + 1]
        elif word.startswith("--mode="):
            mode = word[len("--mode="):]
        elif word in ("--validate_only", "--compile_only"):
            return word[2:]
    return mode


def _is_csrun_run_py(path: Path) -> bool:
    """Whether ``path`` is a Python file that uses csrun's runtime (names ``csrun_runtime``): any
    other script would run whole here in capture mode."""
    try:
        return path.suffix == ".py" and "csrun_runtime" in path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False


def plan(command: Sequence[str], *, secs: int, container: bool, workers: int, cpus: int,
         skipped_by: str = "", cwd: Path | None = None) -> BatchCheck | None:
    """The check for a launch of ``command`` (``python-ws``/``python-pt`` already expanded to the
    interpreter), or ``None`` when it does not run: ``skipped_by`` names a flag that skips it
    (``--no-batch-check``, ``--dry-run``, ``--check``, ``--no-path-checks``); ``secs`` is 0; the
    launch runs in a ``container`` (this host's Python may lack the image's packages); the command
    is not ``python SCRIPT.py ...`` whose script uses ``csrun_runtime``; or its ``--mode`` does not
    train (:data:`TRAIN_MODES`; no ``--mode``: the params decide, the runtime skips what does not
    train). ``workers``: the job's input-worker count W (>= 1); ``cpus``: one worker's CPUs,
    capped at this host's."""
    if skipped_by or secs <= 0 or container:
        return None
    script, args = script_of(command)
    if script is None or not _is_csrun_run_py((cwd or Path.cwd()) / script):
        return None
    mode = _mode(args)
    if mode is not None and mode not in TRAIN_MODES:
        return None
    here = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    argv = (command[0], "-m", "csrun_runtime.first_batch", "--workers", str(max(1, workers)),
            "--cpus", str(max(1, min(cpus, here))), script, *args)
    return BatchCheck(argv=argv, secs=secs)


def _last_line(path: Path) -> str:
    try:
        lines = [ln.strip() for ln in path.read_text(encoding="utf-8", errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1][:200] if lines else ""


def _stop_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run(check: BatchCheck, cwd: Path | None = None) -> Outcome:
    """Run ``check`` in a child process of its own session, its output in a temporary file;
    over ``check.secs`` seconds its process group is killed (``"timeout"``); at the end the
    group is killed anyway (DataLoader worker processes left behind)."""
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="csrun-batch-check-") as tmp:
        report, log = Path(tmp) / "report", Path(tmp) / "log"
        argv = [*check.argv[:3], "--report", str(report), *check.argv[3:]]
        with open(log, "wb") as out:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    cwd=cwd, start_new_session=True)
            try:
                rc = proc.wait(timeout=check.secs)
            except subprocess.TimeoutExpired:
                return Outcome("timeout", "", time.monotonic() - start)
            finally:
                _stop_group(proc.pid)
                proc.wait()
        took = time.monotonic() - start
        text = report.read_text(encoding="utf-8").rstrip("\n") if report.exists() else ""
        if rc == _OK:
            return Outcome("ok", text, took)
        if rc == _USER_ERROR and text:
            return Outcome("user_error", text, took)
        why = text or _last_line(log) or f"exit status {rc}"
        return Outcome("not_checked", f"{' '.join(why.split())} (exit status {rc})", took)


def note(outcome: Outcome, secs: int) -> str | None:
    """The note line for an outcome that lets the launch go on (``None`` for ``"ok"``)."""
    if outcome.status == "timeout":
        return (f"no batch of the training input within {secs} s on this host (checks.batch_secs or "
                f"{BATCH_CHECK_SECS}): not checked before queueing")
    if outcome.status == "not_checked":
        return f"the training input was not checked before queueing: {outcome.text}"
    return None
