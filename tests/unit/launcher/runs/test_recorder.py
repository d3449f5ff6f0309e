"""launcher/runs/recorder.py through csrun_wse and csrun_cpu on canned Slurm (as
tests/unit/launcher/test_preflight.py): every launch but --dry-run writes one record (its command line,
layout, script or srun line, model_dir, job id); the typed options give back the command line."""
from __future__ import annotations

import sys

import pytest
from click.testing import CliRunner

from launcher import cli, slurm
from launcher.flags import CPU_OPTIONS, WSE_OPTIONS
from launcher.runs.api import wse_flags
from launcher.runs.record import RunStore, state_dir
from launcher.runs.recorder import flag_argv

NODES = [slurm.NodeInfo("node1", 2, "gpu:1", "idle", "batch")] + \
    [slurm.NodeInfo(f"node{i}", 2, "", "idle", "batch") for i in range(2, 6)]


@pytest.fixture()
def canned(monkeypatch, tmp_path):
    """Canned Slurm, the current directory ``tmp_path`` with a run.py, the index in tmp."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.chdir(tmp_path)
    for var in ("CSRUN_CONFIG", "CSRUN_LOG_DIR", "CSRUN_RUN_ID"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(slurm, "ping", lambda timeout=1.0, env=None: ("up", "UP"))
    monkeypatch.setattr(slurm, "list_nodes", lambda partition="", flag="--partition": list(NODES))
    monkeypatch.setattr(slurm, "slurm_release", lambda env=None: (22, 5, 8))
    for name in ("accounts", "qos_names"):
        monkeypatch.setattr(slurm, name, lambda env=None: None)
    monkeypatch.setattr(slurm, "reservations", lambda env=None: [])
    monkeypatch.setattr(slurm, "node_features", lambda partition="", env=None: [])
    monkeypatch.setattr(slurm, "submit_batch", lambda script, env=None: "42")
    monkeypatch.setattr(slurm, "run_foreground", lambda argv, env=None, **kw: 0)
    (tmp_path / "run.py").write_text("print('hi')\n")
    return RunStore(state_dir("", {"XDG_STATE_HOME": str(tmp_path / "state")}))


def test_an_sbatch_launch_is_recorded(canned, tmp_path):
    args = ["--use-sbatch", "--total-nodes", "3", "--tasks-per-node", "2", "--cpus-per-task", "1", "--time", "30",
            "python-ws", "run.py", "--mode", "train", "--model_dir", "md"]
    result = CliRunner().invoke(cli.csrun_wse, args, prog_name="csrun_wse")
    assert result.exit_code == 0 and result.stdout == "42\n", result.stderr
    [rec] = canned.all()
    assert f"csrun_wse: run {rec.run_id} (csrun status {rec.run_id})" in result.stderr
    assert rec.jobs == ["42"] and rec.path == "sbatch" and rec.kind == "csrun_wse"
    assert rec.model_dir == str(tmp_path / "md") and rec.time_limit_s == 1800
    assert rec.script.startswith("#!/bin/bash") and "--attempt-dir" in rec.script
    assert [(g["role"], g["ntasks"]) for g in rec.groups] == [("chief", 2), ("worker", 4)]
    assert rec.layout["nodes"] == 3 and rec.log_root == str(tmp_path / "csrun_logs")
    assert rec.argv == ["csrun_wse", "--total-nodes", "3", "--tasks-per-node", "2", "--cpus-per-task", "1", "--time",
                        "30", "--use-sbatch", "python-ws", "run.py", "--mode", "train", "--model_dir", "md"]
    assert not (tmp_path / "md").exists()  # the record does not make the run's model_dir


def test_dry_run_records_nothing_and_the_srun_path_records_its_launcher(canned, tmp_path, monkeypatch):
    CliRunner().invoke(cli.csrun_wse, ["--dry-run", "--use-sbatch", "python-ws", "run.py"], prog_name="csrun_wse")
    assert canned.all() == []
    monkeypatch.setenv("CSRUN_RUN_ID", "wse-1128-gvn2")  # as launch() sets it
    result = CliRunner().invoke(cli.csrun_cpu, ["--no-alloc-node", "python", "run.py"], prog_name="csrun_cpu")
    assert result.exit_code == 0, result.stderr
    [rec] = canned.all()
    assert rec.run_id == "wse-1128-gvn2" and rec.kind == "csrun_cpu" and rec.path == "srun"
    assert rec.srun_line.startswith("srun ") and rec.jobs == [] and rec.model_dir is None
    assert rec.launcher["exit"] == 0 and rec.launcher["pid"] > 0


@pytest.mark.parametrize("options", [
    {"nodes": 3, "tasks_per_node": 2, "use_sbatch": True, "requeue": True, "max_requeues": 2},
    {"requeue": False, "slurm_args": ("--mem=0", "--comment=x y"), "autoscale": True, "min_workers": 1},
    {"qos": "debug", "account": "research", "time": "10", "use_sbatch": True},
    {},
])
def test_typed_options_give_back_their_command_line(options):
    argv = flag_argv(WSE_OPTIONS, wse_flags(**options))
    seen = cli.csrun_wse.make_context("csrun_wse", [*argv, sys.executable, "run.py"]).params
    for name, value in options.items():
        assert seen[name] == value, (name, argv)


def test_cpu_flags_command_line():
    from launcher.flags import CpuFlags

    assert flag_argv(CPU_OPTIONS, CpuFlags(alloc_node=False, use_sbatch=True)) == ["--no-alloc-node", "--use-sbatch"]
