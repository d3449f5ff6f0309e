"""Several trainer ranks: the worker -> rank split, the ports and each rank's variables
(csrun_common.ranks), the roles of a rank job (csrun_common.roles), and the environment a
trainer rank's task gets (csrun_runtime.ranks, with the real scontrol of the test cluster when
it is up)."""
from __future__ import annotations

import json
import shutil

import pytest

from csrun_common.errors import CsrunError
from csrun_common.layout import LayoutSpec
from csrun_common.ranks import BASE_PORT, PORT_SPAN, master_port, rank_key, trainer_env, worker_rank
from csrun_common.roles import RoleError, resolve_role
from csrun_runtime import ranks as task_ranks


def test_each_rank_gets_every_world_th_worker_and_the_split_covers_the_job():
    world, w = 4, 8
    by_rank: dict[int, list[int]] = {}
    for g in range(w):
        rank, slot = worker_rank(g, world)
        by_rank.setdefault(rank, []).append(g)
        assert slot == g // world
    assert by_rank == {0: [0, 4], 1: [1, 5], 2: [2, 6], 3: [3, 7]}
    assert worker_rank(5, 1) == (0, 5)
    with pytest.raises(ValueError):
        worker_rank(-1, 4)


def test_rank_keys_and_ports():
    assert rank_key("42.0", 3, 1) == "42.0" and rank_key("42.0", 3, 4) == "42.0.rank3"
    assert master_port("1234") == BASE_PORT + 1234 % PORT_SPAN
    assert master_port("77+1") == BASE_PORT + 77 and master_port(None) == BASE_PORT
    assert master_port("1234", 31000) == 31000


def test_trainer_env_is_torchruns_and_tf_configs():
    env = trainer_env(3, 1, 4, 2, ["10.0.0.1", "10.0.0.2"], 29600)
    assert {k: env[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                                "MASTER_PORT")} == {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4",
                                                    "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.1",
                                                    "MASTER_PORT": "29600"}
    assert json.loads(env["TF_CONFIG"]) == {
        "cluster": {"worker": ["10.0.0.1:29601", "10.0.0.1:29602", "10.0.0.2:29603", "10.0.0.2:29604"]},
        "task": {"type": "worker", "index": 3}}
    with pytest.raises(ValueError, match="need 2 node"):
        trainer_env(0, 0, 4, 2, ["10.0.0.1"], 29600)
    with pytest.raises(ValueError, match="outside"):
        trainer_env(4, 0, 4, 2, ["a", "b"], 29600)


_JOB = {"SLURM_JOB_ID": "42", "SLURM_STEP_ID": "0", "CSRUN_NUM_WORKERS": "8", "CSRUN_WORLD_SIZE": "4",
        "CSRUN_LOCAL_WORLD_SIZE": "2"}


def test_every_task_of_the_chiefs_group_is_a_rank_with_its_share_of_the_workers():
    rank3 = resolve_role({**_JOB, "CSRUN_ROLE": "chief", "CSRUN_TASK_OFFSET": "0", "SLURM_PROCID": "3",
                          "SLURM_LOCALID": "1"})
    assert (rank3.kind, rank3.rank, rank3.local_rank, rank3.world_size, rank3.num_input_workers) == (
        "chief", 3, 1, 4, 2)
    assert rank3.rendezvous_key == "42.0.rank3" and not rank3.is_rank_zero
    worker = resolve_role({**_JOB, "CSRUN_ROLE": "worker", "CSRUN_TASK_OFFSET": "4", "CSRUN_WORKER_OFFSET": "0",
                           "SLURM_PROCID": "9"})  # input worker 5 of 8
    assert (worker.rank, worker.worker_index, worker.streamer_index, worker.num_input_workers,
            worker.num_streamers) == (1, 1, 5, 2, 8)
    assert worker.rendezvous_key == "42.0.rank1" and worker.describe().startswith("input worker 5 of rank 1")
    own = resolve_role({**_JOB, "CSRUN_ROLE": "chief-input", "CSRUN_TASK_OFFSET": "2", "CSRUN_WORKER_OFFSET": "2",
                        "SLURM_PROCID": "2"})  # rank 2's own input worker
    assert (own.rank, own.worker_index, own.streamer_index) == (2, 0, 2)
    with pytest.raises(RoleError, match="CSRUN_NUM_WORKERS=6 is not a multiple of CSRUN_WORLD_SIZE=4"):
        resolve_role({**_JOB, "CSRUN_NUM_WORKERS": "6", "CSRUN_ROLE": "chief", "SLURM_PROCID": "0"})


def test_one_rank_keeps_the_original_roles():
    chief = resolve_role({"SLURM_JOB_ID": "42", "CSRUN_NUM_WORKERS": "3", "CSRUN_ROLE": "chief", "SLURM_PROCID": "0"})
    worker = resolve_role({"SLURM_JOB_ID": "42", "CSRUN_NUM_WORKERS": "3", "CSRUN_ROLE": "chief", "SLURM_PROCID": "2"})
    assert chief.is_rank_zero and chief.rendezvous_key == "42.0" and chief.world_size == 1
    assert (worker.kind, worker.worker_index, worker.streamer_index, worker.num_streamers) == ("worker", 1, 1, 3)


def test_layout_rules_of_several_ranks():
    spec = LayoutSpec(4, 2, 1, chief_input_cpus=1, chief_nodes=2, chief_tasks_per_node=2).check()
    assert spec.world_size == 4 and spec.num_input_workers == 8
    assert spec.to_flags()[-4:] == ["--chief-nodes", "2", "--chief-tasks-per-node", "2"]
    assert LayoutSpec.from_record(spec.record()) == spec
    with pytest.raises(CsrunError, match=r"^--total-nodes 5 --tasks-per-node 2: 6 input workers for 4 trainer "
                                         r"ranks; .*\(4, 8 would be\)$"):
        LayoutSpec(5, 2, 1, chief_nodes=2, chief_tasks_per_node=2).check()
    with pytest.raises(CsrunError, match="^--single-task-nodes 1: not with several trainer ranks"):
        LayoutSpec(4, 2, 1, single_task_nodes=1, chief_tasks_per_node=2).check()
    with pytest.raises(CsrunError, match="^--chief-nodes 2: must be less than --total-nodes 2"):
        LayoutSpec(2, 2, 1, chief_nodes=2).check()


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
