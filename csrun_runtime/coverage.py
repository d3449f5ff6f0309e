"""Do the input workers read each training file once, or every file each? Checked by building
the pipeline as two input workers would (:func:`csrun_runtime.tensorflow.pipeline.build_worker_input`)
and reading back the files each one lists (:func:`csrun_runtime.tensorflow.pipeline.pipeline_files`).

Sound layouts ("Performance Optimization Practices", "Shard your input data"; "Limitations of
the CerebrasEstimator", "Multiple input workers"):

- **sharded**: the workers' files are disjoint and together are the whole set ("split your
  dataset into multiple, shorter, distinct files and allocate them across the worker nodes
  so that different workers have different slices of the dataset");
- **replicated**: every worker reads every file with its own shuffle ("In the simplest setup,
  the same input data is replicated across every input worker");
- **planned** (with a shard plan): every worker reads exactly its plan entry's files.

Anything else (files read by both workers while others are read by none, a worker reading
files outside its plan entry) is a problem: :func:`coverage_report` makes it a warning, or a
violation with ``strict`` (``--strict`` / ``runconfig.strict``). The whole set is what one
worker of one reads (the pipeline unsharded). Limits: only files whose names flow through a
tf.data dataset into a reader are seen (:func:`csrun_runtime.tensorflow.pipeline.pipeline_files`);
without such a dataset the check says it could not tell.

TensorFlow is imported inside the functions (see :mod:`csrun_runtime.tensorflow.worker`).
"""
from __future__ import annotations

import os
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Coverage", "check_job_files", "coverage_report", "read_and_shared",
           "coverage_of_files", "FIX_SHARD", "FIX_SHARE", "FIX_PLAN"]

#: the fix named when a pipeline that shards by the worker count shards a differently
#: ordered file list on each worker.
FIX_SHARD = ("fix: shard a file list that is in the same order on every input worker: list it with "
             "tf.data.Dataset.list_files(..., shuffle=True) (csrun gives that shuffle the job-wide "
             "seed train_input.file_list_seed) or shard the sorted list before shuffling it")
#: the fix named when workers' files overlap and the pipeline does not shard by the worker count.
FIX_SHARE = ("fix: read every file on every input worker, or shard one file list the same way on "
             "every worker (by TF_CONFIG, e.g. train_input.use_multiple_workers: true in a Model Zoo "
             "processor, or by train_input.worker_index and num_workers), or make a shard plan "
             "(cs_input_analyzer shard-plan --params ...) and launch with csrun_wse --shard-plan")
#: the fix named when a worker does not read its plan entry's files.
FIX_PLAN = ("fix: read the plan's files through train_input.data_dir (csrun points it at a view "
            "of this worker's files) or train_input.data_files, and make the plan from the same "
            "files (cs_input_analyzer shard-plan --params ...)")


@dataclass
class Coverage:
    """Outcome of a file-coverage check (:func:`coverage_of_files`, a backend's check).

    Attributes:
        verdict: ``sharded``, ``replicated``, ``planned`` (sound); ``overlap`` (a problem);
            ``unknown`` (the files could not be read back).
        num_input_workers: the worker count simulated (2, or the plan's).
        files: real paths each simulated worker lists, by worker index.
        all_files: the whole set (one unsharded worker's files, or the plan's files).
        problems: one message per problem, each ending with the fix.
        note: why the verdict is ``unknown``, or how the pipeline was seen to shard.
        level: what the verdict judges: ``file`` (the files each worker reads), or ``sample``
            (the dataset indices each PyTorch streamer draws: :mod:`csrun_runtime.pytorch.samples`).
    """

    verdict: str
    num_input_workers: int
    files: dict[int, list[str]] = field(default_factory=dict)
    all_files: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    note: str = ""
    level: str = "file"

    @property
    def ok(self) -> bool:
        """No problem found (``unknown`` is not a problem)."""
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (file lists as counts plus a few names)."""
        return {"verdict": self.verdict, "num_workers": self.num_input_workers,
                "files_per_worker": {str(k): len(v) for k, v in self.files.items()},
                "total_files": len(self.all_files), "problems": list(self.problems),
                "note": self.note, "level": self.level}


def _some(paths: set[str] | list[str], n: int = 3) -> str:
    names = sorted(os.path.basename(p) for p in paths)
    more = f" and {len(names) - n} more" if len(names) > n else ""
    return ", ".join(names[:n]) + more


def read_and_shared(sets: Mapping[Any, set[Any]]) -> tuple[set[Any], set[Any]]:
    """``(items in any of the sets, items in more than one)`` of the input workers' sets (files,
    or a sampler's indices: :func:`csrun_runtime.pytorch.samples.judge`)."""
    counts = Counter(x for s in sets.values() for x in s)
    return set(counts), {x for x, c in counts.items() if c > 1}


