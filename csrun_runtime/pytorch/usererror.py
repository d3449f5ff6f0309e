"""A user's exception as the person at the terminal needs it (issue 33 item 9): its type, its
message and the last frames of its traceback that are in the user's code (not Python's, not an
installed package's such as torch's, not csrun's), as a few lines::

    train_input: the DataLoader raised ValueError: sample 7 is broken (in __getitem__)
      File "/home/me/job/data.py", line 31, in __getitem__
        raise ValueError(f"sample {i} is broken")

A DataLoader worker process's error is re-raised by torch in the main process as the same type
whose message holds the original traceback as text (``Caught ValueError in DataLoader worker
process 0.`` / ``Original Traceback (most recent call last):`` ...): its frames and last line are
read from that text. Pure; imports no torch.
"""
from __future__ import annotations

import re
import sysconfig
import traceback
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

__all__ = ["FRAMES", "UserCodeError", "describe", "user_frames", "guarded"]

#: Frames of the user's code shown at most (the last ones: nearest the raise).
FRAMES = 3

_ORIGINAL = "Original Traceback (most recent call last):"
_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+), in (.+)$')
_CSRUN = Path(__file__).resolve().parents[2]
_OURS = tuple(str(_CSRUN / p) for p in ("csrun_runtime", "csrun_common", "launcher", "analyzer"))
_THEIRS = tuple({p for k in ("stdlib", "platstdlib", "purelib", "platlib")
                 if (p := sysconfig.get_paths().get(k))})


class UserCodeError(ValueError):
    """The user's code raised (a data function, a Dataset, a sampler, a collate function):
    ``str()`` is :func:`describe`'s text (first line, then indented frames); ``error`` is the
    exception raised."""

    def __init__(self, text: str, error: BaseException):
        super().__init__(text)
        self.error = error


def is_user_file(filename: str) -> bool:
    """Whether a frame's file is the user's: not ``<frozen ...>``/``<string>``, not under Python's
    library or site-packages, not csrun's own packages."""
    if not filename or filename.startswith("<"):
        return False
    return not filename.startswith(_OURS + _THEIRS)


def _text_frames(text: str) -> list[tuple[str, int, str, str]]:
    """``(file, line, function, code)`` of the frames in a traceback printed as text."""
    lines = text.splitlines()
    out = []
    for i, ln in enumerate(lines):
        m = _FRAME.match(ln)
        if m:
            code = lines[i + 1].strip() if i + 1 < len(lines) and not _FRAME.match(lines[i + 1]) else ""
            out.append((m.group(1), int(m.group(2)), m.group(3), code))
    return out


def _original(message: str) -> tuple[str, str] | None:
    """``(traceback text, last line)`` of a DataLoader worker process's error message, else None."""
    _, sep, rest = message.partition(_ORIGINAL)
    if not sep:
        return None
    lines = [ln for ln in rest.splitlines() if ln.strip()]
    return rest, (lines[-1].strip() if lines else "")


def user_frames(error: BaseException, limit: int = FRAMES) -> list[tuple[str, int, str, str]]:
    """The last ``limit`` frames of ``error``'s traceback in the user's code (:func:`is_user_file`),
    outermost first, as ``(file, line, function, code)``; a DataLoader worker process's frames are
    read from the message (see the module docstring)."""
    orig = _original(str(error))
    if orig is not None:
        frames = _text_frames(orig[0])
    else:
        frames = [(f.filename, f.lineno or 0, f.name, (f.line or "").strip())
                  for f in traceback.extract_tb(error.__traceback__)]
    return [f for f in frames if is_user_file(f[0])][-limit:] if limit > 0 else []


def describe(error: BaseException, what: str, limit: int = FRAMES) -> str:
    """``"{what} raised {Type}: {message} (in {function})"`` then the user's frames
    (:func:`user_frames`), each as Python prints it, indented by two more spaces so that log
    readers (``launcher/tasklog.py``) keep them with the first line. The message is the
    exception's first line (a DataLoader worker process's: the original exception's line)."""
    orig = _original(str(error))
    if orig is not None and orig[1]:
        head = orig[1]
    else:
        message = str(error).strip().splitlines()
        head = f"{type(error).__name__}: {message[0]}" if message else type(error).__name__
    frames = user_frames(error, limit)
    where = f" (in {frames[-1][2]})" if frames else ""
    out = [f"{what} raised {head}{where}"]
    for file, line, name, code in frames:
        out.append(f'  File "{file}", line {line}, in {name}')
        if code:
            out.append(f"    {code}")
    return "\n".join(out)


def guarded(batches: Iterable[Any], what: str, passes: Callable[[BaseException], bool] = lambda e: False
            ) -> Iterator[Any]:
    """``batches``, with what their iteration raises (the user's Dataset, sampler or collate
    function under a DataLoader) turned into :class:`UserCodeError` (:func:`describe` with
    ``what``); an exception for which ``passes(e)`` is true propagates unchanged."""
    it = iter(batches)
    while True:
        try:
            batch = next(it)
        except StopIteration:
            return
        except Exception as e:  # noqa: BLE001 - the user's code raised: named with its frames
            if passes(e):
                raise
            raise UserCodeError(describe(e, what), e) from e
        yield batch
