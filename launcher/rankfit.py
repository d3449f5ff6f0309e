"""A layout of several trainer ranks against the partition: the launcher's checks in one place, and
the nearest layout that passes them (docs/MULTI-RANK.md "Refusals").

csrun_wse (:func:`launcher.cli._wse_layout`) and cs_input_analyzer (before it probes) ask
:func:`layout_error` whether the partition takes a layout: :func:`launcher.layout.plan` and
:meth:`csrun_common.layout.LayoutSpec.check_node` (the layout's own rules against a node's CPUs),
then the chief nodes' GRES (``R ×`` the site's ``gres.resource`` on each of ``C`` nodes) and the
input-worker nodes outside ``gres.node``. :func:`check` raises the first refusal with a layout
that fits (:func:`fitting_layout`: the same world size, the asked values kept where they can be)
or, when the GRES is what no layout of that world size finds, the site-config line that runs the
ranks without it (:data:`NO_GRES_LINE`).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Protocol

from csrun_common.errors import CsrunError
from csrun_common.layout import LayoutSpec, RankWorkersError, flag

from .layout import plan
from .resolve import gres_nodes

__all__ = ["Node", "layout_error", "rules_error", "partition_error", "fitting_layout", "check", "gres_count",
           "gres_missing", "NO_GRES_LINE"]

#: The site-config line that runs trainer ranks without a GRES (CPU ranks, gloo / RING collectives).
NO_GRES_LINE = ('to train the ranks on CPU nodes without GRES, set gres.resource = "" in the site config '
                '($CSRUN_CONFIG; docs/MULTI-RANK.md "On CPU nodes")')


class Node(Protocol):
    """What the checks read of a node (``launcher.slurm.NodeInfo``): its name and GRES."""

    @property
    def name(self) -> str: ...

    @property
    def gres(self) -> str: ...


def gres_count(spec: str) -> tuple[str, int]:
    """``(name, count)`` of a GRES spec as sinfo prints it or the site gives it (``gpu:a100:4(S:0-1)``:
    ``("gpu", 4)``; no count: 1)."""
    head = spec.split("(")[0]
    name, _, rest = head.partition(":")
    last = rest.rpartition(":")[2]
    return name, int(last) if last.isdigit() else 1


def gres_missing(gres: str, nodes: Sequence[Node]) -> str | None:
    """The one line when no node of ``nodes`` has the GRES ``gres`` names (any count), else ``None``."""
    name = gres.split(":")[0]
    if not gres or any(node.gres.split(":")[0] == name for node in nodes):
        return None
    return f"gres.resource = {gres!r}: no node in the partition has GRES {name!r}"


def _gres_error(spec: LayoutSpec, gres: str, nodes: Sequence[Node]) -> str | None:
    c, r = spec.chief_nodes, spec.chief_tasks_per_node
    if not gres:
        return None
    name, count = gres_count(gres)
    fit = [n.name for n in nodes
           if any(gres_count(g)[0] == name and gres_count(g)[1] >= count * r for g in n.gres.split(",") if g)]
    if len(fit) >= c:
        return None
    return (f"{flag('chief_nodes')} {c} {flag('chief_tasks_per_node')} {r}: {c} node(s) with {r} × gres.resource "
            f"{gres!r} needed, the partition has {len(fit)}")


def rules_error(spec: LayoutSpec, gres: str, node_cpus: int) -> str | None:
    """The layout's own rules against a node of ``node_cpus`` CPUs
    (:meth:`csrun_common.layout.LayoutSpec.check_node`, :func:`launcher.layout.plan`): the one
    line, or ``None``. The worker-count rule's line comes without its counts (:func:`check`
    names a layout instead)."""
    try:
        spec.check_node(node_cpus)
        plan(spec, gres, node_cpus)
    except RankWorkersError as e:
        return e.reason
    except CsrunError as e:
        return str(e)
    return None


def partition_error(spec: LayoutSpec, gres: str, gres_node: str, nodes: Sequence[Node]) -> str | None:
    """The partition's refusal of ``spec``'s node count and chief nodes (it reads only those and
    the ranks per node): too few nodes, no node with the GRES (one chief), too few chief nodes
    with ``R ×`` the GRES, too few input-worker nodes outside ``gres.node``; ``None`` when none."""
    if spec.nodes > len(nodes):
        return f"{flag('nodes')} {spec.nodes}: the partition has only {len(nodes)} node(s)"
    if spec.world_size <= 1:
        return gres_missing(gres, nodes)
    error = _gres_error(spec, gres, nodes)
    if error:
        return error
    others = len(nodes) - len(gres_nodes(gres_node) & {n.name for n in nodes})
    if spec.nodes - spec.chief_nodes > others:
        return (f"{flag('nodes')} {spec.nodes} {flag('chief_nodes')} {spec.chief_nodes}: "
                f"{spec.nodes - spec.chief_nodes} input-worker node(s) needed outside gres.node {gres_node!r}, "
                f"the partition has {others}")
    return None


def layout_error(spec: LayoutSpec, gres: str, gres_node: str, nodes: Sequence[Node], node_cpus: int) -> str | None:
    """Why the partition refuses ``spec`` (one line), or ``None``: :func:`rules_error`, :func:`partition_error`."""
    return rules_error(spec, gres, node_cpus) or partition_error(spec, gres, gres_node, nodes)


def _splits(spec: LayoutSpec) -> list[tuple[int, int]]:
    """``(chief_nodes, chief_tasks_per_node)`` of ``spec``'s world size: the asked one first."""
    world = spec.world_size
    asked = (spec.chief_nodes, spec.chief_tasks_per_node)
    return [asked] + [(c, world // c) for c in range(1, world + 1) if world % c == 0 and (c, world // c) != asked]


#: Weights of :func:`_distance`: input CPUs short of the asked cost more than the same surplus (an
#: input-bound job is what the layout is for), and a shape change counts a tenth of a CPU change.
SHORTFALL_WEIGHT, SHAPE_WEIGHT = 1.5, 0.1


def _distance(spec: LayoutSpec, asked: int, n: int, t: int, cpus: int, c: int, world: int) -> float:
    """How far the layout ``n × t × cpus`` of ``c`` chief nodes (and ``world`` ranks, with their own
    input workers when ``spec``'s have them) is from ``spec``, whose input workers have ``asked``
    CPUs: the relative change of the input workers' CPUs (:data:`SHORTFALL_WEIGHT` when fewer),
    plus :data:`SHAPE_WEIGHT` × the relative changes of the node count, tasks and CPUs."""
    asked_c = spec.cpus_per_task or 1
    got = ((n - c) * t + (world if spec.chief_input_workers else 0)) * cpus
    change = (got - asked) / max(1, asked)
    shape = abs(n - spec.nodes) / spec.nodes + abs(t - spec.tasks_per_node) / spec.tasks_per_node \
        + abs(cpus - asked_c) / asked_c
    return (change if change >= 0 else -SHORTFALL_WEIGHT * change) + SHAPE_WEIGHT * shape


def _nearest(spec: LayoutSpec, gres: str, gres_node: str, nodes: Sequence[Node], node_cpus: int, c: int,
             r: int) -> LayoutSpec | None:
    """The layout of ``c`` chief nodes × ``r`` ranks (the chief's input CPUs as ``spec``'s) nearest to
    ``spec`` (:func:`_distance`, then fewer nodes) that :func:`layout_error` takes, of at most
    twice the asked nodes; the worker-count rule is applied first by arithmetic."""
    world, asked = c * r, spec.num_input_workers * (spec.cpus_per_task or 1)
    cands = []
    for n in range(c, min(len(nodes), 2 * spec.nodes + c) + 1):
        for t in range(1, node_cpus + 1):
            in_chief = world if spec.chief_input_workers else 0
            if ((n - c) * t + in_chief) % world or (n - c) * t + in_chief == 0:
                continue
            for cpus in range(1, node_cpus // t + 1):
                cands.append((_distance(spec, asked, n, t, cpus, c, world), n, t, cpus))
    refused: dict[int, str | None] = {}  # node count -> the partition's refusal (it reads no more)
    for _, n, t, cpus in sorted(cands):
        cand = replace(spec, nodes=n, tasks_per_node=t, cpus_per_task=cpus, chief_nodes=c, chief_tasks_per_node=r)
        if n not in refused:
            refused[n] = partition_error(cand, gres, gres_node, nodes)
        if refused[n] is None and rules_error(cand, gres, node_cpus) is None:
            return cand
    return None


def fitting_layout(spec: LayoutSpec, gres: str, gres_node: str, nodes: Sequence[Node],
                   node_cpus: int) -> LayoutSpec | None:
    """The layout nearest to ``spec`` with its world size that :func:`layout_error` takes:
    ``spec``'s chief nodes × ranks first (:func:`_splits`; a split whose chief nodes lack the GRES
    is skipped whole), its chief's input CPUs kept before 0, then :func:`_nearest`; ``None``
    when none fits."""
    for c, r in _splits(spec):
        if _gres_error(replace(spec, chief_nodes=c, chief_tasks_per_node=r), gres, nodes):
            continue
        for inputs in dict.fromkeys((spec, spec.without_chief_input())):
            fit = _nearest(inputs, gres, gres_node, nodes, node_cpus, c, r)
            if fit is not None:
                return fit
    return None


def check(spec: LayoutSpec, gres: str, gres_node: str, nodes: Sequence[Node], node_cpus: int) -> None:
    """Raise :class:`CsrunError` with :func:`layout_error`'s line when the partition refuses
    ``spec`` (several trainer ranks), followed by the nearest layout that fits, or by
    :data:`NO_GRES_LINE` when the GRES is what none finds."""
    error = layout_error(spec, gres, gres_node, nodes, node_cpus)
    if error is None:
        return
    fit = fitting_layout(spec, gres, gres_node, nodes, node_cpus)
    if fit is not None:
        raise CsrunError(f"{error}; a layout of {spec.world_size} trainer ranks that fits the partition: "
                         f"{' '.join(fit.to_flags())}")
    if gres and fitting_layout(spec, "", gres_node, nodes, node_cpus) is not None:
        raise CsrunError(f"{error}; no layout of {spec.world_size} trainer ranks finds that GRES: {NO_GRES_LINE}")
    raise CsrunError(f"{error}; no layout of {spec.world_size} trainer ranks fits the partition's "
                     f"{len(nodes)} node(s) of {node_cpus} CPUs")
