"""csrun_common/roles.py: a task's role from the environment csrun_wse sets
(docs/CONTRACT.md, "Role of a task"). Pure: no TensorFlow, no Slurm."""
from __future__ import annotations

import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from csrun_common.roles import Role, RoleError, resolve_role


def env(**kw):
    base = {"SLURM_JOB_ID": "42", "SLURM_STEP_ID": "0", "SLURMD_NODENAME": "node9"}
    base.update({k: str(v) for k, v in kw.items()})
    return base


def test_no_csrun_role_is_single_process_chief():
    r = resolve_role({})
    assert r.kind == "chief" and r.is_chief and r.single_process and r.in_process_input
    assert r.worker_index is None and r.num_input_workers == 0
    assert r.rendezvous_key is None


def test_chief_component_task0_is_chief():
    r = resolve_role(env(CSRUN_ROLE="chief", SLURM_PROCID=0, CSRUN_TASK_OFFSET=0,
                         CSRUN_WORKER_OFFSET=0, CSRUN_NUM_WORKERS=6, CSRUN_HET_GROUP=0))
    assert r.kind == "chief" and not r.single_process and not r.in_process_input
    assert r.num_input_workers == 6 and r.node == "node9"
    assert r.rendezvous_key == "42.0"


def test_chief_component_other_tasks_are_workers():
    # S = 0 layout: the chief's node runs T - 1 workers beside the chief.
    r = resolve_role(env(CSRUN_ROLE="chief", SLURM_PROCID=2, CSRUN_TASK_OFFSET=0,
                         CSRUN_WORKER_OFFSET=0, CSRUN_NUM_WORKERS=7))
    assert r.kind == "worker" and r.worker_index == 1


def test_single_task_component():
    r = resolve_role(env(CSRUN_ROLE="single-task", SLURM_PROCID=1, CSRUN_TASK_OFFSET=1,
                         CSRUN_WORKER_OFFSET=0, CSRUN_NUM_WORKERS=6, CSRUN_HET_GROUP=1))
    assert r.kind == "worker" and r.worker_index == 0 and r.het_group == 1


def test_single_task_component_with_two_tasks_is_refused():
    with pytest.raises(RoleError, match="single-task component has one task"):
        resolve_role(env(CSRUN_ROLE="single-task", SLURM_PROCID=2, CSRUN_TASK_OFFSET=1,
                         CSRUN_WORKER_OFFSET=0, CSRUN_NUM_WORKERS=6))


def test_worker_component_index_counts_from_offsets():
    # README layout: N=4, S=1, T=2 -> chief (task 0), workers 0..5 on tasks 1..6.
    for procid in range(1, 7):
        r = resolve_role(env(CSRUN_ROLE="worker", SLURM_PROCID=procid, CSRUN_TASK_OFFSET=1,
                             CSRUN_WORKER_OFFSET=0, CSRUN_NUM_WORKERS=6, CSRUN_HET_GROUP=1))
        assert r.kind == "worker" and r.worker_index == procid - 1
        assert r.describe() == f"input worker {procid - 1} on node9"


def test_chief_without_workers_reads_in_process():
    r = resolve_role(env(CSRUN_ROLE="chief", SLURM_PROCID=0, CSRUN_NUM_WORKERS=0))
    assert r.is_chief and r.in_process_input and not r.single_process


