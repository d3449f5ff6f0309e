"""Which data an input worker's ``input_fn`` reads: TF_CONFIG, the seed rules and the shard
plan's ``data_dir`` view (docs/CONTRACT.md, "What the runtime gives each input worker's
input_fn"). Pure Python (no TensorFlow): the unit tests check these rules for 1-64 workers.

Model Zoo data processors (the Cerebras Model Zoo, release R1.6.1) list their files with
``tf.data.Dataset.list_files(<data_dir>/*.tfrecord*, shuffle=True, seed=shuffle_seed)`` and,
with ``train_input.use_multiple_workers``, shard that list by ``TF_CONFIG``
(``len(cluster.worker)`` shards, shard ``task.index``), "For sharding on the Cerebras System, we
need to explicitly retrieve TF_CONFIG". The rules here make that work under csrun:

- :func:`tf_config`: every input worker ``i`` of ``W`` gets ``TF_CONFIG`` with ``W`` entries
  in ``cluster.worker`` and ``task.index = i``; the chief's in-process pipeline (and its eval
  input) gets one worker. With a shard plan every worker gets one worker too
  (:func:`tf_config_for`): the plan already split the files, and a pipeline that also shards
  by TF_CONFIG must read its whole share, not a W-th of it.
- :func:`file_list_seed`: one seed for the whole job (the YAML's base seed, else one derived
  from the job id), which the runtime gives the file-list shuffle of ``list_files`` when the
  pipeline shards, so every worker shards the *same* list (:mod:`csrun_runtime.tensorflow.pipeline`).
  Everything else keeps the per-worker ``shuffle_seed`` (:func:`csrun_runtime.params.worker_params`),
  so record-level shuffles differ per worker ("Limitations of the CerebrasEstimator": "each
  worker node must shuffle its data differently").
- :func:`make_data_dir_view`: with a shard plan, ``train_input.data_dir`` points at a
  per-worker directory of symbolic links that shows the original directory without the other
  workers' plan files, so a pipeline that knows only ``data_dir`` reads exactly its plan files.
"""
from __future__ import annotations

import os
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from csrun_common.datapaths import resolve_data_path

__all__ = [
    "TF_CONFIG_VAR", "tf_config", "tf_config_for", "file_list_seed", "DataDirView",
    "make_data_dir_view", "plan_files",
]

#: the environment variable the Model Zoo's ``shard_dataset`` reads.
TF_CONFIG_VAR = "TF_CONFIG"
#: file-list seeds stay below this (a non-negative int64 that numpy and tf.data accept).
_SEED_MOD = 2 ** 31 - 1


def tf_config(worker_index: int, num_input_workers: int) -> dict[str, Any]:
    """``TF_CONFIG`` of input worker ``worker_index`` of ``num_input_workers`` as the Model Zoo's ``shard_dataset``
    reads it (``len(cluster["worker"])`` shards, shard ``task["index"]``; the ``input-worker-<k>:0`` entries
    are placeholders). Raises ``ValueError`` for ``num_input_workers < 1`` or an index outside the workers."""
    if num_input_workers < 1 or not 0 <= worker_index < num_input_workers:
        raise ValueError(f"worker_index {worker_index} outside [0, {num_input_workers})")
    return {"cluster": {"worker": [f"input-worker-{k}:0" for k in range(num_input_workers)]},
            "task": {"type": "worker", "index": worker_index}}


def tf_config_for(worker_index: int, num_input_workers: int, has_plan: bool) -> dict[str, Any]:
    """The ``TF_CONFIG`` the runtime sets for input worker ``worker_index`` of ``num_input_workers``:
    :func:`tf_config` without a shard plan; one worker (index 0) with a plan, whose files are
    already this worker's share."""
    if has_plan:
        return tf_config(0, 1)
    return tf_config(worker_index, max(1, num_input_workers))


def file_list_seed(base: int | None, job_key: str | None) -> int:
    """The job-wide seed of a file-sharding pipeline's file-list shuffle: ``base`` (``train_input.shuffle_seed``,
    else ``runconfig.seed``) when given, else one derived from ``job_key`` (``"<SLURM_JOB_ID>.<SLURM_STEP_ID>"``,
    the same in every task of a step), else a constant (``job_key`` ``None``: outside a job)."""
    if base is not None:
        return int(base)
    return zlib.crc32((job_key or "csrun-no-job").encode()) % _SEED_MOD


