"""The csrun_wse layouts of the original, for every case of the issue."""
import pytest

from csrun_common.errors import CsrunError
from launcher.layout import CHIEF, SINGLE_TASK, WORKER, plan_layout, resolve_counts


def shape(layout):
    return [(c.role, c.nodes, c.tasks_per_node, c.cpus_per_task, c.gres, c.exclusive, c.distribution,
             c.task_offset, c.worker_offset) for c in layout.components]


def test_one_node_is_one_component_with_the_gres():
    lay = plan_layout(1, 4, 2, gres="gpu:1", node_cpus=8)
    assert shape(lay) == [(CHIEF, 1, 4, 2, "gpu:1", True, "block", 0, 0)]
    assert lay.num_tasks == 4 and lay.num_input_workers == 3


def test_many_nodes_no_single_task():
    lay = plan_layout(3, 2, 1, cyclic=True, gres="gpu:1", node_cpus=2)
    assert shape(lay) == [
        (CHIEF, 1, 2, 1, "gpu:1", True, "block", 0, 0),
        (WORKER, 2, 2, 1, "", True, "cyclic", 2, 1),
    ]
    assert lay.num_tasks == 6 and lay.num_input_workers == 5 and lay.total_nodes == 3


@pytest.mark.parametrize("n,s,t", [(4, 1, 2), (5, 2, 3), (14, 2, 8), (2, 1, 1)])
def test_single_task_nodes(n, s, t):
    lay = plan_layout(n, t, 1, single_task_nodes=s, gres="gpu:1", node_cpus=16)
    comps = lay.components
    assert len(comps) == s + 1
    assert [c.role for c in comps] == [CHIEF] + [SINGLE_TASK] * (s - 1) + [WORKER]
    assert all(c.nodes == 1 and c.tasks_per_node == 1 and c.cpus_per_task == 16 for c in comps[:s])
    assert comps[0].gres == "gpu:1" and all(c.gres == "" for c in comps[1:])
    assert comps[-1].nodes == n - s and comps[-1].tasks_per_node == t
    assert lay.num_tasks == s + (n - s) * t  # total tasks S + (N−S)·T
    # offsets are contiguous: task and worker indices cover 0..num-1 exactly once
    assert [c.task_offset for c in comps] == [sum(x.ntasks for x in comps[:i]) for i in range(len(comps))]
    assert comps[-1].worker_offset + comps[-1].num_input_workers == lay.num_input_workers


@pytest.mark.parametrize("kw,msg", [
    (dict(total_nodes=0, tasks_per_node=1, cpus_per_task=1), "--total-nodes 0"),
    (dict(total_nodes=2, tasks_per_node=0, cpus_per_task=1), "--tasks-per-node 0"),
    (dict(total_nodes=2, tasks_per_node=1, cpus_per_task=-1), "--cpus-per-task -1"),
    (dict(total_nodes=3, tasks_per_node=1, cpus_per_task=1, single_task_nodes=3), "--single-task-nodes 3"),
    (dict(total_nodes=3, tasks_per_node=1, cpus_per_task=1, single_task_nodes=5), "--total-nodes 3"),
])
def test_bad_layouts_name_the_flag(kw, msg):
    with pytest.raises(CsrunError, match=msg):
        plan_layout(**kw)


def test_resolve_counts_rules():
    # both given and fitting
    assert resolve_counts(2, 4, 9, 9, 8) == (2, 4)
    # T only: default C kept when T of them fit, else Slurm chooses
    assert resolve_counts(2, None, 4, 4, 8) == (2, 4)
    assert resolve_counts(4, None, 4, 4, 8) == (4, None)
    # C only: T = floor(node CPUs / C)
    assert resolve_counts(None, 3, 4, 4, 8) == (2, 3)
    # neither: the defaults
    assert resolve_counts(None, None, 2, 1, 2) == (2, 1)


@pytest.mark.parametrize("t,c,msg", [
    (2, 2, r"--tasks-per-node 2 × --cpus-per-task 2 = 4"),
    (None, 3, r"--cpus-per-task 3"),
    (3, None, r"--tasks-per-node 3"),
])
def test_resolve_counts_refuses_what_does_not_fit(t, c, msg):
    with pytest.raises(CsrunError, match=msg):
        resolve_counts(t, c, 1, 1, 2)


def test_default_tasks_that_do_not_fit_name_the_config_key():
    with pytest.raises(CsrunError, match="defaults.tasks_per_node 4"):
        resolve_counts(None, None, 4, 8, 2)
