"""The input_fn contract ("Limitations of the CerebrasEstimator"), checked by ``--mode validate_only`` and at every run.

Rules and their messages ("Limitations of the CerebrasEstimator"):

1. ``input_fn`` takes a single dictionary parameter, ``params`` -> :data:`MSG_SINGLE_PARAM`.
2. It returns a ``tf.data.Dataset`` -> :data:`MSG_NOT_DATASET`.
3. Each element is ``(features, labels)``: features a tensor or a dict of tensors, labels a
   tensor or ``None`` -> :data:`MSG_STRUCTURE`.
4. Batches have a fixed size across steps: every tensor's static first dimension is known and
   the same -> :data:`MSG_BATCH` (``drop_remainder=True``).
5. For training the dataset repeats indefinitely (cardinality ``INFINITE``; the number of steps
   comes from ``max_steps``) -> :data:`MSG_REPEAT`.
6. Each input worker must shuffle differently: a seeded shuffle whose effective seeds are the
   same on every worker is a *warning* (:data:`MSG_SHARED_SEED`). The check builds the dataset
   as workers 0 and 1 would, each with its per-worker params and TensorFlow global seed (the
   runtime sets the global seed of worker ``i`` to its ``shuffle_seed``), so a hard-coded op
   seed is only flagged when there is no base seed to tell the workers apart. The file-list
   shuffles the runtime makes job-wide on purpose (:mod:`csrun_runtime.tensorflow.pipeline`) are not flagged.
7. The input workers' files are disjoint and cover the set (sharded), or every worker reads
   every file (replicated), or each reads its shard-plan entry (:mod:`csrun_runtime.coverage`,
   built as workers 0 and 1 would be): otherwise a *warning* naming the files and the fix, a
   violation with ``--strict`` / ``runconfig.strict``.

A violation is an error (validate_only exits 2 listing every one; a run refuses to start);
a warning is logged. TensorFlow is imported inside the functions.
"""
from __future__ import annotations

import inspect
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..coverage import coverage_report
from ..sharding import tf_config
from .coverage import check_file_coverage
from .pipeline import build_worker_input, call_input_fn, input_environment, listed_input_files

if TYPE_CHECKING:  # annotations only: TensorFlow is imported inside the functions
    import tensorflow as tf

__all__ = [
    "MSG_SINGLE_PARAM", "MSG_NOT_DATASET", "MSG_STRUCTURE", "MSG_BATCH", "MSG_REPEAT",
    "MSG_SHARED_SEED", "Report", "check_signature", "call_input_fn", "check_dataset",
    "shuffle_seeds", "check_shuffle_seeds", "check_workers", "check_model", "synthetic_batch",
    "validate", "build_eval_input", "check_input_files", "Refused",
]

MSG_SINGLE_PARAM = ("[Unsupported TensorFlow] The input function only takes a single "
                    "dictionary parameter, params")
MSG_NOT_DATASET = "[Unsupported TensorFlow] Input function must return a Dataset"
MSG_STRUCTURE = ("[Unsupported TensorFlow] Each element of the Dataset must be structured to "
                 "consist of features and labels: features must be a tensor (or a dict of "
                 "tensors) and labels a tensor or None")
MSG_BATCH = ("[Unsupported TensorFlow] Inconsistent batch sizes detected. To ensure a fixed "
             "batch size across all steps, set `drop_remainder=True` when batching your Dataset "
             "in the input function.")
MSG_REPEAT = ("[Unsupported TensorFlow] For training, the Dataset must repeat indefinitely: use "
              "the default parameter of the repeat function (count=None), e.g. "
              "dataset.shuffle(1000).repeat().batch(batch_size, drop_remainder=True); the number "
              "of steps comes from max_steps")
MSG_SHARED_SEED = ("Each worker node must shuffle its data differently, but input_fn uses a fixed "
                   "shuffle seed that is the same on every input worker, so every worker feeds "
                   "the same sequence: use params['train_input']['shuffle_seed'] (distinct per "
                   "worker) or no seed")

