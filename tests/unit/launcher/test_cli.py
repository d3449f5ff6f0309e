"""csrun_wse / csrun_cpu flags of issue 11 without a cluster: Slurm's answers are canned
(launcher.slurm's query functions replaced), so these run in the unit suite. The same
behaviour is checked on the real test cluster in tests/integration/test_prod_cluster.py.
launcher.cli: the job's secret (issue 45, docs/SECURITY.md) that csrun_wse makes for every
launch: in the environment srun or sbatch gets, the same across the srun path's relaunches,
never in argv, the batch script or the Launching line (Slurm's answers canned too)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from csrun_common.env import JOB_SECRET
from csrun_common.errors import SlurmUnavailable
from launcher import cli, resolve, slurm
from launcher.requeue import REQUEUE_EXIT
from tests.unit.canned_slurm import invoke

BIN = Path(sys.executable).parent


def test_dry_run_carries_policies_and_quiet_logging(cluster):
    code, out, err = invoke(cli.csrun_wse, ["--dry-run", "--total-nodes", "3", "--time", "90", "--slurm-arg=--mem=0",
                                            "python", "x.py"])
    assert code == 0, err
    assert out.count("--time=90") == 2 and out.count("--mem=0") == 2 and out.count("TF_CPP_MIN_LOG_LEVEL=1") == 2


def test_verbose_and_the_users_own_setting(cluster):
    _, out, _ = invoke(cli.csrun_wse, ["--dry-run", "--verbose", "python", "x.py"])
    assert "TF_CPP_MIN_LOG_LEVEL=0" in out
    cluster.setenv("CSRUN_VERBOSE", "1")
    assert "TF_CPP_MIN_LOG_LEVEL=0" in invoke(cli.csrun_wse, ["--dry-run", "python", "x.py"])[1]
    cluster.setenv("TF_CPP_MIN_LOG_LEVEL", "3")  # the user's own value travels with --export=ALL
    assert "TF_CPP_MIN_LOG_LEVEL" not in invoke(cli.csrun_wse, ["--dry-run", "python", "x.py"])[1]
    assert resolve.task_env(False, {}) == (("TF_CPP_MIN_LOG_LEVEL", "1"),)


def test_site_config_policies_and_flags_win(cluster, tmp_path):
    cfg = tmp_path / "site.toml"
    cfg.write_text('[slurm]\nqos = "normal"\ntime = "30"\nextra_args = ["--mem=0"]\n')
    cluster.setenv("CSRUN_CONFIG", str(cfg))
    _, out, _ = invoke(cli.csrun_cpu, ["--dry-run", "--time", "10", "--slurm-arg=--comment=x", "python", "x.py"])
    assert "--qos=normal" in out and "--time=10" in out and "--time=30" not in out
    assert out.index("--mem=0") < out.index("--comment=x")


def test_requeue_flags(cluster):
    code, out, err = invoke(cli.csrun_wse, ["--dry-run", "--use-sbatch", "--requeue", "--time", "2:00:00",
                                            "--max-requeues", "5", "--requeue-signal", "USR1@300", "python", "x.py"])
    assert code == 0, err
    assert "#SBATCH --signal=USR1@300" in out and "csrun_max_requeues=5" in out
    assert "CSRUN_STOP_SIGNALS=USR1:TERM" in out


@pytest.mark.parametrize("args,msg", [
    (["--time", "1:2:3:4"], "--time '1:2:3:4': not a Slurm time"),
    (["--requeue", "--max-requeues", "-1"], "--max-requeues -1: must be 0 or more"),
    (["--max-requeues", "2"], "--max-requeues 2: only with --requeue"),
    (["--requeue", "--time", "1"], "requeue.signal USR2@90: the lead time 90 s must be shorter"),
    (["--requeue", "--requeue-signal", "STOP@5"], "SIGSTOP cannot be the warning signal"),
    (["--slurm-arg=--ntasks=9"], "--slurm-arg '--ntasks=9': csrun sets --ntasks itself; use --tasks-per-node"),
    (["--reservation", "maint"], "--reservation 'maint': no such reservation in Slurm (reservations: none)"),
    (["--check", "--dry-run"], "--check with --dry-run: choose one"),
])
def test_bad_values_one_line_exit_2(cluster, args, msg):
    code, out, err = invoke(cli.csrun_wse, args + ["python", "x.py"])
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("csrun_wse: error: ") and msg in err, err


def test_unknown_qos_with_accounting(cluster):
    cluster.setattr(slurm, "qos_names", lambda env=None: ["debug", "normal"])
    code, _, err = invoke(cli.csrun_cpu, ["--qos", "fast", "python", "x.py"])
    assert code == 2 and "--qos 'fast': no such QOS in Slurm (QOS: debug, normal)" in err


def test_dry_run_without_a_controller(cluster):
    def down(partition="", flag="--partition"):
        raise SlurmUnavailable("sinfo did not answer in 5 s: is slurmctld running and reachable?")

    cluster.setattr(slurm, "list_nodes", down)
    code, out, err = invoke(cli.csrun_wse, ["--dry-run", "--total-nodes", "9", "--tasks-per-node", "2",
                                            "--cpus-per-task", "3", "python", "x.py"])
    assert code == 0 and out.startswith("srun ") and out.count("--cpus-per-task=3") == 2
    assert err.startswith("csrun_wse: note: sinfo did not answer") and "without checking" in err
    code, out, err = invoke(cli.csrun_wse, ["--dry-run", "python", "x.py"])
    assert code == 2 and "give --tasks-per-node and --cpus-per-task, or set defaults.node_cpus" in err
    code, out, err = invoke(cli.csrun_wse, ["--dry-run", "--single-task-nodes", "1", "--tasks-per-node", "2",
                                            "--cpus-per-task", "1", "python", "x.py"])
    assert code == 2 and "--single-task-nodes 1" in err and "defaults.node_cpus" in err
    code, out, err = invoke(cli.csrun_wse, ["python", "x.py"])  # a real launch needs the controller
    assert code == 2 and err.strip() == "csrun_wse: error: sinfo did not answer in 5 s: is slurmctld running and " \
                                        "reachable?"
    code, out, _ = invoke(cli.csrun_cpu, ["--dry-run", "--no-alloc-node", "python", "x.py"])
    assert code == 0 and "--cpus-per-task=1" in out


def test_dry_run_without_a_controller_uses_defaults_node_cpus(cluster, tmp_path):
    cluster.setattr(slurm, "list_nodes", lambda *a, **k: (_ for _ in ()).throw(SlurmUnavailable("down")))
    cfg = tmp_path / "site.toml"
    cfg.write_text("[defaults]\nnode_cpus = 8\n")
    cluster.setenv("CSRUN_CONFIG", str(cfg))
    code, out, _ = invoke(cli.csrun_wse, ["--dry-run", "--single-task-nodes", "1", "--total-nodes", "3",
                                          "--cpus-per-task", "2", "python", "x.py"])
    assert code == 0 and "--cpus-per-task=8" in out and out.count("--ntasks-per-node=4") == 1


def test_srun_path_requeue_relaunches_within_the_budget(cluster):
    calls = []

    def fake_run(argv, env=None, **_output):
        calls.append(env["CSRUN_REQUEUE_COUNT"])
        return REQUEUE_EXIT

    cluster.setattr(slurm, "run_foreground", fake_run)
    code, _, err = invoke(cli.csrun_wse, ["--requeue", "--max-requeues", "2", "python", "x.py"])
    assert code == REQUEUE_EXIT and calls == ["0", "1", "2"]
    assert err.count("Launching: srun ") == 3 and "retry budget spent (2 requeue(s), --max-requeues 2)" in err
    results = iter([REQUEUE_EXIT, 0])
    calls.clear()
    cluster.setattr(slurm, "run_foreground", lambda argv, env=None, **_: calls.append(1) or next(results))
    assert invoke(cli.csrun_wse, ["--requeue", "python", "x.py"])[0] == 0 and len(calls) == 2
    cluster.setattr(slurm, "run_foreground", lambda argv, env=None, **_: 130)  # Ctrl-C ends the loop
    assert invoke(cli.csrun_wse, ["--requeue", "python", "x.py"])[0] == 130


@pytest.mark.parametrize("prog", ["csrun_wse", "csrun_cpu", "cs_input_analyzer"])
def test_shell_completion(prog):
    var = f"_{prog.upper()}_COMPLETE"
    script = subprocess.run([str(BIN / prog)], env={**os.environ, var: "bash_source"}, capture_output=True,
                            text=True, timeout=60)
    assert script.returncode == 0 and "complete -o nosort -F" in script.stdout and prog in script.stdout
    env = {**os.environ, var: "bash_complete", "COMP_WORDS": f"{prog} --ver", "COMP_CWORD": "1"}
    words = subprocess.run([str(BIN / prog)], env=env, capture_output=True, text=True, timeout=60)
    assert "plain,--version" in words.stdout.splitlines(), words.stdout


def test_completion_of_requeue_flags():
    env = {**os.environ, "_CSRUN_WSE_COMPLETE": "bash_complete", "COMP_WORDS": "csrun_wse --requeue-s",
           "COMP_CWORD": "1"}
    words = subprocess.run([str(BIN / "csrun_wse")], env=env, capture_output=True, text=True, timeout=60)
    assert words.stdout.splitlines() == ["plain,--requeue-signal"]


def test_cli_exports_the_setting_and_refuses_bounds_without_autoscale(cluster):
    code, out, err = invoke(cli.csrun_wse, ["--dry-run", "--total-nodes", "3", "--tasks-per-node", "2",
                                            "--autoscale", "--max-workers", "4", "--autoscale-policy", "step",
                                            "python", "x.py"])
    assert code == 0, err
    assert out.count("CSRUN_AUTOSCALE=1:1:4:step:10,") == 2
    code, out, err = invoke(cli.csrun_wse, ["--dry-run", "--max-workers", "4", "python", "x.py"])
    assert code == 2 and err.strip() == "csrun_wse: error: --max-workers 4: needs --autoscale" and not out
    code, _, err = invoke(cli.csrun_wse, ["--dry-run", "--total-nodes", "2", "--tasks-per-node", "1",
                                          "--autoscale", "--max-workers", "3", "python", "x.py"])
    assert code == 2 and err.strip().startswith("csrun_wse: error: --max-workers 3: the layout has only 1")
    code, out, _ = invoke(cli.csrun_wse, ["--dry-run", "--total-nodes", "3", "python", "x.py"])
    assert code == 0 and "CSRUN_AUTOSCALE" not in out


HEX64 = re.compile(r"^[0-9a-f]{64}$")


def test_each_srun_launch_gets_a_fresh_secret_in_its_environment_only(cluster):  # noqa: F811
    cluster.setenv(JOB_SECRET.name, "ab" * 32)  # an inherited one is replaced
    launches = []
    cluster.setattr(slurm, "run_foreground", lambda argv, env=None, **_: launches.append((argv, env)) or 0)
    for _ in range(2):
        code, out, err = invoke(cli.csrun_wse, ["--total-nodes", "3", "python", "x.py"])
        assert code == 0, err
    secrets = [env[JOB_SECRET.name] for _, env in launches]
    assert all(HEX64.match(s) for s in secrets) and len(set(secrets)) == 2 and "ab" * 32 not in secrets
    for (argv, _), s in zip(launches, secrets, strict=True):
        assert not any(s in a for a in argv) and JOB_SECRET.name not in " ".join(argv)
    assert "Launching: srun " in err and secrets[1] not in err + out and JOB_SECRET.name not in err


def test_the_srun_paths_relaunches_keep_the_runs_secret(cluster):  # noqa: F811
    results, seen = iter([REQUEUE_EXIT, 0]), []
    cluster.setattr(slurm, "run_foreground", lambda argv, env=None, **_: seen.append(env[JOB_SECRET.name])
                    or next(results))
    assert invoke(cli.csrun_wse, ["--requeue", "python", "x.py"])[0] == 0
    assert len(seen) == 2 and seen[0] == seen[1]


def test_sbatch_gets_the_secret_in_its_environment_not_in_the_script(cluster):  # noqa: F811
    submitted = []
    cluster.setattr(slurm, "submit_batch", lambda script, env=None: submitted.append((script, env)) or "42")
    code, out, err = invoke(cli.csrun_wse, ["--use-sbatch", "--requeue", "--total-nodes", "3", "python", "x.py"])
    assert code == 0 and out.strip() == "42", err
    ((script, env),) = submitted
    assert HEX64.match(env[JOB_SECRET.name]) and env[JOB_SECRET.name] not in script
    assert JOB_SECRET.name not in script  # Slurm keeps the submitting environment for every requeue
    code, out, _ = invoke(cli.csrun_wse, ["--use-sbatch", "--dry-run", "python", "x.py"])
    assert code == 0 and JOB_SECRET.name not in out
