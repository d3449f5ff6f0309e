"""Several trainer ranks in the launcher (docs/MULTI-RANK.md), across csrun_common/layout.py,
launcher/layout.py, launcher/builders.py and launcher/cli.py: the plan's shapes, the tasks'
environment, the srun and sbatch text, and the original layouts kept byte for byte."""
from __future__ import annotations

import hashlib
import itertools

import pytest

from csrun_common.errors import CsrunError
from csrun_common.layout import LayoutSpec
from launcher import cli, slurm
from launcher.builders import WseRequest, expand_python_word
from launcher.layout import plan
from launcher.requeue import RequeueSpec
from tests.unit.canned_slurm import invoke
from tests.unit.golden import assert_golden

PY = "/opt/venv/bin/python"


def original_layouts() -> list[LayoutSpec]:
    """360 layouts of the original flags (no ranks): N 1..6, every S < N up to 2, T 1..3,
    C given or not, with and without the chief's input CPUs, block and cyclic."""
    out = []
    for n, t, c, own, cyc in itertools.product(range(1, 7), (1, 2, 3), (None, 1), (0, 1), (False, True)):
        for s in range(min(n, 3)):
            out.append(LayoutSpec(n, t, c, s, own, cyc))
    return out


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _original_line(spec: LayoutSpec) -> str:
    name = " ".join(spec.to_flags()) + (" (sbatch with --requeue)" if spec.nodes % 2 else "")
    try:
        lay = plan(spec, "gpu:1", node_cpus=4)
    except CsrunError as exc:
        return f"{name}: {exc}"
    cmd, mode = expand_python_word(("python-ws", "run.py", "--mode", "train"), PY)
    req = WseRequest(layout=lay, command=tuple(cmd), python=PY, execution_mode=mode, exclude_node="node1",
                     requeue=RequeueSpec.parse("USR1@60", 2) if spec.nodes % 2 else None)
    return f"{name}: srun {_digest(req.srun_line())} sbatch {_digest(req.materialize_sbatch())}"


def test_the_360_original_layouts_are_byte_identical():
    specs = original_layouts()
    assert len(specs) == 360
    assert_golden("wse_original_layouts.sha256", "".join(_original_line(s) + "\n" for s in specs))


def ranks_request(n, t, c, chief_nodes, ranks, own=0, cyclic=False, gres="gpu:1", node_cpus=8, **kw):
    spec = LayoutSpec(n, t, c, 0, own, cyclic, chief_nodes, ranks)
    cmd, mode = expand_python_word(("python-pt", "run.py", "--mode", "train"), PY)
    return WseRequest(layout=plan(spec, gres, node_cpus), command=tuple(cmd), python=PY, execution_mode=mode,
                      exclude_node="node1", **kw)


def shape(layout):
    return [(c.role, c.nodes, c.tasks_per_node, c.cpus_per_task, c.gres, c.exclusive, c.distribution,
             c.task_offset, c.worker_offset) for c in layout.components]


def test_ranks_plan_chief_nodes_of_ranks_then_the_input_workers():
    lay = plan(LayoutSpec(6, 2, 1, chief_nodes=2, chief_tasks_per_node=2), "gpu:1", node_cpus=8)
    assert shape(lay) == [("chief", 2, 2, 4, "gpu:2", True, "block", 0, 0),
                          ("worker", 4, 2, 1, "", True, "block", 4, 0)]
    assert (lay.world_size, lay.local_world_size, lay.num_tasks, lay.num_input_workers) == (4, 2, 12, 8)
    assert [c.num_input_workers for c in lay.components] == [0, 8]


def test_ranks_plan_with_each_ranks_own_input_worker_and_cyclic():
    spec = LayoutSpec(4, 2, 1, 0, 1, True, 2, 2)
    lay = plan(spec, "", node_cpus=2)
    assert shape(lay) == [("chief", 2, 2, 1, "", True, "block", 0, 0),
                          ("worker", 2, 2, 1, "", True, "cyclic", 4, 4)]  # rank r's own worker is r
    assert lay.num_input_workers == spec.num_input_workers == 8
    alone = plan(LayoutSpec(2, 2, 1, 0, 1, False, 2, 2), "gpu:1", node_cpus=2)  # the ranks' own workers only
    assert shape(alone) == [("chief", 2, 2, 1, "gpu:2", True, "block", 0, 0)] and alone.num_input_workers == 4


def test_one_node_of_four_ranks_scales_the_gres():
    lay = plan(LayoutSpec(3, 2, 1, chief_tasks_per_node=4), "gpu:1", node_cpus=16)
    assert shape(lay)[0] == ("chief", 1, 4, 4, "gpu:4", True, "block", 0, 0)
    assert (lay.world_size, lay.local_world_size) == (4, 4)


