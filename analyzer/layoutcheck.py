"""The layouts cs_input_analyzer may recommend, checked with csrun_wse's own checks before any probe
(issue 44; docs/INPUT-ANALYZER.md "Never a layout csrun_wse refuses").

The layouts the recommendation draws from (:func:`analyzer.recommend.candidate_layouts`, those of
several trainer ranks :func:`analyzer.recommend.rank_layouts`) are each given to
:func:`launcher.rankfit.layout_error`'s checks against the partition's nodes (``sinfo``) and the
site configuration (the partition's part once per node count): :func:`launcher.layout.plan`, the
chief nodes' GRES (``R ×`` ``gres.resource``), the input-worker nodes outside ``gres.node``.
When none passes, the analysis stops at once, in one line (exit 2), before its probing budget is
spent; when only layouts of fewer nodes pass (the input workers need nodes outside
``gres.node``), the recommendation is held to those.
"""
from __future__ import annotations

from collections.abc import Sequence

from csrun_common.errors import CsrunError
from csrun_common.layout import LayoutSpec
from launcher import slurm
from launcher.config import SiteConfig
from launcher.rankfit import NO_GRES_LINE, Node, fitting_layout, partition_error, rules_error

__all__ = ["usable_nodes"]


def _refusal(specs: Sequence[LayoutSpec], errors: Sequence[str], cfg: SiteConfig, nodes: Sequence[Node],
             node_cpus: int) -> str:
    """The one line of an analysis no layout fits: the first layout's refusal, and the site-config
    line when the GRES is what none finds."""
    first, world = errors[0], specs[0].world_size
    if world == 1:
        return first
    if cfg.gres_resource and fitting_layout(specs[0], "", cfg.gres_node, nodes, node_cpus) is not None:
        return f"{first}; no layout of {world} trainer ranks finds that GRES: {NO_GRES_LINE}"
    return f"{first}; no layout of {world} trainer ranks the analyzer would recommend fits the partition"


def usable_nodes(specs: Sequence[LayoutSpec], cfg: SiteConfig | None, partition: str, node_cpus: int | None,
                 available_nodes: int) -> int:
    """The most nodes of ``specs`` (the layouts the recommendation would choose from, at most
    ``available_nodes`` nodes) that csrun_wse takes on ``partition``: ``available_nodes`` when
    every node count passes, fewer when only smaller layouts do; unchecked (``available_nodes``)
    without a site configuration (``--local``) or a node's CPUs. Raises :class:`CsrunError` (one
    line: the first layout's refusal and what would fit) when none passes."""
    if cfg is None or not node_cpus or not specs:
        return available_nodes
    nodes = slurm.list_nodes(partition)
    refused: dict[int, str | None] = {}  # node count -> the partition's refusal (it reads no more of a layout)
    errors = []
    for s in specs:
        if s.nodes not in refused:
            refused[s.nodes] = partition_error(s, cfg.gres_resource, cfg.gres_node, nodes)
        errors.append(rules_error(s, cfg.gres_resource, node_cpus) or refused[s.nodes])
    passed = [s.nodes for s, e in zip(specs, errors, strict=True) if e is None]
    if not passed:
        raise CsrunError(_refusal(specs, [e for e in errors if e], cfg, nodes, node_cpus))
    return max(passed)
