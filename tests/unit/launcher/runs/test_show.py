"""launcher/runs/show.py: the text ``csrun list`` and ``status`` print from records and
performance.json, pure: the list's columns, the performance summary on one line, and each
allocation's steps and the input workers it lost, replaced or paused."""
from __future__ import annotations

from launcher.runs import show

from .conftest import make_run


def test_the_list_has_a_header_and_a_line_per_run(store, tmp_path):
    a = make_run(store, tmp_path, "wse-1128-aaaa")
    b = make_run(store, tmp_path, "wse-1128-bbbb", jobs=())
    head, first, second = show.list_lines([(a, "RUNNING"), (b, "PENDING")])
    assert head.split() == ["RUN", "STATE", "JOB", "SUBMITTED", "COMMAND"]
    assert first.split()[:3] == ["wse-1128-aaaa", "RUNNING", "57"] and first.endswith("python-ws run.py")
    assert second.split()[:3] == ["wse-1128-bbbb", "PENDING", "-"]
    assert show.when(None) == "-" and len(show.when(a.submitted_at)) == 19


def test_the_performance_summary_is_one_line():
    perf = {"steps": 400, "steady_samples_per_sec": 812.5, "input_wait_fraction": 0.123,
            "verdict": {"bound": "input"}, "ended": "target reached"}
    assert show.performance_line(perf) == ("400 steps, 812.5 samples/s, input wait 12.3 %, input-bound; "
                                           "ended: target reached")
    assert show.performance_line({}) == "- steps, - samples/s, input wait -, unknown-bound; ended: -"


def test_each_allocation_says_its_steps_and_its_workers():
    perf = {"allocation_history": [
        {"allocation": 1, "job_id": "57", "requeue": 0, "start_step": 0, "end_step": 120, "stopped_by": "SIGUSR2",
         "workers_lost": [{"worker": 2}], "workers_replaced": [2]},
        {"allocation": 2, "job_id": "57", "requeue": 1, "start_step": 120, "end_step": 400, "stopped_by": None}]}
    first, second = show.allocation_lines(perf)
    assert first.startswith("    allocation 1 (job 57, requeue 0): steps 0..120, stopped by SIGUSR2; lost ")
    assert "replaced 2" in first
    assert second.endswith("steps 120..400, stopped by -; no worker lost, replaced or paused")
