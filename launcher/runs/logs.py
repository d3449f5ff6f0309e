"""A run's logs per task and per attempt (``csrun logs``), each line labelled with its role and
task: read from the attempt directories of :mod:`launcher.attempts`, and followed as they grow."""
from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from csrun_common.errors import CsrunError
from csrun_common.layout import LayoutSpec

from ..attempts import SRUN_LOG, Attempt, task_file
from .record import RunRecord
from .view import attempts_of

#: ``--role`` values: the role of a task as the record's het groups give it (``rank``: one of
#: several trainer ranks; ``single``: a single-task node's task).
ROLE_NAMES = {"chief": "chief", "rank": "rank", "worker": "worker", "single": "single-task", "srun": "srun"}
#: Seconds between two reads of a followed file.
FOLLOW_POLL_S = 0.25


@dataclass(frozen=True)
class LogLine:
    """One line of a task's log: its ``role`` (the record's), ``index`` within the role, global
    ``task`` number (srun's ``--label``), ``attempt`` and ``text``."""

    role: str
    index: int
    task: int
    attempt: int
    text: str

    @property
    def label(self) -> str:
        """``chief``, ``rank 1``, ``worker 3``, ``single-task 0``, ``srun``."""
        return self.role if self.role in ("chief", "srun") else f"{self.role} {self.index}"

    def labelled(self) -> str:
        """``[worker 3] text``."""
        return f"[{self.label}] {self.text}"


def tasks_of(rec: RunRecord) -> list[tuple[int, str, int]]:
    """``(task, role, index within the role)`` of every task of the run's het groups: the chief's
    group's other tasks are input workers (:meth:`launcher.tasklog.TaskGroup.role_of`); input
    workers count from 1 when the chief runs worker 0 itself (the chief's own input worker)."""
    out: list[tuple[int, str, int]] = []
    try:
        own = LayoutSpec.from_record(rec.layout).chief_input_workers if rec.layout else 0
    except (KeyError, TypeError, ValueError):  # a csrun_cpu run's, or an older record's
        own = 0
    seen: dict[str, int] = {"worker": 1 if own else 0}
    for g in rec.groups:
        role, first = str(g.get("role", "task")), int(g.get("first_task", 0))
        for t in range(first, first + int(g.get("ntasks", 0))):
            r = "worker" if role == "chief" and t != first else role
            out.append((t, r, seen.get(r, 0)))
            seen[r] = seen.get(r, 0) + 1
    return out


def select(rec: RunRecord, role: str | None, task: int | None) -> list[tuple[int, str, int]]:
    """The tasks ``--role`` and ``--task`` name (``--task`` counts within ``--role``; without a
    role it is srun's task number). Raises :class:`CsrunError` naming the flag and the choices."""
    tasks = tasks_of(rec)
    if role == "srun":
        return [(-1, "srun", 0)]
    if role is not None:
        want = ROLE_NAMES.get(role)
        tasks = [t for t in tasks if t[1] == want]
        if not tasks:
            have = sorted({k for k, v in ROLE_NAMES.items() if v in {r for _, r, _ in tasks_of(rec)}} | {"srun"})
            raise CsrunError(f"--role {role}: this run has no such tasks (roles: {', '.join(have)})")
    if task is None:
        return tasks
    picked = [t for t in tasks if (t[2] if role else t[0]) == task]
    if not picked:
        top = max((t[2] if role else t[0]) for t in tasks)
        raise CsrunError(f"--task {task}: out of range (0..{top}{' for --role ' + role if role else ''})")
    return picked


def pick_attempt(rec: RunRecord, attempt: int | None) -> Attempt | None:
    """Attempt ``attempt`` (1-based), else the latest; ``None`` when none started yet. Raises
    :class:`CsrunError` for an attempt the run does not have."""
    found = [a for _, a in attempts_of(rec)]
    if attempt is None:
        return found[-1] if found else None
    for a in found:
        if a.number == attempt:
            return a
    raise CsrunError(f"--attempt {attempt}: the run has {len(found)} attempt(s) so far"
                     + (f" ({', '.join(str(a.number) for a in found)})" if found else ""))


