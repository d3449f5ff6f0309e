"""Do a PyTorch run.py's input workers read each training file once, or every file each?
(contract rule 7 of docs/CONTRACT.md, the file-coverage check of ``validate_only`` and of
``cs_input_analyzer``; the TensorFlow check is :mod:`csrun_runtime.coverage`).

A DataLoader does not say which files it reads, so the check watches: it builds the training
DataLoader as streamers 0 and 1 of 2 and as one unsharded streamer, exactly as an input worker
builds it (:func:`.worker.build_loader`, DataLoader ``num_workers`` 0 so that every read
happens in this process), iterates one pass of each, and records every regular file opened
for reading meanwhile (a :func:`sys.addaudithook` on the ``open`` event: ``open()``, ``io.open``,
``os.open``, hence ``np.load``, PIL, ``torch.load``), leaving out Python's own files (under
``sys.prefix``/``sys.base_prefix``, ``.py``/``.pyc``/``.so`` files), the system's (``/proc``,
``/etc``, time zones, ...) and whatever a module opens while it is imported (a library's first
import inside the data function). A pass longer than ``max_seconds`` is cut: the file verdict
then speaks of the files read so far and the note says so.

Two levels (:class:`csrun_runtime.coverage.Coverage`'s ``level``):

- **by sample** where the three DataLoaders draw from the same dataset (a map-style dataset of
  one length on all three; its indices listed from the sampler, :mod:`.samples`): a
  ``DistributedSampler`` over one file loaded in memory opens the same file on every streamer
  and is still ``sharded``, its ``drop_last`` remainder and the DataLoader's partial last
  batches counted as dropped, not unread; a sampler that gives every streamer every sample is
  ``replicated``, a warning. The files are then described, not judged.
- **by file** otherwise (an ``IterableDataset``, a dataset built from the streamer's own
  files, or files already disjoint and covering): :func:`csrun_runtime.coverage.coverage_of_files`'
  ``sharded``, ``replicated``, ``overlap``, or ``unknown`` when no file was opened; the note
  says why the samples were not judged.

Imports torch through the worker's build only; never TensorFlow. Call it in a process of its
own (the audit hook stays installed, inactive, until the process exits).
"""
from __future__ import annotations

import os
import stat
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import FrameType
from typing import Any

from ..coverage import Coverage, coverage_of_files
from .samples import Drawn, SampleJudgement, drawn_indices, judge
from .worker import build_loader

__all__ = ["Seen", "check_dataloader_files", "files_read", "watch_streamer", "validate_lines", "FIX_STREAMERS"]

#: The fix named when the PyTorch workers' files overlap.
FIX_STREAMERS = ("fix: shard with csrun's streamer facts (num_streamers() / get_streaming_rank(): a "
                 "DistributedSampler seeded with the job-wide train_input.shuffle_seed, or every "
                 "num_streamers()-th file of a sorted list), read every file on every worker, or make "
                 "a shard plan (cs_input_analyzer shard-plan) and launch with csrun_wse --shard-plan")

_WATCH: dict[str, Any] = {"on": False, "files": None}
_SKIP_SUFFIXES = (".py", ".pyc", ".so", ".pth", ".pyi")
#: The system's own files (time zones, CPU and cgroup facts a library reads once), never data.
_SYSTEM_DIRS = ("/proc", "/sys", "/dev", "/etc", "/run", "/usr/share/zoneinfo")


def _importing() -> bool:
    """A module is being imported somewhere up the stack: what it opens is the library's own
    (a time-zone file read once by the first import), not the data set."""
    f: FrameType | None = sys._getframe(2)
    while f is not None:
        if f.f_code.co_filename.startswith("<frozen importlib"):
            return True
        f = f.f_back
    return False


def _hook(event: str, args: tuple) -> None:
    if event != "open" or not _WATCH["on"] or not args or not isinstance(args[0], (str, bytes, os.PathLike)):
        return
    if _importing():
        return
    mode = args[1] if len(args) > 1 else None
    flags = args[2] if len(args) > 2 and isinstance(args[2], int) else 0
    if (isinstance(mode, str) and any(c in mode for c in "wax+")) or flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
        return  # written, not read: logs, caches, a tap
    _WATCH["on"] = False  # os.stat below must not recurse into the hook's own work
    try:
        path = os.path.realpath(os.fsdecode(args[0]))
        skip = (*_prefixes(), *_SYSTEM_DIRS)
        if not path.endswith(_SKIP_SUFFIXES) and not any(path.startswith(p + os.sep) for p in skip):
            st = os.stat(path)
            if stat.S_ISREG(st.st_mode):
                _WATCH["files"].add(path)
    except (OSError, ValueError, TypeError):
        pass
    finally:
        _WATCH["on"] = True


def _prefixes() -> set[str]:
    return {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix) if p}


_INSTALLED = False


@dataclass
class Seen:
    """What one streamer's DataLoader did in the check: ``files`` (real paths opened for reading,
    sorted), ``complete`` (the pass was not cut), ``drawn`` (:func:`.samples.drawn_indices`: its
    first pass's indices, or why they cannot be listed)."""

    files: list[str]
    complete: bool
    drawn: Drawn | str


