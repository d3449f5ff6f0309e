"""launcher/attempts.py: one attempt's directory (each task's log, srun's lines, the start and
end markers), written by the batch script's filter (launcher.tasklog's main, fed recorded srun
output here) and read back."""
from __future__ import annotations

import io
import json
import sys

from launcher import tasklog
from launcher.attempts import SCRIPT_ATTEMPT_DIR, AttemptLog, het_nodes, job_dir, read_attempts, task_file

SRUN_OUTPUT = """\
srun: jobid 57: nodes(2):`node[1-2]', cpu counts: 2(x2)
srun: launching StepId=57.0 on host node1, 2 tasks: [0-1]
srun: launching StepId=58.0 on host node2, 2 tasks: [0-1]
0: INFO:csrun:chief: global_step = 1, loss = 2.3
2: worker line: "quoted" \\ and a colon: here
1: first worker line
3: slurmstepd: error: *** STEP 58.0 ON node2 CANCELLED ***
0: INFO:csrun:chief: global_step = 2, loss = 2.1
csrun_wse-srun-exit-status: 75
"""


def test_het_nodes_from_the_job_environment():
    env = {"SLURM_JOB_NODELIST_HET_GROUP_1": "node[2-3]", "SLURM_JOB_NODELIST_HET_GROUP_0": "node1",
           "SLURM_JOB_NODELIST": "node1"}
    assert list(het_nodes(env).items()) == [("0", "node1"), ("1", "node[2-3]")]
    assert het_nodes({"SLURM_JOB_NODELIST": "node4"}) == {"0": "node4"}
    assert het_nodes({}) == {}


def test_the_filter_writes_each_task_and_the_markers(tmp_path, monkeypatch, capsys):
    attempt = tmp_path / "csrun_wse-57" / "attempt-2"
    monkeypatch.setenv("SLURM_JOB_ID", "57")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    monkeypatch.setenv("SLURM_JOB_NODELIST_HET_GROUP_0", "node1")
    monkeypatch.setenv("SLURM_JOB_NODELIST_HET_GROUP_1", "node2")
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(SRUN_OUTPUT.encode())))
    assert tasklog.main(["--groups", "0:chief:0:2,1:worker:2:2", "--ok", "0,75", "--log",
                         str(tmp_path / "all.log"), "--attempt-dir", str(attempt)]) == 0
    assert task_file(attempt, 0).read_text() == ("INFO:csrun:chief: global_step = 1, loss = 2.3\n"
                                                 "INFO:csrun:chief: global_step = 2, loss = 2.1\n")
    assert task_file(attempt, 2).read_text() == 'worker line: "quoted" \\ and a colon: here\n'
    srun = (attempt / "srun.log").read_text()
    assert "srun: jobid 57" in srun and "slurmstepd: error: *** STEP 58.0" in srun
    assert not task_file(attempt, 3).exists()  # slurmstepd's labelled notice is srun's, not task 3's
    [a] = read_attempts(attempt.parent)
    assert a.number == 2 and a.tasks == [0, 1, 2]
    assert a.start["job_id"] == "57" and a.start["attempt"] == 2 and a.start["nodes"] == {"0": "node1", "1": "node2"}
    assert a.end["status"] == 75 and a.end["task_nodes"]["2"] == "node2"
    assert "global_step = 2" in (tmp_path / "all.log").read_text()  # the task log as before


def test_output_cut_short_has_no_status_but_the_chiefs_exit_code(tmp_path, monkeypatch):
    """scontrol requeue ends the batch script before it writes srun's status; srun's own lines
    still say how the chief exited (the lines of a requeued job on the test cluster)."""
    attempt = tmp_path / "a"
    cut = (b"srun: launching StepId=10.0 on host node1, 2 tasks: [0-1]\n0: working\n"
           b"slurmstepd-node1: error: *** STEP 10.0 ON node1 CANCELLED AT 2026-11-28T07:37:54 DUE TO JOB REQUEUE ***\n"
           b"srun: error: node1: task 0: Exited with exit code 75\n")
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(cut)))
    tasklog.main(["--groups", "0:chief:0:2", "--log", str(tmp_path / "l.log"), "--attempt-dir", str(attempt)])
    end = json.loads((attempt / "end.json").read_text())
    assert end["status"] is None and end["exit_codes"] == {"0": 75}


def test_the_filter_leaves_the_status_csrun_wse_decides_for_the_script(tmp_path, monkeypatch, capsys):
    """srun reported a task it ended (143) before the one that failed (exit 1): the job's status is
    1 in the output file and in ``exit-status``, which the batch script exits with."""
    attempt = tmp_path / "a"
    out = (b"srun: launching StepId=10.0 on host node1, 2 tasks: [0-1]\n0: run.py failed at import: x\n"
           b"srun: error: node1: task 1: Terminated\nsrun: error: node1: task 0: Exited with exit code 1\n"
           + tasklog.STATUS_LINE.encode() + b"143\n")
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(out)))
    tasklog.main(["--groups", "0:chief:0:2", "--log", str(tmp_path / "l.log"), "--attempt-dir", str(attempt)])
    assert (attempt / tasklog.EXIT_STATUS_FILE).read_text() == "1\n"
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("csrun_wse: exit status 1; ")
    assert json.loads((attempt / "end.json").read_text())["status"] == 143  # srun's own, as recorded


def test_attempts_read_in_order_and_the_script_names_the_same_directory(tmp_path):
    root = job_dir(tmp_path, "csrun_wse", "9")
    for k in (10, 2, 1):
        log = AttemptLog(root / f"attempt-{k}")
        log.start("9", k, {})
        log.line(0, f"attempt {k}")
        if k != 10:
            log.end(0, {})
    (root / "attempt-x").mkdir()
    found = read_attempts(root)
    assert [a.number for a in found] == [1, 2, 10] and found[-1].end is None
    assert task_file(found[0].directory, 0).read_text() == "attempt 1\n"
    assert read_attempts(tmp_path / "nope") == []
    assert SCRIPT_ATTEMPT_DIR % ("CSRUN_LOG_DIR", "csrun_wse") == \
        "${CSRUN_LOG_DIR:-csrun_logs}/csrun_wse-${SLURM_JOB_ID}/attempt-$((${SLURM_RESTART_COUNT:-0} + 1))"
