"""launcher/runs/poll.py and view.py on canned Slurm output: one squeue for every watched run, one
sacct at most and only for jobs squeue forgot, none for a run whose end is recorded; the state
from the markers without accounting (one warning); the backoff."""
from __future__ import annotations

import itertools
import subprocess

import pytest

from launcher import slurm
from launcher.runs import poll, states

from .conftest import make_run, write_attempt


@pytest.fixture()
def slurm_answers(monkeypatch):
    """``answers[name]`` = (rc, stdout, stderr) per Slurm client; returns the argv lists asked."""
    asked: list[list[str]] = []
    answers: dict[str, tuple[int, str, str]] = {}

    def fake(argv, env=None, timeout=slurm.QUERY_TIMEOUT_S, input_text=None):
        asked.append(list(argv))
        return subprocess.CompletedProcess(argv, *answers[argv[0]])

    monkeypatch.setattr(slurm.command, "run", fake)
    monkeypatch.setattr(poll, "_warned", [])
    return answers, asked


def test_one_squeue_for_all_and_nothing_for_ended_runs(store, tmp_path, slurm_answers):
    answers, asked = slurm_answers
    running = make_run(store, tmp_path, "wse-1128-aaaa", jobs=("57",))
    pending = make_run(store, tmp_path, "wse-1128-bbbb", jobs=("60",))
    ended = make_run(store, tmp_path, "wse-1128-cccc", jobs=("50",),
                     end={"state": "SUCCEEDED", "reason": "exit 0", "time": 1.0})
    write_attempt(running, 1, {0: ["INFO:csrun:chief: global_step = 12, loss = 1"]}, ended=False)
    answers["squeue"] = (0, "57+0|RUNNING|None|node1\n57+1|RUNNING|None|node[2-3]\n"
                            "60+0|PENDING|Resources|\n60+1|PENDING|Resources|\n", "")
    got = poll.refresh(store, [running, pending, ended])
    assert [a[0] for a in asked] == ["squeue"] and "--jobs=57,60" in asked[0]
    assert {k: s.state for k, s in got.items()} == {running.run_id: "RUNNING", pending.run_id: "PENDING",
                                                      ended.run_id: "SUCCEEDED"}
    st = got[running.run_id]
    assert [(g.role, g.nodes, g.state) for g in st.groups] == [("chief", "node1", "RUNNING"),
                                                               ("worker", "node[2-3]", "RUNNING")]
    assert st.live.step == 12 and st.attempts[0].state == "RUNNING"
    asked.clear()
    assert poll.refresh(store, [ended], light=True)[ended.run_id].state == "SUCCEEDED" and asked == []


def test_sacct_once_for_forgotten_jobs_and_the_end_recorded(store, tmp_path, slurm_answers):
    answers, asked = slurm_answers
    a = make_run(store, tmp_path, "wse-1128-aaaa", jobs=("57",))
    b = make_run(store, tmp_path, "wse-1128-bbbb", jobs=("58",))
    answers["squeue"] = (1, "", "slurm_load_jobs error: Invalid job id specified\n")
    answers["sacct"] = (0, "57+0|REQUEUED|0:0|node1|t1|t2\n57+0|COMPLETED|0:0|node1|t3|t4\n"
                           "58+0|CANCELLED by 0|0:15|node2|t5|t6\n58+1|CANCELLED by 0|0:15|node3|t5|t6\n", "")
    got = poll.refresh(store, [a, b])
    assert [x[0] for x in asked] == ["squeue", "sacct"]
    assert got[a.run_id].state == "SUCCEEDED" and got[b.run_id].state == "CANCELLED"
    assert store.load(a.run_id).end["state"] == "SUCCEEDED"  # asked once: recorded
    asked.clear()
    poll.refresh(store, [store.load(a.run_id)])
    assert asked == []


