"""One error, once: the output of a csrun_wse job's tasks, read as srun prints it, into what the
person at the terminal sees and what goes to the job's task log.

csrun_wse runs srun with ``--label`` (srun(1): "Prepend task number to lines of stdout/err";
in a het step the number is the task's id in the whole step, ``SLURM_PROCID``) and
``--verbose`` (its ``jobid J: nodes(N):`...'`` and ``launching StepId=J.S on host NODE, N tasks:
0-1`` lines say which node runs which task; srun's own error lines count tasks from 0 in each
het component). :class:`TaskOutput` takes those lines one by one and says which to print now:
the chief's (task 0) lines, live, except that from an error-looking line on they are held
until the chief goes on (a log record below ERROR, or :data:`HOLD_LINES` lines) or the job
ends; another task's ``WARNING`` records, once per text, naming the task;
srun's allocation messages (queued, allocated, refused) before the tasks start. Every line
goes to the log. When the job has failed, :meth:`TaskOutput.finish` gives the first failing
task's first error, once, under a line naming the task (het group, role, task id) and its
node, then the exit status and the log's path.

Pure: no process, no file; :mod:`launcher.slurm` runs srun and writes the log. The one
exception is :func:`main`, the batch script's filter (``python -m launcher.tasklog``), which
reads stdin and writes the log itself.
"""
from __future__ import annotations

import contextlib
import re
from collections import deque
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from csrun_common import atomic

from .attempts import AttemptLog, het_nodes
from .errorblock import (
    PROGRESS,
    clip,
    find_copy,
    first_error,
    is_error_start,
    last_words,
    stream_error,
)

__all__ = ["TaskGroup", "TaskMap", "TaskOutput", "Failure", "parse_label", "parse_ranges", "first_error",
           "is_error_start", "is_supervisor_notice", "last_words", "summarise"]

#: srun's ``--label`` prefix: the task id, right-aligned to the width of the largest (``" 3: "``).
_LABEL = re.compile(r"^\s*(\d+): ?(.*)$", re.DOTALL)
_JOBID = re.compile(r"^srun: jobid (\d+): nodes\(")
_LAUNCH = re.compile(r"^srun: launching StepId=(\d+)\.\S+ on host (\S+), \d+ tasks?: (\S+)")
_FAILED = re.compile(r"^srun: error: (\S+): tasks? (\S+): (.+)$")
_EXIT = re.compile(r"Exited with exit code (\d+)")
_QUEUE = re.compile(r"^srun: (error|fatal|warning|Warning|Job \d+|job \d+|Requested|Required|Force Terminated)")
_STEPD_NOTICE = re.compile(r"^slurmstepd(-\S+)?: error: \*\*\* .*\*\*\*$")
#: slurmstepd's notice glued to the end of a task's unfinished line (the task was killed mid-write).
_GLUED_NOTICE = re.compile(r"^(.+?)(slurmstepd(-\S+)?: error: \*\*\* .*\*\*\*)$")

#: A warning log record of Python's ``logging`` (default format, and csrun's ``WARNING:csrun:``).
_WARNING = re.compile(r"^WARNING[:\s]")
#: A notice of an input worker's supervisor (csrun_runtime/supervise.py): a worker process died
#: and is started again, or a worker lost with its node starts again on another node.
_SUPERVISOR_NOTICE = re.compile(r"^csrun: .*( died of .*; | lost with node .* starts again on )")
#: Lines a task's error may have: each task's lines are kept from its first error on (the rest
#: is in the log), at most this many.
KEPT_LINES = 400
#: Lines of the chief held after an error-looking line, at most: past them it went on working.
HOLD_LINES = 200
#: Each task's last lines kept whatever they say: a task that failed without an error-looking
#: line (``sys.exit("message")``) is shown with its last words (:func:`last_words`).
LAST_LINES = 20


