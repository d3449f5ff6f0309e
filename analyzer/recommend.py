"""Extend the per-node model to csrun_wse layouts and choose one (pure).

A layout is ``N`` nodes × ``T`` tasks per node × ``C`` CPUs per task with ``S`` single-task
nodes, shaped as :func:`launcher.layout.plan_layout` shapes it (docs/CONTRACT.md):

* ``S = 0``: node 1 runs the chief and ``T - 1`` input workers, nodes 2..N run ``T`` input
  workers each; ``N = T = 1`` runs the input pipeline inside the chief.
* ``S > 0``: node 1 runs the chief alone, nodes 2..S one input worker owning the node,
  nodes S+1..N ``T`` input workers each.

The delivered rate (samples/s) is the sum of the input workers' rates — a node with ``T``
tasks of which ``w`` are workers delivers ``w / T`` of the probed node rate — limited by
CPU *domains*: each node is one domain of ``T × C`` cores (its tasks' CPUs; ``n`` for a
single-task node), or, where nodes share a physical host beyond its cores (the unpinned
Slurm test cluster: several ``slurmd`` on one machine), that host is one domain of its
cores. A domain's demand is, per delivered sample, the pipeline's CPU-seconds ``k`` at that
layout plus what serving an element costs an input worker (``h``, the served probe) for
its workers, and the chief's CPU-seconds per sample (``k_c``) where the chief runs; a
domain over its cores scales its workers down until it fits (a chief-only domain caps the
job at ``cores / k_c``). The chief's measured ingest rate caps the job too, unless that
probe was CPU-bound (then the chief's own CPU budget is the limit, as just said).

The choice: with a target, the layout whose interval's low end meets it with the fewest
nodes, then the fewest reserved cores (``N × T × C``), then the highest rate (if none
meets it by its low end, by its point prediction; if none at all, the best layout and the
accelerator is input-starved); without a target, the fewest nodes and cores among the
layouts within ``tolerance`` (5 %) of the best rate for the available nodes.
"""
from __future__ import annotations

import math
from typing import Any

from .model import NodeModel

#: ``z`` of the interval: ``prediction × (1 ± Z × relative spread)``.
Z = 2.0


def _nodes(model: NodeModel, N: int, T: int, C: int, S: int) -> list[dict[str, Any]]:
    """Per-node plan: ``{"workers", "tasks", "cpus", "chief", "rate", "k"}`` (rate = samples/s
    delivered by the node's input workers)."""
    n = model.node_cpus

    def node(tasks: int, cpus: int, workers: int, chief: bool) -> dict[str, Any]:
        rate = model.node_rate(tasks, cpus) * (workers / tasks) if workers else 0.0
        full = model.node_rate(tasks, cpus)
        k = model.cores_used(tasks, cpus) / full if full > 0 else model.k
        return {"tasks": tasks, "cpus": cpus, "workers": workers, "chief": chief,
                "rate": rate, "k": k, "rel": model.node_rel_spread(tasks, cpus)}

    out = []
    if S == 0:
        out.append(node(T, C, T - 1, True))
        out += [node(T, C, T, False) for _ in range(N - 1)]
    else:
        out.append(node(1, n, 0, True))
        out += [node(1, n, 1, False) for _ in range(S - 1)]
        out += [node(T, C, T, False) for _ in range(N - S)]
    return out


