"""Command line and params YAML of a run.py, in the Model Zoo layout ("Cerebras Model Zoo YAML parameters").

Pure Python (no TensorFlow): the CLIs, the analyzer and the unit tests import it.

The params YAML has the sections ``train_input``, ``eval_input``, ``model``, ``optimizer`` and
``runconfig``. The command line the runtime owns (the Model Zoo's)::

    --mode train|eval|train_and_eval|validate_only|compile_only
    --params PATH  --model_dir DIR  --max_steps N  --num_steps N  --eval_steps N
    --checkpoint_path PATH  --cs_ip HOST[:PORT]  (accepted and recorded; there is no system)
    --validate_only / --compile_only (older Model Zoo spellings of the two modes)

Command-line values override ``runconfig``. Honoured ``runconfig`` keys are listed in
:data:`RUNCONFIG_KEYS` (documented in ``csrun_runtime/README.md``); Model Zoo keys the runtime does not
implement are accepted with a warning (:data:`IGNORED_MODELZOO_KEYS`), other unknown keys warn as
unknown, and an invalid value fails with :class:`ParamsError` naming ``runconfig.<key>``.

Per-worker parameters (what each input worker's ``input_fn`` sees in ``params["train_input"]``):

- ``worker_index`` (int, ``0..num_workers-1``; 0 in single-process mode),
- ``num_workers`` (int, >= 1; the job's input-worker count, 1 in single-process mode),
- ``shuffle_seed``: the shard plan's ``seed`` for this worker if there is a plan, else
  ``base + worker_index`` where ``base`` is the YAML's ``train_input.shuffle_seed`` or else
  ``runconfig.seed``; ``None`` when there is no base (then shuffle unseeded, which differs per
  process). The YAML's value is kept as ``base_shuffle_seed``.
- ``file_list_seed`` (int): the same on every input worker of the job
  (:func:`csrun_runtime.sharding.file_list_seed`): the seed the runtime gives the file-list
  shuffle of ``tf.data.Dataset.list_files`` when the pipeline shards its files.
- ``data_files`` (list of str): only with a shard plan (``CSRUN_SHARD_PLAN``): this worker's files.
"""
from __future__ import annotations

import argparse
import copy
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from csrun_common import shardplan_schema as schema
from csrun_common.modes import MODES, TRAIN_MODES

from . import registry
from .facts import Key, auto_or_int, int_min
from .sharding import file_list_seed

__all__ = [
    "MODES", "SECTIONS", "RUNCONFIG_KEYS", "IGNORED_MODELZOO_KEYS", "ParamsError",
    "build_arg_parser", "parse_args", "load_yaml", "resolve_params", "validate_params",
    "training_target", "worker_params", "load_shard_plan", "Resolved",
]

#: Default of ``runconfig.device_prefetch``, both frameworks' chiefs: what they stage on the GPU
#: ahead of the step (PyTorch: batches; TensorFlow: received elements). Measured on an H200 host
#: (16 cores, k = 8 senders, ResNet-50 bf16, a 38.5 MB image batch a step): depth 1, 2 and 4 all
#: fed the step within 0.14 % of the batch resident on the GPU (54.74 / 54.74 / 54.73 ms against
#: 54.66 ms, ``bench/bench_gpu_feed.py``, BENCHMARKS.md "GPU feed"); 2 keeps one batch of margin
#: for a step that needs more input.
DEVICE_PREFETCH = 2

#: Top-level sections of the params YAML ("Cerebras Model Zoo YAML parameters").
SECTIONS = ("train_input", "eval_input", "model", "optimizer", "runconfig")


class ParamsError(ValueError):
    """Invalid command line or params; ``problems`` lists every message (each names its key)."""

    def __init__(self, problems: Sequence[str] | str):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("; ".join(self.problems))


