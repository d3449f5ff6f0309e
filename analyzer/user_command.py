"""The user's command: split into its interpreter word, run.py and arguments
(:func:`split_command`), run first (:func:`run_user_command`), and the accelerator's target
rate its ``model_dir`` holds (:func:`find_target`). Light: imported at the CLI's start-up.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import click

from csrun_common import exits
from csrun_common.errors import CsrunError
from csrun_runtime.registry import launchers
from launcher.config import KEY_FLAGS


@dataclass
class Command:
    """The user's command split: ``python`` word, ``run_py`` (absolute), ``argv`` after it."""

    words: list[str]
    python_word: str | None
    run_py: str
    argv: list[str] = field(default_factory=list)


def split_command(words: Sequence[str], cwd: str) -> Command:
    """``python run.py ARGS`` / ``python-ws run.py ARGS`` / ``run.py ARGS`` → :class:`Command`.

    Raises :class:`CsrunError` (exit 2) when no ``*.py`` script follows the interpreter.
    """
    words = list(words)
    if not words:
        raise CsrunError("COMMAND: missing (expected `python run.py --params ... --mode validate_only`)")
    first = words[0]
    if first.endswith(".py"):
        py_word, script, rest = None, first, words[1:]
    else:
        base = os.path.basename(first)
        if not (base.startswith("python") or base in launchers().values()):
            raise CsrunError(f"COMMAND {first!r}: expected `python run.py ...` (a Python run.py)")
        if len(words) < 2 or not words[1].endswith(".py"):
            raise CsrunError(f"COMMAND {' '.join(words[:2])!r}: expected a run.py after {first}")
        py_word, script, rest = first, words[1], words[2:]
    path = Path(script) if os.path.isabs(script) else Path(cwd) / script
    if not path.is_file():
        raise CsrunError(f"COMMAND: {script}: no such file")
    return Command(words=words, python_word=py_word, run_py=str(path.resolve()), argv=list(rest))


def find_target(model_dir: str) -> tuple[float | None, str]:
    """The accelerator's consumption rate (samples/s) and where it came from.

    Looks, in order, at ``compile_report.json`` (``est_samples_per_sec``), ``compile_report.txt``
    (a number followed by ``samples/s`` or ``samples per second``) and
    ``performance/performance.json`` (``est_samples_per_sec``) in ``model_dir``. Returns
    ``(None, reason)`` when none has one.
    """
    md = Path(model_dir)
    for name in ("compile_report.json",):
        v = _json_rate(md / name)
        if v:
            return v, f"estimate in {md / name}"
    txt = md / "compile_report.txt"
    if txt.is_file():
        m = re.search(r"([0-9][0-9,]*\.?[0-9]*)\s*(?:samples/s(?:ec)?|samples per sec)",
                      txt.read_text(errors="replace"), re.IGNORECASE)
        if m:
            try:
                return float(m.group(1).replace(",", "")), f"estimate in {txt}"
            except ValueError:
                pass
    perf = md / "performance" / "performance.json"
    v = _json_rate(perf)
    if v:
        return v, f"est_samples_per_sec of a previous run ({perf})"
    return None, "no --target-samples-per-sec, compile report or previous run"


def _json_rate(path: Path) -> float | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    for key in ("est_samples_per_sec", "estimated_samples_per_sec", "samples_per_sec_estimate"):
        v = data.get(key)
        if isinstance(v, (int, float)) and v > 0:
            return float(v)
    for sub in data.values():
        if isinstance(sub, dict):
            v = sub.get("est_samples_per_sec")
            if isinstance(v, (int, float)) and v > 0:
                return float(v)
    return None


def console_script(name: str) -> str:
    """The console script ``name`` beside this interpreter, else on PATH, else ``name``."""
    here = Path(sys.executable).parent / name
    return str(here) if here.exists() else (shutil.which(name) or name)


def run_user_command(cmd: Command, local: bool, mount_dirs: str | None, cwd: str, log: Path,
                     python: str, timeout_s: float = 1800) -> int:
    """Run the user's command first (``csrun_cpu [--mount-dirs] CMD`` or, locally, CMD with
    ``python`` for the interpreter word). Output goes to ``log`` and, on failure, its tail
    to stderr. Returns the exit status."""
    if local:
        argv = [python, cmd.run_py, *cmd.argv]
    else:
        mount = [KEY_FLAGS["mount_dirs"].flag, mount_dirs] if mount_dirs else []
        argv = [console_script("csrun_cpu"), *mount, *cmd.words]
    shown = argv[:1] + [os.path.basename(argv[1])] + argv[2:] if local else argv
    click.echo(f"cs_input_analyzer: running {' '.join(shown)}", err=True)
    with open(log, "wb") as f:
        try:
            proc = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT, cwd=cwd, timeout=timeout_s,
                                  stdin=subprocess.DEVNULL)
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            rc = exits.TIMEOUT
        except OSError as exc:
            raise CsrunError(f"cannot run {argv[0]}: {exc.strerror}", 2) from None
    if rc != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-15:]
        click.echo("\n".join(tail), err=True)
    return rc

