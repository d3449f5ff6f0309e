"""A layout of several trainer ranks against a partition (launcher/rankfit.py, issue 44): the
launcher's checks in one function, the refusal naming a layout that fits (or the site-config line
for ranks without GRES), and every layout it names taken by the same checks."""
from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from csrun_common.errors import CsrunError
from csrun_common.layout import LayoutSpec
from launcher.rankfit import NO_GRES_LINE, check, fitting_layout, layout_error


@dataclass(frozen=True)
class N:
    name: str
    gres: str = ""


#: The test cluster: node1 with gpu:1, node2..node5 CPU nodes, 2 CPUs each.
TEST_CLUSTER = [N("node1", "gpu:1")] + [N(f"node{i}") for i in range(2, 6)]


def spec(n, t, c, cn, r, inputs=0):
    return LayoutSpec(n, t, c, chief_input_cpus=inputs, chief_nodes=cn, chief_tasks_per_node=r)


def test_two_ranks_on_the_test_cluster_need_the_gres_line():
    with pytest.raises(CsrunError) as e:
        check(spec(3, 2, 1, 1, 2), "gpu:1", "node1", TEST_CLUSTER, 2)
    assert str(e.value) == ("--chief-nodes 1 --chief-tasks-per-node 2: 1 node(s) with 2 × gres.resource 'gpu:1' "
                            "needed, the partition has 0; no layout of 2 trainer ranks finds that GRES: "
                            f"{NO_GRES_LINE}")
    check(spec(3, 2, 1, 1, 2), "", "node1", TEST_CLUSTER, 2)  # without GRES it fits


def test_a_worker_count_the_world_does_not_divide_names_a_layout_that_fits():
    # 3 nodes × 1 task for 2 ranks on 1 chief node: 2 input workers... fits; 4 nodes × 1: 3 workers, not
    assert layout_error(spec(4, 1, 1, 1, 2), "", "node1", TEST_CLUSTER, 2) == (
        "--total-nodes 4 --tasks-per-node 1: 3 input workers for 2 trainer ranks; they must be a multiple of the "
        "world size")
    # the nearest input capacity, rounded up (one more node: 4 input workers), the shape kept
    with pytest.raises(CsrunError, match=r"world size; a layout of 2 trainer ranks that fits the partition: "
                                         r"--total-nodes 5 --tasks-per-node 1 --cpus-per-task 1 "
                                         r"--chief-tasks-per-node 2$"):
        check(spec(4, 1, 1, 1, 2), "", "node1", TEST_CLUSTER, 2)


def test_another_split_of_the_world_is_named_when_its_gres_fits():
    # 1 × 8 ranks need gpu:8 on a node; 2 × 4 find gpu:4 on two: the input workers keep their 32 CPUs
    gpus = [N(f"g{i}", "gpu:a100:4(S:0-1)") for i in range(2)] + [N(f"c{i}") for i in range(6)]
    with pytest.raises(CsrunError, match=r"1 node\(s\) with 8 × gres.resource 'gpu:1' needed, the partition has 0; "
                                         r"a layout of 8 trainer ranks that fits the partition: --total-nodes 6 "
                                         r"--tasks-per-node 4 --cpus-per-task 2 --chief-nodes 2 "
                                         r"--chief-tasks-per-node 4$"):
        check(spec(5, 4, 2, 1, 8), "gpu:1", "g[0-1]", gpus, 8)


def test_input_worker_nodes_outside_gres_node():
    err = layout_error(spec(5, 2, 1, 1, 2), "", "node[1-2]", TEST_CLUSTER, 2)
    assert err == ("--total-nodes 5 --chief-nodes 1: 4 input-worker node(s) needed outside gres.node 'node[1-2]', "
                   "the partition has 3")
    fit = fitting_layout(spec(5, 2, 1, 1, 2), "", "node[1-2]", TEST_CLUSTER, 2)
    assert fit is not None and " ".join(fit.to_flags()) == ("--total-nodes 4 --tasks-per-node 2 --cpus-per-task 1 "
                                                            "--chief-tasks-per-node 2")


def test_no_layout_fits_a_partition_too_small():
    with pytest.raises(CsrunError, match=r"no layout of 8 trainer ranks fits the partition's 5 node\(s\) of 2 CPUs$"):
        check(spec(5, 2, 1, 4, 2), "", "node1", TEST_CLUSTER, 2)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 6), st.integers(1, 4), st.integers(1, 4), st.integers(1, 3), st.integers(1, 4),
       st.integers(0, 1), st.sampled_from(["", "gpu:1"]), st.integers(4, 8), st.integers(0, 3))
def test_every_named_layout_passes_the_same_checks(n, t, c, cn, r, inputs, gres, size, gpu_nodes):
    """Whatever is asked, a layout check() names is one layout_error() takes, of the same world."""
    nodes = [N(f"n{i}", "gpu:4" if i < gpu_nodes else "") for i in range(size)]
    asked = spec(n, t, c, cn, r, inputs)
    fit = fitting_layout(asked, gres, "n0", nodes, 4)
    if fit is not None:
        assert layout_error(fit, gres, "n0", nodes, 4) is None and fit.world_size == asked.world_size