_SHUFFLE_OPS = ("ShuffleDataset", "ShuffleDatasetV2", "ShuffleDatasetV3",
                "ShuffleAndRepeatDataset", "ShuffleAndRepeatDatasetV2")


class Refused(Exception):
    """The run refuses to start: contract violations (exit 2); ``problems`` lists them.
    Raised by the chief (:mod:`csrun_runtime.tensorflow.chief` and the modules it delegates to)."""

    def __init__(self, problems: Sequence[str]):
        self.problems = list(problems)
        super().__init__("; ".join(self.problems))


@dataclass
class Report:
    """Outcome of checks.

    Attributes:
        violations: error messages (each starts with the checked section, e.g. ``train_input:``).
        warnings: warning messages.
        info: facts found (``batch_size``, ``element_spec`` text, ``cardinality``, ...), by section.
    """

    violations: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True when there is no violation."""
        return not self.violations

    def extend(self, other: Report) -> Report:
        """Append another report's findings; returns self."""
        self.violations += other.violations
        self.warnings += other.warnings
        self.info.update(other.info)
        return self

    def text(self) -> str:
        """Human-readable listing (one line per finding)."""
        lines = []
        for v in self.violations:
            lines.append(f"ERROR: {v}")
        for w in self.warnings:
            lines.append(f"WARNING: {w}")
        if not lines:
            lines.append("OK: no violation")
        return "\n".join(lines)


def check_signature(fn: Callable[..., Any], name: str = "input_fn") -> list[str]:
    """Rule 1: exactly one required positional parameter (``params``).

    Optional parameters with defaults are allowed (e.g. a Model Zoo ``mode=TRAIN``).
    """
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return []
    required = [p for p in sig.parameters.values()
                if p.default is inspect.Parameter.empty
                and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    positional = [p for p in sig.parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)]
    if len(required) != 1 or not positional or required[0].kind == required[0].KEYWORD_ONLY:
        return [f"{MSG_SINGLE_PARAM} ({name}{sig} has {len(required)} required parameter(s))"]
    return []


def _spec_text(spec: Any) -> str:
    text = repr(spec)
    return text if len(text) < 400 else text[:400] + "..."


def _is_tensor_spec(tf: Any, s: Any) -> bool:
    return isinstance(s, tf.TensorSpec)


def _is_none_spec(s: Any) -> bool:
    return type(s).__name__ == "NoneTensorSpec" or s is None


def _batch_tensors(tf: Any, spec: Any) -> list[tuple[str, Any]] | None:
    """``(name, TensorSpec)`` of the features and labels of an element spec of the contract's
    structure (``(features, labels)``, features a tensor or a dict of them, labels a tensor or
    ``None``); ``None`` when the structure is another."""
    if not (isinstance(spec, tuple) and len(spec) == 2):
        return None
    tensors: list[tuple[str, Any]] = []
    features, labels = spec
    if _is_tensor_spec(tf, features):
        tensors.append(("features", features))
    elif isinstance(features, Mapping) and features and all(
            isinstance(k, str) and _is_tensor_spec(tf, v) for k, v in features.items()):
        tensors += [(f"features[{k!r}]", v) for k, v in features.items()]
    else:
        return None
    if _is_tensor_spec(tf, labels):
        tensors.append(("labels", labels))
    elif not _is_none_spec(labels):
        return None
    return tensors


def _check_batch(rep: Report, info: dict[str, Any], section: str, tensors: list[tuple[str, Any]],
                 batch_size: int | None) -> None:
    """Rule 3 (batched, one static batch dimension) into ``rep``; ``info["batch_size"]`` set."""
    dims = {}
    problems = []
    for name, s in tensors:
        if s.shape.rank is None or s.shape.rank == 0:
            problems.append(f"{name} has shape {s.shape}: elements are not batched")
        elif s.shape[0] is None:
            problems.append(f"{name} has static batch dimension None (shape {s.shape})")
        else:
            dims[name] = int(s.shape[0])
    if not problems and len(set(dims.values())) > 1:
        problems.append("batch dimensions differ: "
                        + ", ".join(f"{k}={v}" for k, v in dims.items()))
    if problems:
        rep.violations.append(f"{section}: {MSG_BATCH} ({'; '.join(problems)})")
    elif dims:
        bs = next(iter(dims.values()))
        info["batch_size"] = bs
        if batch_size is not None and batch_size != bs:
            rep.warnings.append(f"{section}: batch_size is {batch_size} in params but the "
                                f"Dataset's batches have {bs} elements")