@pytest.mark.parametrize("kw,needle", [
    (dict(CSRUN_ROLE="boss", SLURM_PROCID=0, CSRUN_NUM_WORKERS=1), "CSRUN_ROLE='boss'"),
    (dict(CSRUN_ROLE="worker", CSRUN_NUM_WORKERS=1), "SLURM_PROCID is required"),
    (dict(CSRUN_ROLE="worker", SLURM_PROCID=1), "CSRUN_NUM_WORKERS is required"),
    (dict(CSRUN_ROLE="worker", SLURM_PROCID="x", CSRUN_NUM_WORKERS=1), "SLURM_PROCID='x' is not an integer"),
    (dict(CSRUN_ROLE="worker", SLURM_PROCID=0, CSRUN_TASK_OFFSET=1, CSRUN_NUM_WORKERS=1),
     "below CSRUN_TASK_OFFSET=1"),
    (dict(CSRUN_ROLE="worker", SLURM_PROCID=5, CSRUN_TASK_OFFSET=1, CSRUN_NUM_WORKERS=2),
     "outside [0, CSRUN_NUM_WORKERS=2)"),
    (dict(CSRUN_ROLE="worker", SLURM_PROCID=1, CSRUN_NUM_WORKERS=-1), "CSRUN_NUM_WORKERS=-1 must be >= 0"),
    (dict(CSRUN_ROLE="chief", SLURM_PROCID=0, CSRUN_NUM_WORKERS=1, CSRUN_CPUS_PER_TASK="two"),
     "CSRUN_CPUS_PER_TASK='two'"),
])
def test_invalid_environment_names_the_variable(kw, needle):
    with pytest.raises(RoleError) as info:
        resolve_role(env(**kw))
    assert needle in str(info.value)


def test_job_id_required_with_workers():
    e = env(CSRUN_ROLE="chief", SLURM_PROCID=0, CSRUN_NUM_WORKERS=2)
    del e["SLURM_JOB_ID"]
    with pytest.raises(RoleError, match="SLURM_JOB_ID is required"):
        resolve_role(e)


def test_other_variables_are_carried():
    r = resolve_role(env(CSRUN_ROLE="worker", SLURM_PROCID=3, CSRUN_TASK_OFFSET=1,
                         CSRUN_WORKER_OFFSET=0, CSRUN_NUM_WORKERS=4, CSRUN_CPUS_PER_TASK="2",
                         CSRUN_SHARD_PLAN="/p/plan.json", CSRUN_EXECUTION_MODE="weight_streaming",
                         CSRUN_ADVERTISE_HOST="10.0.0.7", SLURM_STEP_ID="3"))
    assert r.cpus_per_task == 2 and r.shard_plan == "/p/plan.json"
    assert r.execution_mode == "weight_streaming" and r.host == "10.0.0.7"
    assert r.rendezvous_key == "42.3"
    assert isinstance(r, Role)


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 6), s=st.integers(0, 5), t=st.integers(1, 4))
def test_every_layout_gives_each_worker_index_exactly_once(n, s, t):
    """Emulate csrun_wse's components for N nodes, S single-task nodes, T tasks per node and
    check that the chief is unique and the worker indices are exactly 0..W-1."""
    if s >= n and s > 0:
        return
    comps = []  # (component, ntasks)
    if s > 0:
        comps = [("chief", 1)] + [("single-task", 1)] * (s - 1)
        if n - s > 0:
            comps.append(("worker", (n - s) * t))
    else:
        comps = [("chief", t)] + ([("worker", (n - 1) * t)] if n > 1 else [])
    W = sum(k for _, k in comps) - 1
    procid = woff = 0
    kinds, indices = [], []
    for g, (comp, k) in enumerate(comps):
        for local in range(k):
            r = resolve_role(env(CSRUN_ROLE=comp, SLURM_PROCID=procid + local, CSRUN_TASK_OFFSET=procid,
                                 CSRUN_WORKER_OFFSET=woff, CSRUN_NUM_WORKERS=W, CSRUN_HET_GROUP=g))
            kinds.append(r.kind)
            if r.worker_index is not None:
                indices.append(r.worker_index)
        woff += k - 1 if comp == "chief" else k
        procid += k
    assert kinds.count("chief") == 1
    assert sorted(indices) == list(range(W))


def test_roles_does_not_import_tensorflow():
    import subprocess
    out = subprocess.run([sys.executable, "-c", "import sys, csrun_common.roles, "
                          "csrun_runtime.params, csrun_runtime; "
                          "print('tensorflow' in sys.modules)"], capture_output=True, text=True)
    assert out.stdout.strip() == "False", out.stderr

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
