"""Job accounting on the Slurm test cluster: slurmdbd with MariaDB, started by
``slurm-test-cluster/cluster up``.

What the cluster promises (docs/TESTING.md, "The Slurm test cluster"): ``sacct`` reports a finished
job's state and exit code; Slurm itself refuses an unknown account or QOS
(``AccountingStorageEnforce=associations,limits,qos``); the accounts ``csrun`` (root's
default) and ``research`` and the QOS ``normal`` (root's default) and ``debug`` (at most
10 minutes, longer jobs refused at submission) exist.
"""
from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

pytestmark = pytest.mark.cluster

BIN = Path(sys.executable).parent
FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED"}
FIELDS = ["JobID", "JobName", "State", "ExitCode", "Account", "QOS"]


@pytest.fixture()
def env(accounting_cluster) -> dict:
    return dict(accounting_cluster["env"])


def unique(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


def sacct_jobs(selector: list[str], env: dict, expect: int = 1, timeout: float = 30.0) -> list[dict]:
    """The allocation rows (``sacct -X``) chosen by ``selector`` (e.g. ``["-j", "12"]``),
    once ``expect`` of them are in a final state with their QOS known. slurmctld sends job
    records to slurmdbd asynchronously: a job that just ended may show as PENDING for a
    moment, and its QOS as "Unknown" for a second or two more (seen on Slurm 22.05)."""
    deadline = time.monotonic() + timeout
    rows: list[dict] = []
    while time.monotonic() < deadline:
        out = subprocess.run(["sacct", "-X", "-n", "-P", "-a", "-S", "now-1hour", "-o", ",".join(FIELDS), *selector],
                             env=env, capture_output=True, text=True, check=True).stdout
        rows = [dict(zip(FIELDS, line.split("|"), strict=True)) for line in out.splitlines() if line.strip()]
        if len(rows) >= expect and all(r["State"].split()[0] in FINAL and r["QOS"] != "Unknown" for r in rows):
            return rows
        time.sleep(0.5)
    raise AssertionError(f"sacct {selector}: {rows} after {timeout} s (expected {expect} finished)")


def sbatch_wait(args: list[str], env: dict, tmp_path: Path) -> tuple[str, int]:
    """Submit a batch job, wait for its end (``sbatch --wait``); returns (job id, sbatch's exit status)."""
    proc = subprocess.run(["sbatch", "--parsable", "--wait", f"--output={tmp_path}/%j.out", *args],
                          env=env, capture_output=True, text=True, timeout=120)
    return proc.stdout.strip().split(";")[0], proc.returncode


def test_sacct_reports_finished_jobs_state_and_exit_code(env, tmp_path):
    ok_id, ok_rc = sbatch_wait(["--job-name", unique("acct-ok"), "--wrap", "true"], env, tmp_path)
    bad_id, bad_rc = sbatch_wait(["--job-name", unique("acct-fail"), "--wrap", "exit 3"], env, tmp_path)
    assert (ok_rc, bad_rc) == (0, 3)
    [ok] = sacct_jobs(["-j", ok_id], env)
    [bad] = sacct_jobs(["-j", bad_id], env)
    assert (ok["State"], ok["ExitCode"]) == ("COMPLETED", "0:0")
    assert (bad["State"], bad["ExitCode"]) == ("FAILED", "3:0")
    # Root's defaults, as the cluster registers them.
    assert (ok["Account"], ok["QOS"]) == ("csrun", "normal")


def test_sacct_reports_a_step_killed_by_a_signal(env):
    name = unique("acct-signal")
    proc = subprocess.run(["srun", "--job-name", name, "bash", "-c", "kill -TERM $$"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    [row] = sacct_jobs(["--name", name], env)
    # sacct's ExitCode is "<exit status>:<signal>": no exit status, signal 15 (SIGTERM).
    assert (row["State"], row["ExitCode"]) == ("FAILED", "0:15")


@pytest.mark.parametrize("flag,message", [
    ("--account", "Invalid account"),
    ("--qos", "Invalid qos specification"),
])
def test_slurm_refuses_an_unknown_account_or_qos(env, flag, message):
    name = unique("acct-refused")
    proc = subprocess.run(["srun", "--job-name", name, f"{flag}=no-such-{flag[2:]}", "true"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert message in proc.stderr, proc.stderr
    # Refused at submission: no job was created at all.
    listed = subprocess.run(["sacct", "-X", "-n", "-P", "-a", "-S", "now-1hour", "--name", name, "-o", "JobID"],
                            env=env, capture_output=True, text=True, check=True).stdout
    assert listed.strip() == ""


def test_a_known_account_and_qos_are_accepted_and_recorded(env):
    name = unique("acct-research")
    proc = subprocess.run(["srun", "--job-name", name, "--account=research", "--qos=debug", "true"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    [row] = sacct_jobs(["--name", name], env)
    assert (row["Account"], row["QOS"], row["State"]) == ("research", "debug", "COMPLETED")


def test_qos_limit_is_enforced_at_submission(env):
    # debug allows 10 minutes (MaxWall) with DenyOnLimit: an 11-minute job is refused outright.
    proc = subprocess.run(["srun", "--qos=debug", "--time=11", "true"], env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 1
    assert "QOSMaxWallDurationPerJobLimit" in proc.stderr, proc.stderr


def test_sacctmgr_lists_the_created_accounts_and_qos(env):
    def show(*what: str) -> list[list[str]]:
        out = subprocess.run(["sacctmgr", "-n", "-P", "show", *what], env=env, capture_output=True, text=True,
                             check=True).stdout
        return [line.split("|") for line in out.splitlines() if line.strip()]

    accounts = {row[0] for row in show("account", "format=account")}
    assert {"csrun", "research"} <= accounts
    qos = {row[0]: row[1] for row in show("qos", "format=name,maxwall")}
    assert qos.get("normal") == "" and qos.get("debug") == "00:10:00", qos
    [[default]] = show("user", "root", "format=defaultaccount")
    assert default == "csrun"
    assoc = {row[0]: row[1] for row in show("assoc", "user=root", "format=account,qos")}
    for account in ("csrun", "research"):
        assert set(assoc[account].split(",")) == {"normal", "debug"}, assoc


def test_csrun_wse_jobs_are_accounted_under_the_site_config_account(env, tmp_path):
    # slurm.account of the site config goes to every het component (README: Site configuration).
    cfg = tmp_path / "config.toml"
    cfg.write_text('[slurm]\naccount = "research"\n')
    marker = tmp_path / "ran"
    proc = subprocess.run([str(BIN / "csrun_wse"), "--use-sbatch", "--total-nodes", "2", "--tasks-per-node", "1",
                           "touch", str(marker)], env=dict(env, CSRUN_CONFIG=str(cfg)), cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    job = proc.stdout.strip()
    assert job.isdigit(), proc.stdout
    rows = sacct_jobs(["-j", job], env, expect=2, timeout=120)   # a het job: one row per het component
    assert {r["JobID"] for r in rows} == {f"{job}+0", f"{job}+1"}
    assert {(r["Account"], r["State"], r["ExitCode"]) for r in rows} == {("research", "COMPLETED", "0:0")}
    assert marker.exists()