def _path(a: Attempt, task: int) -> Path:
    return a.directory / SRUN_LOG if task < 0 else task_file(a.directory, task)


def read(rec: RunRecord, role: str | None = None, task: int | None = None, attempt: int | None = None,
         tail: int | None = None, grep: str | None = None) -> list[LogLine]:
    """The lines of the tasks :func:`select` picks in one attempt (:func:`pick_attempt`), task by
    task; only those matching the regular expression ``grep``, the last ``tail`` of each task."""
    picked = select(rec, role, task)
    a = pick_attempt(rec, attempt)
    if a is None:
        return []
    rx = _regex(grep)
    out: list[LogLine] = []
    for t, r, i in picked:
        try:
            text = _path(a, t).read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        lines = [LogLine(r, i, t, a.number, s) for s in text.splitlines() if rx is None or rx.search(s)]
        out += lines[-tail:] if tail else lines
    return out


def _regex(grep: str | None) -> re.Pattern[str] | None:
    if not grep:
        return None
    try:
        return re.compile(grep)
    except re.error as exc:
        raise CsrunError(f"--grep {grep!r}: not a regular expression ({exc})") from None


def follow(rec_now: Callable[[], RunRecord], ended: Callable[[], bool], role: str | None = None,
           task: int | None = None, tail: int | None = 10, grep: str | None = None) -> Iterator[LogLine]:
    """The picked tasks' lines as they are written: the latest attempt's last ``tail`` lines of
    each task first, then every new line, into each later attempt (all its lines), until
    ``ended()`` says the run is over once the current attempt's end marker is written."""
    rec = rec_now()
    picked, rx = select(rec, role, task), _regex(grep)
    a: Attempt | None = None
    files: dict[int, IO[bytes]] = {}
    while True:
        newest = pick_attempt(rec, None)
        if newest is not None and (a is None or newest.directory != a.directory):
            for f in files.values():
                f.close()
            backlog = tail if a is None else None
            a, files = newest, {}
            yield from _backlog(a, picked, backlog, rx, files)
        fresh = False
        for t, r, i in picked:
            for s in _new_lines(a, t, files):
                fresh = True
                if rx is None or rx.search(s):
                    yield LogLine(r, i, t, a.number if a else 0, s)
        if not fresh and a is not None and (a.directory / "end.json").exists() and ended():
            return
        time.sleep(FOLLOW_POLL_S)
        rec = rec_now()


def _backlog(a: Attempt, picked: list[tuple[int, str, int]], tail: int | None, rx: re.Pattern[str] | None,
             files: dict[int, IO[bytes]]) -> Iterator[LogLine]:
    """Each picked task's whole lines so far in attempt ``a`` (its last ``tail`` when given);
    leaves the files open in ``files``, just after the last whole line."""
    for t, r, i in picked:
        try:
            f = open(_path(a, t), "rb")  # noqa: SIM115 - closed by follow()
        except OSError:
            continue
        files[t] = f
        data = f.read()
        cut = data.rfind(b"\n") + 1
        f.seek(cut)
        lines = data[:cut].decode("utf-8", "replace").splitlines()
        for s in lines[-tail:] if tail else lines:
            if rx is None or rx.search(s):
                yield LogLine(r, i, t, a.number, s)


def _new_lines(a: Attempt | None, task: int, files: dict[int, IO[bytes]]) -> list[str]:
    """Whole lines written to task ``task``'s file since the last read (opening it when it
    appeared since)."""
    if a is None:
        return []
    f = files.get(task)
    if f is None:
        try:
            f = files[task] = open(_path(a, task), "rb")  # noqa: SIM115 - closed by follow()
        except OSError:
            return []
    out: list[str] = []
    while True:
        pos = f.tell()
        s = f.readline()
        if not s:
            return out
        if not s.endswith(b"\n"):
            f.seek(pos)
            return out
        out.append(s.decode("utf-8", "replace").rstrip("\n"))
