"""TensorFlow's import, without the two C++ lines it prints before any log level applies.

TensorFlow 2.21 prints, while ``import tensorflow`` runs and before it reads
``TF_CPP_MIN_LOG_LEVEL``, absl's "WARNING: All log messages before absl::InitializeLog() is
called are written to STDERR" and its oneDNN note ("... port.cc:...] oneDNN custom
operations are on ...", LOG(INFO) in ``tensorflow/core/util/port.cc``), each twice: 4 lines
per task, 28 for the 7-task main job. No environment variable removes them
(``TF_CPP_MIN_LOG_LEVEL``, ``GLOG_minloglevel`` and ``ABSL_MIN_LOG_LEVEL`` were tried;
``TF_ENABLE_ONEDNN_OPTS=0`` does, by switching oneDNN off, which changes the numerics).

So in a launched task (``CSRUN_ROLE`` set) the runtime imports TensorFlow itself, when the
runtime is imported (run.py imports it first, docs/CONTRACT.md), with file descriptor 2
pointed at a temporary file; then it writes back to stderr every line captured except
those two messages. Everything else printed during the import (warnings, errors, a
traceback) reaches stderr as before, in order, once the import returns or fails.
``TF_CPP_MIN_LOG_LEVEL=0`` (``csrun_wse --verbose`` exports it) or ``CSRUN_VERBOSE=1``
keeps every line.
"""
from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterable, Mapping

from csrun_common.env import ROLE, VERBOSE

__all__ = ["NOISE", "is_noise", "wanted", "import_tensorflow"]

#: The start-up lines dropped (substrings of the whole line).
NOISE = ("WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
         "oneDNN custom operations are on.")


def is_noise(line: str) -> bool:
    """True for one of the :data:`NOISE` lines (the oneDNN note only as a C++ log line of
    ``port.cc``, so that a user's own message quoting it is kept)."""
    if NOISE[0] in line:
        return line.strip() == NOISE[0]
    return NOISE[1] in line and "port.cc:" in line


def wanted(environ: Mapping[str, str], argv0: str) -> bool:
    """Whether the runtime imports TensorFlow quietly in this process: a launched task
    (``CSRUN_ROLE`` set) running a script (``argv0`` a file, not ``-m`` or ``-c``: the input
    worker's supervisor, ``python -m csrun_runtime...``, needs no TensorFlow), neither
    ``CSRUN_VERBOSE=1`` nor ``TF_CPP_MIN_LOG_LEVEL=0``, and TensorFlow not imported yet."""
    if not environ.get(ROLE) or argv0 in ("", "-m", "-c"):
        return False
    if VERBOSE.flag(environ):
        return False
    if environ.get("TF_CPP_MIN_LOG_LEVEL", "1").strip() == "0":
        return False
    return "tensorflow" not in sys.modules


def _replay(lines: Iterable[str]) -> None:
    for line in lines:
        if not is_noise(line):
            sys.stderr.write(line)
    sys.stderr.flush()


def import_tensorflow() -> None:
    """``import tensorflow`` with the :data:`NOISE` lines dropped from what it prints on file
    descriptor 2 (see the module docstring). Raises what the import raises (after the
    captured lines are written back)."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            import tensorflow  # noqa: F401 - the import is the point
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            _replay(tmp.read().decode("utf-8", "replace").splitlines(keepends=True))
