"""``csrun_wse --check`` / ``csrun_cpu --check``: would this job run, before it waits an hour
in the queue and dies of a typo?

Nothing is submitted. The check asks Slurm (``sbatch --test-only`` for ``--use-sbatch``,
else ``srun --test-only``: sbatch(1)/srun(1) "return an estimate of when a job would be
scheduled to run given the current job queue and all the other arguments specifying the
job requirements. No job is actually submitted.") and looks at the files the job will need
on the shared file system: the command's script (run.py) and its ``--params`` file, the
parent of its ``--model_dir`` (or of ``runconfig.model_dir`` in the params), the mount
directories and the container image. It prints one line per check and the expected start
time; the exit status is 0 when everything passed, else 2 with one error line naming the
first problem (the layout, partition, account, QOS and the other flags were checked before,
as for any launch).
"""
from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from csrun_common.errors import CsrunError

from . import slurm
from .builders import CpuRequest, WseRequest
from .container import Container

__all__ = ["Check", "command_checks", "container_checks", "slurm_check", "run_check", "format_report"]


@dataclass(frozen=True)
class Check:
    """One line of the report: ``name`` (``run.py``, ``params``, ``slurm`` ...), whether it
    passed, and what was found."""

    name: str
    ok: bool
    detail: str


def _option_value(argv: Sequence[str], name: str) -> str | None:
    """The value of ``--name X`` or ``--name=X`` in ``argv`` (the last one wins)."""
    value = None
    for i, word in enumerate(argv):
        if word == name and i + 1 < len(argv):
            value = argv[i + 1]
        elif word.startswith(name + "="):
            value = word[len(name) + 1:]
    return value


def _readable_file(name: str, path: Path) -> Check:
    if not path.exists():
        return Check(name, False, f"{path}: no such file")
    if not path.is_file():
        return Check(name, False, f"{path}: not a file")
    if not os.access(path, os.R_OK):
        return Check(name, False, f"{path}: not readable")
    return Check(name, True, f"{path} (readable)")


def _writable_dir_check(name: str, path: Path) -> Check:
    if path.exists():
        ok = path.is_dir() and os.access(path, os.W_OK | os.X_OK)
        return Check(name, ok, f"{path} ({'exists, writable' if ok else 'exists but is not a writable directory'})")
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    ok = parent.is_dir() and os.access(parent, os.W_OK | os.X_OK)
    return Check(name, ok, f"{path} (to be created in {parent}: {'writable' if ok else 'NOT writable'})")


def _script_of(command: Sequence[str]) -> tuple[str | None, list[str]]:
    """The script a Python command runs and the arguments after it: ``python run.py --x``
    → ``("run.py", ["--x"])``; ``None`` for ``python -m mod`` / ``-c`` or a non-Python
    command."""
    if not command or not os.path.basename(command[0]).startswith("python"):
        return None, list(command[1:])
    for i, word in enumerate(command[1:], start=1):
        if word in ("-m", "-c"):
            return None, list(command[i + 1:])
        if not word.startswith("-"):
            return word, list(command[i + 1:])
    return None, []


def command_checks(command: Sequence[str], cwd: Path, in_container: bool) -> list[Check]:
    """Checks of the command's files, relative paths taken from ``cwd`` (srun keeps the
    submitting directory): the program (on PATH, unless it runs in a container), the
    script, ``--params`` and the model_dir's parent (``--model_dir``, else the params'
    ``runconfig.model_dir``)."""
    checks = []
    if command and not in_container:
        prog = command[0]
        found = shutil.which(prog) if "/" not in prog else (prog if os.access(cwd / prog, os.X_OK) else None)
        checks.append(Check("program", found is not None, f"{prog}: {found or 'not found or not executable'}"))
    script, args = _script_of(command)
    if script is not None:
        checks.append(_readable_file("script", cwd / script))
    params = _option_value(args, "--params")
    model_dir = _option_value(args, "--model_dir")
    if params is not None:
        check = _readable_file("params", cwd / params)
        checks.append(check)
        if check.ok and model_dir is None:
            model_dir = _model_dir_of(cwd / params)
    if model_dir is not None:
        checks.append(_writable_dir_check("model_dir", (cwd / model_dir).resolve()))
    return checks


def _model_dir_of(params: Path) -> str | None:
    """``runconfig.model_dir`` of a params YAML ("Cerebras Model Zoo YAML parameters"), if any."""
    try:
        data = yaml.safe_load(params.read_text())
    except (OSError, yaml.YAMLError):
        return None
    rc = data.get("runconfig") if isinstance(data, dict) else None
    value = rc.get("model_dir") if isinstance(rc, dict) else None
    return str(value) if value else None


