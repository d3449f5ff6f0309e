"""csrun_wse and csrun_cpu launching real jobs on the Slurm test cluster.

Every task runs tests/fixtures/report_task.py, which writes what it sees (node, het
group, rank, role, CPUs, argv) to a JSON file; the tests read those files.
"""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.cluster

REPORT = str(Path(__file__).resolve().parent.parent / "fixtures" / "report_task.py")
BIN = Path(sys.executable).parent
HOSTILE = ["a b", "it's", '"dq"', "$(touch pwned)", "`id`", "x; rm -rf /tmp/nope", "new\nline",
           "ünïcödé ✓", "--leading-dash", "-n", "*", "back\\slash", "", "tab\there", "a:b"]


def run(cli, args, env, cwd=None, timeout=120):
    return subprocess.run([str(BIN / cli), *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def reports(outdir: Path) -> list[dict]:
    return sorted((json.loads(p.read_text()) for p in outdir.glob("task-*.json")), key=lambda r: r["procid"])


def all_job_ids(env, workdir: Path | None = None) -> set[str]:
    """Ids of every job squeue still knows (any state), optionally only those submitted
    from ``workdir`` (so that jobs of other users of the cluster do not interfere)."""
    out = subprocess.run(["squeue", "--noheader", "--states=all", "--format=%i|%Z"], env=env,
                         capture_output=True, text=True, check=True).stdout
    ids = set()
    for line in out.splitlines():
        job, _, wd = line.partition("|")
        if workdir is None or Path(wd) == Path(workdir):
            ids.add(job)
    return ids


def wait_job_done(job_id: str, env, timeout=120.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        out = subprocess.run(["squeue", "--noheader", "--format=%i", f"--jobs={job_id}"], env=env,
                             capture_output=True, text=True).stdout
        if not out.strip():
            return
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} still in squeue after {timeout} s")


def test_wse_srun_single_task_layout(cli_env, tmp_path):
    proc = run("csrun_wse", ["--total-nodes", "4", "--single-task-nodes", "1", "--tasks-per-node", "2",
                             "python-ws", REPORT, str(tmp_path)], cli_env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.startswith("Launching: srun ")
    recs = reports(tmp_path)
    assert [r["procid"] for r in recs] == list(range(7))  # S + (N−S)·T = 1 + 3·2
    chief = recs[0]
    # In a het step Slurm 22.05 gives every task the *last* component's SLURM_CPUS_PER_TASK,
    # so the per-component value travels in CSRUN_CPUS_PER_TASK.
    assert (chief["node"], chief["role"], chief["het_group"], chief["csrun_cpus_per_task"]) == \
        ("node1", "chief", "0", "2")
    workers = recs[1:]
    assert all(r["role"] == "worker" and r["het_group"] == "1" for r in workers)
    assert all(r["node"] != "node1" for r in workers)
    assert len({r["node"] for r in workers}) == 3
    assert all(r["execution_mode"] == "weight_streaming" and r["num_workers"] == "6" for r in recs)
    assert all(r["csrun_cpus_per_task"] == "1" for r in workers)
    assert len({r["job_id"] for r in recs}) == 1


@pytest.mark.parametrize("cyclic", [False, True])
def test_wse_block_and_cyclic_distribution(cli_env, tmp_path, cyclic):
    args = ["--total-nodes=3", "--tasks-per-node=2", "--cpus-per-task=1"] + (["--cyclic"] if cyclic else [])
    proc = run("csrun_wse", args + ["python", REPORT, str(tmp_path)], cli_env)
    assert proc.returncode == 0, proc.stderr
    recs = reports(tmp_path)
    assert len(recs) == 6
    assert recs[0]["role"] == "chief" and recs[0]["node"] == "node1"
    assert recs[1]["role"] == "chief" and recs[1]["node"] == "node1"  # task 1 of het group 0: an input worker
    assert recs[0]["execution_mode"] is None
    w = [r["node"] for r in recs[2:]]
    if cyclic:
        assert w[0] == w[2] and w[1] == w[3] and w[0] != w[1]
    else:
        assert w[0] == w[1] and w[2] == w[3] and w[0] != w[2]


def test_wse_sbatch_runs_the_same_layout(cli_env, tmp_path):
    proc = run("csrun_wse", ["--use-sbatch", "--total-nodes", "3", "--single-task-nodes", "2",
                             "python-ws", REPORT, str(tmp_path)], cli_env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.strip()
    assert job_id.isdigit()
    wait_job_done(job_id, cli_env)
    recs = reports(tmp_path)
    assert [(r["role"], r["het_group"]) for r in recs] == [("chief", "0"), ("single-task", "1"), ("worker", "2"),
                                                           ("worker", "2")]
    assert recs[0]["node"] == "node1" and len({r["node"] for r in recs}) == 3
    assert (tmp_path / f"csrun_wse-{job_id}.out").exists()


@pytest.mark.parametrize("use_sbatch", [False, True])
def test_hostile_argv_is_byte_exact_at_every_task(cli_env, tmp_path, use_sbatch):
    out = tmp_path / "it's a $(dir)"
    out.mkdir()
    args = ["--total-nodes", "2", "--tasks-per-node", "2"] + (["--use-sbatch"] if use_sbatch else [])
    proc = run("csrun_wse", args + ["python", REPORT, str(out), *HOSTILE, ":"], cli_env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    if use_sbatch:
        wait_job_done(proc.stdout.strip(), cli_env)
    recs = reports(out)
    assert len(recs) == 4
    for r in recs:
        assert r["argv"] == HOSTILE + [":"]
    assert not Path("pwned").exists() and not (tmp_path / "pwned").exists()


def test_csrun_cpu_takes_a_whole_cpu_node(cli_env, tmp_path):
    proc = run("csrun_cpu", ["python", REPORT, str(tmp_path), *HOSTILE], cli_env)
    assert proc.returncode == 0, proc.stderr
    (rec,) = reports(tmp_path)
    assert rec["node"] != "node1"
    assert rec["slurm_cpus_per_task"] == "2"  # all the CPUs of a test node
    assert rec["argv"] == HOSTILE


def test_csrun_cpu_sbatch(cli_env, tmp_path):
    proc = run("csrun_cpu", ["--use-sbatch", "--no-alloc-node", "python", REPORT, str(tmp_path), "x y"], cli_env,
               cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    wait_job_done(proc.stdout.strip(), cli_env)
    (rec,) = reports(tmp_path)
    assert rec["node"] != "node1" and rec["slurm_cpus_per_task"] == "1" and rec["argv"] == ["x y"]


@pytest.mark.parametrize("cli,args", [
    ("csrun_wse", ["--total-nodes", "2"]),
    ("csrun_cpu", []),
])
def test_exit_status_propagates(cli_env, tmp_path, cli, args):
    env = dict(cli_env, REPORT_TASK_EXIT="3", REPORT_TASK_FAIL_RANK="0")
    proc = run(cli, args + ["python", REPORT, str(tmp_path)], env)
    assert proc.returncode == 3, proc.stderr


def test_sigint_leaves_nothing_in_squeue(cli_env, tmp_path):
    before = all_job_ids(cli_env)
    proc = subprocess.Popen([str(BIN / "csrun_wse"), "--total-nodes", "2", "sleep", "300"], env=cli_env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    new = set()
    while time.time() < deadline and not new:
        out = subprocess.run(["squeue", "--noheader", "--states=RUNNING", "--format=%i"], env=cli_env,
                             capture_output=True, text=True).stdout.split()
        new = set(out) - before
        time.sleep(0.3)
    assert new, "the job never started"
    proc.send_signal(signal.SIGINT)
    t0 = time.time()
    while time.time() - t0 < 10:
        out = subprocess.run(["squeue", "--noheader", "--format=%i"], env=cli_env, capture_output=True,
                             text=True).stdout.split()
        if not set(out) & new:
            break
        time.sleep(0.2)
    else:
        pytest.fail(f"jobs {new} still in squeue 10 s after SIGINT")
    assert proc.wait(timeout=20) != 0


def _bad_conf(tmp_path: Path, conf: Path) -> Path:
    text = conf.read_text()
    bad = tmp_path / "unreachable.conf"
    import re
    bad.write_text(re.sub(r"SlurmctldPort=\d+", "SlurmctldPort=1", text))
    return bad


@pytest.mark.parametrize("case", [
    "zero_nodes", "negative_tasks", "non_integer_cpus", "single_ge_total", "t_times_c_over_node",
    "missing_command", "unknown_partition", "unknown_option", "too_many_nodes", "bad_config",
    "no_slurmctld", "plan_for_other_worker_count",
])
def test_bad_input_one_line_exit_2_nothing_submitted(cli_env, tmp_path, slurm_cluster, case):
    env = dict(cli_env)
    base = ["python", REPORT, str(tmp_path)]
    args = {
        "zero_nodes": ["--total-nodes", "0"] + base,
        "negative_tasks": ["--tasks-per-node=-2"] + base,
        "non_integer_cpus": ["--cpus-per-task", "two"] + base,
        "single_ge_total": ["--total-nodes", "2", "--single-task-nodes", "2"] + base,
        "t_times_c_over_node": ["--tasks-per-node", "2", "--cpus-per-task", "2"] + base,
        "missing_command": ["--total-nodes", "2"],
        "unknown_partition": ["--partition", "nosuch"] + base,
        "unknown_option": ["--totl-nodes", "2"] + base,
        "too_many_nodes": ["--total-nodes", "99"] + base,
        "bad_config": base,
        "no_slurmctld": base,
        "plan_for_other_worker_count": ["--total-nodes", "2", "--shard-plan", str(tmp_path / "plan.json")] + base,
    }[case]
    expect = {
        "zero_nodes": "--total-nodes", "negative_tasks": "--tasks-per-node", "non_integer_cpus": "--cpus-per-task",
        "single_ge_total": "--single-task-nodes 2", "t_times_c_over_node": "--cpus-per-task 2",
        "missing_command": "COMMAND", "unknown_partition": "nosuch", "unknown_option": "--totl-nodes",
        "too_many_nodes": "--total-nodes 99", "bad_config": "defaults.nodez", "no_slurmctld": "slurmctld",
        "plan_for_other_worker_count": "--shard-plan",
    }[case]
    if case == "bad_config":
        cfg = tmp_path / "bad.toml"
        cfg.write_text("[defaults]\nnodez = 2\n")
        env["CSRUN_CONFIG"] = str(cfg)
    if case == "no_slurmctld":
        env["SLURM_CONF"] = str(_bad_conf(tmp_path, slurm_cluster["conf"]))
    if case == "plan_for_other_worker_count":
        (tmp_path / "plan.json").write_text(json.dumps({
            "version": 1, "num_workers": 9, "total_bytes": 1, "total_records": None, "imbalance": 1.0,
            "workers": [{"index": i, "files": [f"f{i}"], "bytes": 1, "records": None, "shuffle_seed": i}
                        for i in range(9)],
            "warnings": []}))
    before = all_job_ids(cli_env, tmp_path)
    proc = run("csrun_wse", args, env, cwd=tmp_path, timeout=90)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("csrun_wse: error: ") and expect in lines[0], lines[0]
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert all_job_ids(cli_env, tmp_path) == before == set()
    assert not list(tmp_path.glob("task-*.json"))


def test_csrun_cpu_bad_config_and_show_config(cli_env, tmp_path):
    cfg = tmp_path / "site.toml"
    cfg.write_text('[container]\nruntime = "singularity"\nimage = "/img/x.sif"\n')
    env = dict(cli_env, CSRUN_CONFIG=str(cfg))
    proc = run("csrun_cpu", ["--show-config"], env)
    assert proc.returncode == 0
    assert f'container.runtime = "singularity"  # {cfg}' in proc.stdout
    assert "defaults.nodes = 2  # embedded default" in proc.stdout
    cfg.write_text("[container]\nruntime = 3\n")
    proc = run("csrun_cpu", ["python", "-c", "pass"], env)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "container.runtime" in proc.stderr


def test_dry_run_prints_the_exact_line_and_submits_nothing(cli_env, tmp_path):
    import shlex

    proc = run("csrun_wse", ["--total-nodes", "3", "--cyclic", "--dry-run", "python", REPORT, str(tmp_path), *HOSTILE],
               cli_env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    argv = shlex.split(proc.stdout)
    assert argv[0] == "srun" and argv.count(":") == 1
    assert all_job_ids(cli_env, tmp_path) == set()
    # and running that very line does what csrun_wse would do
    subprocess.run(argv, env=cli_env, check=True, capture_output=True, timeout=120)
    recs = reports(tmp_path)
    assert len(recs) == 6 and all(r["argv"] == HOSTILE for r in recs)


def test_check_accepts_the_shape_of_several_trainer_ranks(cli_env, tmp_path):
    """Slurm takes het group 0 of 2 nodes × 2 trainer ranks and 4 input workers on 2 more nodes
    (docs/MULTI-RANK.md), on the srun and the sbatch path; --test-only submits nothing (~2 s)."""
    cfg = tmp_path / "site.toml"
    cfg.write_text('[gres]\nresource = ""\n')  # the test cluster has gpu:1 on node1 only
    env = dict(cli_env, CSRUN_CONFIG=str(cfg))
    layout = ["--total-nodes", "4", "--tasks-per-node", "2", "--cpus-per-task", "1", "--chief-nodes", "2",
              "--chief-tasks-per-node", "2", "--chief-input-cpus", "1"]
    for path, tool in (([], "srun"), (["--use-sbatch"], "sbatch")):
        proc = run("csrun_wse", ["--check", *path, *layout, "python", REPORT, str(tmp_path)], env, cwd=tmp_path)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert proc.stdout.startswith("csrun_wse --check: the job can run\n"), proc.stdout
        assert f"{tool} --test-only: expected start" in proc.stdout
    assert all_job_ids(cli_env, tmp_path) == set() and not list(tmp_path.glob("task-*.json"))