def coverage_of_files(files: Mapping[int, list[str]], all_files: list[str],
                      shards: bool = False, fix: str | None = None) -> Coverage:
    """The verdict for input workers' file lists against the whole set (no plan). Pure.

    Args:
        files: real paths each input worker reads, by worker index (two or more workers).
        all_files: the whole set.
        shards: the pipeline shards by the worker count (names :data:`FIX_SHARD`, else
            :data:`FIX_SHARE`).
        fix: the fix to name instead (a framework's own, e.g. the PyTorch runtime's).
    """
    fix = fix or (FIX_SHARD if shards else FIX_SHARE)
    sets = {k: set(v) for k, v in files.items()}
    every = set(all_files) | set().union(*sets.values())
    n = len(files)
    cov = Coverage(verdict="overlap", num_input_workers=n, files=dict(files), all_files=sorted(every))
    idle = sorted(k for k, v in sets.items() if not v)
    if idle:
        cov.problems.append(
            f"input worker(s) {', '.join(map(str, idle))} of {n} read no file (the "
            f"{len(every)} file(s) are fewer than the workers?); fix: launch at most "
            f"{len(every)} input workers, or split the files (cs_input_analyzer reshard)")
    if every and all(v == every for v in sets.values()):
        cov.verdict = "replicated"
        return cov
    seen, shared = read_and_shared(sets)
    unread = every - seen
    if shared:
        cov.problems.append(
            f"{len(shared)} of the {len(every)} training file(s) are read by more than one of "
            f"the {n} input workers ({_some(shared)})"
            + (f" and {len(unread)} by none ({_some(unread)})" if unread else "")
            + f"; {fix}")
    elif unread:
        cov.problems.append(
            f"{len(unread)} of the {len(every)} training file(s) are read by none of the {n} "
            f"input workers ({_some(unread)}); {fix}")
    if not cov.problems:
        cov.verdict = "sharded"
    return cov


def check_job_files(files: Mapping[int, list[str]], plan: Mapping[str, Any] | None,
                    all_files: list[str] | None, shards: bool = False) -> Coverage:
    """Rule 7 on every input worker of a job: the files each one's pipeline lists (real
    paths, by worker index) against its plan entry, or against the whole set (``None``:
    the union of the workers' files, so only files read twice are found). Pure."""
    if plan is not None:
        return plan_coverage(files, plan)
    return coverage_of_files(files, list(all_files or []), shards)


def plan_coverage(files: Mapping[int, list[str]], plan: Mapping[str, Any]) -> Coverage:
    entries = {int(w["index"]): {os.path.realpath(f) for f in w["files"]} for w in plan["workers"]}
    every = sorted(set().union(*entries.values()))
    cov = Coverage(verdict="planned", num_input_workers=int(plan["num_workers"]), files=dict(files),
                   all_files=every)
    for k, read in sorted(files.items()):
        extra, missing = set(read) - entries[k], entries[k] - set(read)
        if extra:
            cov.problems.append(f"input worker {k} reads {len(extra)} file(s) outside its shard-plan "
                                f"entry ({_some(extra)}); {FIX_PLAN}")
        if missing:
            cov.problems.append(f"input worker {k} does not read {len(missing)} file(s) of its "
                                f"shard-plan entry ({_some(missing)}); {FIX_PLAN}")
    if cov.problems:
        cov.verdict = "overlap"
    return cov


def coverage_report(cov: Coverage, strict: bool, section: str = "train_input") -> tuple[list[str], list[str]]:
    """``(violations, warnings)`` of a coverage outcome: its problems are violations with
    ``strict``, else warnings."""
    msgs = [f"{section}: {p}" for p in cov.problems]
    return (msgs, []) if strict else ([], msgs)