def plan_files(plan: Mapping[str, Any], index: int) -> tuple[set[str], set[str]]:
    """``(own, others)``: real paths of worker ``index``'s plan files and of the files the
    plan gives only to other workers."""
    own: set[str] = set()
    every: set[str] = set()
    for w in plan["workers"]:
        paths = {os.path.realpath(f) for f in w["files"]}
        every |= paths
        if int(w["index"]) == index:
            own |= paths
    return own, every - own


@dataclass
class DataDirView:
    """The per-worker ``data_dir`` made from a shard plan.

    Attributes:
        data_dir: the value to give ``train_input.data_dir`` (a path, or a list of paths when
            the original was a list), or ``None`` when no view was made.
        root: the directory holding the view.
        hidden: how many plan files of other workers the view leaves out.
        outside: this worker's plan files under none of the ``data_dir`` entries (the view
            cannot show them; the pipeline sees them only in ``train_input.data_files``).
        notes: why an entry of ``data_dir`` was kept as it was (not a directory, ...).
    """

    data_dir: str | list[str] | None
    root: str
    hidden: int = 0
    outside: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _ancestors(paths: Iterable[str]) -> set[str]:
    out: set[str] = set()
    for p in paths:
        d = os.path.dirname(p)
        while d and d not in out and d != os.path.dirname(d):
            out.add(d)
            d = os.path.dirname(d)
    return out


def _mirror(src: str, dst: Path, hide: set[str], hide_dirs: set[str]) -> int:
    """Mirror directory ``src`` into ``dst`` with symbolic links, leaving out ``hide`` (real
    paths); directories holding hidden files are recreated, the others linked whole.
    Returns the number of files left out."""
    dst.mkdir(parents=True, exist_ok=True)
    hidden = 0
    with os.scandir(src) as it:
        entries = sorted(it, key=lambda e: e.name)
    for e in entries:
        real = os.path.realpath(e.path)
        if real in hide:
            hidden += 1
        elif real in hide_dirs and e.is_dir():
            hidden += _mirror(e.path, dst / e.name, hide, hide_dirs)
        else:
            link, target = dst / e.name, os.path.abspath(e.path)
            if os.path.islink(link):  # this worker's earlier view: a replacement rebuilds it
                if os.readlink(link) == target:
                    continue
                os.unlink(link)
            os.symlink(target, link)
    return hidden


def make_data_dir_view(data_dir: str | Sequence[str] | None, own: set[str], others: set[str],
                       root: str | os.PathLike) -> DataDirView:
    """Build the per-worker view of ``data_dir`` under ``root``.

    Each directory entry ``d`` of ``data_dir`` (resolved against the current directory, as the
    Model Zoo does) becomes ``root/<k>``: ``d`` mirrored with symbolic links, leaving out every
    file of ``others``. This worker's plan files and every file the plan does not mention
    (metadata, vocabularies, eval files) stay visible under their own names and relative paths,
    so a pipeline's own glob (``*.tfrecord*``, ``train/train-*.tfrecords``) matches as before.

    Args:
        data_dir: ``train_input.data_dir``: a path or a list of paths (the Model Zoo's
            "Path/s to the data files to use"), or ``None``.
        own: real paths of this worker's plan files.
        others: real paths of the other workers' plan files.
        root: an empty or missing directory, or the view this worker built there before (reused).

    Returns:
        :class:`DataDirView`; its ``data_dir`` is ``None`` when ``data_dir`` names no directory.

    Raises:
        OSError: the view cannot be written under ``root``.
    """
    view = DataDirView(data_dir=None, root=os.fspath(root))
    if data_dir is None:
        return view
    entries = [data_dir] if isinstance(data_dir, str) else list(data_dir)
    hide_dirs = _ancestors(others)
    out: list[str] = []
    covered: set[str] = set()
    for k, entry in enumerate(entries):
        if not isinstance(entry, str) or not os.path.isdir(resolve_data_path(entry)):
            view.notes.append(f"train_input.data_dir entry {entry!r} is not a directory; kept as it is")
            out.append(entry)
            continue
        real = os.path.realpath(resolve_data_path(entry))  # the launch directory's rule (csrun_common.datapaths)
        covered |= {f for f in own if f.startswith(real + os.sep)}
        dst = Path(root) / str(k)
        view.hidden += _mirror(real, dst, others, hide_dirs)
        out.append(str(dst))
    view.outside = sorted(own - covered)
    if len(out) != len(entries) or all(o == e for o, e in zip(out, entries, strict=True)):
        return view
    view.data_dir = out[0] if isinstance(data_dir, str) else out
    return view