# --------------------------------------------------------------------------- value checkers
def _opt(check: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def inner(v):
        return None if v is None else check(v)
    inner.__doc__ = (check.__doc__ or "") + " or null"
    return inner


def _pos_float(v):
    """number > 0"""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise ValueError("must be a number > 0")
    return float(v)


def _bool(v):
    """true or false"""
    if not isinstance(v, bool):
        raise ValueError("must be true or false")
    return v


def _str(v):
    """string"""
    if not isinstance(v, str) or not v:
        raise ValueError("must be a non-empty string")
    return v


def _int_any(v):
    """integer"""
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError("must be an integer")
    return v


def _mode(v):
    """one of train, eval, train_and_eval, validate_only, compile_only"""
    if v not in MODES:
        raise ValueError(f"must be one of {', '.join(MODES)}")
    return v


def _logging(v):
    """DEBUG, INFO, WARNING or ERROR"""
    if isinstance(v, str) and v.upper() in ("DEBUG", "INFO", "WARNING", "ERROR"):
        return v.upper()
    raise ValueError("must be one of DEBUG, INFO, WARNING, ERROR")


#: ``runconfig.dataplane_shm_bytes``' default: 256 MiB per input worker on the chief's node, six
#: 38.5 MB image batches (what a CUDA device feed holds, plus the credit window, plus one; a
#: bundle larger than the ring goes over TCP).
SHM_RING_BYTES = 256 << 20

#: runconfig keys every backend honours: name -> (checker, default, meaning). Seed 004 for the
#: Model Zoo ones; the last group are csrun extensions.
_CORE_KEYS: dict[str, Key] = {
    "mode": Key(_mode, "train", "what to run (also --mode)"),
    "max_steps": Key(_opt(int_min(1)), None,
                     "train until the global step reaches this (also --max_steps)"),
    "num_steps": Key(_opt(int_min(1)), None,
                     "train this many steps in this run, capped by max_steps (also --num_steps)"),
    "checkpoint_steps": Key(int_min(0), 0,
                            "save model-ckpt-<step> every N steps (0: only at the end)"),
    "log_steps": Key(int_min(1), 100,
                     "log 'global_step = N, loss = X' and write summaries every N steps"),
    "model_dir": Key(_str, "./model_dir", "where artifacts go (also --model_dir)"),
    "seed": Key(_opt(_int_any), None,
                "random seed of model init; base of the per-worker shuffle seeds"),
    "save_initial_checkpoint": Key(_bool, False, "save a checkpoint before the first step"),
    "autoload_last_checkpoint": Key(_bool, True, "restore the newest checkpoint in model_dir"),
    "checkpoint_path": Key(_opt(_str), None,
                           "restore this checkpoint (file prefix or directory) first"),
    "eval_steps": Key(_opt(int_min(1)), None,
                      "batches per evaluation (null: the whole, finite, eval dataset)"),
    "eval_frequency": Key(_opt(int_min(1)), None,
                          "train_and_eval: evaluate every N steps (and at the end)"),
    "keep_checkpoint_max": Key(int_min(1), 5, "checkpoints kept in model_dir"),
    "logging": Key(_logging, "INFO", "log level of the runtime's messages"),
    "cs_ip": Key(_opt(_str), None, "accepted and recorded; there is no system to talk to"),
    "validate_only": Key(_bool, False, "same as mode: validate_only"),
    "compile_only": Key(_bool, False, "same as mode: compile_only"),
    # csrun extensions
    "input_timeout_secs": Key(_pos_float, 30.0,
                              "chief watchdog: fail when no batch arrives for this long"),
    "worker_start_timeout_secs": Key(_pos_float, 300.0,
                                     "wait this long for the rendezvous of chief and workers"),
    "compile_only_steps": Key(int_min(1), 20, "compile_only: timed steps after the compile"),
    "strict": Key(_bool, False,
                  "input workers' files that overlap or leave files unread are an error, not a "
                  "warning (also --strict)"),
    "steps_per_execution": Key(auto_or_int, "auto",
                               "most training steps per call (auto: every batch of a received element)"),
    "device_prefetch": Key(int_min(1), DEVICE_PREFETCH,
                           "both frameworks: what the chief stages on its GPU ahead of the step; PyTorch: "
                           "batches on its device or in flight to it (docs/PYTORCH.md \"The device feed\"); "
                           "TensorFlow, when it sees a GPU: received elements, by prefetch_to_device "
                           "(in-process pipeline) or a copying thread (input workers' streams), off with "
                           "several trainer ranks and for the streams under --autoscale, a no-op on CPU "
                           "(csrun_runtime/README.md \"Prefetch to the device\")"),
    "dataplane_bulk": Key(_bool, False,
                          "data plane: input workers send their batches' bytes on a TCP connection of "
                          "their own, read straight into the chief's buffers (pinned ones on a CUDA "
                          "PyTorch chief: one host copy instead of two), control staying on zmq "
                          "(docs/DATAPLANE.md \"The bulk channel\")"),
    "dataplane_shm_bytes": Key(int_min(0), SHM_RING_BYTES,
                               "data plane: each input worker on the chief's node (the chief's own, or one placed "
                               "there) writes its batches into a shared-memory ring of this many bytes that the "
                               "chief reads in place (pinned for the GPU's copy on a CUDA PyTorch chief), instead "
                               "of sending them over TCP; 0: TCP for every worker (docs/DATAPLANE.md "
                               "\"Co-located input workers\")"),
    "sync_batchnorm": Key(_bool, False,
                          "several trainer ranks: BatchNorm statistics over every rank's batch (Model Zoo's key): "
                          "PyTorch converts BatchNorm to SyncBatchNorm (CUDA ranks only), TensorFlow sets "
                          "BatchNormalization's synchronized=True (docs/MULTI-RANK.md \"Weights and statistics\")"),
}
#: runconfig keys the runtime honours: every backend's (:data:`_CORE_KEYS`), then each backend's own
#: (:attr:`csrun_runtime.facts.BackendFacts.runconfig`), accepted whatever the run's framework.
RUNCONFIG_KEYS: dict[str, Key] = {**_CORE_KEYS, **{k: v for fw in registry.FRAMEWORKS
                                                   for k, v in registry.facts(fw).runconfig.items()}}

#: Model Zoo / TF Estimator runconfig keys that are accepted but not implemented (warned about).
IGNORED_MODELZOO_KEYS = frozenset({
    "autogen_policy", "check_loss_values", "compile_dir", "credentials_path", "debug_args_path",
    "disable_strict_checkpoint_loading", "dist_addr", "dist_backend", "enable_distributed",
    "enable_summaries", "init_method", "job_labels", "load_checkpoint_states", "steps_per_epoch",
    "mgmt_address", "mount_dirs", "num_act_servers", "num_csx", "num_epochs", "num_wgt_servers",
    "num_workers_per_csx", "precision_opt_level", "python_paths", "save_losses",
    "target_device", "use_cs_grad_accum", "wsc_log_level", "save_summary_steps",
    "save_checkpoints_steps", "save_checkpoints_secs", "tf_random_seed", "log_step_count_steps",
    "multireplica", "max_checkpoints", "experimental",
    # Model Zoo R1.6.x PyTorch YAMLs and run code (docs/PYTORCH.md "Model Zoo params")
    "show_debug_metrics", "summary_dir", "is_pretrained_checkpoint",
})


# --------------------------------------------------------------------------- command line
def build_arg_parser(prog: str | None = None) -> argparse.ArgumentParser:
    """The Model Zoo command line of a run.py (see the module docstring)."""
    # allow_abbrev=False: an unambiguous prefix (--max_step) is an error, not silently --max_steps (issue 24)
    p = argparse.ArgumentParser(prog=prog, description="Train/evaluate a model with csrun's runtime.",
                                allow_abbrev=False)
    p.add_argument("--mode", choices=MODES, default=None,
                   help="train, eval, train_and_eval, validate_only or compile_only "
                        "(default: runconfig.mode, else train)")
    p.add_argument("-p", "--params", default=None,
                   help="params YAML (default: configs/params.yaml beside run.py)")
    p.add_argument("-o", "--model_dir", default=None, help="model directory (overrides runconfig)")
    p.add_argument("--max_steps", type=int, default=None, help="overrides runconfig.max_steps")
    p.add_argument("--num_steps", type=int, default=None, help="overrides runconfig.num_steps")
    p.add_argument("--eval_steps", type=int, default=None, help="overrides runconfig.eval_steps")
    p.add_argument("--checkpoint_path", default=None, help="checkpoint to restore first")
    p.add_argument("--cs_ip", default=None, help="accepted for compatibility; unused")
    p.add_argument("--validate_only", action="store_true", help="same as --mode validate_only")
    p.add_argument("--compile_only", action="store_true", help="same as --mode compile_only")
    p.add_argument("--strict", action="store_true", default=None,
                   help="input workers' files that overlap or leave files unread are an error "
                        "(exit 2), not a warning (sets runconfig.strict)")
    return p


def drop_options(argv: Sequence[str], valued: Sequence[str] = (), flags: Sequence[str] = ()) -> list[str]:
    """A run.py command line without some of its options: every ``NAME VALUE`` and
    ``NAME=VALUE`` of the names in ``valued`` (a name last on the line, with no value after
    it, is kept) and every bare flag in ``flags``. Pure; the other words keep their order."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in valued and i + 1 < len(argv):
            i += 2
            continue
        if a in flags or any(a.startswith(f"{v}=") for v in valued):
            i += 1
            continue
        out.append(a)
        i += 1
    return out


def parse_args(argv: Sequence[str], run_py: str | None = None) -> argparse.Namespace:
    """Parse a run.py command line (without the program name).

    Raises:
        ParamsError: unknown option or bad value (argparse's message), or both
            ``--validate_only`` and ``--compile_only``.
    """
    parser = build_arg_parser(prog=os.path.basename(run_py) if run_py else None)

    def error(message):  # argparse exits by default; we raise instead
        raise ParamsError(f"command line: {message}")

    parser.error = error  # type: ignore[method-assign]
    args = parser.parse_args(list(argv))
    if args.validate_only and args.compile_only:
        raise ParamsError("command line: --validate_only and --compile_only exclude each other")
    if args.validate_only:
        args.mode = "validate_only"
    if args.compile_only:
        args.mode = "compile_only"
    if args.params is None and run_py is not None:
        default = Path(run_py).resolve().parent / "configs" / "params.yaml"
        if default.exists():
            args.params = str(default)
    return args


def load_yaml(path: str | os.PathLike) -> dict[str, Any]:
    """Load a params YAML with ``yaml.safe_load``.

    Raises:
        ParamsError: missing file, YAML syntax error, or a top level that is not a mapping.
    """
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except FileNotFoundError:
        raise ParamsError(f"params file {path} not found") from None
    except yaml.YAMLError as e:
        raise ParamsError(f"params file {path} is not valid YAML: {e}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ParamsError(f"params file {path}: the top level must be a mapping of sections "
                          f"({', '.join(SECTIONS)}), got {type(data).__name__}")
    return data


# --------------------------------------------------------------------------- validation
def _checked_runconfig(rc_in: Mapping[str, Any], problems: list[str], warnings: list[str]) -> dict[str, Any]:
    """``runconfig`` with each known key checked (:data:`RUNCONFIG_KEYS`), defaults filled and
    ``mode`` reconciled with ``validate_only``/``compile_only``; problems and warnings appended."""
    rc: dict[str, Any] = {}
    for key, value in rc_in.items():
        if key in RUNCONFIG_KEYS:
            try:
                rc[key] = RUNCONFIG_KEYS[key].check(value)
            except ValueError as e:
                problems.append(f"runconfig.{key} {e}, got {value!r}")
        elif key in IGNORED_MODELZOO_KEYS:
            warnings.append(f"runconfig.{key} is a Model Zoo key that csrun's runtime does not "
                            f"implement; ignored")
            rc[key] = value
        else:
            warnings.append(f"runconfig.{key} is not a known runconfig key; ignored")
            rc[key] = value
    for key, spec in RUNCONFIG_KEYS.items():
        rc.setdefault(key, copy.deepcopy(spec.default))
    if rc.get("validate_only") is True and rc.get("compile_only") is True:
        problems.append("runconfig.validate_only and runconfig.compile_only are both true")
    elif rc.get("validate_only") is True:
        rc["mode"] = "validate_only"
    elif rc.get("compile_only") is True:
        rc["mode"] = "compile_only"
    return rc


def _check_mode_needs(out: Mapping[str, Any], rc: Mapping[str, Any], problems: list[str]) -> None:
    """The sections and step count ``rc``'s mode needs, and the input sections' ``batch_size``:
    problems appended."""
    mode = rc.get("mode")
    if mode in MODES:
        needs = {"train": ["train_input"], "train_and_eval": ["train_input", "eval_input"],
                 "eval": ["eval_input"], "compile_only": ["train_input"]}.get(mode, [])
        for section in needs:
            if not isinstance(out.get(section), dict):
                problems.append(f"params.{section} is required for mode {mode}")
        if mode in TRAIN_MODES and rc.get("max_steps") is None and rc.get("num_steps") is None:
            problems.append(f"runconfig.max_steps or runconfig.num_steps is required for mode "
                            f"{mode} (or --max_steps)")
    for section in ("train_input", "eval_input"):
        sec = out.get(section)
        if isinstance(sec, dict) and "batch_size" in sec:
            bs = sec["batch_size"]
            if isinstance(bs, bool) or not isinstance(bs, int) or bs < 1:
                problems.append(f"{section}.batch_size must be an integer >= 1, got {bs!r}")


def validate_params(params: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Check sections and runconfig; fill runconfig defaults.

    Args:
        params: the params dict (sections as in the Cerebras document "Cerebras Model Zoo YAML
            parameters"); not modified.

    Returns:
        ``(params_with_defaults, warnings)``: a deep copy whose ``runconfig`` has every key of
        :data:`RUNCONFIG_KEYS` (defaults filled, ``mode`` reconciled with the
        ``validate_only``/``compile_only`` booleans), and the warning messages (unknown
        sections, unknown or ignored runconfig keys).

    Raises:
        ParamsError: every invalid value, each message naming ``section.key``; a section that
            is not a mapping; a mode that needs a missing section (``train_input`` for
            train/train_and_eval/compile_only, ``eval_input`` for eval/train_and_eval); a
            training mode without ``max_steps`` or ``num_steps``; ``batch_size`` not an int >= 1.
    """
    out = copy.deepcopy(dict(params))
    problems: list[str] = []
    warnings: list[str] = []
    for name in list(out):
        if name not in SECTIONS:
            warnings.append(f"params: unknown section '{name}' (known: {', '.join(SECTIONS)}); "
                            f"passed to input_fn/model_fn unchanged")
    for name in SECTIONS:
        if name in out and out[name] is None:
            out[name] = {}
        if name in out and not isinstance(out[name], dict):
            problems.append(f"params.{name} must be a mapping, got {type(out[name]).__name__}")
    rc = _checked_runconfig(out["runconfig"] if isinstance(out.get("runconfig"), dict) else {}, problems, warnings)
    out["runconfig"] = rc
    _check_mode_needs(out, rc, problems)
    if problems:
        raise ParamsError(problems)
    return out, warnings


@dataclass
class Resolved:
    """Params after command-line overrides and validation.

    Attributes:
        params: the resolved params dict (runconfig complete; ``model_dir`` absolute).
        warnings: messages to log (unknown/ignored keys).
        params_path: the YAML file read (absolute) or ``None``.
        argv: the command line parsed.
    """

    params: dict[str, Any]
    warnings: list[str]
    params_path: str | None
    argv: list[str]

    @property
    def mode(self) -> str:
        """``runconfig.mode`` after overrides."""
        return self.params["runconfig"]["mode"]

    @property
    def model_dir(self) -> str:
        """Absolute model directory."""
        return self.params["runconfig"]["model_dir"]


def resolve_params(argv: Sequence[str], run_py: str | None = None,
                   cwd: str | None = None) -> Resolved:
    """Parse the command line, load the YAML, apply overrides and validate.

    Args:
        argv: run.py's arguments (without the program name).
        run_py: path of run.py (for the default ``configs/params.yaml`` beside it).
        cwd: directory relative ``model_dir``/``checkpoint_path`` are resolved against
            (default: the current directory, as the Model Zoo does).

    Returns:
        :class:`Resolved`.

    Raises:
        ParamsError: see :func:`parse_args`, :func:`load_yaml`, :func:`validate_params`.
    """
    args = parse_args(argv, run_py=run_py)
    raw: dict[str, Any] = load_yaml(args.params) if args.params else {}
    rc = raw.get("runconfig")
    if rc is None:
        rc = raw["runconfig"] = {}
    if isinstance(rc, dict):
        for key in ("mode", "model_dir", "max_steps", "num_steps", "eval_steps",
                    "checkpoint_path", "cs_ip", "strict"):
            value = getattr(args, key)
            if value is not None:
                rc[key] = value
        if args.mode is not None:  # an explicit --mode wins over the YAML booleans
            rc.pop("validate_only", None)
            rc.pop("compile_only", None)
    params, warnings = validate_params(raw)
    base = Path(cwd or os.getcwd())
    rc = params["runconfig"]
    rc["model_dir"] = str((base / os.path.expanduser(rc["model_dir"])).resolve())
    if rc.get("checkpoint_path"):
        rc["checkpoint_path"] = str((base / os.path.expanduser(rc["checkpoint_path"])).resolve())
    return Resolved(params=params, warnings=warnings,
                    params_path=str(Path(args.params).resolve()) if args.params else None,
                    argv=list(argv))


def training_target(start_step: int, runconfig: Mapping[str, Any]) -> int:
    """Global step at which this run's training stops.

    ``num_steps`` counts from ``start_step`` (the restored global step); ``max_steps`` is an
    absolute cap. With both, the smaller target wins. Seed 004 (runconfig max_steps/num_steps).

    Raises:
        ParamsError: neither key is set.
    """
    max_steps = runconfig.get("max_steps")
    num_steps = runconfig.get("num_steps")
    if max_steps is None and num_steps is None:
        raise ParamsError("runconfig.max_steps or runconfig.num_steps is required for training")
    targets = []
    if num_steps is not None:
        targets.append(start_step + int(num_steps))
    if max_steps is not None:
        targets.append(int(max_steps))
    return min(targets)


# --------------------------------------------------------------------------- workers, shard plan
def load_shard_plan(path: str | os.PathLike, num_input_workers: int) -> dict[str, Any]:
    """Load and check the shard plan at ``path`` (``CSRUN_SHARD_PLAN``; :mod:`csrun_common.shardplan_schema`'s
    ``csrun.shard_plan`` version 1) for ``num_input_workers`` (1: a chief reading in-process); returns it,
    ``workers`` in index order. Raises :class:`ParamsError` for an unreadable or malformed plan (the field
    named) or one made for another number of workers (both named)."""
    try:
        plan = schema.load_plan(path)
        schema.check_plan_workers(plan, num_input_workers, source=os.fspath(path))
    except ValueError as e:
        raise ParamsError(str(e)) from None
    return plan


def worker_params(params: Mapping[str, Any], worker_index: int, num_input_workers: int,
                  plan: Mapping[str, Any] | None = None,
                  job_key: str | None = None) -> dict[str, Any]:
    """The params one input worker's ``input_fn`` receives.

    Args:
        params: resolved params (not modified).
        worker_index: this worker's index, ``0 <= worker_index < num_input_workers``.
        num_input_workers: input workers in the job (>= 1; 1 for an in-process pipeline).
        plan: a shard plan from :func:`load_shard_plan`, or ``None``.
        job_key: ``"<SLURM_JOB_ID>.<SLURM_STEP_ID>"`` of the job step (``None`` outside a
            job): the job-wide ``file_list_seed`` derives from it when there is no base seed.

    Returns:
        A deep copy whose ``train_input`` has ``worker_index``, ``num_workers``,
        ``shuffle_seed`` (see the module docstring), ``base_shuffle_seed``,
        ``file_list_seed`` and, with a plan, ``data_files`` (the worker's files) and
        ``shard_plan_entry`` (its whole plan entry). ``data_dir`` is not changed here (the
        plan's per-worker view is made by :func:`csrun_runtime.tensorflow.pipeline.build_worker_input`).

    Raises:
        ValueError: ``worker_index`` outside ``[0, num_input_workers)``.
    """
    if not 0 <= worker_index < num_input_workers:
        raise ValueError(f"worker_index {worker_index} outside [0, {num_input_workers})")
    out = copy.deepcopy(dict(params))
    ti = out.get("train_input")
    if not isinstance(ti, dict):
        ti = out["train_input"] = {}
    base = ti.get("base_shuffle_seed", ti.get("shuffle_seed"))
    if base is None:
        base = (out.get("runconfig") or {}).get("seed")
    seed = None if base is None else int(base) + worker_index
    entry = None
    if plan is not None:
        entry = plan["workers"][worker_index]
        plan_seed = entry.get("seed", entry.get("shuffle_seed"))
        if plan_seed is not None:
            seed = int(plan_seed)
        ti["data_files"] = list(entry["files"])
        ti["shard_plan_entry"] = copy.deepcopy(entry)
    ti["base_shuffle_seed"] = base
    ti["shuffle_seed"] = seed
    ti["file_list_seed"] = file_list_seed(base, job_key)
    ti["worker_index"] = worker_index
    ti["num_workers"] = num_input_workers
    return out
