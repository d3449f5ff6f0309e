"""Building the training input as input worker ``i`` of ``W`` builds it, and reading back which
files a built pipeline reads.

:func:`build_worker_input` is the one way the runtime calls a training ``input_fn``: in the
input-worker task (:mod:`csrun_runtime.tensorflow.worker`), in the chief's in-process pipeline and its
checks (:mod:`csrun_runtime.tensorflow.chief`, :mod:`csrun_runtime.tensorflow.contract`,
:mod:`csrun_runtime.coverage`) and in the analyzer's probes. Around the call it sets what a
Model Zoo data processor expects of an input worker of the Cerebras system
(:mod:`csrun_runtime.sharding` has the rules; docs/CONTRACT.md the whole list):

1. ``params`` from :func:`csrun_runtime.params.worker_params` (per-worker ``shuffle_seed``,
   job-wide ``file_list_seed``; with a shard plan ``data_files`` and a ``data_dir`` view);
2. ``TF_CONFIG`` (:func:`csrun_runtime.sharding.tf_config_for`) and TensorFlow's global seed
   (the worker's ``shuffle_seed``);
3. when the built pipeline shards by the worker count (a ``Dataset.shard(W, ...)`` in its
   chain, as the Model Zoo's ``shard_dataset`` does from TF_CONFIG) and it listed its files
   with a shuffling ``tf.data.Dataset.list_files``, ``input_fn`` is called a second time with
   ``list_files`` giving its shuffle the job-wide seed pair ``(file_list_seed,
   file_list_seed)``: every worker then shards the same file order, so the shards are disjoint
   and cover the set, while every other random op keeps the worker's own seeds.

:func:`pipeline_files` reads a built dataset's file names: it walks the dataset's inputs to the
datasets of file names that feed a reader (``TFRecordDataset``, ``interleave``, ``flat_map``,
``map``), and iterates those small datasets (names only; no record is read).

TensorFlow is imported inside the functions (see :mod:`csrun_runtime.tensorflow.worker`).
"""
from __future__ import annotations

import contextlib
import inspect
import json
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..params import worker_params
from ..sharding import TF_CONFIG_VAR, DataDirView, make_data_dir_view, plan_files, tf_config_for

__all__ = ["WorkerInput", "build_worker_input", "call_input_fn", "input_environment", "pipeline_files",
           "shard_counts", "MAX_FILE_NAMES", "ListedFiles", "listed_input_files"]

#: at most this many file names are read from one file-name dataset.
MAX_FILE_NAMES = 100_000

#: dataset classes that consume file names (their inputs may be lists of files).
_CONSUMERS = ("Interleave", "FlatMap", "MapDataset", "TFRecordDataset", "TextLineDataset",
              "FixedLengthRecordDataset")
#: dataset classes a pure list of file names is built from (iterating them reads no file).
_NAME_LIST_CLASSES = frozenset({
    "_TensorSliceDataset", "_TensorDataset", "_ShuffleDataset", "_ShardDataset", "_RepeatDataset",
    "_TakeDataset", "_SkipDataset", "_ConcatenateDataset", "_PrefetchDataset", "_OptionsDataset",
    "DatasetV1Adapter", "_FilterDataset", "_CacheDataset", "_RangeDataset", "_UnbatchDataset",
    "_ShuffleAndRepeatDataset",
})


def _accepts_mode(fn: Callable[..., Any]) -> bool:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return False
    return "mode" in sig.parameters or any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values())


def call_input_fn(input_fn: Callable[..., Any], params: dict[str, Any], purpose: str = "train",
                  eval_input_fn: Callable[..., Any] | None = None) -> Any:
    """Build the dataset for ``purpose``: ``"train"``: ``input_fn(params)``; ``"eval"``: ``eval_input_fn(params)``
    when given, else ``input_fn(params, mode="eval")`` when input_fn has a ``mode`` parameter (Model Zoo style).

    Raises:
        TypeError: evaluation without an eval input function; whatever input_fn raises.
    """
    if purpose == "eval":
        if eval_input_fn is not None:
            return eval_input_fn(params)
        if _accepts_mode(input_fn):
            return input_fn(params, mode="eval")
        raise TypeError("evaluation needs run(..., eval_input_fn=...) or an input_fn with a "
                        "`mode` parameter (input_fn(params, mode='eval'))")
    return input_fn(params)