def _check_cardinality(tf: Any, rep: Report, info: dict[str, Any], section: str, card: int, purpose: str,
                       eval_steps: int | None) -> None:
    """Rules 4-5 (training repeats, eval ends unless ``eval_steps``) into ``rep``;
    ``info["cardinality"]`` set (-1 infinite, -2 unknown)."""
    info["cardinality"] = card
    if purpose == "train":
        if card >= 0:
            rep.violations.append(f"{section}: {MSG_REPEAT} (the Dataset has {card} batch(es))")
        elif card == tf.data.UNKNOWN_CARDINALITY:
            rep.warnings.append(f"{section}: cannot verify that the Dataset repeats indefinitely "
                                f"(cardinality unknown, e.g. after filter); make sure it ends "
                                f"with .repeat()")
    else:
        if card == tf.data.INFINITE_CARDINALITY and eval_steps is None:
            rep.violations.append(f"{section}: the eval Dataset repeats indefinitely; set "
                                  f"runconfig.eval_steps or do not repeat it")


def check_dataset(ds: tf.data.Dataset, purpose: str = "train", section: str | None = None,
                  eval_steps: int | None = None,
                  batch_size: int | None = None) -> Report:
    """Rules 2-5 on a built dataset (no element is read).

    Args:
        ds: what input_fn returned.
        purpose: ``"train"`` (must repeat) or ``"eval"`` (finite unless ``eval_steps``).
        section: prefix of messages (default ``train_input``/``eval_input``).
        eval_steps: ``runconfig.eval_steps``.
        batch_size: the params section's ``batch_size`` (a mismatch is a warning).

    Returns:
        :class:`Report`; ``info[section]`` has ``batch_size`` (int or None), ``element_spec``
        (text), ``cardinality`` (int; -1 infinite, -2 unknown).
    """
    import tensorflow as tf

    section = section or ("eval_input" if purpose == "eval" else "train_input")
    rep = Report()
    if not isinstance(ds, tf.data.Dataset):
        rep.violations.append(f"{section}: {MSG_NOT_DATASET} (got {type(ds).__name__})")
        return rep
    spec = ds.element_spec
    info: dict[str, Any] = {"element_spec": _spec_text(spec), "batch_size": None}
    rep.info[section] = info
    tensors = _batch_tensors(tf, spec)
    if tensors is None:
        rep.violations.append(f"{section}: {MSG_STRUCTURE} (element_spec: {_spec_text(spec)})")
    else:
        _check_batch(rep, info, section, tensors, batch_size)
    _check_cardinality(tf, rep, info, section, int(ds.cardinality().numpy()), purpose, eval_steps)
    return rep


def shuffle_seeds(ds: tf.data.Dataset) -> list[tuple[str, int, int]]:
    """``(op, seed, seed2)`` of every shuffle op in the dataset's graph (functions included).

    ``(0, 0)`` means unseeded (random per process). Seeds that are not constants are skipped.
    """
    import tensorflow as tf
    from tensorflow.python.framework import tensor_util

    gd = tf.compat.v1.GraphDef()
    gd.ParseFromString(ds._as_serialized_graph(
        external_state_policy=tf.data.experimental.ExternalStatePolicy.WARN).numpy())

    def scan(nodes, fn_style):
        consts = {}
        for n in nodes:
            if n.op == "Const":
                try:
                    consts[n.name] = tensor_util.MakeNdarray(n.attr["value"].tensor)
                except Exception:  # noqa: BLE001 - non-numeric constants
                    pass
        found = []
        for n in nodes:
            if n.op in _SHUFFLE_OPS and len(n.input) >= 4:
                vals = []
                for ref in n.input[2:4]:
                    name = ref.lstrip("^").split(":")[0]
                    vals.append(consts.get(name))
                a, b = vals
                if a is not None and b is not None and getattr(a, "shape", ()) == () == getattr(b, "shape", ()):
                    found.append((n.op, int(a), int(b)))
        return found

    out = scan(gd.node, False)
    for fn in gd.library.function:
        out += scan(fn.node_def, True)
    return out


