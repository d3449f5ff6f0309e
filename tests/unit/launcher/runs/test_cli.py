"""``csrun`` (launcher/runs/cli.py) on recorded runs whose end is known (no Slurm asked): list,
status, describe, logs, cancel of a finished run; bad input one line and exit 2 naming the
closest ids; a light start-up (the API: test_api.py)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from click.testing import CliRunner

from launcher.runs.cli import csrun, since_time

from .conftest import make_run, write_attempt

ENDED = {"state": "SUCCEEDED", "reason": "exit 0", "time": 1.0, "status": 0}


def run_cli(*args):
    r = CliRunner().invoke(csrun, list(args), prog_name="csrun")
    return r.exit_code, r.stdout, r.stderr


def test_list_with_state_since_and_json(store, tmp_path):
    make_run(store, tmp_path, "wse-1128-aaaa", end=ENDED)
    make_run(store, tmp_path, "wse-1128-bbbb", end={**ENDED, "state": "FAILED"})
    code, out, _ = run_cli("list")
    assert code == 0 and out.splitlines()[0].startswith("RUN") and len(out.splitlines()) == 3
    code, out, _ = run_cli("list", "--state", "failed", "--json")
    [row] = [json.loads(line) for line in out.splitlines()]
    assert row["run_id"] == "wse-1128-bbbb" and row["state"] == "FAILED" and row["jobs"] == ["57"]
    assert run_cli("list", "--since", "2020-01-01")[1].count("wse-1128") == 2
    assert run_cli("list", "--since", "1s")[1].count("wse-1128") == 0


def test_status_describe_and_logs_of_an_ended_run(store, tmp_path):
    rec = make_run(store, tmp_path, end=ENDED)
    write_attempt(rec, 1, {0: ["INFO:csrun:chief: global_step = 5, loss = 1"], 3: ["worker two says hi"]})
    code, out, _ = run_cli("status", rec.run_id)
    assert code == 0 and out.startswith(f"{rec.run_id}: SUCCEEDED (exit 0)")
    assert "het group 1: worker" in out and "trainer: global step 5" in out and "    1   job 57" in out
    code, out, _ = run_cli("status", "57", "--json")
    data = json.loads(out)
    assert data["state"] == "SUCCEEDED" and data["attempts"][0]["status"] == 0 and data["live"]["step"] == 5
    code, out, _ = run_cli("describe", rec.model_dir)
    assert code == 0 and "the sbatch script that ran:" in out and "    #SBATCH --job-name=csrun_wse" in out
    code, out, _ = run_cli("logs", rec.run_id, "--role", "worker", "--task", "2")
    assert out == "[worker 2] worker two says hi\n"


def test_cancel_of_a_finished_run_says_so_and_exits_0(store, tmp_path):
    rec = make_run(store, tmp_path, end={**ENDED, "state": "CANCELLED", "reason": "cancelled through csrun"})
    code, out, _ = run_cli("cancel", rec.run_id, "--checkpoint")
    assert code == 0 and out == f"{rec.run_id} already ended: CANCELLED (cancelled through csrun)\n"


def test_bad_input_is_one_line_and_exit_2(store, tmp_path):
    make_run(store, tmp_path, "wse-1128-k3m9", end=ENDED)
    proc = subprocess.run([sys.executable, "-m", "launcher.runs.cli", "status", "wse-1128-k3n9"],
                          capture_output=True, text=True, env=os.environ.copy(), timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == ("csrun: error: RUN 'wse-1128-k3n9': no such run id, job id or model_dir "
                           "(closest: wse-1128-k3m9)\n")
    code, _, err = run_cli("logs", "wse-1128-k3m9", "--task", "-1")
    assert code == 2 and len(err.strip().splitlines()) == 1
    code, _, err = run_cli("list", "--since", "yesterday")
    assert code == 2 and err.startswith("csrun: error: --since 'yesterday': ")


def test_since_ages_and_dates():
    assert since_time("2h", now=10_000.0) == 10_000.0 - 7200
    assert since_time("2026-11-28") == time.mktime(time.strptime("2026-11-28", "%Y-%m-%d"))


def test_start_up_is_light():
    code = ("import sys, launcher.runs.cli; bad = {'tensorflow', 'torch', 'pandas', 'matplotlib', 'submitit'} "
            "& set(sys.modules); print(sorted(bad))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout
    assert out.strip() == "[]"
