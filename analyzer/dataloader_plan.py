"""The PyTorch probe grid's third axis: the DataLoader's ``num_workers`` (docs/INPUT-ANALYZER.md
"PyTorch").

A PyTorch pipeline probe row carries ``dataloader_workers`` (the DataLoader's worker processes,
``train_input.num_workers``, inside the task's ``C`` CPUs). For each CPUs-per-task ``C`` the
planner sweeps :func:`candidates` ``(C)`` = 0, 1, 2, 4, .. up to ``2C`` at the layout where ``C``
was first probed, in that order, stopping early once the two largest counts measured both ran below
:data:`STOP_BELOW` of the best so far (so up to ``C = 2`` every count is measured: one
noisy point does not end a sweep); a point whose DataLoader cannot be built (``status``
``invalid``: e.g. a processor that passes ``prefetch_factor`` at ``num_workers: 0``, which
torch 2 rejects) is skipped. :func:`best_workers` is the fewest workers within
:data:`TIE` of the best per-task rate at that ``C``; :func:`at_best` keeps, at each ``C``,
only the rows at that count, so the TensorFlow planner (:func:`analyzer.probe_plan.next_probe`)
and the model (:mod:`analyzer.model`) see the per-task rate at ``C`` CPUs = the best measured
over ``num_workers``. ``prefetch_factor`` is not swept (the params' value is used).

Pure functions of probe-table rows (dicts); no numpy, no torch.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

__all__ = ["candidates", "best_workers", "at_best", "next_point", "workers_for", "has_dataloader_workers",
           "STOP_BELOW", "TIE", "INVALID"]

#: A sweep stops once its two largest counts both run below this share of the best so far.
STOP_BELOW = 0.9
#: The fewest workers within this share of the best rate is the best (fewer processes, less memory).
TIE = 0.05
#: Probe status of a point whose DataLoader could not be built.
INVALID = "invalid"


def candidates(cpus: int) -> list[int]:
    """DataLoader ``num_workers`` to sweep at ``cpus`` CPUs per task: 0, 1, then powers of
    two up to ``2 × cpus``, and ``cpus`` and ``2 × cpus`` themselves (``[0, 1, 2]`` at 1 CPU):
    more processes than CPUs pay off when each one also waits (a read's latency)."""
    top = 2 * max(1, int(cpus))
    out = [0, 1] + [2 ** i for i in range(1, 20) if 2 ** i < top] + [max(1, int(cpus)), top]
    return sorted(dict.fromkeys(out))


def has_dataloader_workers(r: dict[str, Any]) -> bool:
    """A pipeline probe row of a DataLoader sweep (PyTorch: it has a ``dataloader_workers`` value)."""
    v = r.get("dataloader_workers")
    return r.get("kind", "pipeline") == "pipeline" and v is not None and not _nan(v)


def _nan(x: Any) -> bool:
    try:
        return math.isnan(float(x))
    except (TypeError, ValueError):
        return True


def _rates(rows: list[dict[str, Any]], cpus: int) -> dict[int, float]:
    """Mean per-task rate (samples/s per task) by ``num_workers`` of the ok PyTorch pipeline
    rows at ``cpus`` CPUs per task, at the tasks count of the first such row (the sweep's)."""
    at_c = [r for r in rows if has_dataloader_workers(r) and int(r["cpus_per_task"]) == cpus]
    if not at_c:
        return {}
    t_sweep = int(at_c[0]["tasks"])
    by: dict[int, list[float]] = {}
    for r in at_c:
        if r.get("status") == "ok" and int(r["tasks"]) == t_sweep and not _nan(r.get("samples_per_sec")):
            by.setdefault(int(r["dataloader_workers"]), []).append(float(r["samples_per_sec"]) / t_sweep)
    return {k: sum(v) / len(v) for k, v in by.items()}


def best_workers(rows: list[dict[str, Any]]) -> dict[int, int]:
    """``{C: num_workers}``: at each CPUs per task with an ok PyTorch probe, the fewest
    DataLoader workers whose per-task rate is within :data:`TIE` of the best."""
    out = {}
    for c in sorted({int(r["cpus_per_task"]) for r in rows if has_dataloader_workers(r)}):
        rates = _rates(rows, c)
        if rates:
            top = max(rates.values())
            out[c] = min(k for k, v in rates.items() if v >= (1 - TIE) * top)
    return out


def at_best(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` with each PyTorch pipeline row at a ``C`` that has a best count
    (:func:`best_workers`) kept only when it has that count, and ``invalid`` rows dropped;
    other rows (TensorFlow, other kinds, a ``C`` whose every point failed) unchanged."""
    best = best_workers(rows)
    out = []
    for r in rows:
        if has_dataloader_workers(r):
            if r.get("status") == INVALID:
                continue
            c = int(r["cpus_per_task"])
            if c in best and int(r["dataloader_workers"]) != best[c]:
                continue
        out.append(r)
    return out


def _sweep_next(rows: list[dict[str, Any]], cpus: int) -> tuple[int, int] | None:
    """``(tasks, num_workers)`` of the next point of the sweep at ``cpus`` (None: done)."""
    at_c = [r for r in rows if has_dataloader_workers(r) and int(r["cpus_per_task"]) == cpus]
    if not at_c:
        return None
    t_sweep = int(at_c[0]["tasks"])
    tried = {int(r["dataloader_workers"]) for r in at_c if int(r["tasks"]) == t_sweep}
    rates = _rates(rows, cpus)
    if rates:
        best = max(rates.values())
        more = sorted(k for k in rates if k > 0)[-2:]  # the two largest counts measured so far
        if len(more) == 2 and all(rates[k] < STOP_BELOW * best for k in more):
            return None  # more workers made it slower twice in a row: stop
    for k in candidates(cpus):
        if k not in tried:
            return t_sweep, k
    return None


def next_point(rows: list[dict[str, Any]], n: int, max_tasks: int,
               plan: Callable[..., tuple[str, int, int] | None],
               predict: Callable[[int, int], float] | None = None,
               served: bool = False) -> tuple[str, int, int, int] | None:
    """The next PyTorch probe ``(kind, T, C, num_workers)`` or None (probing is done).

    An unfinished sweep comes first (:func:`_sweep_next`, CPUs per task in the order first
    probed); then ``plan(at_best(rows), n, max_tasks, False, predict, want_served=served)``
    (the TensorFlow planner without its tf.data service ingest probe; with ``served``, its
    ``served`` probes: the chief's ingest over the data plane) chooses the layout or the served
    probe, probed at the best count of its ``C``, or at the first count of a new sweep there.
    With ``served`` the first ``served`` probe (2 tasks × 1 CPU: the chief and one input worker)
    comes as soon as the sweeps are done and one at 1 CPU per task was (its best count), before
    the planner's other layouts: the chief's ingest caps every layout."""
    for c in dict.fromkeys(int(r["cpus_per_task"]) for r in rows if has_dataloader_workers(r)):
        nxt = _sweep_next(rows, c)
        if nxt is not None:
            return "pipeline", nxt[0], c, nxt[1]
    best = best_workers(rows)
    if served and max_tasks >= 2 and 1 in best and not any(r.get("kind") == "served" for r in rows):
        return "served", 2, 1, best[1]  # the chief's ingest as soon as the count at 1 CPU is known
    got = plan(at_best(rows), n, max_tasks, False, predict, want_served=served)
    if got is None:
        return None
    kind, t, c = got
    return kind, t, c, best.get(c, candidates(c)[0])


def workers_for(rows: list[dict[str, Any]], cpus: int) -> dict[str, Any]:
    """The DataLoader ``num_workers`` to recommend at ``cpus`` CPUs per task: ``{"num_workers",
    "measured_at_cpus", "how"}``; the best count at ``cpus`` when swept there (``how``
    ``"measured"``), else that of the nearest swept ``C`` scaled by ``cpus / C`` (rounded,
    within ``[1, 2 × cpus]``; 0 stays 0; ``how`` ``"scaled"``). ``{}`` without a PyTorch probe."""
    best = best_workers(rows)
    if not best:
        return {}
    if cpus in best:
        return {"num_workers": best[cpus], "measured_at_cpus": cpus, "how": "measured"}
    near = min(best, key=lambda c: (abs(math.log(c / cpus)), c))
    k = best[near]
    scaled = 0 if k == 0 else min(2 * cpus, max(1, round(k * cpus / near)))
    return {"num_workers": scaled, "measured_at_cpus": near, "how": "scaled"}
