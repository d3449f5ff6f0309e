"""Contract rule 7 for a TensorFlow ``input_fn``: build the training input as input workers 0
and 1 and judge the files their pipelines list (:func:`check_file_coverage`) with the core's
framework-neutral judgement (:mod:`csrun_runtime.coverage`). TensorFlow is imported inside
the functions (see :mod:`csrun_runtime.tensorflow.worker`)."""
from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Mapping
from typing import Any

from ..coverage import Coverage, coverage_of_files, plan_coverage
from .pipeline import WorkerInput, build_worker_input, pipeline_files

__all__ = ["check_file_coverage"]


def _built(input_fn: Callable[..., Any], params: Mapping[str, Any], index: int, num: int,
           plan: Mapping[str, Any] | None, view_root: str) -> WorkerInput:
    return build_worker_input(input_fn, params, index, num, plan, view_root=view_root)


def check_file_coverage(input_fn: Callable[..., Any], params: Mapping[str, Any],
                        plan: Mapping[str, Any] | None = None,
                        built: Mapping[int, WorkerInput] | None = None) -> Coverage:
    """Build the training input as input workers 0 and 1 (of 2, or of the plan's count) and
    judge the files they read (see the module docstring).

    Args:
        input_fn: the training input function.
        params: resolved params.
        plan: a shard plan, or ``None``.
        built: workers 0 and 1 already built with :func:`build_worker_input` for this check
            (fresh: not iterated), to save building them again.

    Returns:
        :class:`Coverage`. Raises what ``input_fn`` raises.
    """
    num = int(plan["num_workers"]) if plan is not None else 2
    if num < 2:
        return Coverage(verdict="unknown", num_input_workers=num,
                        note="one input worker: nothing to share")
    root = tempfile.mkdtemp(prefix="csrun-coverage-")
    try:
        workers = dict(built or {})
        for k in (0, 1):
            if k not in workers:
                workers[k] = _built(input_fn, params, k, num, plan, root)
        files = {k: pipeline_files(w.dataset) for k, w in workers.items()}
        if any(v is None for v in files.values()):
            return Coverage(verdict="unknown", num_input_workers=num,
                            note="could not tell which files input_fn reads (no dataset of file "
                                 "names feeding a reader in its pipeline); not checked")
        known = {k: list(v or []) for k, v in files.items()}
        if plan is not None:
            return plan_coverage(known, plan)
        whole = pipeline_files(_built(input_fn, params, 0, 1, None, root).dataset) or []
        cov = coverage_of_files(known, whole, workers[0].shards_by_worker_count)
        if workers[0].shards_by_worker_count:
            cov.note = ("the pipeline shards by the input-worker count"
                        + (" (file list shuffled with the job-wide train_input.file_list_seed)"
                           if workers[0].file_list_job_wide else ""))
        return cov
    finally:
        shutil.rmtree(root, ignore_errors=True)
