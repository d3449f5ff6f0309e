"""csrun_runtime/ranks.py: the environment a trainer rank's task gets (with the real scontrol of the
test cluster when it is up)."""
from __future__ import annotations

import json
import shutil

import pytest

from csrun_runtime import ranks as task_ranks

_JOB = {"SLURM_JOB_ID": "42", "SLURM_STEP_ID": "0", "CSRUN_NUM_WORKERS": "8", "CSRUN_WORLD_SIZE": "4",
        "CSRUN_LOCAL_WORLD_SIZE": "2"}


def test_a_task_that_is_not_a_rank_of_several_gets_nothing():
    assert task_ranks.rank_environment({"CSRUN_ROLE": "chief", "SLURM_PROCID": "0", "CSRUN_NUM_WORKERS": "0"}) == {}
    assert task_ranks.rank_environment({**_JOB, "CSRUN_ROLE": "worker", "CSRUN_TASK_OFFSET": "4",
                                        "SLURM_PROCID": "5"}) == {}
    with pytest.raises(task_ranks.RankEnvError, match="SLURM_JOB_NODELIST_HET_GROUP_0"):
        task_ranks.rank_environment({**_JOB, "CSRUN_ROLE": "chief", "SLURM_PROCID": "0"})


@pytest.mark.skipif(shutil.which("scontrol") is None, reason="needs Slurm's scontrol (the test cluster's)")
def test_a_rank_names_the_chief_nodes_by_slurms_hostlist_and_node_addresses(slurm_cluster):
    env = {**_JOB, "CSRUN_ROLE": "chief", "SLURM_PROCID": "2", "SLURM_LOCALID": "0",
           "SLURM_JOB_NODELIST_HET_GROUP_0": "node[1-2]", "CSRUN_MASTER_PORT": "30100"}
    out = task_ranks.rank_environment(env)
    hosts = [task_ranks.node_address(n) for n in ("node1", "node2")]
    assert out["MASTER_ADDR"] == hosts[0] and out["RANK"] == "2" and out["MASTER_PORT"] == "30100"
    assert json.loads(out["TF_CONFIG"])["cluster"]["worker"][2] == f"{hosts[1]}:30103"


def test_the_chief_nodes_are_het_group_0s_by_its_new_or_old_name_before_the_jobs():
    both = {"SLURM_JOB_NODELIST_HET_GROUP_0": "a[1-2]", "SLURM_JOB_NODELIST_PACK_GROUP_0": "b[1-2]",
            "SLURM_JOB_NODELIST": "c[1-4]"}
    assert task_ranks.chief_nodelist(both) == "a[1-2]"
    # srun 22.05's het step names the group by its older name only, beside the whole job's list
    assert task_ranks.chief_nodelist({**both, "SLURM_JOB_NODELIST_HET_GROUP_0": ""}) == "b[1-2]"
    assert task_ranks.chief_nodelist({"SLURM_JOB_NODELIST": "c[1-4]"}) == "c[1-4]"
