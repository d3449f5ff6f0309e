"""``csrun_wse --check`` / ``csrun_cpu --check``: would this job run, before it waits an hour
in the queue and dies of a typo?

Nothing is submitted. The check asks Slurm (``sbatch --test-only`` for ``--use-sbatch``,
else ``srun --test-only``: sbatch(1)/srun(1) "return an estimate of when a job would be
scheduled to run given the current job queue and all the other arguments specifying the
job requirements. No job is actually submitted.") and looks at the files the job will need
on the shared file system: the command's script (run.py) and its ``--params`` file, the
input data the params name, the parent of its ``--model_dir`` (or of ``runconfig.model_dir``
in the params), a shard plan's files, the mount directories and the container image. It
prints one line per check and the expected start time; the exit status is 0 when everything
passed, else 2 with one error line naming the first problem (the layout, partition, account,
QOS and the other flags were checked before, as for any launch).

Every launch, ``--check`` or not, runs the file checks first (:func:`presubmit`, the same
code): a misspelled script, a missing params file or data directory is refused in a few
milliseconds with one line naming the path and the flag or params field, instead of a job
that waits in the queue and fails on the nodes (issue 24). ``--no-path-checks`` skips them
where the login node does not see the compute nodes' file systems (docs/CHECKS.md).
"""
from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from csrun_common.datapaths import data_path_exists
from csrun_common.errors import CsrunError
from csrun_common.shardplan_schema import load_plan

from . import slurm
from .builders import CpuRequest, WseRequest
from .container import Container

__all__ = ["Check", "script_of", "command_checks", "data_checks", "shard_plan_checks", "presubmit_checks", "presubmit",
           "container_checks", "slurm_check", "run_check", "format_report", "load_params", "show", "DATA_KEYS"]


@dataclass(frozen=True)
class Check:
    """One line of the report: ``name`` (``run.py``, ``params``, ``slurm`` ...), whether it
    passed, and what was found."""

    name: str
    ok: bool
    detail: str
    where: str = ""  # the flag or params field the checked path comes from ("--params x.yaml")
    warning: str = ""  # a check that passed but deserves a line (a launch prints it as a warning)

    def message(self) -> str:
        """The one-line error of a failed check: where the path came from, then what was found."""
        return f"{self.where or self.name}: {self.detail}"


def _option_value(argv: Sequence[str], *names: str) -> tuple[str, str] | None:
    """``(name, value)`` of the last ``--name X`` or ``--name=X`` in ``argv`` for any of
    ``names`` (``-p X`` for a short name); ``None`` when absent."""
    found = None
    for i, word in enumerate(argv):
        for name in names:
            if word == name and i + 1 < len(argv):
                found = (name, argv[i + 1])
            elif name.startswith("--") and word.startswith(name + "="):
                found = (name, word[len(name) + 1:])
    return found


def show(value: object) -> str:
    """A path or value for a one-line message: as it is when plain, else ``repr`` (quotes,
    spaces, newlines and other control characters cannot break the line or mislead)."""
    text = str(value)
    if text and text.isprintable() and not any(c in text for c in " '\"\\"):
        return text
    return repr(text)


def _readable_file(name: str, path: Path, where: str = "") -> Check:
    if not path.exists():
        return Check(name, False, f"{show(path)}: no such file", where)
    if not path.is_file():
        return Check(name, False, f"{show(path)}: not a file", where)
    if not os.access(path, os.R_OK):
        return Check(name, False, f"{show(path)}: not readable", where)
    return Check(name, True, f"{show(path)} (readable)", where)


def _writable_dir_check(name: str, path: Path, where: str = "") -> Check:
    if path.exists():
        ok = path.is_dir() and os.access(path, os.W_OK | os.X_OK)
        state = "exists, writable" if ok else "exists but is not a writable directory"
        return Check(name, ok, f"{show(path)} ({state})", where)
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    ok = parent.is_dir() and os.access(parent, os.W_OK | os.X_OK)
    return Check(name, ok, f"{show(path)} (to be created in {show(parent)}: {'writable' if ok else 'NOT writable'})",
                 where)