def predict_layout(model: NodeModel, nodes: int, tasks_per_node: int, cpus_per_task: int,
                   single_task_nodes: int = 0, ingest: dict | None = None,
                   topology: dict | None = None) -> dict[str, Any]:
    """Predicted delivered samples/s of one csrun_wse layout (rules in the module docstring).

    ``ingest``: :func:`analyzer.model.ingest_limits` output or ``None`` (no service costs
    known: the workers' rates are summed). ``topology``: ``{"node_hosts": [host of node 1
    (the chief's), host of worker node 2, ...], "host_cores": {host: cores}}`` for hosts
    whose nodes share cores, or ``None`` for independent nodes.

    Returns ``{"nodes", "tasks_per_node", "cpus_per_task", "single_task_nodes",
    "input_workers", "predicted_samples_per_sec", "interval": [lo, hi], "workers_rate"
    (the workers' probed rates summed, before any limit), "limited_by": "input workers" |
    "node CPUs (pipeline and serving)" | "chief ingest" | "shared host CPUs" | "in-process
    pipeline",
    "per_node": [samples/s delivered by each node's workers]}``.
    Raises ``ValueError`` for N < 1, T < 1, C < 1 or S outside [0, N).
    """
    N, T, C, S = int(nodes), int(tasks_per_node), int(cpus_per_task), int(single_task_nodes)
    if N < 1 or T < 1 or C < 1 or not (0 <= S < max(N, 1)) or (S and S >= N):
        raise ValueError(f"bad layout N={N} T={T} C={C} S={S}")
    ingest = ingest or {}
    k_c = ingest.get("chief_cpu_seconds_per_sample")
    if k_c is None:
        k_c = ingest.get("cpu_seconds_per_sample") or 0.0  # the whole hop, charged to the chief
    h_w = ingest.get("worker_hop_cpu_seconds_per_sample") or 0.0
    measured_cap = ingest.get("samples_per_sec") or math.inf
    # A CPU-bound ingest probe measured its node's CPUs, which the chief's domain models.
    cap = math.inf if (ingest.get("cpu_bound") and k_c > 0) else measured_cap
    base = {"nodes": N, "tasks_per_node": T, "cpus_per_task": C, "single_task_nodes": S}

    if N == 1 and T == 1 and S == 0:
        rate = model.node_rate(1, C)
        rel = model.node_rel_spread(1, C)
        return {**base, "input_workers": 0, "predicted_samples_per_sec": rate,
                "interval": [rate * max(0.0, 1 - Z * rel), rate * (1 + Z * rel)],
                "workers_rate": rate, "limited_by": "in-process pipeline", "per_node": [rate]}

    plan = _nodes(model, N, T, C, S)
    workers = sum(p["workers"] for p in plan)
    raw = [p["rate"] for p in plan]
    domains = _domains(plan, model.node_cpus, topology)
    scale = [1.0] * len(plan)
    chief_cap = math.inf
    for _ in range(60):
        rates = [r * s for r, s in zip(raw, scale, strict=True)]
        delivered = min(sum(rates), cap, chief_cap)
        changed = False
        for cores, idx in domains:
            demand = sum(rates[i] * (plan[i]["k"] + h_w) for i in idx)
            if 0 in idx and k_c > 0:
                demand += delivered * k_c
            if demand <= cores * (1 + 1e-6):
                continue
            if any(rates[i] > 0 for i in idx):
                f = cores / demand
                for i in idx:
                    scale[i] *= f
            else:  # the chief alone: its CPUs cap what it can take
                chief_cap = min(chief_cap, cores / k_c)
            changed = True
        if not changed:
            break
    rates = [r * s for r, s in zip(raw, scale, strict=True)]
    wrate = sum(rates)
    pred = min(wrate, cap, chief_cap)
    if min(cap, chief_cap) < wrate * (1 - 1e-6):
        limited = "chief ingest"
    elif any(s < 0.999 for s in scale):
        limited = "shared host CPUs" if topology else "node CPUs (pipeline and serving)"
    else:
        limited = "input workers"
    # Relative spread of a sum of independent nodes: rate-weighted RMS (kept conservative:
    # no 1/sqrt(N) shrink).
    rel = math.sqrt(sum((r * p["rel"]) ** 2 for r, p in zip(rates, plan, strict=True)) /
                    max(sum(r * r for r in rates), 1e-12)) if wrate > 0 else model.rel_spread
    rel = max(rel, model.rel_spread)
    return {**base, "input_workers": workers, "predicted_samples_per_sec": pred,
            "interval": [pred * max(0.0, 1 - Z * rel), pred * (1 + Z * rel)],
            "workers_rate": sum(raw), "limited_by": limited, "per_node": rates}


def _domains(plan: list[dict[str, Any]], node_cpus: int,
             topology: dict | None) -> list[tuple[float, list[int]]]:
    """CPU domains ``[(cores, [plan indices])]``, the chief's (index 0) first: one per
    node (``tasks × cpus`` cores, ``node_cpus`` for a single-task node), or one per shared
    host from ``topology`` (its ``host_cores``)."""
    if topology:
        hosts = list(topology.get("node_hosts") or [])
        cores = topology.get("host_cores") or {}
        host_of = [hosts[i] if i < len(hosts) else f"__own_{i}" for i in range(len(plan))]
        groups: dict[str, list[int]] = {}
        for i, h in enumerate(host_of):
            groups.setdefault(h, []).append(i)
        out = []
        for h, idx in groups.items():
            c = cores.get(h)
            if c:
                out.append((float(c), idx))
            else:
                out += [(_node_cores(plan[i], node_cpus), [i]) for i in idx]
        return sorted(out, key=lambda d: 0 if 0 in d[1] else 1)
    return [(_node_cores(p, node_cpus), [i]) for i, p in enumerate(plan)]


