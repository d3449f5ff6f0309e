"""Slurm's facts for probing and the layout model: the partition's nodes, their CPUs and hosts
(:func:`cluster_info`), and the hosts several nodes share (:func:`topology`)."""
from __future__ import annotations

from typing import Any, TypedDict

from csrun_common.errors import CsrunError
from launcher import slurm
from launcher.resolve import gres_nodes


class ClusterInfo(TypedDict):
    """Slurm facts for probing and the layout model (``report.json``'s ``cluster``):
    ``nodes`` (names, the chief's GRES node first), ``node_cpus`` (CPUs of one CPU node),
    ``node_hosts`` (the host of each node, in the order of ``nodes``) and ``host_cores``
    (per host: the CPUs its nodes declare together; :func:`topology` replaces it by the
    probe's measured host CPUs where nodes share a host)."""

    nodes: list[str]
    node_cpus: int
    node_hosts: list[str]
    host_cores: dict[str, int]


def cluster_info(partition: str, exclude: str) -> ClusterInfo:
    """The :class:`ClusterInfo` of ``partition`` ("" : Slurm's default partitions), with
    ``exclude`` (the site's ``gres.node``: a name, a comma list or a Slurm hostlist) first, from
    :func:`launcher.slurm.list_nodes` and :func:`launcher.slurm.node_hosts`.

    Raises :class:`CsrunError` (exit 2) when Slurm cannot be reached, suggesting ``--local``,
    or when ``exclude`` does not parse.
    """
    gres = gres_nodes(exclude)
    try:
        nodes = slurm.list_nodes(partition)
        n = slurm.cpu_node_cpus(nodes, exclude=gres)
    except CsrunError as exc:
        raise CsrunError(f"cannot use Slurm ({exc}); run with --local to probe this machine instead") from None
    try:
        hosts = slurm.node_hosts(partition)
    except CsrunError:
        hosts = {}  # every node its own host
    names = list(dict.fromkeys(x.name for x in nodes))
    order = [x for x in names if x in gres] + [x for x in names if x not in gres]
    node_hosts = [hosts.get(x, x) for x in order]
    cpus = {x.name: x.cpus for x in nodes}
    host_cores: dict[str, int] = {}
    for name, h in zip(order, node_hosts, strict=True):
        host_cores[h] = host_cores.get(h, 0) + cpus.get(name, n)
    return {"nodes": order, "node_cpus": n, "node_hosts": node_hosts, "host_cores": host_cores}


def topology(info: ClusterInfo | None, hellos: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Host sharing for :func:`analyzer.recommend.predict_layout`: the hosts that carry
    several nodes declaring more CPUs together than the host has (``cpu_count`` seen by the
    probe processes on that host; the Slurm test cluster unpinned); nodes pinned to their
    own CPUs of one host (``cluster up --pin``) are independent. ``None`` when none is
    shared."""
    if not info:
        return None
    counts: dict[str, int] = {}
    for h in info["node_hosts"]:
        counts[h] = counts.get(h, 0) + 1
    seen: dict[str, int] = {}
    for hello in hellos:
        if hello.get("host") and hello.get("cpu_count"):
            seen[hello["host"]] = int(hello["cpu_count"])
    cores = {}
    for h, c in counts.items():
        declared = info["host_cores"][h]
        if c > 1 and h in seen and declared > seen[h]:
            cores[h] = seen[h]
        elif c > 1 and h not in seen:
            cores[h] = declared  # not probed: what the nodes declare together
    shared = {h for h, c in cores.items() if c < info["host_cores"][h]}
    if not shared:
        return None
    return {"nodes": info["nodes"], "node_hosts": info["node_hosts"],
            "host_cores": {h: cores[h] for h in shared}, "shared_hosts": sorted(shared)}

