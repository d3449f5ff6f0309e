"""``csrun_wse --chief-input-cpus`` in the launcher (docs/CHIEF-INPUT.md), across launcher/layout.py,
launcher/builders.py and launcher/cli.py: the layout's worker indices, the chief's variable on its
component only, and the refusal of too many CPUs before anything is submitted."""
from __future__ import annotations

import pytest
from click.testing import CliRunner

from csrun_common.errors import CsrunError
from csrun_common.roles import CHIEF_INPUT_ENV
from launcher.builders import WseRequest
from launcher.cli import csrun_wse
from launcher.layout import plan_layout


def test_indices_shift_by_one_and_the_job_counts_the_chiefs_worker():
    lay = plan_layout(3, 2, 1, gres="gpu:1", node_cpus=2, chief_input_cpus=1)
    assert [(c.role, c.task_offset, c.worker_offset) for c in lay.components] == [("chief", 0, 1), ("worker", 2, 2)]
    assert lay.num_tasks == 6 and lay.num_input_workers == 6  # 5 tasks + the chief's own
    # the task indices 1..5 and the chief's 0 cover 0..num_input_workers-1 exactly once
    last = lay.components[-1]
    assert last.worker_offset + last.num_input_workers == lay.num_input_workers


def test_single_task_layout_gives_the_chief_the_node():
    lay = plan_layout(4, 2, 1, single_task_nodes=2, gres="gpu:1", node_cpus=8, chief_input_cpus=7)
    assert lay.components[0].cpus_per_task == 8 and lay.num_input_workers == 1 + 4 + 1
    assert [c.worker_offset for c in lay.components] == [1, 1, 2]


@pytest.mark.parametrize("kw,msg", [
    (dict(total_nodes=1, tasks_per_node=2, cpus_per_task=1, chief_input_cpus=2),
     "--chief-input-cpus 2: more than the chief task's 1 CPU"),
    (dict(total_nodes=1, tasks_per_node=2, cpus_per_task=None, chief_input_cpus=1),
     "--chief-input-cpus 1: the chief's CPUs are left to Slurm"),
    (dict(total_nodes=1, tasks_per_node=2, cpus_per_task=1, chief_input_cpus=-1), "--chief-input-cpus -1"),
])
def test_bad_values_name_the_flag(kw, msg):
    with pytest.raises(CsrunError, match=msg):
        plan_layout(**kw, node_cpus=2)


def test_only_the_chiefs_component_gets_the_variable():
    req = WseRequest(layout=plan_layout(2, 2, 1, gres="gpu:1", node_cpus=2, chief_input_cpus=1),
                     command=("python", "run.py"), python="python")
    envs = [dict(req.component_env(c)) for c in req.layout.components]
    assert envs[0][CHIEF_INPUT_ENV] == "1" and CHIEF_INPUT_ENV not in envs[1]
    assert {e["CSRUN_NUM_WORKERS"] for e in envs} == {"4"}
    off = WseRequest(layout=plan_layout(2, 2, 1, gres="gpu:1", node_cpus=2), command=("python",), python="python")
    assert all(CHIEF_INPUT_ENV not in dict(off.component_env(c)) for c in off.layout.components)


def test_cli_refuses_too_many_cpus_in_one_line_and_submits_nothing(tmp_path):
    res = CliRunner().invoke(csrun_wse, ["--dry-run", "--total-nodes", "1", "--tasks-per-node", "2",
                                         "--cpus-per-task", "1", "--chief-input-cpus", "3", "python-ws", "run.py"],
                             env={"SLURM_CONF": str(tmp_path / "x")})  # no slurmctld: a dry run offline
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.startswith("csrun_wse: error")]
    assert len(lines) == 1 and "--chief-input-cpus 3" in lines[0] and "--export" not in res.output