def _node_cores(p: dict[str, Any], node_cpus: int) -> float:
    return float(min(p["tasks"] * p["cpus"], node_cpus))


def candidate_layouts(node_cpus: int, available_nodes: int) -> list[tuple[int, int, int]]:
    """All ``(N, T, C)`` with ``1 ≤ N ≤ available_nodes`` and ``T × C ≤ node_cpus``."""
    out = []
    for N in range(1, available_nodes + 1):
        for C in range(1, node_cpus + 1):
            for T in range(1, node_cpus // C + 1):
                out.append((N, T, C))
    return out


def recommend(model: NodeModel, available_nodes: int, target: float | None = None,
              ingest: dict | None = None, topology: dict | None = None,
              tolerance: float = 0.05) -> dict[str, Any]:
    """Choose the layout (rules in the module docstring).

    ``target``: samples/s the accelerator consumes (``None``: best for the available nodes).
    Returns the chosen :func:`predict_layout` dict plus ``"target"``, ``"meets_target"``
    (``None`` without a target), ``"input_starved"`` (``True`` when the prediction is
    below the target, ``"at risk"`` when only the interval's low end is, ``False``, or
    ``None`` without a target), ``"reason"`` (a sentence) and ``"alternatives"`` (the five
    next layouts by the same order).
    Raises ``ValueError`` when ``available_nodes < 1``.
    """
    if available_nodes < 1:
        raise ValueError(f"available nodes {available_nodes}: must be at least 1")
    preds = [predict_layout(model, N, T, C, 0, ingest, topology)
             for N, T, C in candidate_layouts(model.node_cpus, available_nodes)]

    def cores(p: dict) -> int:
        return p["nodes"] * p["tasks_per_node"] * p["cpus_per_task"]

    order = lambda p: (p["nodes"], cores(p), -p["predicted_samples_per_sec"])  # noqa: E731
    best_rate = max(p["predicted_samples_per_sec"] for p in preds)
    if target:
        sure = sorted((p for p in preds if p["interval"][0] >= target), key=order)
        point = sorted((p for p in preds if p["predicted_samples_per_sec"] >= target), key=order)
        if sure:
            chosen, ranked = sure[0], sure
            reason = (f"fewest nodes, then fewest cores, whose interval's low end meets the target "
                      f"{target:.0f} samples/s")
        elif point:
            chosen, ranked = point[0], point
            reason = (f"fewest nodes, then fewest cores, whose prediction meets the target "
                      f"{target:.0f} samples/s (its interval's low end does not)")
        else:
            ranked = sorted(preds, key=lambda p: (-p["predicted_samples_per_sec"], p["nodes"], cores(p)))
            near = sorted((p for p in preds if p["predicted_samples_per_sec"] >= (1 - tolerance) * best_rate),
                          key=order)
            chosen = near[0]
            reason = (f"no layout on {available_nodes} node(s) reaches the target {target:.0f} samples/s; "
                      f"the fewest nodes and cores within {tolerance:.0%} of the best rate")
        lo, pred = chosen["interval"][0], chosen["predicted_samples_per_sec"]
        starved: Any = True if pred < target else ("at risk" if lo < target else False)
        meets = pred >= target
    else:
        ranked = sorted((p for p in preds if p["predicted_samples_per_sec"] >= (1 - tolerance) * best_rate),
                        key=order)
        chosen = ranked[0]
        reason = (f"no target given: the fewest nodes, then fewest cores, within {tolerance:.0%} "
                  f"of the best predicted rate on {available_nodes} available node(s)")
        starved, meets = None, None
    if not target:
        ranked = sorted(preds, key=lambda p: (-p["predicted_samples_per_sec"], p["nodes"], cores(p)))
    alts = [p for p in ranked if p is not chosen][:5]
    return {**chosen, "target": target, "meets_target": meets, "input_starved": starved,
            "reason": reason, "best_available_samples_per_sec": best_rate,
            "alternatives": [{k: a[k] for k in ("nodes", "tasks_per_node", "cpus_per_task",
                                                 "predicted_samples_per_sec", "interval")}
                             for a in alts]}