def container_checks(container: Container) -> list[Check]:
    """The mount directories (each an existing, readable directory) and the image (a
    readable file for Singularity/Apptainer; for Pyxis only a path-like image, a registry
    reference cannot be checked from here)."""
    checks = []
    for d in container.mount_dirs:
        p = Path(d)
        ok = p.is_dir() and os.access(p, os.R_OK | os.X_OK)
        checks.append(Check("mount dir", ok, f"{d} ({'readable directory' if ok else 'no such readable directory'})"))
    if container.runtime in ("singularity", "apptainer"):
        checks.append(_readable_file("image", Path(container.image)))
    elif container.runtime == "pyxis":
        if container.image.startswith(("/", "./")) or container.image.endswith(".sqsh"):
            checks.append(_readable_file("image", Path(container.image)))
        else:
            checks.append(Check("image", True, f"{container.image} (registry image: not checked from here)"))
    return checks


def slurm_check(req: WseRequest | CpuRequest, use_sbatch: bool) -> Check:
    """Slurm's ``--test-only`` answer for the request: the expected start time, or its reason."""
    if use_sbatch:
        answer, how = slurm.test_only_batch(req.materialize_sbatch()), "sbatch --test-only"
    else:
        answer, how = slurm.test_only_srun(req.materialize_srun()), "srun --test-only"
    return _test_only_check("slurm", how, answer)


def worker_job_check(req: WseRequest) -> Check | None:
    """``srun --test-only`` of the input workers' own job (``--survive-node-loss``), which the
    chief's ``--test-only`` does not cover: it is a job of its own, started beside the chief's
    (by csrun_wse, or by the batch script). ``None`` without it."""
    argv = req.materialize_worker_srun()
    if argv is None:
        return None
    return _test_only_check("worker job", "srun --test-only", slurm.test_only_srun(argv))


def _test_only_check(name: str, how: str, answer: slurm.TestOnly) -> Check:
    if answer.ok:
        return Check(name, True, f"{how}: expected start {answer.start} ({'; '.join(answer.lines)})")
    return Check(name, False, f"{how}: cannot run: {answer.reason}")


def requeue_check(req: WseRequest) -> Check | None:
    """What ``--requeue`` will meet on this cluster: the warning signal, ``KillWait`` (the
    chief's time to save after SIGTERM) and, on releases that have it, ``MaxBatchRequeue``
    (Slurm's own cap on automatic requeues; 22.05 has none). ``None`` without ``--requeue``."""
    if req.requeue is None:
        return None
    conf = slurm.config_values(["KillWait", "MaxBatchRequeue"])
    spec = req.requeue
    detail = (f"SIG{spec.signal} {spec.lead} s before the time limit, at most {spec.max_requeues} requeue(s); "
              f"KillWait {conf.get('KillWait', '?')} after SIGTERM")
    cap = conf.get("MaxBatchRequeue")
    if cap is not None and cap.isdigit() and spec.max_requeues > int(cap):
        detail += f"; note: Slurm's MaxBatchRequeue is {cap}, below --max-requeues {spec.max_requeues}"
    return Check("requeue", True, detail)


def format_report(prog: str, checks: Sequence[Check]) -> str:
    """The report printed on stdout: a verdict line, then one ``ok``/``FAIL`` line per check."""
    failed = [c for c in checks if not c.ok]
    head = f"{prog} --check: " + ("the job can run" if not failed else f"{len(failed)} problem(s): the job cannot run")
    width = max((len(c.name) for c in checks), default=0)
    lines = [head] + [f"  {'ok  ' if c.ok else 'FAIL'}  {c.name:<{width}}  {c.detail}" for c in checks]
    return "\n".join(lines)


def run_check(prog: str, req: WseRequest | CpuRequest, use_sbatch: bool, cwd: Path | None = None) -> tuple[str, int]:
    """Run every check; returns the report and the exit status (0). Raises
    :class:`CsrunError` (exit 2) naming the first problem after the report was built, so
    the CLI prints the report, then the one error line."""
    here = Path.cwd() if cwd is None else cwd
    checks = [slurm_check(req, use_sbatch)]
    if isinstance(req, WseRequest):
        checks += [c for c in (worker_job_check(req), requeue_check(req)) if c is not None]
    checks += command_checks(req.command, here, req.container.runtime != "none")
    checks += container_checks(req.container)
    report = format_report(prog, checks)
    failed = [c for c in checks if not c.ok]
    if failed:
        raise PreflightFailed(report, f"--check: the job cannot run: {failed[0].name}: {failed[0].detail}"
                              + (f" (and {len(failed) - 1} more problem(s) above)" if len(failed) > 1 else ""))
    return report, 0


class PreflightFailed(CsrunError):
    """``--check`` found problems: ``report`` is the full report (printed on stdout before the
    one error line)."""

    def __init__(self, report: str, message: str):
        super().__init__(message)
        self.report = report