@dataclass
class WorkerInput:
    """The training dataset as one input worker builds it, and how it was built.

    Attributes:
        dataset: what ``input_fn`` returned (normally a ``tf.data.Dataset``).
        params: the params ``input_fn`` received.
        worker_index: the worker's index; ``num_input_workers``: the job's input-worker count.
        tf_config: the ``TF_CONFIG`` set while ``input_fn`` ran.
        global_seed: TensorFlow's global seed while it ran (the worker's ``shuffle_seed``).
        file_list_seed: the job-wide seed of file-list shuffles.
        shards_by_worker_count: the pipeline has a ``shard(W, ...)`` with ``W`` the
            TF_CONFIG worker count (>= 2).
        file_list_job_wide: ``list_files`` shuffled with the job-wide seed pair (rule 3).
        file_list_seed_pairs: ``(seed, seed2)`` of those job-wide shuffles (the shared-seed
            warning ignores them: they are meant to be the same on every worker).
        view: the shard plan's ``data_dir`` view, or ``None``.
    """

    dataset: Any
    params: dict[str, Any]
    worker_index: int
    num_input_workers: int
    tf_config: dict[str, Any]
    global_seed: int | None
    file_list_seed: int
    shards_by_worker_count: bool = False
    file_list_job_wide: bool = False
    file_list_seed_pairs: set[tuple[int, int]] = field(default_factory=set)
    view: DataDirView | None = None

    def describe(self) -> dict[str, Any]:
        """JSON-ready summary (worker registrations and reports)."""
        ti = self.params.get("train_input") or {}
        return {"tf_config": self.tf_config, "shuffle_seed": ti.get("shuffle_seed"),
                "global_seed": self.global_seed, "file_list_seed": self.file_list_seed,
                "shards_by_worker_count": self.shards_by_worker_count,
                "file_list_job_wide": self.file_list_job_wide,
                "data_dir_view": self.view.data_dir if self.view else None}


@contextlib.contextmanager
def input_environment(tf_config: Mapping[str, Any] | None, global_seed: int | None,
                      restore: bool = True, set_seed: bool = True) -> Iterator[None]:
    """Set ``TF_CONFIG`` (JSON) and TensorFlow's global seed for building an input pipeline;
    put the previous values back afterwards unless ``restore`` is false (an input-worker task
    keeps them for its whole life). ``tf_config=None`` leaves ``TF_CONFIG`` alone;
    ``set_seed=False`` leaves the global seed alone."""
    import tensorflow as tf
    from tensorflow.python.eager import context

    old_env = os.environ.get(TF_CONFIG_VAR)
    old_seed = context.global_seed()
    if tf_config is not None:
        os.environ[TF_CONFIG_VAR] = json.dumps(dict(tf_config))
    if set_seed:
        tf.random.set_seed(global_seed)
    try:
        yield
    finally:
        if restore:
            if tf_config is not None:
                if old_env is None:
                    os.environ.pop(TF_CONFIG_VAR, None)
                else:
                    os.environ[TF_CONFIG_VAR] = old_env
            if set_seed:
                tf.random.set_seed(old_seed)


