"""What an error looks like in a task's output: where it starts and ends, a task's last words when
it printed none, and a copy of it in another task's lines (:mod:`launcher.tasklog` shows each
error once). Pure functions over lines of text (srun's label removed)."""
from __future__ import annotations

import re
from collections.abc import Sequence

__all__ = ["ERROR_START", "PROGRESS", "HEAD", "TAIL", "COPY_GAP", "is_error_start", "first_error", "error_of",
           "stream_error", "last_words", "find_copy", "clip"]

#: The first line of an error a task prints: a Python traceback, the interpreter refusing a
#: script or module, argparse's usage + ``error:``, an ``ERROR``/``CRITICAL`` log record
#: (``logging``'s default format and csrun's ``ERROR:csrun:``), an absl/TensorFlow C++ log
#: line of severity F (fatal; its E lines are mostly start-up noise such as a failed
#: ``cuInit`` on a CPU node, and a real failure follows them), a bare ``...Error: message``
#: line, a fatal signal.
ERROR_START = re.compile(
    r"^(Traceback \(most recent call last\):"
    r"|\S+: can't open file "
    r"|\S+: (No module named |Error while finding module)"
    r"|usage: "
    r"|(\S+: )?error: "
    r"|(ERROR|CRITICAL|FATAL)[:\s]"
    r"|F\d{4} \d"
    r"|[\w.]*(Error|Exception): "
    r"|Fatal Python error"
    r"|Segmentation fault)")
#: A line that starts a new log record: it ends an error block that is not a traceback.
_RECORD = re.compile(r"^((DEBUG|INFO|WARNING|ERROR|CRITICAL)[:\s]|[IWEF]\d{4} \d|Traceback \(most)")
#: A log record of a level below ERROR: when the chief prints one after an error, it went on
#: working, and its held lines are shown.
PROGRESS = re.compile(r"^((DEBUG|INFO|WARNING)[:\s]|[IW]\d{4} \d)")
_CHAINED = ("During handling of the above exception", "The above exception was the direct cause")
#: Lines of an error shown at most: the first :data:`HEAD` and the last :data:`TAIL`.
HEAD, TAIL = 8, 30
#: Last words shown at most.
LAST_WORDS = 3


def is_error_start(text: str) -> bool:
    """Whether one line of a task (label removed) starts an error (see :data:`ERROR_START`)."""
    return bool(ERROR_START.match(text))


def _block_end(lines: Sequence[str], start: int) -> int:
    """Index after the error block starting at ``lines[start]``: a traceback runs through its
    indented frames, chained tracebacks and the exception's (possibly several) lines, up to the
    next log record; argparse's usage through its ``error:`` line; any other error through its
    indented continuation lines."""
    first = lines[start]
    i = start + 1
    if first.startswith("usage: "):
        while i < len(lines) and not re.match(r"^\S+: error: ", lines[i]):
            i += 1
        return min(i + 1, len(lines))
    if first.startswith("Traceback (most recent call last):"):
        while i < len(lines):
            text = lines[i]
            if text.startswith(_CHAINED) or text.startswith("Traceback (most"):
                i += 1
                continue
            if _RECORD.match(text) or (not text.strip() and not _chain_follows(lines, i)):
                break
            i += 1
        return i
    while i < len(lines) and lines[i].startswith((" ", "\t")):
        i += 1
    if i < len(lines) and lines[i].startswith("Traceback (most recent call last):") and _RECORD.match(first):
        return _block_end(lines, i)  # logging's exception(): the record, then its traceback
    return i


def _chain_follows(lines: Sequence[str], i: int) -> bool:
    """Whether the blank line ``lines[i]`` sits inside a chain of tracebacks."""
    rest = [t for t in lines[i + 1:i + 3] if t.strip()]
    return bool(rest) and rest[0].startswith((*_CHAINED, "Traceback (most"))


def first_error(lines: Sequence[str]) -> tuple[int, int] | None:
    """``(start, end)`` of the first error block in one task's lines (label removed), or
    ``None`` when none looks like an error."""
    for i, text in enumerate(lines):
        if is_error_start(text):
            return i, _block_end(lines, i)
    return None


def error_of(lines: Sequence[str]) -> list[str]:
    """The lines of the first error block of ``lines`` (:func:`first_error`), or ``[]``."""
    span = first_error(lines)
    return list(lines[span[0]:span[1]]) if span else []


def stream_error(entries: Sequence[tuple[str, str]]) -> list[str]:
    """The first error block of one task's ``(stream, text)`` lines, read on the stream of its first
    error-looking line only (docs/DESIGN.md, launcher/errorblock.py)."""
    stream = next((s for s, t in entries if is_error_start(t)), None)
    return error_of([t for s, t in entries if s == stream]) if stream else []


def last_words(lines: Sequence[str]) -> list[str]:
    """The last lines of a task that printed no error-looking line (label removed): after its
    last log record, at most :data:`LAST_WORDS`, trailing blank lines dropped; ``[]`` when it
    ended on a log record or printed nothing (``sys.exit("run.py failed at import: ...")``
    → that line)."""
    rest = list(lines)
    while rest and not rest[-1].strip():
        rest.pop()
    out: list[str] = []
    for text in reversed(rest):
        if PROGRESS.match(text) or len(out) >= LAST_WORDS:
            break
        out.insert(0, text)
    return out


#: The label a trainer rank other than 0 puts on its log lines (csrun_runtime.task.log_prefix).
_RANK_LABEL = re.compile(r"\[rank \d+ [^\]\s]*\] ")
#: Lines of another stream (or another record) that may sit between two lines of a copy of an
#: error block: :func:`find_copy` still recognises it.
COPY_GAP = 8


def _unranked(text: str) -> str:
    return _RANK_LABEL.sub("", text, count=1)


def find_copy(lines: Sequence[str], block: Sequence[str]) -> list[int] | None:
    """The indices in ``lines`` of a copy of ``block``: its lines in order, each within
    :data:`COPY_GAP` lines of the previous one (a line of the task's other stream may arrive
    between them), a trainer rank's label aside (several ranks failing with the same error print
    it once each); ``None`` when there is none or ``block`` is empty."""
    if not block:
        return None
    lines, block = [_unranked(t) for t in lines], [_unranked(t) for t in block]
    for start in (i for i, t in enumerate(lines) if t == block[0]):
        found, at = [start], start
        for want in block[1:]:
            nxt = next((j for j in range(at + 1, min(len(lines), at + 2 + COPY_GAP)) if lines[j] == want), None)
            if nxt is None:
                break
            found.append(nxt)
            at = nxt
        if len(found) == len(block):
            return found
    return None


def clip(block: Sequence[str]) -> list[str]:
    if len(block) <= HEAD + TAIL + 1:
        return list(block)
    return [*block[:HEAD], f"... ({len(block) - HEAD - TAIL} lines: the whole error is in the log)",
            *block[-TAIL:]]
