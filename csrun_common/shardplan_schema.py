"""The shard plan file: its schema, loader and checks (pure, standard library only).

A *shard plan* says which data files each input worker reads and with which shuffle
seed. ``cs_input_analyzer shard-plan`` writes it; ``csrun_wse --shard-plan PLAN`` exports
its absolute path as ``CSRUN_SHARD_PLAN`` and every input worker reads only its own
files with its own seed (``docs/CONTRACT.md``). The rule comes from the seeds'
performance guide ("Performance Optimization Practices", "Shard your input data": split the dataset into shorter,
distinct files and allocate them so that different workers read different slices) and
from the CerebrasEstimator limitations ("Limitations of the CerebrasEstimator", "Multiple input workers": every
worker must shuffle differently).

This module is imported by the launcher and by the task runtime, so it must stay free
of the analyzer, NumPy and TensorFlow.

Format (JSON object, ``version`` 1)::

    {
      "schema": "csrun.shard_plan",          # required, exactly this
      "version": 1,                          # required, exactly 1
      "num_workers": W,                      # required, int >= 1
      "mode": "shard" | "replicate",         # required
      "balance_by": "bytes" | "records",     # required
      "workers": [                           # required, exactly W entries, in index order
        {"index": i,                         # == position in the list
         "files": ["/abs/path", ...],        # non-empty list of non-empty strings
         "bytes": int >= 0,                  # total size of the files (bytes)
         "records": int >= 0 | null,         # total records (null when not counted)
         "seed": int in [0, 2**63)},         # shuffle seed, distinct across workers
        ...],
      # optional, informative:
      "base_seed": int, "records_exact": bool, "imbalance": float,
      "totals": {...}, "layout": {...} | null, "shuffle": {...} | null,
      "warnings": [{"code", "severity", "message", "fix"}, ...], "created_by": str
    }

In ``shard`` mode no file appears in two workers; in ``replicate`` mode (fewer files
than workers) every worker reads every file, and only the seeds differ.
"""
from __future__ import annotations

import json
import os
from typing import Any, TypeGuard

from .errors import CsrunError
from .layout import LayoutSpec, flag

SCHEMA = "csrun.shard_plan"
VERSION = 1
MODES = ("shard", "replicate")
BALANCE_BY = ("bytes", "records")
SEED_LIMIT = 2 ** 63  # seeds are non-negative int64 (tf.data / numpy accept them)

__all__ = [
    "SCHEMA", "VERSION", "MODES", "BALANCE_BY", "SEED_LIMIT",
    "input_worker_count", "validate_plan", "load_plan", "check_plan_workers",
    "worker_assignment",
]


def input_worker_count(nodes: int, tasks_per_node: int, single_task_nodes: int = 0,
                       chief_input: bool = False) -> int:
    """Input workers of a ``csrun_wse`` job of ``N`` nodes, ``T`` tasks per node and ``S``
    single-task nodes, plus one in the chief's task with ``chief_input`` (docs/CONTRACT.md), by
    :attr:`csrun_common.layout.LayoutSpec.num_input_workers`.

    Returns a count of tasks (0: the chief reads its input in-process, no plan). Raises
    ``ValueError`` naming the flag for a value that is not an integer, N < 1, T < 1, S < 0 or
    S >= N (when S > 0).
    """
    values = {"nodes": nodes, "tasks_per_node": tasks_per_node, "single_task_nodes": single_task_nodes}
    for name, value in values.items():
        if not _is_int(value):
            raise ValueError(f"{flag(name)} {value!r}: must be an integer")
    try:
        return LayoutSpec(nodes, tasks_per_node, None, single_task_nodes, 1 if chief_input else 0).check() \
            .num_input_workers
    except CsrunError as exc:
        raise ValueError(str(exc)) from None


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _fail(source: str, field: str, problem: str, value: Any) -> ValueError:
    text = repr(value)
    if len(text) > 80:
        text = text[:77] + "..."
    return ValueError(f"shard plan {source}: {field}: {problem}, got {text}")


def validate_plan(plan: Any, source: str = "<plan>") -> dict:
    """Check that ``plan`` (a decoded JSON value) is a well-formed shard plan; returns it (a dict).

    Raises ``ValueError``, one line ``shard plan SOURCE: FIELD: PROBLEM, got VALUE`` naming the
    first bad field (``workers[3].seed``). Cost: O(file entries) time and memory (``shard``
    mode's disjointness check keeps a set of the paths).
    """
    workers = _check_header(plan, source)
    seen_seeds: dict[int, int] = {}
    files_check = _FilesCheck(plan["mode"], source)
    for i, w in enumerate(workers):
        files = _check_worker(w, i, source, seen_seeds)
        files_check.add(i, files)
    return plan


def _check_header(plan: Any, source: str) -> list:
    """The plan's top-level fields; returns its ``workers`` list (``num_workers`` entries)."""
    if not isinstance(plan, dict):
        raise _fail(source, "top level", "expected a JSON object", type(plan).__name__)
    if plan.get("schema") != SCHEMA:
        raise _fail(source, "schema", f"expected {SCHEMA!r}", plan.get("schema"))
    if plan.get("version") != VERSION or not _is_int(plan.get("version")):
        raise _fail(source, "version", f"expected {VERSION}", plan.get("version"))
    num = plan.get("num_workers")
    if not _is_int(num) or num < 1:
        raise _fail(source, "num_workers", "expected an integer >= 1", num)
    if plan.get("mode") not in MODES:
        raise _fail(source, "mode", f"expected one of {', '.join(MODES)}", plan.get("mode"))
    if plan.get("balance_by") not in BALANCE_BY:
        raise _fail(source, "balance_by", f"expected one of {', '.join(BALANCE_BY)}",
                    plan.get("balance_by"))
    if "base_seed" in plan and not _is_int(plan["base_seed"]):
        raise _fail(source, "base_seed", "expected an integer", plan["base_seed"])
    workers = plan.get("workers")
    if not isinstance(workers, list):
        raise _fail(source, "workers", "expected a list", type(workers).__name__)
    if len(workers) != num:
        raise _fail(source, "workers", f"expected {num} entries (num_workers)", f"{len(workers)} entries")
    return workers


