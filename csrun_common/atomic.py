"""Atomic file writes: readers on a shared file system never see a partial file.

The one helper for write-to-a-temporary-file-then-rename in csrun (model_dir artifacts,
rendezvous files, probe results, reports, shard plans, benchmark results).

Files are created with the mode ``open()`` would give them (``0o666`` less the process's
umask: 0644 under the usual 022), as checkpoints and TensorBoard events are, so teammates
on a shared cluster can read them; ``tempfile.mkstemp`` alone would leave them 0600. With
``private=True`` a file is 0600: only its owner reads it (the rendezvous' files,
docs/SECURITY.md).
"""
from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

__all__ = ["atomic_open", "write_json", "write_text", "read_json", "current_umask"]


def current_umask() -> int:
    """The process's umask (e.g. ``0o022``): the ``Umask:`` line of ``/proc/self/status``
    (Linux >= 4.7, read without changing anything), else set and restored with ``os.umask``."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextmanager
def atomic_open(path: str | os.PathLike[str], mode: str = "w", private: bool = False) -> Iterator[IO[Any]]:
    """Open a temporary file beside ``path`` for writing; on a clean exit of the ``with``
    block it is renamed over ``path`` (``os.replace``: atomic on POSIX); on an exception
    it is removed and ``path`` is left as it was. Creates the parent directory. The file
    gets ``0o666 & ~umask`` (:func:`current_umask`), as a plain ``open()`` would give it;
    ``private``: 0600.
    ``mode`` is ``"w"`` (text, UTF-8) or ``"wb"``."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=str(p.parent))
    try:
        os.fchmod(fd, 0o600 if private else 0o666 & ~current_umask())
        with os.fdopen(fd, mode, encoding=None if "b" in mode else "utf-8") as f:
            yield f
        os.replace(tmp, p)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_text(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` to ``path`` atomically (:func:`atomic_open`). Returns the path."""
    with atomic_open(path) as f:
        f.write(text)
    return Path(path)


def write_json(path: str | os.PathLike[str], obj: Any, indent: int | None = 2,
               allow_nan: bool = True, private: bool = False) -> Path:
    """Write ``obj`` as JSON atomically (:func:`atomic_open`; ``private``: 0600), ending with a
    newline; values JSON cannot hold are written with ``str()``. With ``allow_nan=False`` a NaN
    or infinity raises ``ValueError`` (strict JSON). Returns the path."""
    with atomic_open(path, private=private) as f:
        json.dump(obj, f, indent=indent, default=str, allow_nan=allow_nan)
        f.write("\n")
    return Path(path)


def read_json(path: str | os.PathLike[str]) -> Any | None:
    """Read JSON; ``None`` when the file is missing or unreadable (e.g. being replaced)."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None
