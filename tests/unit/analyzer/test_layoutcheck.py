"""The analyzer's layouts against csrun_wse's own checks before it probes (analyzer/layoutcheck.py,
issue 44): on the test cluster's partition (canned sinfo: node1 with gpu:1, four 2-CPU nodes) two
ranks on a node cannot have gpu:2, so nothing is recommended and the refusal says how to run them
without GRES; without GRES every layout the recommendation draws from passes the launcher's checks."""
from __future__ import annotations

import pytest

from csrun_common.errors import CsrunError
from launcher import slurm
from launcher.config import load_config
from launcher.rankfit import NO_GRES_LINE, layout_error
from tests.unit.canned_slurm import NODES


def _specs(world_nodes=1, ranks=2, available=5):
    from analyzer.recommend import rank_layouts

    return rank_layouts(2, available, world_nodes, ranks)


def test_no_layout_of_two_ranks_finds_gpu_2_and_the_refusal_says_what_runs_them(cluster):
    from analyzer.layoutcheck import usable_nodes

    with pytest.raises(CsrunError) as e:
        usable_nodes(_specs(), load_config(), "", 2, 5)
    line = str(e.value)
    assert "\n" not in line and line.startswith("--chief-nodes 1 --chief-tasks-per-node 2: 1 node(s) with 2 × "
                                                "gres.resource 'gpu:1' needed, the partition has 0")
    assert line.endswith(f"no layout of 2 trainer ranks finds that GRES: {NO_GRES_LINE}")


def test_without_gres_every_layout_passes_the_launchers_checks(cluster, tmp_path):
    from analyzer.layoutcheck import usable_nodes

    cfg = tmp_path / "site.toml"
    cfg.write_text('[gres]\nresource = ""\n')
    cluster.setenv("CSRUN_CONFIG", str(cfg))
    site = load_config()
    assert usable_nodes(_specs(), site, "", 2, 5) == 5
    assert all(layout_error(s, "", "node1", NODES, 2) is None for s in _specs())
    # gres.node names two nodes: the input workers have 3 outside it, so 4 nodes at most
    cfg.write_text('[gres]\nresource = ""\nnode = "node[1-2]"\n')
    assert usable_nodes(_specs(), load_config(), "", 2, 5) == 4


def test_one_chief_needs_a_node_with_the_gres(cluster, monkeypatch):
    from analyzer.layoutcheck import usable_nodes
    from csrun_common.layout import LayoutSpec

    monkeypatch.setattr(slurm, "list_nodes", lambda partition="", flag="--partition": [
        slurm.NodeInfo(f"node{i}", 2, "", "idle", "batch") for i in range(1, 4)])
    with pytest.raises(CsrunError, match=r"^gres.resource = 'gpu:1': no node in the partition has GRES 'gpu'"):
        usable_nodes([LayoutSpec(2, 1, 1)], load_config(), "", 2, 3)
    assert usable_nodes([LayoutSpec(2, 1, 1)], None, "", 2, 3) == 3  # --local: nothing to ask
