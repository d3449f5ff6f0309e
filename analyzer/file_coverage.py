"""cs_input_analyzer's file-coverage step: do the input workers of a launch read each training
file once (sharded), or every file each (replicated)?

The step runs one process (``python -m analyzer.file_coverage``, the interpreter that runs the
user's run.py) on the machine running the analyzer. That process loads run.py in capture mode
(:func:`csrun_runtime.capture.load_entry`: the user edits nothing), builds the training input
as input workers 0 and 1 of 2 would and as one unsharded worker, and reads back the files each
lists (:func:`csrun_runtime.tensorflow.coverage.check_file_coverage`; names only, no record is read); a
PyTorch run.py's DataLoaders are iterated for one pass each while the files they open are
recorded, and judged by the samples their samplers draw where those can be listed
(:func:`csrun_runtime.pytorch.coverage.check_dataloader_files`, ``level: sample``); the backend's
``probe`` module runs its framework's check (``file_coverage``, through :mod:`csrun_runtime.registry`).
Files read by both workers while others are read by none are a warning with the fix (exit 0),
or an error with ``--strict`` (exit 2, before any probe runs). The outcome goes into
``report.json`` (``file_coverage``) and the report's notes.

This module is imported by the CLI lazily; the task side imports the framework only in its
process, through the backend.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from csrun_common.atomic import write_json

__all__ = ["run_check", "findings", "main"]

#: seconds the check process may take (TensorFlow's import, run.py's load, three builds).
TIMEOUT_S = 300.0


def run_check(run_py: str, argv: Sequence[str], cwd: str, python: str, out: Path,
              timeout_s: float = TIMEOUT_S) -> dict[str, Any]:
    """Run the check process; returns its outcome (``verdict``: ``sharded``, ``replicated``,
    ``overlap`` or ``unknown``; ``problems``: messages with the fix; ``note``). A process that
    fails or times out gives ``verdict: unknown`` with the reason in ``note``."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    argv_py = [python, "-m", "analyzer.file_coverage", "--out", str(out), run_py, *argv]
    try:
        proc = subprocess.run(argv_py, cwd=cwd, capture_output=True, text=True, timeout=timeout_s,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return {"verdict": "unknown", "problems": [], "note": f"not checked: no result within {timeout_s:.0f} s"}
    except OSError as exc:
        return {"verdict": "unknown", "problems": [], "note": f"not checked: cannot run {python}: {exc.strerror}"}
    try:
        result = json.loads(out.read_text())
    except (OSError, ValueError):
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [f"exit status {proc.returncode}"]
        return {"verdict": "unknown", "problems": [], "note": f"not checked: {tail[0][:300]}"}
    return dict(result)


def findings(result: dict[str, Any], strict: bool, echo: Callable[[str], None]) -> tuple[list[str], int | None]:
    """Say the outcome on stderr (through ``echo``) and turn it into report notes.

    Returns ``(notes, exit_code)``: ``exit_code`` is 2 when ``strict`` and there is a problem
    (the analysis stops), else ``None``."""
    verdict = result.get("verdict", "unknown")
    problems = list(result.get("problems") or [])
    level = "error" if strict else "warning"
    for p in problems:
        echo(f"cs_input_analyzer: {level}: train_input: {p}")
    note = result.get("note") or ""
    # the backend's wording (its probe module's facts, not its framework)
    from csrun_runtime.probing import facts

    built = facts(result.get("framework")).coverage_built
    if result.get("level") == "sample" and verdict == "sharded":
        verdict = "sharded by sample"  # the note says the sample-level judgement
    notes = [f"input workers' files ({built}): {verdict}"
             + (f" ({note})" if note else "")]
    notes += [f"{level}: {p}" for p in problems]
    return notes, (2 if strict and problems else None)


def _task(run_py: str, argv: list[str]) -> dict[str, Any]:
    """The check in the task's process (the framework runs there, never in the analyzer's):
    run.py captured, its backend's ``probe.file_coverage``, with ``framework``."""
    from csrun_runtime import registry
    from csrun_runtime.capture import load_entry

    entry = load_entry(run_py, argv)
    return {**registry.entry(entry.framework, "probe").file_coverage(entry), "framework": entry.framework}


def main(args: Sequence[str] | None = None) -> int:
    """The check process: ``python -m analyzer.file_coverage --out FILE RUN_PY [ARGS...]``;
    writes the outcome as JSON to FILE. Exit 0 when written, 1 otherwise."""
    args = list(sys.argv[1:] if args is None else args)
    if len(args) < 3 or args[0] != "--out":
        print("usage: python -m analyzer.file_coverage --out FILE RUN_PY [ARGS...]", file=sys.stderr)
        return 2
    out, run_py, argv = Path(args[1]), args[2], args[3:]
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        result = _task(run_py, argv)
    except Exception as exc:  # noqa: BLE001 - the user's run.py or input_fn failed: say why
        result = {"verdict": "unknown", "problems": [],
                  "note": f"not checked: {type(exc).__name__}: {str(exc).strip()[:300]}"}
    write_json(out, result)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # tf.data threads must not block the exit (ARCHITECTURE.md)


if __name__ == "__main__":
    sys.exit(main())
