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

Several trainer ranks (``chief_nodes`` × ``chief_tasks_per_node`` = the world size > 1,
docs/MULTI-RANK.md): the chief's nodes run ranks only (``node CPUs // ranks`` each, no input
worker), the input workers run on the other ``N - chief_nodes`` nodes, ``T`` each, and input
worker ``g`` feeds rank ``g % world``. Each chief node is a domain whose ranks ingest their share
of the stream (``ranks / world`` of it, at ``k_c`` each); the measured ingest rate caps each rank,
so the world at ``world`` times it. The ranks step together, so the world receives ``world`` ×
the slowest rank's rate (``"slowest rank"`` where that is the limit). The candidates are
:func:`rank_layouts`' (``W`` a multiple of the world size, the layout's own check), without
the chief's input worker (not modelled with several ranks), and the target is the world's.

The choice: every candidate ``(N, T, C)`` with ``S = 0`` and ``T × C ≤ n``, each with
``L = 0`` and the chief-input variants :func:`chief_input_choices` gives (``C - 1`` pinned,
training keeping one CPU; ``C = 1`` shared; and ``C - m`` where the chief's stream needs
``m ≥ 2`` CPUs), a variant kept only where it raises the layout's rate by at least
:data:`MIN_CHIEF_INPUT_GAIN`. With a target, the layout whose interval's low end meets it
with the fewest nodes, then the fewest reserved cores (``N × T × C``: the chief's input
worker reserves none, it uses the chief's own CPUs), then the highest rate, then ``L = 0``
(if none meets it by its low end, by its point prediction; if none at all, the best layout
and the accelerator is input-starved); without a target, the fewest nodes and cores among
the layouts within ``tolerance`` (5 %) of the best rate for the available nodes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from csrun_common.errors import CsrunError
from csrun_common.layout import RANK_FIELDS, LayoutSpec, flag

from .model import NodeModel

#: ``z`` of the interval: ``prediction × (1 ± Z × relative spread)``.
Z = 2.0
#: A chief-input variant of a layout is a candidate only when it raises the layout's
#: predicted rate by at least this fraction (1 %): no extra process for no gain.
MIN_CHIEF_INPUT_GAIN = 0.01


def _nodes(model: NodeModel, spec: LayoutSpec) -> list[dict[str, Any]]:
    """Per-node plan of layout ``spec``: ``{"workers", "tasks", "cpus", "chief", "rate", "k"}``
    (rate = samples/s delivered by the node's input workers); with several trainer ranks the
    chief's nodes come first, ``chief_tasks_per_node`` ranks each and no input worker."""

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


def _chief_input_entry(model: NodeModel, T: int, S: int, L: int) -> dict[str, Any]:
    """The chief's input worker on node 1 as a plan entry: one task of ``L`` CPUs among the
    node's ``T`` (``S = 0``) or alone on it (``S > 0``)."""
    tasks = T if S == 0 else 1
    return {"tasks": tasks, "cpus": L, "workers": 1, "chief": True,
            "rate": model.node_rate(tasks, L) / tasks, "k": _k(model, tasks, L),
            "rel": model.node_rel_spread(tasks, L)}


def _chief_costs(ingest: dict) -> tuple[float, float]:
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


def predict_layout(model: NodeModel, spec: LayoutSpec, ingest: dict | None = None,
                   topology: dict | None = None) -> dict[str, Any]:
    """Predicted delivered samples/s of the csrun_wse layout ``spec`` (rules in the module
    docstring; its CPUs per task ``None``, Slurm's choice, predicted as 1).

    ``ingest``: :func:`analyzer.model.ingest_limits` output or ``None`` (no service costs
    known: the workers' rates are summed). ``topology``: ``{"node_hosts": [host of node 1
    (the chief's), host of worker node 2, ...], "host_cores": {host: cores}}`` for hosts
    whose nodes share cores, or ``None`` for independent nodes. A world of trainer ranks
    above 1 (``spec.world_size``): the module docstring's "Several trainer ranks".

    Returns ``{"nodes", "tasks_per_node", "cpus_per_task", "single_task_nodes",
    "chief_input_cpus", "input_workers" (the chief's own counted), "predicted_samples_per_sec",
    "interval": [lo, hi], "workers_rate" (the workers' probed rates summed, before any limit),
    "limited_by": "input workers" | "node CPUs (pipeline and serving)" | "chief ingest" |
    "shared host CPUs" | "in-process pipeline" | "slowest rank",
    "per_node": [samples/s delivered by each node's workers, the chief's own in node 1's],
    "chief_input_samples_per_sec": samples/s of the chief's input worker (0 without one)}``;
    with a world above 1 also ``"chief_nodes"``, ``"chief_tasks_per_node"``, ``"world_size"``,
    ``"input_workers_per_rank"`` and ``"per_rank_samples_per_sec"`` (samples/s each rank's
    workers deliver, lockstep aside; the world's rate is the world size × the slowest rank's,
    within the chiefs' limits).
    Raises ``ValueError`` for a layout :meth:`csrun_common.layout.LayoutSpec.check` refuses
    (N, T, C < 1, S outside [0, N), input workers not a multiple of the world size, ...),
    ``chief_input_cpus`` above the chief task's CPUs, or ``chief_input_cpus`` with several
    trainer ranks (not modelled).

    The steps: :func:`_check_layout`, the in-process case (:func:`_in_process`), the plan
    of input workers and CPU domains (:func:`_balance`), their fixed point
    (:meth:`_Balance.settle`) and the summary (:func:`_prediction`).
    """
    spec = spec.with_(cpus_per_task=1) if spec.cpus_per_task is None else spec
    c_task = _check_layout(model, spec)
    base = spec.record()
    if spec.world_size == 1 and (spec.nodes, spec.tasks_per_node, spec.single_task_nodes,
                                 spec.chief_input_cpus) == (1, 1, 0, 0):
        return _in_process(model, base, int(spec.cpus_per_task or 1))
    bal = _balance(model, spec, c_task, ingest or {}, topology)
    bal.settle()
    return _prediction(model, base, bal, topology)


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


def _in_process(model: NodeModel, base: dict[str, Any], C: int) -> dict[str, Any]:
    """:func:`predict_layout`'s result for ``N = T = 1``, ``S = L = 0``: the pipeline runs
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


def _balance(model: NodeModel, spec: LayoutSpec, c_task: int, ingest: dict, topology: dict | None) -> _Balance:
    """The unbalanced :class:`_Balance` of a layout with input workers: the per-node plan
    (:func:`_nodes`) plus the chief input worker (:func:`_chief_input_entry`, in the
    chief's domain), the CPU domains (:func:`_domains`), the service costs
    (:func:`_chief_costs`) and caps, and, for a pinned chief input worker (``L < C_c``,
    :func:`csrun_runtime.chief_input.split_cpus`), the worker on its ``L`` CPUs and the
    chief on the rest. With several trainer ranks each chief node's ranks take their share
    of the stream (``takes``) and the measured ingest cap is each rank's."""
    T, S, L, world = spec.tasks_per_node, spec.single_task_nodes, spec.chief_input_cpus, spec.world_size
    k_c, h_w = _chief_costs(ingest)
    measured_cap = ingest.get("samples_per_sec") or math.inf
    # A CPU-bound ingest probe measured its node's CPUs, which the chief's domain models.
    cap = math.inf if (ingest.get("cpu_bound") and k_c > 0) else measured_cap * world
    plan = _nodes(model, spec)
    domains = _domains(plan, model.node_cpus, topology)
    ci: int | None = None  # the chief input worker's plan index
    if L:
        ci = len(plan)
        plan.append(_chief_input_entry(model, T, S, L))
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
    """:func:`predict_layout`'s result from the settled :class:`_Balance`: the delivered
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
    k_c, _h = _chief_costs(ingest or {})
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
    """Choose the layout (rules in the module docstring), the chief's input CPUs included.

    ``target``: samples/s the accelerator consumes (``None``: best for the available nodes);
    with several trainer ranks (``chief_nodes`` × ``chief_tasks_per_node`` > 1) the world's
    (every rank's together), and the layouts are :func:`rank_layouts`'.
    Returns the chosen :func:`predict_layout` dict plus ``"target"``, ``"meets_target"``
    (``None`` without a target), ``"input_starved"`` (``True`` when the prediction is
    below the target, ``"at risk"`` when only the interval's low end is, ``False``, or
    ``None`` without a target), ``"reason"`` (a sentence) and ``"alternatives"`` (the five
    next layouts by the same order).
    Raises ``ValueError`` when ``available_nodes < 1``, or, with several trainer ranks, when
    no layout of at most ``available_nodes`` nodes fits the world (the message names the flags).

    The steps: the candidates' predictions (:func:`_candidates`), the choice with a target
    (:func:`_choose_for_target`) or without (:func:`_choose_best`), and the result
    (:func:`_recommendation`).
    """
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