#: Options of the Python interpreter that take a value (``python -W ignore run.py``).
_PYTHON_VALUED = ("-W", "-X", "--check-hash-based-pycs")


def script_of(command: Sequence[str]) -> tuple[str | None, list[str]]:
    """The script a Python command runs and the arguments after it: ``python run.py --x``
    → ``("run.py", ["--x"])``; ``None`` for ``python -m mod`` / ``-c`` or a non-Python
    command."""
    if not command or not os.path.basename(command[0]).startswith("python"):
        return None, list(command[1:])
    words = list(command[1:])
    i = 0
    while i < len(words):
        word = words[i]
        if word in ("-m", "-c") or (word.startswith("-") and word[1:2] in ("m", "c") and not word.startswith("--")):
            return None, words[i + 1:]
        if word in _PYTHON_VALUED:
            i += 2
            continue
        if not word.startswith("-") or word == "-":
            return (word, words[i + 1:]) if word != "-" else (None, words[i + 1:])
        i += 1
    return None, []


#: Keys of ``train_input`` / ``eval_input`` that name input data: a path, a glob, or a list
#: of them (the Model Zoo's ``data_dir`` may be a list; ``data_files`` is what a shard plan
#: gives each worker, docs/CONTRACT.md).
DATA_KEYS = ("data_dir", "data_dirs", "data_file", "data_files", "dataset_path", "dataset_paths")
#: The params sections whose :data:`DATA_KEYS` are checked.
INPUT_SECTIONS = ("train_input", "eval_input")
#: Appended to the one-line error of a failed path check.
SKIP_HINT = "checked from this host; --no-path-checks skips the path checks"


def _ancestors(path: Path) -> list[Path]:
    return [path, *path.parents]


def _found_elsewhere(value: str, bases: Sequence[Path]) -> Path | None:
    """The first of ``bases`` a relative ``value`` (a path or a glob) names something from."""
    for b in bases:
        if data_path_exists(value, b):
            return b
    return None


def data_checks(params: Mapping[str, Any], params_where: str, launch_dir: Path,
                elsewhere: Sequence[Path] = ()) -> list[Check]:
    """One check per :data:`DATA_KEYS` entry of the input sections of ``params``: each path
    (or every path of a list) exists, a relative one taken from ``launch_dir`` as the job's
    tasks take it (:func:`csrun_common.datapaths.resolve_data_path`, the runtime's rule). A
    relative path found only from one of ``elsewhere`` (the script's and the params file's
    directories and their parents: a pipeline may resolve against its own directory, as
    examples/images does) passes with a ``warning``; one found nowhere fails.
    ``params_where`` names the params file in the messages."""
    checks = []
    for section in INPUT_SECTIONS:
        body = params.get(section)
        if not isinstance(body, Mapping):
            continue
        for key in DATA_KEYS:
            value = body.get(key)
            values = [value] if isinstance(value, str) else list(value) if isinstance(value, list) else []
            values = [v for v in values if isinstance(v, str) and v]
            if not values:
                continue
            where = f"{section}.{key} ({params_where})"
            missing = [v for v in values if not data_path_exists(v, launch_dir)]
            found = {v: _found_elsewhere(v, elsewhere) for v in missing if not os.path.isabs(v)}
            lost = [v for v in missing if found.get(v) is None]
            if lost:
                more = f" (and {len(lost) - 1} more of {len(values)})" if len(lost) > 1 else ""
                rel = "" if os.path.isabs(lost[0]) else \
                    f" (relative: from the launch directory {show(str(launch_dir))}, where the job's tasks resolve it)"
                checks.append(Check("data", False, f"{show(lost[0])}: no such file or directory{rel}{more}", where))
                continue
            warning = ""
            if missing:
                v = missing[0]
                warning = (f"{where}: {show(v)} is not found from the launch directory {show(str(launch_dir))}, "
                           f"where the job's tasks resolve relative paths, but from {show(str(found[v]))}: "
                           f"fine only if the pipeline resolves it against its own directory")
            checks.append(Check("data", True, f"{section}.{key}: {len(values)} path(s) found", where, warning))
    return checks