def test_more_ranks_than_a_nodes_cpus_is_refused():
    with pytest.raises(CsrunError, match="--chief-tasks-per-node 4: more trainer ranks than the 2 CPUs of a node"):
        plan(LayoutSpec(3, 2, 1, chief_tasks_per_node=4), "", node_cpus=2)


def test_scale_gres():
    from launcher.layout import scale_gres
    assert [scale_gres(g, 4) for g in ("gpu:1", "gpu:a100:2", "gpu", "")] == ["gpu:4", "gpu:a100:8", "gpu:4", ""]
    assert scale_gres("gpu:2", 1) == "gpu:2"


def test_ranks_env_on_every_component_and_the_master_port():
    req = ranks_request(4, 2, 1, 2, 2, own=1, node_cpus=2, master_port=29400)
    envs = [dict(req.component_env(c)) for c in req.layout.components]
    for env in envs:
        assert (env["CSRUN_WORLD_SIZE"], env["CSRUN_LOCAL_WORLD_SIZE"], env["CSRUN_MASTER_PORT"]) == ("4", "2", "29400")
        assert env["CSRUN_NUM_WORKERS"] == "8" and env["CSRUN_NUM_TASKS"] == "8"
    assert envs[0]["CSRUN_CHIEF_INPUT_CPUS"] == "1" and "CSRUN_CHIEF_INPUT_CPUS" not in envs[1]
    assert envs[1]["CSRUN_WORKER_OFFSET"] == "4"
    derived = dict(ranks_request(4, 2, 1, 2, 2, own=1, node_cpus=2).component_env(req.layout.components[0]))
    assert "CSRUN_MASTER_PORT" not in derived  # 0: each rank derives it from the job id
    one = WseRequest(layout=plan(LayoutSpec(3, 2, 1), "gpu:1", 2), command=("x",), python=PY, master_port=29400)
    assert not any(k in dict(one.component_env(c)) for c in one.layout.components
                   for k in ("CSRUN_WORLD_SIZE", "CSRUN_LOCAL_WORLD_SIZE", "CSRUN_MASTER_PORT"))


def test_the_task_log_names_the_ranks_group():
    groups = ranks_request(6, 2, 1, 2, 2).task_output().groups
    assert [(g.role, g.first_task, g.ntasks) for g in groups] == [("rank", 0, 4), ("worker", 4, 8)]
    assert groups[0].role_of(3) == "rank"


RANK_GOLDENS = [
    ("wse_ranks_2x2_own", dict(n=4, t=2, c=1, chief_nodes=2, ranks=2, own=1, node_cpus=2)),
    ("wse_ranks_1x4_gpu", dict(n=3, t=2, c=1, chief_nodes=1, ranks=4, node_cpus=16)),
    ("wse_ranks_2x4_cyclic", dict(n=4, t=4, c=2, chief_nodes=2, ranks=4, cyclic=True, node_cpus=8)),
]


@pytest.mark.parametrize("name,kw", RANK_GOLDENS)
def test_ranks_srun_golden(name, kw):
    assert_golden(f"{name}.srun.txt", ranks_request(**kw).srun_line() + "\n")


@pytest.mark.parametrize("name,kw", RANK_GOLDENS)
def test_ranks_sbatch_golden(name, kw):
    req = ranks_request(**kw, requeue=RequeueSpec.parse("USR2@90", 3) if "cyclic" in name else None)
    assert_golden(f"{name}.sbatch", req.materialize_sbatch())


RANK_FLAGS = ["--total-nodes", "4", "--tasks-per-node", "2", "--cpus-per-task", "1", "--chief-nodes", "2",
              "--chief-tasks-per-node", "2", "--chief-input-cpus", "1"]


@pytest.fixture()
def no_gres(cluster, tmp_path):
    """The canned cluster with a site config whose gres.resource is empty; launches recorded."""
    cfg = tmp_path / "site.toml"
    cfg.write_text('[gres]\nresource = ""\n[ranks]\nmaster_port = 29400\n')
    cluster.setenv("CSRUN_CONFIG", str(cfg))
    launched: list = []
    cluster.setattr(slurm, "run_foreground", lambda *a, **k: launched.append(a) or 0)
    cluster.setattr(slurm, "submit_batch", lambda *a, **k: launched.append(a) or "1")
    return launched