def watch_streamer(train_data_fn: Callable[..., Any], params: Mapping[str, Any], rank: int, num_streamers: int,
                   max_seconds: float = 60.0) -> Seen:
    """Build streamer ``rank`` of ``num_streamers``'s DataLoader, list the indices its first pass
    draws, iterate that pass (at most ``max_seconds``) and record the files opened meanwhile.
    Raises what the data function raises (:class:`.contract.ContractError`)."""
    global _INSTALLED
    if not _INSTALLED:
        sys.addaudithook(_hook)
        _INSTALLED = True
    ti = dict(params.get("train_input") or {})
    ti["num_workers"] = 0  # every read in this process, where the hook sees it
    for k in ("prefetch_factor", "persistent_workers"):  # torch 2 refuses them without workers
        ti.pop(k, None)
    p = {**params, "train_input": ti}
    _WATCH["files"], _WATCH["on"] = set(), True
    complete = False
    try:
        loader, _params, _seed = build_loader(train_data_fn, p, rank, num_streamers, rank)
        drawn = drawn_indices(loader)  # set_epoch(0) too, as contract.epochs() before the first pass
        t_end = time.monotonic() + max_seconds
        complete = True
        for _batch in loader:  # one pass, however long (an IterableDataset has no length)
            if time.monotonic() > t_end:
                complete = False
                break
    finally:
        _WATCH["on"] = False
    return Seen(sorted(_WATCH["files"]), complete, drawn)


def files_read(train_data_fn: Callable[..., Any], params: Mapping[str, Any], rank: int, num_streamers: int,
               max_seconds: float = 60.0) -> tuple[list[str], bool]:
    """Real paths of the files streamer ``rank`` of ``num_streamers``'s DataLoader opens in one pass (at most
    ``max_seconds`` s), and whether it completed (:func:`watch_streamer`). Raises what the data function raises."""
    seen = watch_streamer(train_data_fn, params, rank, num_streamers, max_seconds)
    return seen.files, seen.complete


def check_dataloader_files(train_data_fn: Callable[..., Any], params: Mapping[str, Any],
                           max_seconds: float = 60.0) -> Coverage:
    """Streamers 0 and 1 of 2 against one unsharded streamer (see the module docstring): by
    sample where their indices can be compared and the files do not already show a split by
    file, else by file. Returns a :class:`csrun_runtime.coverage.Coverage` (``level``
    ``sample`` or ``file``); raises what the data function raises."""
    seen = {k: watch_streamer(train_data_fn, params, k, 2, max_seconds) for k in (0, 1)}
    whole = watch_streamer(train_data_fn, params, 0, 1, max_seconds)
    by_file = _by_file(seen, whole, max_seconds)
    by_sample = _samples(seen, whole)
    if by_file.verdict == "sharded" or isinstance(by_sample, str):
        if isinstance(by_sample, str) and by_file.verdict != "sharded":
            by_file.note += f"; samples not judged: {by_sample}"
        return by_file
    return Coverage(verdict=by_sample.verdict, num_input_workers=2, files=by_file.files, all_files=by_file.all_files,
                    problems=[f"{p}; {FIX_STREAMERS}" for p in by_sample.problems],
                    note=f"{by_sample.line}; files not judged, the split being by sample: {_files_seen(by_file)}",
                    level="sample")


def _by_file(seen: Mapping[int, Seen], whole: Seen, max_seconds: float) -> Coverage:
    files = {k: v.files for k, v in seen.items()}
    if not whole.files and not any(files.values()):
        return Coverage(verdict="unknown", num_input_workers=2,
                        note="file-level: no data file was opened while the DataLoader was built and iterated "
                             "(data made in memory?); not checked")
    cov = coverage_of_files(files, whole.files, fix=FIX_STREAMERS)
    partial = [str(k) for k, v in seen.items() if not v.complete] + ([] if whole.complete else ["unsharded"])
    cov.note = ("file-level: files opened while the DataLoader was built and iterated for one pass"
                + (f" (cut after {max_seconds:g} s for {', '.join(partial)}: the files read so far)"
                   if partial else ""))
    return cov


def _samples(seen: Mapping[int, Seen], whole: Seen) -> SampleJudgement | str:
    """The sample-level judgement, or why there is none."""
    for d in [*(v.drawn for v in seen.values()), whole.drawn]:
        if isinstance(d, str):
            return d
    drawn = {k: v.drawn for k, v in seen.items() if isinstance(v.drawn, Drawn)}
    lengths = [d.length for d in drawn.values()] + [whole.drawn.length if isinstance(whole.drawn, Drawn) else -1]
    if len(set(lengths)) > 1:
        return (f"the dataset has {' and '.join(map(str, lengths[:-1]))} samples on streamers 0 and 1 of 2 but "
                f"{lengths[-1]} on one streamer (each builds its own dataset: its files say what it reads)")
    return judge(drawn)


def _files_seen(cov: Coverage) -> str:
    if cov.verdict == "unknown":
        return "no data file was opened (data made in memory?)"
    sets = [set(v) for _, v in sorted(cov.files.items())]
    both = set.intersection(*sets) if sets else set()
    return (f"streamers 0 and 1 opened {' and '.join(str(len(s)) for s in sets)} of {len(cov.all_files)} "
            f"file(s), {len(both)} by both")


def _line(cov: Coverage) -> str:
    """The verdict as the report says it: ``sharded by sample`` when judged by sample."""
    return cov.verdict + (" by sample" if cov.level == "sample" and cov.verdict == "sharded" else "")


def validate_lines(train_data_fn: Callable[..., Any], params: Mapping[str, Any], strict: bool,
                   max_seconds: float) -> list[str]:
    """validate_only's rule 7: the check's verdict line and one ``warning:`` line per problem.
    Raises :class:`.contract.ContractError` naming the problems when ``strict``
    (``runconfig.strict`` / ``--strict``)."""
    from .contract import ContractError

    cov = check_dataloader_files(train_data_fn, params, max_seconds)
    if cov.problems and strict:
        raise ContractError("train_input: " + "; ".join(cov.problems))
    return ([f"input workers' files (the DataLoader built as streamers 0 and 1 of 2): {_line(cov)}"
             + (f" ({cov.note})" if cov.note else "")] + [f"warning: train_input: {p}" for p in cov.problems])
