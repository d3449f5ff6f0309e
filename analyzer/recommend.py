"""Extend the per-node model to csrun_wse layouts and choose one (pure).

A layout is ``N`` nodes × ``T`` tasks per node × ``C`` CPUs per task with ``S`` single-task
nodes and ``L`` CPUs of the chief's task given to its own input worker
(the chief's input CPUs), shaped as :func:`launcher.layout.plan_layout` shapes it
(docs/CONTRACT.md):

* ``S = 0``: node 1 runs the chief and ``T - 1`` input workers, nodes 2..N run ``T`` input
  workers each; ``N = T = 1`` (``L = 0``) runs the input pipeline inside the chief.
* ``S > 0``: node 1 runs the chief alone, nodes 2..S one input worker owning the node,
  nodes S+1..N ``T`` input workers each.
* ``L > 0``: the chief's task (``C`` CPUs when ``S = 0``, the whole node's ``n`` when
  ``S > 0``: its *task CPUs* ``C_c``) also runs input worker 0 (:mod:`csrun_runtime.chief_input`),
  one more worker on node 1: with ``N = T = 1`` the job is the chief and that one worker.

A layout's rate: :mod:`analyzer.cpu_domains` (the CPU domains, the chief's input worker,
several trainer ranks).

The choice: every candidate ``(N, T, C)`` with ``S = 0`` and ``T × C ≤ n``, each with
``L = 0`` and the chief-input variants :func:`chief_input_choices` gives (``C - 1`` pinned,
training keeping one CPU; ``C = 1`` shared; and ``C - m`` where the chief's stream needs
``m ≥ 2`` CPUs), a variant kept only where it raises the layout's rate by at least
:data:`MIN_CHIEF_INPUT_GAIN`. With a target, the layout whose interval's low end meets it
with the fewest nodes, then the fewest reserved cores (``N × T × C``: the chief's input
worker reserves none, it uses the chief's own CPUs), then the highest rate, then ``L = 0``
(if none meets it by its low end, by its point prediction; if none at all, the best layout
and the accelerator is input-starved); without a target, the fewest nodes and cores among
the layouts within ``tolerance`` (5 %) of the best rate for the available nodes. With several
trainer ranks the candidates are :func:`rank_layouts`' (``W`` a multiple of the world size, the
layout's own check), without the chief's input worker (not modelled with several ranks), and
the target is the world's.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from csrun_common.errors import CsrunError
from csrun_common.layout import RANK_FIELDS, LayoutSpec, flag

from .cpu_domains import chief_costs, in_process, predict_balanced
from .model import NodeModel

#: A chief-input variant of a layout is a candidate only when it raises the layout's
#: predicted rate by at least this fraction (1 %): no extra process for no gain.
MIN_CHIEF_INPUT_GAIN = 0.01


def predict_layout(model: NodeModel, spec: LayoutSpec, ingest: dict | None = None,
                   topology: dict | None = None) -> dict[str, Any]:
    """Predicted delivered samples/s of the csrun_wse layout ``spec`` (the rules:
    :mod:`analyzer.cpu_domains`; ``cpus_per_task`` ``None``, Slurm's choice, predicted as 1).

    ``ingest``: :func:`analyzer.model.ingest_limits`' dict, or ``None`` (the workers' rates
    summed). ``topology``: :func:`analyzer.slurm_facts.topology`'s dict, or ``None``
    (independent nodes). Returns ``spec.record()`` plus ``"input_workers"`` (the chief's own
    counted), ``"predicted_samples_per_sec"``, ``"interval": [lo, hi]``, ``"workers_rate"``
    (probed, before any limit), ``"limited_by"`` (``"input workers"``, ``"node CPUs (pipeline
    and serving)"``, ``"chief ingest"``, ``"shared host CPUs"``, ``"in-process pipeline"``,
    ``"slowest rank"``), ``"per_node"`` (samples/s of each node's workers, the chief's own input
    worker in node 1's) and ``"chief_input_samples_per_sec"``; with several trainer ranks also
    ``"world_size"``, ``"input_workers_per_rank"`` and ``"per_rank_samples_per_sec"``.
    Raises ``ValueError`` for a layout :meth:`~csrun_common.layout.LayoutSpec.check` or
    :meth:`~csrun_common.layout.LayoutSpec.check_chief_input` refuses, or a chief's input
    worker with several trainer ranks (not modelled).
    """
    spec = spec.with_(cpus_per_task=1) if spec.cpus_per_task is None else spec
    c_task = _check_layout(model, spec)
    if spec.world_size == 1 and (spec.nodes, spec.tasks_per_node, spec.single_task_nodes,
                                 spec.chief_input_cpus) == (1, 1, 0, 0):
        return in_process(model, spec.record(), int(spec.cpus_per_task or 1))
    return predict_balanced(model, spec, spec.chief_input_cpus, c_task, ingest or {}, topology)


def _check_layout(model: NodeModel, spec: LayoutSpec) -> int:
    """The chief task's CPUs (:meth:`csrun_common.layout.LayoutSpec.chief_task_cpus`) of a
    valid layout (:meth:`~csrun_common.layout.LayoutSpec.check` and
    :meth:`~csrun_common.layout.LayoutSpec.check_chief_input`, the layout's rules); raises
    ``ValueError`` with their message, as :func:`predict_layout` says."""
    try:
        spec.check().check_chief_input(model.node_cpus)
    except CsrunError as exc:
        raise ValueError(str(exc)) from None
    if spec.world_size > 1 and spec.chief_input_cpus:
        raise ValueError(f"{flag('chief_input_cpus')} {spec.chief_input_cpus}: not predicted with several "
                         f"trainer ranks")
    return int(spec.chief_task_cpus(model.node_cpus) or 0)


def candidate_layouts(node_cpus: int, available_nodes: int) -> list[tuple[int, int, int]]:
    """All ``(N, T, C)`` with ``1 ≤ N ≤ available_nodes`` whose tasks fit a node of ``node_cpus``
    (``T × C ≤ node_cpus``: :meth:`csrun_common.layout.LayoutSpec.check_node`'s rule), in
    ``N``, ``C``, ``T`` order."""
    out = []
    for N in range(1, available_nodes + 1):
        for C in range(1, node_cpus + 1):
            for T in range(1, node_cpus // C + 1):  # every T with T × C within the node
                out.append((N, T, C))
    return out


def chief_input_choices(model: NodeModel, spec: LayoutSpec, ingest: dict | None = None,
                        topology: dict | None = None, without: dict[str, Any] | None = None) -> list[int]:
    """The chief's input CPUs :func:`recommend` tries for an ``S = 0`` layout ``spec`` besides 0
    (CPUs of the chief's ``C``-CPU task):

    * ``C - 1`` when ``C ≥ 2``: the worker pinned apart, training keeping one CPU;
    * ``1`` when ``C = 1``: the worker sharing the chief's one CPU at nice 10;
    * ``C - m`` when the chief's stream needs ``m ≥ 2`` of its CPUs (``m = ⌈k_c × rate⌉``,
      ``rate`` the layout's prediction without a chief input worker, ``without``, plus that
      worker's probed rate at ``C - 1`` CPUs) and ``C - m ≥ 1``: pinned, the chief keeping
      what its stream needs.
    """
    C, T = int(spec.cpus_per_task or 1), spec.tasks_per_node
    if C == 1:
        return [1]
    out = [C - 1]
    k_c, _h = chief_costs(ingest or {})
    if k_c > 0:
        if without is None:
            without = predict_layout(model, spec.with_(chief_input_cpus=0), ingest, topology)
        rate = without["predicted_samples_per_sec"] + model.node_rate(T, C - 1) / T
        m = math.ceil(k_c * rate - 1e-9)
        if m >= 2 and C - m >= 1:
            out.append(C - m)
    return out


def rank_layouts(node_cpus: int, available_nodes: int, chief_nodes: int,
                 chief_tasks_per_node: int) -> list[LayoutSpec]:
    """The layouts of :func:`candidate_layouts` for a world of ``chief_nodes`` ×
    ``chief_tasks_per_node`` trainer ranks: more nodes than the chief's (they run ranks only),
    no chief's input worker, and only those :meth:`csrun_common.layout.LayoutSpec.check_node`
    takes on nodes of ``node_cpus`` CPUs (the input workers ``(N - chief_nodes) × T`` a
    multiple of the world size), in :func:`candidate_layouts`' order. ``[]`` when none is."""
    out = []
    for N, T, C in candidate_layouts(node_cpus, available_nodes):
        spec = LayoutSpec(N, T, C, chief_nodes=chief_nodes, chief_tasks_per_node=chief_tasks_per_node)
        try:
            out.append(spec.check_node(node_cpus))
        except CsrunError:
            continue
    return out


def recommend(model: NodeModel, available_nodes: int, target: float | None = None,
              ingest: dict | None = None, topology: dict | None = None,
              tolerance: float = 0.05, *, chief_nodes: int = 1, chief_tasks_per_node: int = 1) -> dict[str, Any]:
    """Choose the layout (rules: the module docstring), the chief's input CPUs included.

    ``target``: samples/s the accelerator consumes, the world's with several trainer ranks
    (``None``: best for the available nodes). Returns the chosen :func:`predict_layout` dict
    plus ``"target"``, ``"meets_target"``, ``"input_starved"`` (``True``, ``"at risk"`` when
    only the interval's low end misses it, ``False``; both ``None`` without a target),
    ``"reason"`` (a sentence), ``"best_available_samples_per_sec"`` and ``"alternatives"`` (the
    next five). Raises ``ValueError`` when ``available_nodes < 1`` or no layout fits the world
    of trainer ranks (the message names the flags)."""
    if available_nodes < 1:
        raise ValueError(f"available nodes {available_nodes}: must be at least 1")
    if chief_nodes * chief_tasks_per_node > 1:
        preds = _rank_candidates(model, available_nodes, ingest, topology, chief_nodes, chief_tasks_per_node)
    else:
        preds = _candidates(model, available_nodes, ingest, topology)
    if target:
        choice = _choose_for_target(preds, target, available_nodes, tolerance)
    else:
        choice = _choose_best(preds, available_nodes, tolerance)
    return _recommendation(choice, preds, target)


def _candidates(model: NodeModel, available_nodes: int, ingest: dict | None,
                topology: dict | None) -> list[dict[str, Any]]:
    """:func:`predict_layout` of every :func:`candidate_layouts` layout without the chief's
    input worker, and of each :func:`chief_input_choices` variant that raises its rate by at
    least :data:`MIN_CHIEF_INPUT_GAIN`."""
    preds = []
    for N, T, C in candidate_layouts(model.node_cpus, available_nodes):
        spec = LayoutSpec(N, T, C)
        p0 = predict_layout(model, spec, ingest, topology)
        preds.append(p0)
        for L in chief_input_choices(model, spec, ingest, topology, p0):
            p = predict_layout(model, spec.with_(chief_input_cpus=L), ingest, topology)
            if p["predicted_samples_per_sec"] >= (1 + MIN_CHIEF_INPUT_GAIN) * p0["predicted_samples_per_sec"]:
                preds.append(p)
    return preds


def _rank_candidates(model: NodeModel, available_nodes: int, ingest: dict | None, topology: dict | None,
                     chief_nodes: int, chief_tasks_per_node: int) -> list[dict[str, Any]]:
    """:func:`predict_layout` of every :func:`rank_layouts` layout; raises ``ValueError``
    naming the flags when there is none."""
    specs = rank_layouts(model.node_cpus, available_nodes, chief_nodes, chief_tasks_per_node)
    if not specs:
        raise ValueError(no_rank_layout(chief_nodes, chief_tasks_per_node, available_nodes, model.node_cpus))
    return [predict_layout(model, s, ingest, topology) for s in specs]


def no_rank_layout(chief_nodes: int, chief_tasks_per_node: int, available_nodes: int, node_cpus: int | None) -> str:
    """The one line saying that no layout fits a world of ``chief_nodes`` ×
    ``chief_tasks_per_node`` trainer ranks on ``available_nodes`` nodes (of ``node_cpus``
    CPUs, when known)."""
    world = chief_nodes * chief_tasks_per_node
    cpus = f" of {node_cpus} CPUs" if node_cpus else ""
    return (f"{flag('chief_nodes')} {chief_nodes} {flag('chief_tasks_per_node')} {chief_tasks_per_node}: no layout "
            f"of at most {available_nodes} node(s){cpus} has input workers on nodes apart from the chief's "
            f"in a multiple of the world size {world} (give more --available-nodes)")


def _cores(p: dict[str, Any]) -> int:
    """Reserved cores of a prediction's layout: ``N × T × C``."""
    return int(p["nodes"] * p["tasks_per_node"] * p["cpus_per_task"])


def _by_size(p: dict[str, Any]) -> tuple:
    """The choice's order: fewest nodes, fewest cores, highest rate, no chief input worker."""
    return p["nodes"], _cores(p), -p["predicted_samples_per_sec"], p["chief_input_cpus"] > 0


def _by_rate(p: dict[str, Any]) -> tuple:
    """The alternatives' order without a sure choice: highest rate first, then by size."""
    return -p["predicted_samples_per_sec"], p["nodes"], _cores(p), p["chief_input_cpus"] > 0


@dataclass
class _Choice:
    """A chosen prediction, the ranking its alternatives come from, why, and against the
    target: ``meets`` and ``starved`` (``None`` without one)."""

    chosen: dict[str, Any]
    ranked: list[dict[str, Any]]
    reason: str
    meets: bool | None = None
    starved: Any = None


def _choose_for_target(preds: list[dict[str, Any]], target: float, available_nodes: int,
                       tolerance: float) -> _Choice:
    """The smallest layout whose interval's low end meets ``target``, else whose prediction
    does, else the smallest within ``tolerance`` of the best rate (input-starved)."""
    best_rate = max(p["predicted_samples_per_sec"] for p in preds)
    sure = sorted((p for p in preds if p["interval"][0] >= target), key=_by_size)
    point = sorted((p for p in preds if p["predicted_samples_per_sec"] >= target), key=_by_size)
    if sure:
        choice = _Choice(sure[0], sure, f"fewest nodes, then fewest cores, whose interval's low end meets the "
                                        f"target {target:.0f} samples/s")
    elif point:
        choice = _Choice(point[0], point, f"fewest nodes, then fewest cores, whose prediction meets the target "
                                          f"{target:.0f} samples/s (its interval's low end does not)")
    else:
        near = sorted((p for p in preds if p["predicted_samples_per_sec"] >= (1 - tolerance) * best_rate),
                      key=_by_size)
        choice = _Choice(near[0], sorted(preds, key=_by_rate),
                         f"no layout on {available_nodes} node(s) reaches the target {target:.0f} samples/s; "
                         f"the fewest nodes and cores within {tolerance:.0%} of the best rate")
    lo, pred = choice.chosen["interval"][0], choice.chosen["predicted_samples_per_sec"]
    choice.starved = True if pred < target else ("at risk" if lo < target else False)
    choice.meets = pred >= target
    return choice


def _choose_best(preds: list[dict[str, Any]], available_nodes: int, tolerance: float) -> _Choice:
    """Without a target: the smallest layout within ``tolerance`` of the best rate; the
    alternatives by rate."""
    best_rate = max(p["predicted_samples_per_sec"] for p in preds)
    near = sorted((p for p in preds if p["predicted_samples_per_sec"] >= (1 - tolerance) * best_rate),
                  key=_by_size)
    return _Choice(near[0], sorted(preds, key=_by_rate),
                   f"no target given: the fewest nodes, then fewest cores, within {tolerance:.0%} "
                   f"of the best predicted rate on {available_nodes} available node(s)")


def _recommendation(choice: _Choice, preds: list[dict[str, Any]], target: float | None) -> dict[str, Any]:
    """:func:`recommend`'s result: the chosen prediction, the target's verdicts, the reason,
    the best rate and the next five alternatives."""
    alts = [p for p in choice.ranked if p is not choice.chosen][:5]
    keys = ("nodes", "tasks_per_node", "cpus_per_task", "chief_input_cpus", "predicted_samples_per_sec", "interval",
            "input_workers", *RANK_FIELDS, "world_size", "input_workers_per_rank")
    return {**choice.chosen, "target": target, "meets_target": choice.meets, "input_starved": choice.starved,
            "reason": choice.reason,
            "best_available_samples_per_sec": max(p["predicted_samples_per_sec"] for p in preds),
            "alternatives": [{k: a[k] for k in keys if k in a} for a in alts]}
