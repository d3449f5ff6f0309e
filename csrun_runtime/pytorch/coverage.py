"""Do a PyTorch run.py's input workers read each training file once, or every file each?
(contract rule 7 of docs/CONTRACT.md, the file-coverage check of ``validate_only`` and of
``cs_input_analyzer``; the TensorFlow check is :mod:`csrun_runtime.coverage`).

A DataLoader does not say which files it reads, so the check watches: it builds the training
DataLoader as streamers 0 and 1 of 2 and as one unsharded streamer, exactly as an input worker
builds it (:func:`.worker.build_loader`, DataLoader ``num_workers`` 0 so that every read
happens in this process), iterates one pass of each, and records every regular file opened
for reading meanwhile (a :func:`sys.addaudithook` on the ``open`` event: ``open()``, ``io.open``,
``os.open``, hence ``np.load``, PIL, ``torch.load``), leaving out Python's own files (under
``sys.prefix``/``sys.base_prefix``, ``.py``/``.pyc``/``.so`` files). The verdicts are
:func:`csrun_runtime.coverage.coverage_of_files`': ``sharded``, ``replicated``, ``overlap``, or
``unknown`` when no file was opened (data made in memory, or read before the check could see
it). A pass longer than ``max_seconds`` is cut: the verdict then speaks of the files read so
far and the note says so.

Imports torch through the worker's build only; never TensorFlow. Call it in a process of its
own (the audit hook stays installed, inactive, until the process exits).
"""
from __future__ import annotations

import os
import stat
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

from ..coverage import Coverage, coverage_of_files
from .contract import epochs
from .worker import build_loader

__all__ = ["check_dataloader_files", "files_read", "validate_lines", "FIX_STREAMERS"]

#: The fix named when the PyTorch workers' files overlap.
FIX_STREAMERS = ("fix: shard with csrun's streamer facts (num_streamers() / get_streaming_rank(): a "
                 "DistributedSampler seeded with the job-wide train_input.shuffle_seed, or every "
                 "num_streamers()-th file of a sorted list), read every file on every worker, or make "
                 "a shard plan (cs_input_analyzer shard-plan) and launch with csrun_wse --shard-plan")

_WATCH: dict[str, Any] = {"on": False, "files": None}
_SKIP_SUFFIXES = (".py", ".pyc", ".so", ".pth", ".pyi")


def _hook(event: str, args: tuple) -> None:
    if event != "open" or not _WATCH["on"] or not args or not isinstance(args[0], (str, bytes, os.PathLike)):
        return
    mode = args[1] if len(args) > 1 else None
    flags = args[2] if len(args) > 2 and isinstance(args[2], int) else 0
    if (isinstance(mode, str) and any(c in mode for c in "wax+")) or flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
        return  # written, not read: logs, caches, a tap
    _WATCH["on"] = False  # os.stat below must not recurse into the hook's own work
    try:
        path = os.path.realpath(os.fsdecode(args[0]))
        if not path.endswith(_SKIP_SUFFIXES) and not any(path.startswith(p + os.sep) for p in _prefixes()):
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


def files_read(train_data_fn: Callable[..., Any], params: Mapping[str, Any], rank: int, num_streamers: int,
               max_seconds: float = 60.0) -> tuple[list[str], bool]:
    """The real paths of the files streamer ``rank`` of ``num_streamers``'s DataLoader opens
    while it is built and iterated for one pass (at most ``max_seconds``), and whether the
    pass was complete. Raises what the data function raises
    (:class:`.contract.ContractError`)."""
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
        t_end = time.monotonic() + max_seconds
        n = len(loader) if hasattr(loader, "__len__") else None
        it = epochs(loader)
        done = 0
        while n is None or done < n:
            next(it)
            done += 1
            if time.monotonic() > t_end:
                break
        complete = n is not None and done >= n
    finally:
        _WATCH["on"] = False
    return sorted(_WATCH["files"]), complete


def check_dataloader_files(train_data_fn: Callable[..., Any], params: Mapping[str, Any],
                           max_seconds: float = 60.0) -> Coverage:
    """Streamers 0 and 1 of 2 against one unsharded streamer (see the module docstring).
    Returns a :class:`csrun_runtime.coverage.Coverage`; raises what the data function raises."""
    got = {k: files_read(train_data_fn, params, k, 2, max_seconds) for k in (0, 1)}
    whole, whole_complete = files_read(train_data_fn, params, 0, 1, max_seconds)
    files = {k: v[0] for k, v in got.items()}
    if not whole and not any(files.values()):
        return Coverage(verdict="unknown", num_workers=2,
                        note="no data file was opened while the DataLoader was built and iterated "
                             "(data made in memory?); not checked")
    cov = coverage_of_files(files, whole, fix=FIX_STREAMERS)
    partial = [k for k, v in got.items() if not v[1]] + ([] if whole_complete else ["unsharded"])
    cov.note = ("files opened while the DataLoader was built and iterated for one pass"
                + (f" (cut after {max_seconds:g} s for {', '.join(map(str, partial))}: the files read so far)"
                   if partial else ""))
    return cov


def validate_lines(train_data_fn: Callable[..., Any], params: Mapping[str, Any], strict: bool,
                   max_seconds: float) -> list[str]:
    """validate_only's rule 7: the check's verdict line and one ``warning:`` line per problem.
    Raises :class:`.contract.ContractError` naming the problems when ``strict``
    (``runconfig.strict`` / ``--strict``)."""
    from .contract import ContractError

    cov = check_dataloader_files(train_data_fn, params, max_seconds)
    if cov.problems and strict:
        raise ContractError("train_input: " + "; ".join(cov.problems))
    return ([f"input workers' files (the DataLoader built as streamers 0 and 1 of 2): {cov.verdict}"
             + (f" ({cov.note})" if cov.note else "")] + [f"warning: train_input: {p}" for p in cov.problems])


#: Rule 7's check of this backend (:class:`csrun_runtime.backend.CoverageModule`).
check_files = check_dataloader_files
__all__ += ["check_files"]
