"""launcher/runs/logs.py: tasks by role, one attempt's logs labelled, --tail and --grep, bad
flags as one line, and following a log as it is written, into the next attempt."""
from __future__ import annotations

import threading
import time

import pytest

from csrun_common.errors import CsrunError
from launcher.attempts import AttemptLog, job_dir
from launcher.runs import logs

from .conftest import make_run, write_attempt


def test_roles_of_the_tasks(store, tmp_path):
    rec = make_run(store, tmp_path)
    assert logs.tasks_of(rec) == [(0, "chief", 0), (1, "worker", 0), (2, "worker", 1), (3, "worker", 2),
                                  (4, "worker", 3), (5, "worker", 4)]
    assert logs.select(rec, "worker", 3) == [(4, "worker", 3)] and logs.select(rec, None, 4) == [(4, "worker", 3)]
    rec.layout = {"nodes": 3, "tasks_per_node": 2, "cpus_per_task": 1, "single_task_nodes": 0,
                  "chief_input_cpus": 1}  # worker 0 runs inside the chief's task
    assert logs.tasks_of(rec)[1] == (1, "worker", 1)


def test_bad_role_task_attempt_and_grep_are_one_line(store, tmp_path):
    rec = make_run(store, tmp_path)
    write_attempt(rec, 1, {0: ["x"]})
    with pytest.raises(CsrunError, match=r"^--role rank: this run has no such tasks \(roles: chief, srun, worker\)$"):
        logs.select(rec, "rank", None)
    with pytest.raises(CsrunError, match=r"^--task 9: out of range \(0\.\.4 for --role worker\)$"):
        logs.select(rec, "worker", 9)
    with pytest.raises(CsrunError, match=r"^--attempt 3: the run has 1 attempt\(s\) so far \(1\)$"):
        logs.read(rec, attempt=3)
    with pytest.raises(CsrunError, match=r"^--grep '\(': not a regular expression"):
        logs.read(rec, grep="(")


def test_each_attempt_intact_labelled_tail_and_grep(store, tmp_path):
    rec = make_run(store, tmp_path)
    write_attempt(rec, 1, {0: ["chief 1a", "chief 1b"], 4: ["w3 1a", "w3 1b", "w3 1c"]}, status=75)
    write_attempt(rec, 2, {0: ["chief 2a"], 4: ["w3 2a"]}, status=0)
    first = logs.read(rec, "worker", 3, attempt=1)
    assert [ln.labelled() for ln in first] == ["[worker 3] w3 1a", "[worker 3] w3 1b", "[worker 3] w3 1c"]
    assert [ln.text for ln in logs.read(rec)] == ["chief 2a", "w3 2a"]  # the latest attempt, task by task
    assert [ln.text for ln in logs.read(rec, attempt=1, tail=1)] == ["chief 1b", "w3 1c"]
    assert [ln.text for ln in logs.read(rec, attempt=1, grep=r"1[bc]$")] == ["chief 1b", "w3 1b", "w3 1c"]


def test_follow_prints_lines_as_written_and_goes_on_into_the_next_attempt(store, tmp_path, monkeypatch):
    monkeypatch.setattr(logs, "FOLLOW_POLL_S", 0.02)
    rec = make_run(store, tmp_path)
    root = job_dir(rec.log_root, rec.job_name, "57")
    first = AttemptLog(root / "attempt-1")
    first.start("57", 1, {})
    first.line(4, "old line")
    seen: list[tuple[float, str]] = []
    done = threading.Event()

    def writer():
        time.sleep(0.2)
        first.line(4, "new line")
        time.sleep(0.2)
        first.end(75, {})
        second = AttemptLog(root / "attempt-2")
        second.start("57", 2, {})
        second.line(4, "after the requeue")
        second.end(0, {})
        done.set()

    threading.Thread(target=writer, daemon=True).start()
    t0 = time.monotonic()
    for line in logs.follow(lambda: store.load(rec.run_id), done.is_set, "worker", 3, tail=5):
        seen.append((time.monotonic() - t0, f"{line.attempt}:{line.text}"))
    assert [s for _, s in seen] == ["1:old line", "1:new line", "2:after the requeue"]
    assert seen[1][0] < 0.2 + 0.5  # within half a second of its writing
