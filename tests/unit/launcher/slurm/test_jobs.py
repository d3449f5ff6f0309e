"""launcher/slurm/jobs.py on canned Slurm output (22.05's, recorded on the test cluster): many
jobs' rows in one squeue or sacct, a job Slurm forgot, accounting off, scancel's argv."""
from __future__ import annotations

import subprocess

import pytest

from csrun_common.errors import SlurmUnavailable
from launcher import slurm


@pytest.fixture()
def canned(monkeypatch):
    asked: list[list[str]] = []

    def install(answer: tuple[int, str, str]):
        def fake(argv, env=None, timeout=slurm.QUERY_TIMEOUT_S, input_text=None):
            asked.append(list(argv))
            return subprocess.CompletedProcess(argv, *answer)

        monkeypatch.setattr(slurm.command, "run", fake)
        return asked

    return install


def test_one_squeue_for_many_jobs(canned):
    asked = canned((0, "1+0|RUNNING|None|node1\n1+1|RUNNING|None|node2\n12|PENDING|BeginTime|\n", ""))
    rows = slurm.squeue_rows(["12", "1+1", "1"])
    assert asked == [["squeue", "--noheader", "--states=all", "--jobs=1,12", "--format=%i|%T|%r|%N"]]
    assert [(r.job, r.component, r.state, r.nodes) for r in rows] == [
        ("1", 0, "RUNNING", "node1"), ("1", 1, "RUNNING", "node2"), ("12", 0, "PENDING", "")]
    assert rows[2].reason == "BeginTime"


def test_a_forgotten_job_is_no_row_and_a_silent_controller_an_error(canned):
    canned((1, "", "slurm_load_jobs error: Invalid job id specified\n"))
    assert slurm.squeue_rows(["99"]) == []
    assert slurm.squeue_rows([]) == []
    canned((1, "", "slurm_load_jobs error: Unable to contact slurm controller (connect failure)\n"))
    with pytest.raises(SlurmUnavailable, match="cannot reach slurmctld"):
        slurm.squeue_rows(["99"])


def test_sacct_lists_each_requeued_allocation(canned):
    asked = canned((0, "1+0|REQUEUED|0:0|node1|2026-11-28T07:13:30|2026-11-28T07:13:33\n"
                       "1+1|REQUEUED|0:0|node2|2026-11-28T07:13:30|2026-11-28T07:13:33\n"
                       "1+0|CANCELLED by 0|0:15|node1|2026-11-28T07:14:01|2026-11-28T07:14:20\n"
                       "1+1|PENDING|0:0|None assigned|Unknown|Unknown\n", ""))
    rows = slurm.sacct_rows(["1"])
    assert asked[0][:5] == ["sacct", "--noheader", "--parsable2", "--allocations", "--duplicates"]
    assert [r.state for r in rows] == ["REQUEUED", "REQUEUED", "CANCELLED", "PENDING"]
    assert rows[2].exit_code == "0:15" and rows[3].nodes == ""


def test_sacct_without_accounting_is_none(canned):
    canned((1, "", "Slurm accounting storage is disabled\n"))
    assert slurm.sacct_rows(["1"]) is None


def test_scancel_with_and_without_a_signal(canned):
    asked = canned((0, "", ""))
    slurm.signal_job("57+1", "INT")
    slurm.signal_job("57")
    assert asked == [["scancel", "--signal=INT", "57"], ["scancel", "57"]]
    canned((1, "", "scancel: error: Kill job error on job id 57: Invalid job id specified\n"))
    assert "Invalid job id" in slurm.signal_job("57")  # already gone: not an error
