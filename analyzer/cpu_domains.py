"""The rate a layout delivers, bounded by the CPU domains its processes share (pure): the
machinery of :func:`analyzer.recommend.predict_layout` (the layout's shapes:
:mod:`analyzer.recommend`).

The delivered rate (samples/s) is the sum of the input workers' rates — a node with ``T``
tasks of which ``w`` are workers delivers ``w / T`` of the probed node rate — limited by
CPU *domains*: each node is one domain of ``T × C`` cores (its tasks' CPUs; ``n`` for a
single-task node), or, where nodes share a physical host beyond its cores (the unpinned
Slurm test cluster: several ``slurmd`` on one machine), that host is one domain of its
cores. A domain's demand is, per delivered sample, the pipeline's CPU-seconds ``k`` at that
layout plus what serving an element costs an input worker (``h``, the served probe) for
its workers, and the chief's CPU-seconds per sample (``k_c``) where the chief runs; a
domain over its cores scales its workers down until it fits (a chief-only domain, or one
whose chief is saturated by the other nodes' stream alone, caps the job at ``cores / k_c``
and its own workers deliver nothing). The chief's measured ingest rate caps the job too,
unless that probe was CPU-bound (then the chief's own CPU budget is the limit, as just said).

The chief's input worker (``L > 0``) delivers the rate of one task of ``L`` CPUs on the
chief's node: ``node_rate(T, L) / T`` (``S = 0``: one of ``T`` tasks), ``node_rate(1, L)``
(``S > 0``: a task alone on its node), at ``k`` of that layout plus ``h`` per sample, in the
chief's domain beside ``k_c``: a chief node without spare CPUs gains little or nothing from
it. Inside the chief's task it is placed as :func:`csrun_runtime.chief_input.split_cpus`
places it: with ``L < C_c`` pinned apart, the worker on ``L`` CPUs (at most ``L / (k + h)``
samples/s) and the chief's stream on the other ``C_c - L`` (the job at most
``(C_c - L) / k_c``); with ``L = C_c`` sharing them at nice 10, the worker getting what the
chief leaves (``C_c - k_c × rate``). The split assumes Slurm binds tasks to their CPUs;
where it does not, the runtime shares instead and the prediction is conservative.
Source: Pecan (Graur et al., "Pecan: Cost-Efficient ML Data Preprocessing with Automatic
Transformation Ordering and Hybrid Placement", USENIX ATC'24), whose AutoPlacement policy
does this: "we dynamically schedule data preprocessing workers on ML accelerator host
resources to minimize the number of remote CPU workers needed to achieve peak data
ingestion bandwidth".

Several trainer ranks (chief nodes × ranks per chief node = the world size > 1,
docs/MULTI-RANK.md): the chief's nodes run ranks only (``node CPUs // ranks`` each, no input
worker), the input workers run on the job's other nodes, ``T`` each, and input
worker ``g`` feeds rank ``g % world``. Each chief node is a domain whose ranks ingest their share
of the stream (``ranks / world`` of it, at ``k_c`` each); the measured ingest rate caps each rank,
so the world at ``world`` times it. The ranks step together, so the world receives ``world`` ×
the slowest rank's rate (``"slowest rank"`` where that is the limit).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from csrun_common.layout import LayoutSpec

from .model import NodeModel

#: ``z`` of the interval: ``prediction × (1 ± Z × relative spread)``.
Z = 2.0


def _nodes(model: NodeModel, spec: LayoutSpec) -> list[dict[str, Any]]:
    """Per-node plan of layout ``spec``: ``{"workers", "tasks", "cpus", "chief", "rate", "k"}``
    (rate = samples/s delivered by the node's input workers); with several trainer ranks the
    chief's nodes come first, running ranks and no input worker."""

    def node(tasks: int, cpus: int, workers: int, chief: bool) -> dict[str, Any]:
        rate = model.node_rate(tasks, cpus) * (workers / tasks) if workers else 0.0
        return {"tasks": tasks, "cpus": cpus, "workers": workers, "chief": chief,
                "rate": rate, "k": _k(model, tasks, cpus), "rel": model.node_rel_spread(tasks, cpus)}

    shapes = spec.node_shapes(model.node_cpus)  # the layout's rule, written once
    return [node(sh.tasks, int(sh.cpus or spec.cpus_per_task or 1), sh.workers, sh.chief) for sh in shapes]


def _k(model: NodeModel, tasks: int, cpus: int) -> float:
    """CPU-seconds per sample of the pipeline at ``tasks × cpus`` (cores used / node rate)."""
    full = model.node_rate(tasks, cpus)
    return model.cores_used(tasks, cpus) / full if full > 0 else model.k


def _chief_input_entry(model: NodeModel, tasks: int, L: int) -> dict[str, Any]:
    """The chief's input worker on node 1 as a plan entry: one task of ``L`` CPUs among the
    node's ``tasks`` (``T`` with ``S = 0``; 1, alone on it, with ``S > 0``)."""
    return {"tasks": tasks, "cpus": L, "workers": 1, "chief": True,
            "rate": model.node_rate(tasks, L) / tasks, "k": _k(model, tasks, L),
            "rel": model.node_rel_spread(tasks, L)}


def chief_costs(ingest: dict) -> tuple[float, float]:
    """``(k_c, h)``: the chief's CPU-seconds per sample taking the stream and what serving
    adds to an input worker's (0 when unknown)."""
    k_c = ingest.get("chief_cpu_seconds_per_sample")
    if k_c is None:
        k_c = ingest.get("cpu_seconds_per_sample") or 0.0  # the whole hop, charged to the chief
    return float(k_c), float(ingest.get("worker_hop_cpu_seconds_per_sample") or 0.0)


def _fraction(load: float, flow: float, outside: float, limit: float, cores: float, k_c: float) -> float | None:
    """The largest ``f`` in [0, 1] with ``f·load + k_c·min(outside + f·flow, limit) ≤ cores``:
    the share a chief's domain (or task) leaves its workers, whose full rate is ``flow``
    samples/s at ``load`` cores, beside a chief taking ``outside`` samples/s from elsewhere
    (the job capped at ``limit``). ``None`` when the chief alone does not fit (``f = 0``)."""
    if k_c * min(outside, limit) > cores * (1 + 1e-9):
        return None
    f_cap = (limit - outside) / flow if flow > 0 else math.inf  # beyond it the cap fixes the chief's part
    den = load + k_c * flow
    f = (cores - k_c * outside) / den if den > 0 else math.inf
    if f_cap <= 0 or f > f_cap:
        f = (cores - k_c * limit) / load if load > 0 else math.inf
    return max(0.0, min(1.0, f))


def in_process(model: NodeModel, base: dict[str, Any], C: int) -> dict[str, Any]:
    """:func:`analyzer.recommend.predict_layout`'s result for ``N = T = 1``, ``S = L = 0``: the pipeline runs
    inside the chief at the probed ``1 × C`` rate."""
    rate = model.node_rate(1, C)
    rel = model.node_rel_spread(1, C)
    return {**base, "input_workers": 0, "predicted_samples_per_sec": rate,
            "interval": [rate * max(0.0, 1 - Z * rel), rate * (1 + Z * rel)],
            "workers_rate": rate, "limited_by": "in-process pipeline", "per_node": [rate],
            "chief_input_samples_per_sec": 0.0}


@dataclass
class _Balance:
    """The input workers of a layout and the CPU domains they share, balanced to a fixed
    point (:meth:`settle`).

    ``plan``: :func:`_nodes` entries (the chief input worker's last, at index ``ci``);
    ``domains``: ``[(cores, [plan indices])]``; ``raw``: each entry's probed rate
    (samples/s); ``cost``: its CPU-seconds per delivered sample (pipeline plus serving);
    ``eff``: its rate within its own CPUs (the pinned chief input worker's ``L``);
    ``cap``: the chief's measured ingest cap; ``chief_cap``: the chief's stream limit
    (its CPUs over ``k_c``, lowered when its domain is full); ``scale``: what the domains
    leave each entry; ``share``: with ``L = C_c``, the chief input worker's share of the
    CPUs the chief leaves; ``takes``: the share of the delivered stream the chiefs of each
    entry ingest (1 for the chief's entry with one chief, ``ranks / world`` for each chief
    node of several trainer ranks, 0 for the input workers); ``world``: the trainer ranks.
    """

    plan: list[dict[str, Any]]
    domains: list[tuple[float, list[int]]]
    raw: list[float]
    cost: list[float]
    eff: list[float]
    ci: int | None
    pinned: bool
    cap: float
    chief_cap: float
    k_c: float
    c_task: int
    scale: list[float] = field(default_factory=list)
    share: float = 1.0
    takes: list[float] = field(default_factory=list)
    world: int = 1

    def current(self) -> list[float]:
        """Each plan entry's delivered rate (samples/s) as balanced so far."""
        out = [r * s for r, s in zip(self.eff, self.scale, strict=True)]
        if self.ci is not None:
            out[self.ci] *= self.share
        return out

    def settle(self, rounds: int = 60) -> None:
        """Scale the entries down, domain by domain (the chief's last: its fit depends on the
        rate every other domain delivers), until every domain fits its cores (at most
        ``rounds`` passes)."""
        domains = sorted(self.domains, key=lambda d: self._takes(d[1]) > 0)
        for _ in range(rounds):
            changed = False
            for cores, idx in domains:
                changed = self._fit(cores, idx) or changed
            if not changed:
                break

    def _fit(self, cores: float, idx: list[int]) -> bool:
        """Fit one domain of ``cores`` holding plan entries ``idx``; True when anything
        changed."""
        changed = False
        rates = self.current()
        total = sum(rates)
        takes = self._takes(idx)
        chief_here = takes > 0 and self.k_c > 0
        if chief_here and self.ci is not None and not self.pinned and self._share_chief_task(rates, total):
            changed = True
            rates = self.current()
            total = sum(rates)
        delivered = min(total, self.cap, self.chief_cap)
        load = sum(rates[i] * self.cost[i] for i in idx)
        demand = load + (delivered * self.k_c * takes if chief_here else 0.0)
        if demand <= cores * (1 + 1e-6):
            return changed
        if chief_here:
            flow = sum(rates[i] for i in idx)
            f = _fraction(load, flow, total - flow, min(self.cap, self.chief_cap), cores, self.k_c * takes)
            if f is None:  # the chief alone fills its domain: it caps the job, its workers idle
                self.chief_cap, f = min(self.chief_cap, cores / (self.k_c * takes)), 0.0
        else:
            f = cores / demand
        for i in idx:
            self.scale[i] *= f
        return True

    def _takes(self, idx: list[int]) -> float:
        """The share of the delivered stream the chiefs of plan entries ``idx`` ingest."""
        return sum(self.takes[i] for i in idx) if self.takes else (1.0 if 0 in idx else 0.0)

    def _share_chief_task(self, rates: list[float], total: float) -> bool:
        """``L = C_c``: the chief input worker takes what the chief leaves of its task's CPUs
        (:func:`_fraction`); True when its share changed."""
        ci = self.ci
        assert ci is not None
        full = self.eff[ci] * self.scale[ci]
        f_ci = _fraction(full * self.cost[ci], full, total - rates[ci], min(self.cap, self.chief_cap),
                         self.c_task, self.k_c)
        f_ci = 0.0 if f_ci is None else f_ci
        if abs(f_ci - self.share) > 1e-9:
            self.share = f_ci
            return True
        return False


def predict_balanced(model: NodeModel, spec: LayoutSpec, L: int, c_task: int, ingest: dict,
                     topology: dict | None) -> dict[str, Any]:
    """:func:`analyzer.recommend.predict_layout`'s result for a layout with input workers, its
    chief's input worker on ``L`` of the chief task's ``c_task`` CPUs: :func:`_balance` settled."""
    bal = _balance(model, spec, L, c_task, ingest, topology)
    bal.settle()
    return _prediction(model, spec.record(), bal, topology)


def _balance(model: NodeModel, spec: LayoutSpec, L: int, c_task: int, ingest: dict,
             topology: dict | None) -> _Balance:
    """The unbalanced :class:`_Balance` of a layout with input workers: the per-node plan
    (:func:`_nodes`) plus the chief input worker (:func:`_chief_input_entry`, in the
    chief's domain), the CPU domains (:func:`_domains`), the service costs
    (:func:`chief_costs`) and caps, and, for a pinned chief input worker (``L < C_c``,
    :func:`csrun_runtime.chief_input.split_cpus`), the worker on its ``L`` CPUs and the
    chief on the rest. With several trainer ranks each chief node's ranks take their share
    of the stream (``takes``) and the measured ingest cap is each rank's."""
    world = spec.world_size
    k_c, h_w = chief_costs(ingest)
    measured_cap = ingest.get("samples_per_sec") or math.inf
    # A CPU-bound ingest probe measured its node's CPUs, which the chief's domain models.
    cap = math.inf if (ingest.get("cpu_bound") and k_c > 0) else measured_cap * world
    plan = _nodes(model, spec)
    domains = _domains(plan, model.node_cpus, topology)
    ci: int | None = None  # the chief input worker's plan index
    if L:
        ci = len(plan)
        plan.append(_chief_input_entry(model, plan[0]["tasks"], L))
        domains = [(cores, idx + [ci] if 0 in idx else idx) for cores, idx in domains]
    raw = [p["rate"] for p in plan]
    cost = [p["k"] + h_w for p in plan]  # CPU-seconds per delivered sample of each entry
    eff = list(raw)
    chief_cap = math.inf
    pinned = ci is not None and L < c_task
    if ci is not None and pinned:  # split_cpus: the worker on its L CPUs, the chief on the rest
        eff[ci] = min(raw[ci], L / cost[ci]) if cost[ci] > 0 else raw[ci]
        if k_c > 0:
            chief_cap = (c_task - L) / k_c
    # the chief's entry takes the whole stream; each chief node of several ranks its ranks' share
    takes = [float(i == 0) if world == 1 else (p["tasks"] / world if p["chief"] and not p["workers"] else 0.0)
             for i, p in enumerate(plan)]
    return _Balance(plan=plan, domains=domains, raw=raw, cost=cost, eff=eff, ci=ci, pinned=pinned, cap=cap,
                    chief_cap=chief_cap, k_c=k_c, c_task=c_task, scale=[1.0] * len(plan), takes=takes,
                    world=world)


def _rank_rates(rates: list[float], plan: list[dict[str, Any]], world: int) -> list[float]:
    """Samples/s each of ``world`` trainer ranks receives: input worker ``g`` (job-wide, block
    over the input-worker nodes: :func:`csrun_common.ranks.worker_rank`) feeds rank
    ``g % world`` and delivers its node's rate (``rates``, per plan entry) over the node's
    workers."""
    out = [0.0] * world
    g = 0
    for rate, p in zip(rates, plan, strict=True):
        for _ in range(int(p["workers"])):
            out[g % world] += rate / p["workers"]
            g += 1
    return out


def _prediction(model: NodeModel, base: dict[str, Any], bal: _Balance, topology: dict | None) -> dict[str, Any]:
    """:func:`analyzer.recommend.predict_layout`'s result from the settled :class:`_Balance`: the delivered
    rate, what limits it, its interval and the per-node rates (with several trainer ranks
    also each rank's: the ranks step together, so the world takes ``world`` × the slowest)."""
    rates = bal.current()
    wrate = sum(rates)
    per_rank = _rank_rates(rates, bal.plan, bal.world) if bal.world > 1 else []
    lockstep = bal.world * min(per_rank) if per_rank else wrate
    pred = min(wrate, lockstep, bal.cap, bal.chief_cap)
    if min(bal.cap, bal.chief_cap) < min(wrate, lockstep) * (1 - 1e-6):
        limited = "chief ingest"
    elif lockstep < wrate * (1 - 1e-6):
        limited = "slowest rank"
    elif any(s < 0.999 for s in bal.scale):
        limited = "shared host CPUs" if topology else "node CPUs (pipeline and serving)"
    else:
        limited = "input workers"
    # Relative spread of a sum of independent nodes: rate-weighted RMS (kept conservative:
    # no 1/sqrt(N) shrink).
    rel = math.sqrt(sum((r * p["rel"]) ** 2 for r, p in zip(rates, bal.plan, strict=True)) /
                    max(sum(r * r for r in rates), 1e-12)) if wrate > 0 else model.rel_spread
    rel = max(rel, model.rel_spread)
    ci = bal.ci
    per_node = rates[:len(rates) - (1 if ci is not None else 0)]
    ci_rate = rates[ci] if ci is not None else 0.0
    per_node[0] += ci_rate
    workers = sum(p["workers"] for p in bal.plan)
    out = {**base, "input_workers": workers, "predicted_samples_per_sec": pred,
           "interval": [pred * max(0.0, 1 - Z * rel), pred * (1 + Z * rel)],
           "workers_rate": sum(bal.raw), "limited_by": limited, "per_node": per_node,
           "chief_input_samples_per_sec": ci_rate}
    if bal.world > 1:
        out.update(world_size=bal.world, input_workers_per_rank=workers // bal.world,
                   per_rank_samples_per_sec=per_rank)
    return out


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