def is_supervisor_notice(text: str) -> bool:
    """Whether a task's line (label removed) is its supervisor's notice that an input worker restarts."""
    return bool(_SUPERVISOR_NOTICE.match(text))


def parse_label(line: str) -> tuple[int | None, str]:
    """``" 3: text"`` → ``(3, "text")``; a line without srun's label (srun's or slurmstepd's
    own) → ``(None, line)``."""
    m = _LABEL.match(line)
    return (int(m.group(1)), m.group(2)) if m else (None, line)


def parse_ranges(text: str) -> list[int]:
    """srun's task list: ``"0"``, ``"0-1"``, ``"[0-1,4]"``, ``"2,5-6"`` → the ids, in order.
    Raises ValueError on anything else."""
    ids: list[int] = []
    for part in text.strip("[]").split(","):
        lo, _, hi = part.partition("-")
        ids += range(int(lo), int(hi or lo) + 1)
    return ids


@dataclass(frozen=True)
class TaskGroup:
    """One het component of a csrun_wse launch as srun numbers its tasks: het group, the role of
    its tasks (``chief``, ``single-task``, ``worker``; the chief's component's other tasks are
    input workers), the ``--label`` id of its first task and its task count."""

    het_group: int
    role: str
    first_task: int
    ntasks: int

    def role_of(self, task: int) -> str:
        """The role of global task ``task`` of this group."""
        if self.role == "chief" and task != self.first_task:
            return "worker"
        return self.role


@dataclass(frozen=True)
class Failure:
    """A task srun reported failed (``srun: error: node2: task 0: Exited with exit code 2``):
    its global task id (``None`` when the node is not known), node, srun's status words, the
    line, and the id srun printed (``rel``: counted from 0 in its het group; ``None`` when it
    did not parse)."""

    task: int | None
    node: str
    status: str
    line: str
    rel: int | None = None

    def exit_code(self) -> int | None:
        """The task's own exit code (``Exited with exit code 2`` → 2), ``None`` for a signal."""
        m = _EXIT.search(self.status)
        return int(m.group(1)) if m else None


@dataclass
class TaskMap:
    """Which task is where, as srun numbers them: ``--label`` ids are job-wide, srun's own lines
    count from 0 in each het group (``groups``, the launch's het components in order); ``nodes``
    maps each task id to its node once srun named it."""

    groups: Sequence[TaskGroup] = ()
    nodes: dict[int, str] = field(default_factory=dict)
    step_jobs: list[int] = field(default_factory=list)
    _launches: list[tuple[int, str, str]] = field(default_factory=list)
    _node_offset: dict[str, int] = field(default_factory=dict)

    def launch(self, job: int, node: str, ranges: str) -> None:
        """srun's ``launching StepId=J.S on host NODE, N tasks: R``: the node of every task so far
        (het component k is the k-th smallest job id J, its tasks R count from 0)."""
        self._launches.append((job, node, ranges))
        order = sorted({j for j, _, _ in self._launches} | set(self.step_jobs))
        for job, node, ranges in self._launches:
            k = order.index(job)
            offset = self.groups[k].first_task if k < len(self.groups) else 0
            self._node_offset[node] = offset
            try:
                for t in parse_ranges(ranges):
                    self.nodes[offset + t] = node
            except ValueError:
                continue

    def failure(self, node: str, ranges: str, status: str, raw: str) -> Failure:
        """The first task of ``ranges`` on ``node``. srun's error lines count tasks from 0 in
        each het group while ``--label`` numbers them job-wide: the global id is the group's
        first task (the layout's offset, :class:`TaskGroup`) plus that number, the group being
        the one whose launch ran on ``node``; ``None`` while the node is not known (see
        :meth:`resolve`)."""
        try:
            rel = parse_ranges(ranges)
        except ValueError:
            rel = []
        if rel and node in self._node_offset:
            return Failure(self._node_offset[node] + rel[0], node, status, raw, rel[0])
        return Failure(None, node, status, raw, rel[0] if rel else None)

    def resolve(self, f: Failure, talked: Collection[int] = ()) -> int | None:
        """``f``'s global task id: known from its node, else from the layout alone: the one
        group with a task of that number, or among several the one task whose output was seen
        on ``f``'s node or, failing that, the one of ``talked`` (the tasks that printed anything)."""
        if f.task is not None or f.rel is None:
            return f.task
        cands = [g.first_task + f.rel for g in self.groups if f.rel < g.ntasks] or [f.rel]
        if len(cands) == 1:
            return cands[0]
        on_node = [t for t in cands if self.nodes.get(t) == f.node]
        pick = on_node or [t for t in cands if t in talked]
        return pick[0] if len(pick) == 1 else None

    def group_of(self, task: int) -> TaskGroup | None:
        for g in self.groups:
            if g.first_task <= task < g.first_task + g.ntasks:
                return g
        return None

    def describe(self, task: int) -> str:
        """``task 2 (het group 1, worker) on node2``."""
        g = self.group_of(task)
        who = f"het group {g.het_group}, {g.role_of(task)}" if g else ""
        node = self.nodes.get(task)
        return f"task {task}" + (f" ({who})" if who else "") + (f" on {node}" if node else "")


