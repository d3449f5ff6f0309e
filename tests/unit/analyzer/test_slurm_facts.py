"""analyzer/slurm_facts.py: the probe nodes' topology (which share a host's cores)."""
from __future__ import annotations

from analyzer.slurm_facts import topology


def test_topology_pinned_nodes_are_independent():
    info = {"nodes": ["node1", "node2"], "node_cpus": 1, "node_hosts": ["vm", "vm"], "host_cores": {"vm": 2}}
    hello = [{"host": "vm", "cpu_count": 2}]
    assert topology(info, hello) is None  # 1 + 1 declared CPUs on a 2-core host: pinned
    shared = {"nodes": [f"node{i}" for i in range(1, 6)], "node_cpus": 2, "node_hosts": ["vm"] * 5,
              "host_cores": {"vm": 10}}
    topo = topology(shared, hello)
    assert topo["host_cores"] == {"vm": 2} and topo["shared_hosts"] == ["vm"]
    assert topology({**shared, "node_hosts": [f"h{i}" for i in range(5)],
                        "host_cores": {f"h{i}": 2 for i in range(5)}}, hello) is None  # one node per host
