"""A user's exception as the person at the terminal needs it (issue 33 item 9): its type, its
message and the last frames of its traceback that are in the user's code (not Python's, not an
installed package's such as TensorFlow's or torch's, not csrun's), as a few lines::

    train_input: the DataLoader raised ValueError: sample 7 is broken (in __getitem__)
      File "/home/me/job/data.py", line 31, in __getitem__
        raise ValueError(f"sample {i} is broken")

One filter for every backend. A framework that re-raises the user's error elsewhere carries the
original traceback as text in the message: torch for a DataLoader worker process (``Caught
ValueError in DataLoader worker process 0.`` / ``Original Traceback (most recent call last):``
...), TensorFlow for a ``map`` function traced by AutoGraph or run by ``tf.py_function``; those
frames are read from the text and come after the traceback's own. A backend names the files its
framework generates (:attr:`csrun_runtime.facts.BackendFacts.generated_files`: AutoGraph's),
whose frames are not the user's. Pure; imports no framework.
"""
from __future__ import annotations

import re
import sysconfig
import traceback
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

__all__ = ["FRAMES", "UserCodeError", "describe", "user_frames", "is_user_file", "guarded"]

#: Frames of the user's code shown at most (the last ones: nearest the raise).
FRAMES = 3

_ORIGINAL = "Original Traceback (most recent call last):"
_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+), in (\S+)')
_HEAD = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Warning)\b.*")
_CSRUN = Path(__file__).resolve().parents[1]
_OURS = tuple(str(_CSRUN / p) for p in ("csrun_runtime", "csrun_common", "launcher", "analyzer"))
_THEIRS = tuple({p for k in ("stdlib", "platstdlib", "purelib", "platlib")
                 if (p := sysconfig.get_paths().get(k))})

Frame = tuple[str, int, str, str]


class UserCodeError(ValueError):
    """The user's code raised (a data function, a Dataset, a sampler, a collate function):
    ``str()`` is :func:`describe`'s text (first line, then indented frames); ``error`` is the
    exception raised."""

    def __init__(self, text: str, error: BaseException):
        super().__init__(text)
        self.error = error


def is_user_file(filename: str, generated: Sequence[str] = ()) -> bool:
    """Whether a frame's file is the user's: not ``<frozen ...>``/``<string>``, not under Python's
    library or site-packages, not csrun's own packages, none of ``generated`` in its name."""
    if not filename or filename.startswith("<"):
        return False
    return not filename.startswith(_OURS + _THEIRS) and not any(g in filename for g in generated)


def _message_frames(message: str) -> tuple[list[Frame], str]:
    """``(frames, head)`` of a traceback printed in ``message`` (after torch's "Original
    Traceback" line when there is one): its ``(file, line, function, code)`` frames and the
    exception line after the last of them (``""`` when there is none)."""
    _, sep, rest = message.partition(_ORIGINAL)
    lines = (rest if sep else message).splitlines()
    frames, last = [], -1
    for i, ln in enumerate(lines):
        m = _FRAME.match(ln)
        if m:
            code = lines[i + 1].strip() if i + 1 < len(lines) and not _FRAME.match(lines[i + 1]) else ""
            frames.append((m.group(1), int(m.group(2)), m.group(3), code))
            last = i
    if not frames:
        return [], ""
    after = [ln.strip() for ln in lines[last + 2:] if ln.strip()]
    head = next((ln for ln in after if _HEAD.match(ln)), after[-1] if sep and after else "")
    return frames, head


def user_frames(error: BaseException, limit: int = FRAMES, generated: Sequence[str] = ()) -> list[Frame]:
    """The last ``limit`` frames of ``error``'s traceback in the user's code (:func:`is_user_file`),
    outermost first, as ``(file, line, function, code)``: the traceback's own frames, then those
    printed in its message (module docstring)."""
    outer = [(f.filename, f.lineno or 0, f.name, (f.line or "").strip())
             for f in traceback.extract_tb(error.__traceback__)]
    frames = outer + _message_frames(str(error))[0]
    return [f for f in frames if is_user_file(f[0], generated)][-limit:] if limit > 0 else []


def describe(error: BaseException, what: str, limit: int = FRAMES, generated: Sequence[str] = ()) -> str:
    """``"{what} raised {Type}: {message} (in {function})"`` then the user's frames
    (:func:`user_frames`), each as Python prints it, indented by two more spaces so that log
    readers (``launcher/tasklog.py``) keep them with the first line. The message is the
    exception's first line, or the exception line of the traceback its message carries."""
    head = _message_frames(str(error))[1]
    if not head:
        message = str(error).strip().splitlines()
        head = f"{type(error).__name__}: {message[0].strip()}" if message else type(error).__name__
    frames = user_frames(error, limit, generated)
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