def load_params(path: Path) -> tuple[dict[str, Any] | None, str]:
    """A params YAML (``yaml.safe_load``) and ``""``, or ``None`` and why it cannot be used
    (one line: not valid YAML with the parser's first message, or a top level that is not a
    mapping of sections)."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        return None, f"cannot read: {exc.strerror}"
    except UnicodeDecodeError:
        return None, "not a text file"
    except yaml.YAMLError as exc:
        first = " ".join(str(exc).split())
        return None, f"not valid YAML: {first[:200]}"
    if data is None:
        return {}, ""
    if not isinstance(data, dict):
        return None, f"not a mapping of sections (train_input, eval_input, model, optimizer, runconfig): " \
                     f"a YAML {type(data).__name__}"
    return data, ""


def command_checks(command: Sequence[str], cwd: Path, in_container: bool, *, default_params: bool = False,
                   data: bool = True) -> list[Check]:
    """Checks of the command's files, relative paths taken from ``cwd`` (srun and sbatch
    keep the submitting directory): the program (on PATH, unless it runs in a container),
    the script, ``--params``/``-p`` (exists, readable, a YAML mapping; with
    ``default_params`` and no ``--params`` the runtime's default ``configs/params.yaml``
    beside the script when it exists, csrun_runtime.params.parse_args), the input data
    the params name (:func:`data_checks`, with ``data``) and the model_dir's parent
    (``--model_dir``/``-o``, else the params' ``runconfig.model_dir``, else the runtime's
    default ``./model_dir``)."""
    checks = []
    if command and not in_container:
        prog = command[0]
        found = shutil.which(prog) if "/" not in prog else (prog if os.access(cwd / prog, os.X_OK) else None)
        checks.append(Check("program", found is not None,
                            f"{show(prog)}: {show(found) if found else 'not found on PATH or not executable'}",
                            "COMMAND"))
    script, args = script_of(command)
    script_path = None
    if script is not None:
        script_path = cwd / script
        checks.append(_readable_file("script", script_path, f"script {show(script)}"))
    params_opt = _option_value(args, "--params", "-p")
    model_opt = _option_value(args, "--model_dir", "-o")
    params_path = params_where = None
    if params_opt is not None:
        params_path, params_where = cwd / params_opt[1], f"{params_opt[0]} {show(params_opt[1])}"
        check = _readable_file("params", params_path, params_where)
        checks.append(check)
        if not check.ok:
            params_path = None
    elif default_params and script_path is not None and script_path.is_file():
        default = script_path.parent / "configs" / "params.yaml"
        if default.is_file():
            params_path, params_where = default, f"the default params {show(default)}"
    params: dict[str, Any] | None = None
    if params_path is not None and params_where is not None:
        params, why = load_params(params_path)
        if params is None:
            checks.append(Check("params", False, f"{show(params_path)}: {why}", params_where))
        elif data:
            bases: list[Path] = []
            for anchor in (script_path, params_path):
                if anchor is not None:
                    bases += [b for b in _ancestors(anchor.resolve().parent) if b not in bases and b != cwd]
            checks += data_checks(params, params_where, cwd, bases)
    if model_opt is not None:
        checks.append(_writable_dir_check("model_dir", (cwd / model_opt[1]).resolve(),
                                          f"{model_opt[0]} {show(model_opt[1])}"))
    elif params is not None:
        rc = params.get("runconfig")
        value = rc.get("model_dir") if isinstance(rc, dict) else None
        where = f"runconfig.model_dir ({params_where})" if value else "runconfig.model_dir (default ./model_dir)"
        checks.append(_writable_dir_check("model_dir", (cwd / str(value or "model_dir")).resolve(), where))
    return checks


def model_dir_of(command: Sequence[str], cwd: Path) -> Path | None:
    """The model_dir a training command writes, as :func:`command_checks` finds it
    (``--model_dir``/``-o``, else ``runconfig.model_dir`` of ``--params`` or of the default
    ``configs/params.yaml`` beside the script, else ``./model_dir``), absolute; ``None`` for a
    command that runs no Python script."""
    script, args = script_of(command)
    if script is None:
        return None
    model_opt = _option_value(args, "--model_dir", "-o")
    if model_opt is not None:
        return (cwd / model_opt[1]).resolve()
    params_opt = _option_value(args, "--params", "-p")
    params_path = cwd / params_opt[1] if params_opt else (cwd / script).parent / "configs" / "params.yaml"
    params, _why = load_params(params_path) if params_path.is_file() else (None, "")
    rc = (params or {}).get("runconfig")
    value = rc.get("model_dir") if isinstance(rc, dict) else None
    return (cwd / str(value or "model_dir")).resolve()


def shard_plan_checks(plan_path: str, cwd: Path) -> list[Check]:
    """Every file of every worker of the shard plan at ``plan_path`` exists (one check; a
    plan that does not load is reported as such: the CLI checked it before)."""
    where = f"--shard-plan {show(plan_path)}"
    try:
        plan = load_plan(cwd / plan_path)
    except (ValueError, OSError) as exc:
        return [Check("shard plan", False, " ".join(str(exc).split()), where)]
    missing: list[tuple[int, str]] = []
    total = 0
    for w in plan["workers"]:
        for f in w["files"]:
            total += 1
            if not (cwd / f).exists():
                missing.append((int(w["index"]), f))
    if missing:
        index, first = missing[0]
        more = f" (and {len(missing) - 1} more of {total})" if len(missing) > 1 else ""
        return [Check("shard plan", False, f"worker {index}'s file {show(first)}: no such file{more}", where)]
    return [Check("shard plan", True, f"{total} file(s) of {len(plan['workers'])} worker(s) exist", where)]


def presubmit_checks(req: WseRequest | CpuRequest, cwd: Path | None = None) -> list[Check]:
    """The cheap checks of the files a launch needs, run before every submission
    (``csrun_wse``: with the default params beside the script and the shard plan's files;
    ``csrun_cpu``: its command may be the one making the data, so only an explicit
    ``--params``'s data paths): :func:`command_checks` and :func:`shard_plan_checks`. No
    Slurm, no TensorFlow: ~ms of stat calls and one YAML parse."""
    here = Path.cwd() if cwd is None else cwd
    wse = isinstance(req, WseRequest)
    checks = command_checks(req.command, here, req.container.runtime != "none", default_params=wse)
    if isinstance(req, WseRequest) and req.shard_plan:
        checks += shard_plan_checks(req.shard_plan, here)
    return checks


def presubmit(req: WseRequest | CpuRequest, cwd: Path | None = None) -> list[Check]:
    """Run :func:`presubmit_checks`; raises :class:`CsrunError` (exit 2) with one line
    naming the first failure's path and its flag or params field. Returns the checks."""
    checks = presubmit_checks(req, cwd)
    for c in checks:
        if not c.ok:
            raise CsrunError(f"{c.message()} ({SKIP_HINT})")
    return checks


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


def run_check(prog: str, req: WseRequest | CpuRequest, use_sbatch: bool, cwd: Path | None = None,
              path_checks: bool = True) -> tuple[str, int]:
    """Run every check (Slurm's ``--test-only``, the requeue settings, the launch's own
    :func:`presubmit_checks` unless ``path_checks`` is false, the container); returns the
    report and the exit status (0). Raises :class:`CsrunError` (exit 2) naming the first
    problem after the report was built, so the CLI prints the report, then the one error line."""
    here = Path.cwd() if cwd is None else cwd
    checks = [slurm_check(req, use_sbatch)]
    if isinstance(req, WseRequest):
        checks += [c for c in (worker_job_check(req), requeue_check(req)) if c is not None]
    if path_checks:
        checks += presubmit_checks(req, here)
    else:
        checks.append(Check("paths", True, "not checked (--no-path-checks)"))
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
