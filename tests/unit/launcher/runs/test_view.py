"""launcher/runs/view.py: a run's one state and where it comes from — its recorded end first, then
squeue's rows of its current job, sacct's last allocation, and without either its attempts'
markers — and performance.json only when written after the submission. No Slurm is asked: the
rows are given as launcher/slurm/jobs.py parses them."""
from __future__ import annotations

import os

from launcher.runs import view
from launcher.slurm import JobRow

from .conftest import make_run, write_attempt


def test_the_recorded_end_wins(store, tmp_path):
    rec = make_run(store, tmp_path, end={"state": "SUCCEEDED", "reason": "exit 0", "time": 1.0, "status": 0})
    assert view.decide(rec, [JobRow("57", "RUNNING")], None, []) == ("SUCCEEDED", "exit 0", "record")


def test_squeue_then_sacct_then_the_markers(store, tmp_path):
    rec = make_run(store, tmp_path)
    assert view.decide(rec, [JobRow("57+0", "RUNNING"), JobRow("57+1", "PENDING")], None, [])[::2] == \
        ("RUNNING", "squeue")
    acct = [JobRow("57+0", "FAILED", exit_code="1:0", start="2026-11-28T07:00:00"),
            JobRow("57+1", "CANCELLED by 0", exit_code="0:15", start="2026-11-28T07:00:00")]
    assert view.decide(rec, [], acct, []) == ("FAILED", "exit 1:0", "sacct")
    write_attempt(rec, 1, {0: ["INFO:csrun:chief: global_step = 5, loss = 1"]}, status=0)
    found = view.attempts_of(rec)
    assert [(job, a.number) for job, a in found] == [("57", 1)]
    assert view.decide(rec, [], None, found) == ("SUCCEEDED", "exit 0", "markers")


def test_performance_json_is_the_runs_only_when_written_after_its_submission(store, tmp_path):
    rec = make_run(store, tmp_path)
    assert view.performance(rec) is None
    path = tmp_path / "md" / rec.run_id / "performance" / "performance.json"
    path.parent.mkdir(parents=True)
    path.write_text('{"steps": 4}')
    assert view.performance(rec) == {"steps": 4}
    old = rec.submitted_at - 3600
    os.utime(path, (old, old))  # a run before this one in the same model_dir
    assert view.performance(rec) is None


def test_observe_gathers_the_attempts_groups_and_live_figures(store, tmp_path):
    rec = make_run(store, tmp_path)
    write_attempt(rec, 1, {0: ["INFO:csrun:chief: global_step = 7, loss = 1"]}, ended=False)
    st = view.observe(rec, [JobRow("57+0", "RUNNING", nodes="node1"), JobRow("57+1", "RUNNING", nodes="node[2-3]")],
                      None)
    assert (st.state, st.source, st.job_id, st.live.step) == ("RUNNING", "squeue", "57", 7)
    assert [g.role for g in st.groups] == ["chief", "worker"] and st.attempts[0].number == 1
    assert st.to_json()["live"]["step"] == 7