def test_dry_run_prints_the_ranks_srun_line(no_gres):
    code, out, err = invoke(cli.csrun_wse, ["--dry-run", *RANK_FLAGS, "python", "x.py"])
    assert code == 0, err
    chief, workers = out.strip().split(" : ")
    assert "--nodes=2 --ntasks=4 --ntasks-per-node=2 --cpus-per-task=1 --exclusive --distribution=block" in chief
    assert "--gres" not in out and "--exclude=node1" in workers and "--exclude" not in chief
    for part in (chief, workers):
        assert "CSRUN_WORLD_SIZE=4,CSRUN_LOCAL_WORLD_SIZE=2,CSRUN_MASTER_PORT=29400" in part
    assert "CSRUN_WORKER_OFFSET=4" in workers and no_gres == []
    code, out, _ = invoke(cli.csrun_wse, ["--dry-run", "--use-sbatch", *RANK_FLAGS, "python", "x.py"])
    assert code == 0 and "8 task(s): 4 trainer ranks + 8 input worker(s)" in out and "--het-group=1" in out


@pytest.mark.parametrize("args,msg", [
    (["--survive-node-loss"], "--survive-node-loss with --chief-nodes 2 --chief-tasks-per-node 2: not yet"),
    (["--autoscale", "--max-workers", "3"], "--max-workers 3: the layout has only 2 input-worker task(s); raise "
                                            "--total-nodes or --tasks-per-node (per trainer rank: 8 input workers "
                                            "for 4 ranks"),
    # the partition is known: the refusal names a layout that fits it, not worker counts (issue 44)
    (["--total-nodes", "3", "--chief-input-cpus", "0"], "--total-nodes 3 --tasks-per-node 2: 2 input workers for 4 "
                                                        "trainer ranks; they must be a multiple of the world size; "
                                                        "a layout of 4 trainer ranks that fits the partition: "
                                                        "--total-nodes 4 --tasks-per-node 2 --cpus-per-task 1 "
                                                        "--chief-nodes 2 --chief-tasks-per-node 2\n"),
    (["--chief-nodes", "5"], "--chief-nodes 5: must be less than --total-nodes 4"),
    (["--tasks-per-node", "1"], "--total-nodes 4 --tasks-per-node 1: 6 input workers for 4 trainer ranks; they must "
                                "be a multiple of the world size; a layout of 4 trainer ranks that fits the "
                                "partition: --total-nodes 4 --tasks-per-node 2 --cpus-per-task 1 "
                                "--chief-input-cpus 1 --chief-nodes 2 --chief-tasks-per-node 2\n"),
    (["--single-task-nodes", "1"], "--single-task-nodes 1: not with several trainer ranks"),
])
def test_bad_rank_values_one_line_exit_2_nothing_submitted(no_gres, args, msg):
    code, out, err = invoke(cli.csrun_wse, [*RANK_FLAGS, *args, "python", "x.py"])
    assert code == 2 and out == "" and no_gres == []
    assert err.count("\n") == 1 and err.startswith("csrun_wse: error: ") and msg in err, err


def test_the_partition_must_hold_the_ranks_gres_and_the_workers_nodes(cluster):
    code, _, err = invoke(cli.csrun_wse, [*RANK_FLAGS, "python", "x.py"])  # gres.resource gpu:1, on node1 only
    assert code == 2 and err.count("\n") == 1
    assert "--chief-nodes 2 --chief-tasks-per-node 2: 2 node(s) with 2 × gres.resource 'gpu:1' needed, the " \
           "partition has 0; no layout of 4 trainer ranks finds that GRES: to train the ranks on CPU nodes without " \
           "GRES, set gres.resource = \"\" in the site config ($CSRUN_CONFIG; docs/MULTI-RANK.md \"On CPU nodes\")" \
           in err


def test_autoscale_bounds_count_each_ranks_workers(no_gres):
    code, out, err = invoke(cli.csrun_wse, ["--dry-run", *RANK_FLAGS, "--autoscale", "--min-workers", "1",
                                            "python", "x.py"])
    assert code == 0, err
    assert "CSRUN_AUTOSCALE=1:1:2:" in out  # initial:min:max of each rank's 2 input workers


def test_time_and_requeue_reach_both_groups_of_ranks(no_gres):
    code, out, err = invoke(cli.csrun_wse, ["--dry-run", "--time", "10", "--requeue", "--requeue-signal", "USR2@60",
                                            *RANK_FLAGS, "python", "x.py"])
    assert code == 0, err
    assert out.count("--time=10") == 2 and out.count("--signal=") == 2 and out.count("CSRUN_STOP_SIGNALS=") == 2
    code, out, err = invoke(cli.csrun_wse, ["--dry-run", "--use-sbatch", "--time", "10", "--requeue",
                                            "--requeue-signal", "USR2@60", *RANK_FLAGS, "python", "x.py"])
    assert code == 0, err
    assert out.count("#SBATCH --time=10") == 2 and out.count("#SBATCH --requeue") == 2 and "scontrol requeue" in out