def test_no_accounting_the_markers_decide_with_one_warning(store, tmp_path, slurm_answers, capsys):
    answers, asked = slurm_answers
    ok = make_run(store, tmp_path, "wse-1128-aaaa", jobs=("57",))
    write_attempt(ok, 1, {0: ["done"]}, status=0)
    killed = make_run(store, tmp_path, "wse-1128-bbbb", jobs=("58",))
    write_attempt(killed, 1, {0: ["working"]}, ended=False)
    answers["squeue"] = (1, "", "slurm_load_jobs error: Invalid job id specified\n")
    answers["sacct"] = (1, "", "Slurm accounting storage is disabled\n")
    for _ in range(2):
        got = poll.refresh(store, [store.load(ok.run_id), store.load(killed.run_id)])
    assert got[ok.run_id].state == "SUCCEEDED" and got[ok.run_id].source in ("markers", "record")
    assert got[killed.run_id].state == "FAILED" and "end marker" in got[killed.run_id].reason
    assert capsys.readouterr().err.count("warning: sacct does not answer") == 1
    assert [x[0] for x in asked] == ["squeue", "sacct"]  # the ends are recorded after the first ask


def test_requeued_attempts(store, tmp_path, slurm_answers):
    answers, _ = slurm_answers
    rec = make_run(store, tmp_path, jobs=("57",), requeue_exit=75)
    write_attempt(rec, 1, {0: ["a"]}, status=75)
    write_attempt(rec, 2, {0: ["b"]}, status=75)
    answers["squeue"] = (0, "57+0|PENDING|BeginTime|\n57+1|PENDING|BeginTime|\n", "")
    st = poll.refresh(store, [rec])[rec.run_id]
    assert st.state == states.REQUEUED
    assert [(a.number, a.state, a.status) for a in st.attempts] == [(1, "REQUEUED", 75), (2, "REQUEUED", 75)]
    assert st.attempts[0].nodes == {"0": "node1", "1": "node[2-3]"}


def test_the_backoff_goes_from_2_to_30_seconds():
    assert list(itertools.islice(poll.intervals(), 10)) == [2.0, 3.0, 4.5, 6.75, 10.125, 15.1875, 22.78125, 30.0,
                                                            30.0, 30.0]


def test_wait_all_asks_once_per_interval_for_every_run(store, tmp_path, slurm_answers, monkeypatch):
    answers, asked = slurm_answers
    a = make_run(store, tmp_path, "wse-1128-aaaa", jobs=("57",))
    b = make_run(store, tmp_path, "wse-1128-bbbb", jobs=("58",))
    replies = iter(["57|RUNNING|None|node1\n58|PENDING|None|\n", "57|RUNNING|None|node1\n58|RUNNING|None|node2\n",
                    "57|COMPLETED|None|node1\n58|COMPLETED|None|node2\n"])
    slept: list[float] = []
    monkeypatch.setattr(poll.time, "sleep", lambda s: (slept.append(s), answers.update(squeue=(0, next(replies), ""))))
    answers["squeue"] = (0, next(replies), "")
    got = poll.wait_all(store, [a, b], timeout=100)
    assert {s.state for s in got.values()} == {"SUCCEEDED"}
    assert [x[0] for x in asked] == ["squeue"] * 3 and slept == [2.0, 2.0]  # a change restarts the backoff


def test_srun_path_attempt_nodes_come_from_srun_s_lines(store, tmp_path, slurm_answers):
    """The srun path starts its attempt before srun names the nodes: they come from end.json."""
    from launcher.attempts import AttemptLog, job_dir

    answers, _ = slurm_answers
    rec = make_run(store, tmp_path, jobs=("70",), end={"state": "SUCCEEDED", "reason": "exit 0", "time": 1.0})
    log = AttemptLog(job_dir(rec.log_root, rec.job_name, "70") / "attempt-1")
    log.start("70", 1, {})
    log.end(0, {0: "node1", 1: "node1", 2: "node3", 3: "node2", 4: "node2", 5: "node3"})
    [attempt] = poll.refresh(store, [rec])[rec.run_id].attempts
    assert attempt.nodes == {"0": "node1", "1": "node2,node3"}