class _ListFilesHook:
    """Replaces ``tf.data.Dataset.list_files`` (and the ``tf.compat.v1`` one) while active.

    It records every call that shuffles; with ``job_seed`` set, such a call runs under the
    global seed ``job_seed`` with op seed ``job_seed`` (the previous global seed is put back
    right after), so its file order is the same in every process of the job.
    """

    def __init__(self, job_seed: int | None):
        self.job_seed = job_seed
        self.shuffled_calls = 0
        self.seed_pairs: set[tuple[int, int]] = set()

    def _wrap(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def list_files(file_pattern: Any, shuffle: bool | None = None, seed: Any = None,
                       name: str | None = None) -> Any:
            if shuffle is False:
                return original(file_pattern, shuffle=False, seed=seed, name=name)
            self.shuffled_calls += 1
            if self.job_seed is None:
                return original(file_pattern, shuffle=shuffle, seed=seed, name=name)
            import tensorflow as tf
            from tensorflow.python.eager import context
            from tensorflow.python.framework import random_seed

            saved = context.global_seed()
            tf.random.set_seed(self.job_seed)
            try:
                pair = random_seed.get_seed(self.job_seed)
                self.seed_pairs.add((int(pair[0]), int(pair[1])))
                return original(file_pattern, shuffle=True, seed=self.job_seed, name=name)
            finally:
                tf.random.set_seed(saved)
        return list_files

    @contextlib.contextmanager
    def active(self) -> Iterator[_ListFilesHook]:
        from tensorflow.python.data.ops import dataset_ops

        classes = (dataset_ops.DatasetV2, dataset_ops.DatasetV1)
        saved = [cls.__dict__["list_files"] for cls in classes]
        for cls, sm in zip(classes, saved, strict=True):
            cls.list_files = staticmethod(self._wrap(sm.__func__))
        try:
            yield self
        finally:
            for cls, sm in zip(classes, saved, strict=True):
                cls.list_files = sm


def _walk(ds: Any) -> Iterator[Any]:
    """Every dataset object in ``ds``'s input chain (``ds`` first), each once."""
    seen: set[int] = set()
    stack = [ds]
    while stack:
        d = stack.pop()
        if id(d) in seen:
            continue
        seen.add(id(d))
        yield d
        try:
            stack.extend(d._inputs())
        except Exception:  # noqa: BLE001 - a dataset class without inputs
            pass


def shard_counts(ds: Any) -> set[int]:
    """The ``num_shards`` of every ``Dataset.shard`` in ``ds``'s input chain (constant ones;
    shards inside dataset functions are not seen)."""
    out: set[int] = set()
    for d in _walk(ds):
        n = getattr(d, "_num_shards", None)
        if type(d).__name__ == "_ShardDataset" and n is not None:
            try:
                out.add(int(n.numpy()))
            except Exception:  # noqa: BLE001 - not an eager constant
                pass
    return out


def _is_name_list(ds: Any) -> bool:
    import tensorflow as tf

    spec = getattr(ds, "element_spec", None)
    if not (isinstance(spec, tf.TensorSpec) and spec.dtype == tf.string and spec.shape.rank == 0):
        return False
    return all(type(d).__name__ in _NAME_LIST_CLASSES for d in _walk(ds))


def _names(ds: Any) -> list[str]:
    """The distinct names of a name-list dataset in first-seen order (bounded: an infinite
    list stops once a pass over twice the names seen so far brought no new one)."""
    import tensorflow as tf

    infinite = int(ds.cardinality().numpy()) == tf.data.INFINITE_CARDINALITY
    names: dict[str, None] = {}
    since_new = 0
    for i, v in enumerate(ds.as_numpy_iterator()):
        name = v.decode("utf-8", "surrogateescape")
        if name in names:
            since_new += 1
        else:
            names[name] = None
            since_new = 0
        if i + 1 >= MAX_FILE_NAMES or (infinite and since_new > 2 * len(names) + 100):
            break
    return list(names)


def _are_files(names: list[str]) -> bool:
    import tensorflow as tf

    sample = names[:20]
    return bool(sample) and all(tf.io.gfile.exists(n) and not tf.io.gfile.isdir(n) for n in sample)


def pipeline_files(ds: Any) -> list[str] | None:
    """The files a built dataset reads in its first pass, in first-seen order, as real paths.

    Finds in ``ds``'s input chain the datasets of file names (scalar strings from tensor slices,
    ``list_files``, shuffle, shard, repeat, take, skip, filter, ...) that feed a reader
    (``TFRecordDataset`` and the other readers, ``interleave``, ``flat_map``, ``map``), iterates
    them (names only, no file opened) and keeps the names that are existing files. It advances their
    seeded shuffles: call it on a dataset not iterated in-process again (one registered with tf.data
    service is rebuilt on the server).

    Returns:
        The real paths, or ``None`` when no such dataset is found (files opened in Python,
        ``from_generator``, a name list built inside a dataset function, ...).
    """
    found: dict[str, None] = {}
    any_list = False
    for d in _walk(ds):
        if not any(c in type(d).__name__ for c in _CONSUMERS):
            continue
        for src in d._inputs():
            if not _is_name_list(src):
                continue
            names = _names(src)
            if _are_files(names):
                any_list = True
                for n in names:
                    found.setdefault(os.path.realpath(n), None)
    return list(found) if any_list else None


#: tf.data file readers: every name given to one of them is a file it will open.
_READERS = ("TFRecordDataset", "TextLineDataset", "FixedLengthRecordDataset", "CsvDataset")


@dataclass(frozen=True)
class ListedFiles:
    """The names a built dataset lists to one of its file consumers.

    Attributes:
        reader: the consumer's class name (``TFRecordDatasetV2``, ``_InterleaveDataset`` ...).
        names: the distinct names, as listed (not resolved), in first-seen order.
        certain: the consumer is a file reader (:data:`_READERS`), so every name is a file it
            will open; ``False`` for ``interleave``/``flat_map``/``map``, whose strings may be
            something else than file names.
    """

    reader: str
    names: list[str]
    certain: bool


def _listed_names(value: Any) -> list[str] | None:
    """Names held by a reader's ``_filenames``: a name-list dataset (TFRecordDataset,
    TextLineDataset) or a constant string tensor (CsvDataset); ``None`` otherwise."""
    import tensorflow as tf

    if isinstance(value, tf.data.Dataset):
        return _names(value) if _is_name_list(value) else None
    if isinstance(value, tf.Tensor) and value.dtype == tf.string:
        try:
            flat = tf.reshape(value, [-1]).numpy().tolist()
        except Exception:  # noqa: BLE001 - not an eager constant
            return None
        return list(dict.fromkeys(v.decode("utf-8", "surrogateescape") for v in flat))
    return None


def listed_input_files(ds: Any) -> list[ListedFiles]:
    """Every list of names ``ds``'s input chain gives a file consumer, whether the files
    exist or not (unlike :func:`pipeline_files`, which keeps existing files only): the
    ``_filenames`` of the file readers (``TFRecordDataset``, ``TextLineDataset``,
    ``FixedLengthRecordDataset``, ``CsvDataset``: certain) and the name-list datasets
    feeding ``interleave``, ``flat_map`` and ``map`` (not certain). No file is opened; the
    same caveat as :func:`pipeline_files` on seeded shuffles applies. Lazy pipelines are why
    it exists: a reader given a wrong ``data_dir`` builds fine and fails at its first read."""
    out: list[ListedFiles] = []
    for d in _walk(ds):
        cls = type(d).__name__
        if any(r in cls for r in _READERS):
            names = _listed_names(getattr(d, "_filenames", None))
            if names is not None:
                out.append(ListedFiles(cls, names, True))
                continue
        if not any(c in cls for c in _CONSUMERS):
            continue
        try:
            inputs = d._inputs()
        except Exception:  # noqa: BLE001 - a dataset class without inputs
            continue
        for src in inputs:
            if _is_name_list(src):
                out.append(ListedFiles(cls, _names(src), False))
    return out


def _call(input_fn: Callable[..., Any], params: dict[str, Any], tf_config: Mapping[str, Any],
          global_seed: int | None, hook: _ListFilesHook, restore: bool) -> Any:
    with input_environment(tf_config, global_seed, restore=restore), hook.active():
        return call_input_fn(input_fn, params, "train")


def _plan_view(params: dict[str, Any], plan: Mapping[str, Any], index: int,
               view_root: str | os.PathLike | None) -> DataDirView | None:
    ti = params["train_input"]
    if view_root is None or ti.get("data_dir") is None:
        return None
    own, others = plan_files(plan, index)
    view = make_data_dir_view(ti["data_dir"], own, others, os.path.join(view_root, str(index)))
    if view.data_dir is not None:
        ti["data_dir"] = view.data_dir
    return view


def build_worker_input(input_fn: Callable[..., Any], params: Mapping[str, Any], index: int,
                       num_input_workers: int, plan: Mapping[str, Any] | None = None, *,
                       job_key: str | None = None, view_root: str | os.PathLike | None = None,
                       restore: bool = True) -> WorkerInput:
    """Call ``input_fn`` as input worker ``index`` of ``num_input_workers`` (see the module docstring).

    Args:
        input_fn: the training input function (``input_fn(params)``).
        params: resolved params (not modified).
        index: the worker's index in ``[0, num_input_workers)``.
        num_input_workers: the job's input workers (1 for a chief that reads in-process).
        plan: a shard plan (:func:`csrun_runtime.params.load_shard_plan`) or ``None``.
        job_key: ``"<job>.<step>"`` (job-wide ``file_list_seed`` without a base seed).
        view_root: where to write the plan's ``data_dir`` view (``<view_root>/<index>/``);
            ``None``: no view (``data_dir`` unchanged).
        restore: put ``TF_CONFIG`` and the global seed back afterwards (``False`` in the
            input-worker task, which keeps them).

    Returns:
        :class:`WorkerInput`.

    Raises:
        Whatever ``input_fn`` raises; ``OSError`` when the view cannot be written.
    """
    wp = worker_params(params, index, num_input_workers, plan, job_key=job_key)
    ti = wp["train_input"]
    view = _plan_view(wp, plan, index, view_root) if plan is not None else None
    conf = tf_config_for(index, num_input_workers, plan is not None)
    count = len(conf["cluster"]["worker"])
    seed = ti.get("shuffle_seed")
    out = WorkerInput(dataset=None, params=wp, worker_index=index, num_input_workers=num_input_workers,
                      tf_config=conf, global_seed=seed, file_list_seed=int(ti["file_list_seed"]),
                      view=view)
    first = _ListFilesHook(None)
    out.dataset = _call(input_fn, wp, conf, seed, first, restore=True)
    out.shards_by_worker_count = count >= 2 and count in shard_counts(out.dataset)
    if out.shards_by_worker_count and first.shuffled_calls:
        job_wide = _ListFilesHook(out.file_list_seed)
        out.dataset = _call(input_fn, wp, conf, seed, job_wide, restore=restore)
        out.file_list_job_wide = True
        out.file_list_seed_pairs = job_wide.seed_pairs
    elif not restore:
        with input_environment(conf, seed, restore=False):
            pass
    return out