def _check_worker(w: Any, i: int, source: str, seen_seeds: dict[int, int]) -> list:
    """Worker ``i``'s entry: its index, files, sizes and a seed no earlier worker has
    (``seen_seeds``: seed -> worker, updated). Returns its files."""
    where = f"workers[{i}]"
    if not isinstance(w, dict):
        raise _fail(source, where, "expected an object", type(w).__name__)
    if w.get("index") != i or not _is_int(w.get("index")):
        raise _fail(source, f"{where}.index", f"expected {i} (its position)", w.get("index"))
    files = w.get("files")
    if not isinstance(files, list) or not files:
        raise _fail(source, f"{where}.files",
                    "expected a non-empty list of paths (every input worker needs a file)", files)
    for j, f in enumerate(files):
        if not isinstance(f, str) or not f:
            raise _fail(source, f"{where}.files[{j}]", "expected a non-empty path string", f)
    if not _is_int(w.get("bytes")) or w["bytes"] < 0:
        raise _fail(source, f"{where}.bytes", "expected an integer >= 0", w.get("bytes"))
    rec = w.get("records")
    if rec is not None and (not _is_int(rec) or rec < 0):
        raise _fail(source, f"{where}.records", "expected an integer >= 0 or null", rec)
    seed = w.get("seed")
    if not _is_int(seed) or not 0 <= seed < SEED_LIMIT:
        raise _fail(source, f"{where}.seed", "expected an integer in [0, 2**63)", seed)
    if seed in seen_seeds:
        raise _fail(source, f"{where}.seed",
                    f"same as workers[{seen_seeds[seed]}].seed (seeds must differ per worker)", seed)
    seen_seeds[seed] = i
    return files


class _FilesCheck:
    """The files across workers: in ``shard`` mode no file read twice, in ``replicate``
    mode every worker reading the same files."""

    def __init__(self, mode: str, source: str):
        self.mode, self.source = mode, source
        self.owner: dict[str, int] = {}
        self.replicated: set | None = None

    def add(self, i: int, files: list) -> None:
        """Worker ``i``'s ``files``; raises ``ValueError`` naming the first file that breaks the rule."""
        where = f"workers[{i}]"
        if self.mode == "shard":
            local: set = set()
            for j, f in enumerate(files):
                prev = self.owner.setdefault(f, i)
                if prev != i or f in local:
                    raise _fail(self.source, f"{where}.files[{j}]",
                                f"already assigned to workers[{prev}] (shard mode reads each file once)", f)
                local.add(f)
            return
        current = set(files)
        if len(current) != len(files):
            raise _fail(self.source, f"{where}.files", "lists a file twice", files)
        if self.replicated is None:
            self.replicated = current
        elif current != self.replicated:
            raise _fail(self.source, f"{where}.files",
                        "differs from workers[0].files (replicate mode: every worker reads all files)",
                        sorted(current ^ self.replicated)[:3])


def load_plan(path: os.PathLike[str] | str) -> dict:
    """Read and validate the shard plan JSON at ``path``.

    Returns the plan as a dict (see the module docstring for the fields). Raises
    ``ValueError`` with one line naming the path and the bad field/value, also for a
    missing or unreadable file and for invalid JSON.
    """
    source = os.fspath(path)
    try:
        with open(source, encoding="utf-8") as fh:
            data = json.load(fh)
    except FileNotFoundError:
        raise ValueError(f"shard plan {source}: no such file") from None
    except IsADirectoryError:
        raise ValueError(f"shard plan {source}: is a directory, expected a JSON file") from None
    except PermissionError:
        raise ValueError(f"shard plan {source}: permission denied") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"shard plan {source}: not valid JSON ({exc})") from None
    return validate_plan(data, source)


def check_plan_workers(plan: dict, num_input_workers: int, *, source: str | None = None) -> None:
    """Refuse a plan made for a different number of input workers.

    ``num_input_workers`` is the job's input-worker count (``CSRUN_NUM_WORKERS``; see
    :func:`input_worker_count`). Raises ``ValueError``: ``shard plan SOURCE is for X
    workers but the job has Y input workers; ...`` (both numbers, one line).
    """
    planned = plan.get("num_workers") if isinstance(plan, dict) else None
    if planned != num_input_workers:
        where = f" {source}" if source else ""
        raise ValueError(
            f"shard plan{where} is for {planned} workers but the job has {num_input_workers} input "
            f"workers; make a plan for {num_input_workers} (cs_input_analyzer shard-plan --workers "
            f"{num_input_workers} ...) or change the layout")


def worker_assignment(plan: dict, index: int) -> dict:
    """The entry of input worker ``index`` of a validated plan.

    Returns ``{"index", "files" (list of paths), "seed" (int), "bytes", "records"}``.
    Raises ``ValueError`` when ``index`` is outside ``[0, plan["num_workers"])``.
    """
    num = plan["num_workers"]
    if not _is_int(index) or not 0 <= index < num:
        raise ValueError(f"input worker index {index!r}: outside the shard plan's 0..{num - 1}")
    w = plan["workers"][index]
    return {"index": index, "files": list(w["files"]), "seed": w["seed"],
            "bytes": w["bytes"], "records": w.get("records")}