def check_shuffle_seeds(input_fn: Callable[..., Any], params: Mapping[str, Any],
                        plan: Mapping[str, Any] | None = None) -> Report:
    """Rule 6 only (see :func:`check_workers`)."""
    return check_workers(input_fn, params, plan, coverage=False)


def _seed_warning(built: Mapping[int, Any]) -> list[str]:
    seeds = []
    for k in (0, 1):
        job_wide = built[k].file_list_seed_pairs
        seeds.append({s for s in shuffle_seeds(built[k].dataset)
                      if (s[1], s[2]) != (0, 0) and (s[1], s[2]) not in job_wide})
    shared = seeds[0] & seeds[1]
    if not shared:
        return []
    ops = ", ".join(f"{op}(seed={a}, seed2={b})" for op, a, b in sorted(shared))
    return [f"train_input: {MSG_SHARED_SEED} ({ops})"]


def check_workers(input_fn: Callable[..., Any], params: Mapping[str, Any],
                  plan: Mapping[str, Any] | None = None, strict: bool = False,
                  coverage: bool = True) -> Report:
    """Rules 6 and 7: build the training dataset as input workers 0 and 1 would
    (:func:`csrun_runtime.tensorflow.pipeline.build_worker_input`: each with its params, TF_CONFIG and
    global seed; of 2 workers, or of the plan's count) and

    - warn when a seeded shuffle op has the same seeds in both (every worker would shuffle
      identically; "Limitations of the CerebrasEstimator", "Multiple input workers"), the
      job-wide file-list shuffles excepted;
    - with ``coverage``, judge the files each reads (:func:`csrun_runtime.tensorflow.coverage.check_file_coverage`):
      a problem is a warning, or a violation with ``strict``. ``info["file_coverage"]`` holds
      the outcome.
    """
    import tensorflow as tf

    rep = Report()
    if plan is not None and plan.get("num_workers", 0) < 2:
        plan = None
    num = int(plan["num_workers"]) if plan is not None else 2
    root = tempfile.mkdtemp(prefix="csrun-check-")
    try:
        built = {k: build_worker_input(input_fn, params, k, num, plan, view_root=root) for k in (0, 1)}
        if not all(isinstance(b.dataset, tf.data.Dataset) for b in built.values()):
            return rep
        rep.warnings += _seed_warning(built)
        if coverage:
            cov = check_file_coverage(input_fn, params, plan, built=built)
            rep.info["file_coverage"] = cov.to_dict()
            if cov.all_files:
                rep.info["all_files"] = list(cov.all_files)
            violations, warnings = coverage_report(cov, strict)
            rep.violations += violations
            rep.warnings += warnings
    except Exception as e:  # noqa: BLE001 - reported by the other checks
        rep.warnings.append(f"train_input: could not compare the input workers' pipelines: "
                            f"{type(e).__name__}: {e}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return rep


def _open_error(name: str) -> str | None:
    """Why the file ``name`` cannot be opened and read (``None`` when it can): Python's
    ``open`` for local paths, ``tf.io.gfile`` for URLs (``gs://``, ``hdfs://`` ...)."""
    if "://" in name:
        import tensorflow as tf

        try:
            with tf.io.gfile.GFile(name, "rb") as f:
                f.read(1)
        except Exception as e:  # noqa: BLE001 - whatever the file system raises
            return " ".join(f"{type(e).__name__}: {e}".split())[:200]
        return None
    try:
        with open(name, "rb") as f:
            f.read(1)
    except OSError as e:
        return e.strerror or type(e).__name__
    return None


def _look_like_files(names: list[str]) -> bool:
    """Strings given to ``interleave``/``flat_map``/``map`` are taken for file names when
    one of them is an existing file, or all of them are paths (hold a ``/``)."""
    if not names:
        return False
    return any(os.path.isfile(n) for n in names[:100]) or all("/" in n or "://" in n for n in names)


def check_input_files(ds: tf.data.Dataset, section: str = "train_input", shown: int = 3) -> Report:
    """Open (and read one byte of) every input file the built dataset lists
    (:func:`csrun_runtime.tensorflow.pipeline.listed_input_files`): a missing or unreadable one is a
    violation naming it (the first ``shown`` of them, and how many more), so that a wrong
    ``data_dir`` fails ``validate_only`` instead of the run's first read (issue 24). Names
    given to ``interleave``/``flat_map``/``map`` count only when they look like files
    (:func:`_look_like_files`). ``info[f"{section}_files"]`` holds ``{"listed", "unreadable"}``.
    Files a pipeline opens in Python (``from_generator``) are not seen."""
    rep = Report()
    try:
        lists = listed_input_files(ds)
    except Exception as e:  # noqa: BLE001 - reported, not fatal: the other checks ran
        rep.warnings.append(f"{section}: could not read the file names the pipeline lists: {type(e).__name__}: {e}")
        return rep
    bad: list[tuple[str, str, str]] = []
    seen: set[str] = set()
    for listed in lists:
        if not listed.certain and not _look_like_files(listed.names):
            continue
        for name in listed.names:
            if name in seen:
                continue
            seen.add(name)
            why = _open_error(name)
            if why is not None:
                bad.append((name, why, listed.reader))
    rep.info[f"{section}_files"] = {"listed": len(seen), "unreadable": len(bad)}
    if bad:
        first = "; ".join(f"{name!r} ({why})" for name, why, _ in bad[:shown])
        more = f"; and {len(bad) - shown} more" if len(bad) > shown else ""
        rep.violations.append(f"{section}: {len(bad)} of the {len(seen)} input file(s) the pipeline lists cannot be "
                              f"opened: {first}{more} (read by {bad[0][2]}; check data_dir / data_files)")
    return rep


def synthetic_batch(spec: tf.TypeSpec | tuple[tf.TypeSpec, ...], kind: str = "zeros") -> tuple[Any, Any]:
    """A ``(features, labels)`` batch matching ``spec`` (static shapes required).

    Args:
        spec: a validated element_spec ``(features, labels)``.
        kind: ``"zeros"`` or ``"random"`` (normal floats; integers stay 0, strings empty).
    """
    import tensorflow as tf

    def make(s):
        if _is_none_spec(s):
            return None
        shape = [int(d) for d in s.shape]
        if s.dtype == tf.string:
            return tf.fill(shape, "")
        if s.dtype.is_floating and kind == "random":
            return tf.random.normal(shape, dtype=s.dtype)
        return tf.zeros(shape, dtype=s.dtype)

    features, labels = spec
    if isinstance(features, Mapping):
        x = {k: make(v) for k, v in features.items()}
    else:
        x = make(features)
    return x, make(labels)


def check_model(model_fn: Callable[..., Any], params: dict[str, Any],
                spec: tf.TypeSpec | tuple[tf.TypeSpec, ...] | None = None,
                ) -> tuple[Report, Any]:
    """Build the model and run one evaluation step on a zero batch of the input's shapes.

    Returns:
        ``(report, model)``; ``model`` is ``None`` when model_fn failed.
    """
    import keras

    rep = Report()
    try:
        model = model_fn(params)
    except Exception as e:  # noqa: BLE001
        rep.violations.append(f"model: model_fn raised {type(e).__name__}: {e}")
        return rep, None
    if not isinstance(model, keras.Model):
        rep.violations.append(f"model: model_fn must return a keras.Model (tf.keras.Model), got "
                              f"{type(model).__name__}")
        return rep, None
    if not getattr(model, "compiled", False) or getattr(model, "optimizer", None) is None:
        rep.violations.append("model: model_fn must return a compiled model "
                              "(model.compile(optimizer=..., loss=..., metrics=...))")
        return rep, model
    if spec is not None:
        try:
            x, y = synthetic_batch(spec)
            model.test_on_batch(x, y)
            rep.info["model"] = {"parameters": int(model.count_params())}
        except Exception as e:  # noqa: BLE001
            msg = str(e).strip().splitlines()
            rep.violations.append(f"model: the model does not accept the input's "
                                  f"(features, labels): {type(e).__name__}: "
                                  f"{' '.join(msg)[:500]}")
    return rep, model


def build_eval_input(input_fn: Callable[..., Any], params: dict[str, Any],
                     eval_input_fn: Callable[..., Any] | None = None) -> Any:
    """The chief's eval dataset, built in-process under a one-worker ``TF_CONFIG`` (a Model Zoo processor with
    ``eval_input.use_multiple_workers`` reads the whole set). Raises what the input function raises."""
    with input_environment(tf_config(0, 1), None, set_seed=False):
        return call_input_fn(input_fn, params, "eval", eval_input_fn)


def _build_train(input_fn: Callable[..., Any], params: dict[str, Any],
                 plan: Mapping[str, Any] | None, num_input_workers: int) -> Any:
    root = tempfile.mkdtemp(prefix="csrun-validate-")
    try:
        return build_worker_input(input_fn, params, 0, num_input_workers, plan, view_root=root).dataset
    finally:
        shutil.rmtree(root, ignore_errors=True)


def validate(input_fn: Callable[..., Any], model_fn: Callable[..., Any], params: dict[str, Any],
             eval_input_fn: Callable[..., Any] | None = None,
             plan: Mapping[str, Any] | None = None, num_input_workers: int = 1,
             build_model: bool = True, strict: bool = False) -> Report:
    """Every check of ``--mode validate_only``: rules 1-7 on the training input (if
    ``train_input`` exists) and 1-4 on the eval input (if ``eval_input`` exists), every input
    file each lists opened (:func:`check_input_files`), then a model build and one step on a
    zero batch.

    Args:
        params: resolved params.
        plan: shard plan (worker 0's params are used to build the datasets).
        num_input_workers: input workers of the job (>= 1).
        strict: rule 7's problems are violations, not warnings.
    """

    rep = Report()
    rep.violations += [f"train_input: {m}" for m in check_signature(input_fn)]
    if eval_input_fn is not None:
        rep.violations += [f"eval_input: {m}" for m in check_signature(eval_input_fn, "eval_input_fn")]
    if rep.violations:
        return rep
    rc = params.get("runconfig", {})
    spec = None
    for purpose, section in (("train", "train_input"), ("eval", "eval_input")):
        if not isinstance(params.get(section), dict):
            continue
        try:
            if purpose == "train":
                ds = _build_train(input_fn, params, plan, max(1, num_input_workers))
            else:
                ds = build_eval_input(input_fn, params, eval_input_fn)
        except Exception as e:  # noqa: BLE001
            rep.violations.append(f"{section}: the input function raised {type(e).__name__}: {e}")
            continue
        sub = check_dataset(ds, purpose, section, eval_steps=rc.get("eval_steps"),
                            batch_size=params[section].get("batch_size"))
        rep.extend(sub)
        if section in sub.info:  # a Dataset: open every input file it lists
            rep.extend(check_input_files(ds, section))
        if sub.ok and spec is None:
            spec = ds.element_spec
        if purpose == "train" and sub.ok:
            rep.extend(check_workers(input_fn, params, plan, strict=strict))
    if build_model:
        mrep, _ = check_model(model_fn, params, spec)
        rep.extend(mrep)
    return rep