@dataclass
class TaskOutput:
    """What csrun_wse shows of its srun's output, line by line (see the module docstring).

    ``groups``: the launch's het components in order (empty: one group of unknown shape, every
    task shown as ``task N``). ``ok_statuses``: srun exit statuses that are not failures (0, and
    75 with ``--requeue``). Feed lines with :meth:`line`; it returns the lines to print now, as
    ``(stream, text)`` with stream ``"out"`` or ``"err"``. After srun ended, :meth:`finish`
    returns the rest.
    """

    groups: Sequence[TaskGroup] = ()
    ok_statuses: frozenset[int] = frozenset({0})
    job_id: str | None = None
    started: bool = False
    #: Each task's ``(stream, text)`` lines from its first error on (:data:`KEPT_LINES`), in the
    #: order the tasks printed their first error.
    lines: dict[int, list[tuple[str, str]]] = field(default_factory=dict)
    #: Set by :meth:`finish`: a line that arrives later goes to the log only.
    finished: bool = False
    held: list[tuple[str, str]] = field(default_factory=list)
    holding: bool = False
    failures: list[Failure] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)
    _warned: set[str] = field(default_factory=set)
    #: Each task's last :data:`LAST_LINES` lines.
    tails: dict[int, deque[str]] = field(default_factory=dict)
    #: The chief's last lines shown on the terminal (an error it printed too is not repeated).
    _shown: deque[str] = field(default_factory=lambda: deque(maxlen=HOLD_LINES))

    def __post_init__(self) -> None:
        self.tasks = TaskMap(self.groups)

    # ------------------------------------------------------------------ feeding
    def line(self, stream: str, raw: str) -> list[tuple[str, str]]:
        """Take one line of srun's ``stream`` (``"out"``/``"err"``, no newline); returns the
        lines to show now."""
        task, text = parse_label(raw)
        if self.finished:
            return []
        if task is None or text.startswith("slurmstepd"):  # slurmstepd's notices come labelled too
            return self._srun_line(stream, text)
        glued = _GLUED_NOTICE.match(text)
        if glued:  # the task's unfinished line, then slurmstepd's notice: each where it belongs
            self._srun_line(stream, glued.group(2))
            text = glued.group(1)
        self.started = True
        self.tails.setdefault(task, deque(maxlen=LAST_LINES)).append(text)
        kept = self.lines.get(task)
        if kept is None and is_error_start(text):
            kept = self.lines[task] = []
        if kept is not None and len(kept) < KEPT_LINES:
            kept.append((stream, text))
        if task != 0:
            return self._other_task_line(stream, task, text)
        if self.holding and (PROGRESS.match(text) or len(self.held) >= HOLD_LINES):  # it went on
            shown, self.held, self.holding = [*self.held, (stream, text)], [], False
            self._shown.extend(t for _, t in shown)
            return shown
        if not self.holding and is_error_start(text):
            self.holding = True
        if self.holding:
            self.held.append((stream, text))
            return []
        self._shown.append(text)
        return [(stream, text)]

    def _other_task_line(self, stream: str, task: int, text: str) -> list[tuple[str, str]]:
        """A line of a task other than the chief: shown when it is a supervisor's notice (a
        worker replaced: :func:`is_supervisor_notice`, every one) or a ``WARNING`` log record
        no task has shown yet (numbers aside: six input workers' one warning is shown once),
        prefixed with the task (:meth:`TaskMap.describe`)."""
        if is_supervisor_notice(text):
            return [(stream, f"{self.tasks.describe(task)}: {text}")]
        if not _WARNING.match(text):
            return []
        key = re.sub(r"\d+", "#", text)
        if key in self._warned:
            return []
        self._warned.add(key)
        return [(stream, f"{self.tasks.describe(task)}: {text}")]

    def _srun_line(self, stream: str, raw: str) -> list[tuple[str, str]]:
        m = _JOBID.match(raw)
        if m:
            self.tasks.step_jobs.append(int(m.group(1)))
            self.job_id = self.job_id or m.group(1)
            return []
        m = _LAUNCH.match(raw)
        if m:
            self.started = True
            self.tasks.launch(int(m.group(1)), m.group(2), m.group(3))
            return []
        m = _FAILED.match(raw)
        if m:
            self.failures.append(self.tasks.failure(m.group(1), m.group(2), m.group(3), raw))
            return []
        if _STEPD_NOTICE.match(raw) and " DUE TO " in raw:  # time limit, preemption, node failure
            self.notices.append(raw)
            return []
        if not self.started and _QUEUE.match(raw):
            return [(stream, raw)]
        return []

    def exit_codes(self) -> dict[int, int]:
        """The exit code of each task srun reported exited with one (``Exited with exit code 75``),
        by global task id: the chief's own status when the batch script's status line is missing
        (``scontrol requeue`` ends the script before it writes it)."""
        out: dict[int, int] = {}
        for f in self.failures:
            task, code = self.tasks.resolve(f, self.tails), f.exit_code()
            if task is not None and code is not None:
                out.setdefault(task, code)
        return out

    def failing_task(self) -> int | None:
        """The task that failed first: the first srun reported failed (its status not an
        ``ok_statuses`` exit code) whose id is known, else the first task that printed an
        error, else ``None``."""
        f = self._first_failure()
        if f is not None:
            return self.tasks.resolve(f, self.tails)
        return next(iter(self.lines), None)

    def _first_failure(self) -> Failure | None:
        """The failure that decides the job, whatever order srun reported the tasks in: the first
        reported task that exited with an exit code of its own (not in ``ok_statuses``), else the
        first one ended by a signal (``--kill-on-bad-exit`` ends the others with SIGTERM, and srun
        may report them before the task that caused it); only tasks whose id is known."""
        known = [f for f in self.failures if self.tasks.resolve(f, self.tails) is not None]
        exited = [f for f in known if f.exit_code() not in (None, *self.ok_statuses)]
        signalled = [f for f in known if f.exit_code() is None]
        first = exited or signalled
        return first[0] if first else None

    def exit_status(self, status: int, interrupted: bool = False) -> int:
        """csrun_wse's exit status for srun's ``status``: the first failing task's own exit code
        when the job failed and that task exited with one (2 for a mistake the runtime named),
        whatever srun made of the tasks it ended after it (143: SIGTERM; srun returns the
        highest status of all tasks); else ``status`` (a signal, an interrupt, success)."""
        if interrupted or status in self.ok_statuses:
            return status
        f = self._first_failure()
        code = f.exit_code() if f is not None else None
        return code if code is not None and code not in self.ok_statuses and code != 0 else status

    def finish(self, status: int, log_path: str, interrupted: bool = False) -> list[tuple[str, str]]:
        """The lines to show once srun has ended with csrun_wse's exit ``status``: the chief's
        held lines, and when the job failed (``status`` not in ``ok_statuses``, not
        ``interrupted`` by the user) the first failing task's first error once under a line
        naming it, then a line with the exit status and ``log_path``."""
        if interrupted or status in self.ok_statuses:
            out = list(self.held)
            if interrupted:
                out.append(("err", f"csrun_wse: every task's output and srun's messages: {log_path}"))
            return out
        self.finished = True
        task = self.failing_task()
        block = stream_error(self.lines.get(task, [])) if task is not None else []
        if task not in (None, 0) and find_copy([t for _, t in self.lines.get(0, [])], block) is not None:
            task = 0  # the chief printed the same error: its copy is the one shown
        above = False
        if task == 0:  # its first error not shown yet (one it went on after is above already)
            block = stream_error(self.held)
            above = not block and bool(stream_error(self.lines.get(0, [])))
        words: list[str] = []
        if task is not None and not block and not above:  # no error-looking line: its last words
            words = last_words(self.tails.get(task, ()))
            above = bool(words) and all(t in self._shown for t in words)  # the chief's copy is above
            words = [] if above else words
        out = self._chief_lines(task, block)
        out += self._failure_lines(task, block or words, above, last=bool(words))
        out.append(("err", f"csrun_wse: exit status {status}; every task's output and srun's messages: {log_path}"))
        return out

    def _chief_lines(self, task: int | None, block: Sequence[str]) -> list[tuple[str, str]]:
        """The chief's held lines, without the copy of ``block`` the failing task's header will
        show (the same error printed by the chief too, or the chief's own first error)."""
        held = list(self.held)
        found = set(find_copy([t for _, t in held], block) or ())
        return [h for i, h in enumerate(held) if i not in found]

    def _failure_lines(self, task: int | None, block: Sequence[str], above: bool,
                       last: bool = False) -> list[tuple[str, str]]:
        """The header naming ``task`` and its error ``block`` (``last``: its last words, not an
        error-looking block), or srun's line for it when it printed neither."""
        if task is None:
            first = self.failures[0].line if self.failures else "srun: the job step failed"
            return [("err", f"csrun_wse: the job failed: {first}"), *(("err", n) for n in self.notices[:1])]
        reported = next((f for f in self.failures if self.tasks.resolve(f, self.tails) == task), None)
        status = f": {reported.status}" if reported else ""
        said = ", its last output:" if last else ", with this error:"
        tail = said if block else " (its error is above)" if above else ""
        out = [("err", f"csrun_wse: {self.tasks.describe(task)} failed first{status}{tail}")]
        out += [("err", f"  {t}") for t in clip(block)]
        if not block and not above and reported:
            out.append(("err", f"  {reported.line} (no error output)"))
        out += [("err", n) for n in self.notices[:1]]
        return out


def summarise(lines: Iterable[str], groups: Sequence[TaskGroup], status: int, log_path: str) -> list[str]:
    """The whole filter over recorded srun output (``--label --verbose``, stdout and stderr
    merged, as in an sbatch job's output file): the lines shown, in order, then
    :meth:`TaskOutput.finish`. For tests and the batch script's filter."""
    out = TaskOutput(groups=groups)
    shown = [text for raw in lines for _, text in out.line("err", raw.rstrip("\n"))]
    return shown + [text for _, text in out.finish(out.exit_status(status), log_path)]


# --------------------------------------------------------------------------- the batch script's filter
#: The line the batch script writes after srun's output, with srun's exit status (never shown).
STATUS_LINE = "csrun_wse-srun-exit-status: "
#: The file in the attempt's directory where the filter leaves the job's exit status as csrun_wse
#: decides it (the first failing task's own, whatever order srun reported the tasks in).
EXIT_STATUS_FILE = "exit-status"


def encode_groups(groups: Sequence[TaskGroup]) -> str:
    """``groups`` as the filter's ``--groups`` value: ``het_group:role:first_task:ntasks,...``."""
    return ",".join(f"{g.het_group}:{g.role}:{g.first_task}:{g.ntasks}" for g in groups)


def decode_groups(text: str) -> tuple[TaskGroup, ...]:
    """The inverse of :func:`encode_groups`. Raises ValueError on a malformed value."""
    out = []
    for item in filter(None, text.split(",")):
        het, role, first, n = item.split(":")
        out.append(TaskGroup(int(het), role, int(first), int(n)))
    return tuple(out)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m launcher.tasklog --groups G --ok 0,75 --log PATH [--attempt-dir DIR]``: the sbatch
    path's filter. Reads srun's merged output (``--label --verbose``) on stdin, then
    :data:`STATUS_LINE`; writes every line to ``PATH``, each task's to its file in ``DIR`` with the
    attempt's markers (:class:`launcher.attempts.AttemptLog`), what csrun_wse would show to stdout
    (the job's output file), and the job's exit status as csrun_wse decides it
    (:meth:`TaskOutput.exit_status`) to ``DIR/``:data:`EXIT_STATUS_FILE` for the batch script to
    exit with. Ignores SIGINT/SIGTERM (a cancelled job's last lines still arrive), exits 0."""
    import argparse
    import io
    import os
    import signal
    import sys

    ap = argparse.ArgumentParser(prog="python -m launcher.tasklog")
    ap.add_argument("--groups", default="")
    ap.add_argument("--ok", default="0")
    ap.add_argument("--log", required=True)
    ap.add_argument("--attempt-dir", default="")
    args = ap.parse_args(argv)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    out = TaskOutput(groups=decode_groups(args.groups), ok_statuses=frozenset(int(s) for s in args.ok.split(",")))
    os.makedirs(os.path.dirname(args.log) or ".", exist_ok=True)
    status: int | None = None
    stdin = io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8", errors="replace")
    attempt = _attempt_log(args.attempt_dir, os.environ)
    with open(args.log, "a", encoding="utf-8", errors="replace") as log:
        for raw in iter(stdin.readline, ""):
            line = raw.rstrip("\r\n")
            if line.startswith(STATUS_LINE):
                status = int(line[len(STATUS_LINE):])
                continue
            log.write(line + "\n")
            log.flush()
            if attempt is not None:
                attempt.line(*parse_label(line))
            for _, text in out.line("err", line):
                print(text, flush=True)
    if attempt is not None:
        attempt.end(status, out.tasks.nodes, out.exit_codes())
    decided = out.exit_status(status) if status is not None else 0
    for _, text in out.finish(decided, args.log, interrupted=status is None):
        print(text, flush=True)
    if status is not None and args.attempt_dir:
        with contextlib.suppress(OSError):  # the script then exits with srun's own status
            atomic.write_text(Path(args.attempt_dir) / EXIT_STATUS_FILE, f"{decided}\n")
    return 0


def _attempt_log(directory: str, env: Mapping[str, str]) -> AttemptLog | None:
    """The attempt's writer (:class:`launcher.attempts.AttemptLog`, started) or ``None`` without
    ``--attempt-dir`` or when its directory cannot be made (the filter still filters)."""
    if not directory:
        return None
    log = AttemptLog(Path(directory))
    try:
        log.start(env.get("SLURM_JOB_ID", ""), int(env.get("SLURM_RESTART_COUNT") or 0) + 1, het_nodes(env))
    except OSError:
        return None
    return log


if __name__ == "__main__":
    raise SystemExit(main())
