"""analyzer/dataloader_plan.py: the DataLoader num_workers axis of the probe grid for a PyTorch
run.py (its candidates, the sweep's order and stop, invalid points skipped, the best count per
CPUs-per-task), on probe tables recorded with ``cs_input_analyzer --local`` on
tests/fixtures/probes/pt_pipelines (2 CPUs)."""
from __future__ import annotations

from analyzer import dataloader_plan as D
from analyzer.probe_driver import next_probe


def _row(t, c, w, rate, status="ok", contended=False):
    return {"kind": "pipeline", "tasks": t, "cpus_per_task": c, "dataloader_workers": w, "status": status,
            "samples_per_sec": rate if status == "ok" else float("nan"), "cpu_util": 0.9, "contended": contended}


def _plan(rows, n=4, max_tasks=8):
    return D.next_point(rows, n, max_tasks, next_probe)


def test_candidates_are_zero_one_and_powers_of_two_up_to_c():
    assert D.candidates(1) == [0, 1, 2]
    assert D.candidates(2) == [0, 1, 2, 4]
    assert D.candidates(6) == [0, 1, 2, 4, 6, 8, 12]
    assert D.candidates(16) == [0, 1, 2, 4, 8, 16, 32]


def test_sweep_order_then_the_tensorflow_planner_at_the_best_count():
    assert _plan([]) == ("pipeline", 1, 4, 0)  # the 1 x n bracket at num_workers 0
    rows = [_row(1, 4, 0, 100.0)]
    assert _plan(rows) == ("pipeline", 1, 4, 1)
    rows += [_row(1, 4, 1, 150.0), _row(1, 4, 2, 300.0)]
    assert _plan(rows) == ("pipeline", 1, 4, 4)
    rows += [_row(1, 4, 4, 390.0)]
    assert _plan(rows) == ("pipeline", 1, 4, 8)  # up to 2C: a wait per sample scales past the CPUs
    rows += [_row(1, 4, 8, 380.0)]
    # the sweep at C=4 is done: the n x 1 bracket, starting its own sweep at 0
    assert _plan(rows) == ("pipeline", 4, 1, 0)
    rows += [_row(4, 1, 0, 200.0)]
    assert _plan(rows) == ("pipeline", 4, 1, 1)
    rows += [_row(4, 1, 1, 320.0), _row(4, 1, 2, 300.0), _row(1, 1, 1, 80.0)]
    assert D.best_workers(rows) == {1: 1, 4: 4}
    nxt = _plan(rows)
    assert nxt is not None and nxt[3] == D.best_workers(rows).get(nxt[2], 0)


def test_the_fewest_workers_within_five_percent_is_best_and_at_best_keeps_only_it():
    rows = [_row(1, 4, 0, 400.0), _row(1, 4, 1, 200.0), _row(1, 4, 2, 395.0), _row(1, 4, 4, 410.0),
            _row(2, 4, 2, 700.0), _row(2, 4, 0, 800.0)]
    assert D.best_workers(rows) == {4: 0}  # 400 is within 5 % of 410: fewer processes win
    kept = D.at_best(rows)
    assert [(r["tasks"], r["dataloader_workers"]) for r in kept] == [(1, 0), (2, 0)]


def test_a_sweep_stops_after_two_slower_counts_and_an_invalid_point_is_skipped():
    rows = [_row(1, 16, 0, 1000.0), _row(1, 16, 1, 500.0), _row(1, 16, 2, 950.0)]
    assert _plan(rows, n=16)[3] == 4  # one slower count does not end the sweep
    rows += [_row(1, 16, 4, 700.0)]
    assert _plan(rows, n=16) == ("pipeline", 1, 16, 8)
    rows += [_row(1, 16, 8, 600.0)]
    assert _plan(rows, n=16)[1:] != (1, 16, 16)  # 4 and 8 both below 0.9 x best: stopped
    assert D.best_workers(rows) == {16: 0}
    bad = [_row(1, 2, 0, 0.0, status="invalid")]
    assert _plan(bad, n=2) == ("pipeline", 1, 2, 1)  # skipped, the sweep goes on
    bad += [_row(1, 2, 1, 50.0), _row(1, 2, 2, 90.0), _row(1, 2, 4, 60.0)]
    assert D.best_workers(bad) == {2: 2}
    assert all(r["status"] != "invalid" for r in D.at_best(bad))


def test_workers_for_an_unswept_c_scales_the_nearest_best():
    rows = [_row(1, 2, 0, 10.0), _row(1, 2, 1, 15.0), _row(1, 2, 2, 30.0), _row(2, 1, 0, 10.0), _row(2, 1, 1, 9.0)]
    assert D.workers_for(rows, 2) == {"num_workers": 2, "measured_at_cpus": 2, "how": "measured"}
    assert D.workers_for(rows, 4) == {"num_workers": 4, "measured_at_cpus": 2, "how": "scaled"}
    assert D.workers_for([_row(1, 1, 0, 1.0), _row(1, 1, 2, 3.0)], 2)["num_workers"] == 4
    assert D.workers_for(rows, 1)["num_workers"] == 0
    assert D.workers_for([_row(1, 2, 0, 1.0) | {"dataloader_workers": None}], 2) == {}


def test_served_probes_come_once_the_count_at_one_cpu_is_known():
    rows = [_row(1, 2, 0, 100.0), _row(1, 2, 1, 90.0), _row(1, 2, 2, 80.0), _row(1, 2, 4, 70.0),
            _row(2, 1, 0, 150.0), _row(2, 1, 1, 120.0), _row(2, 1, 2, 100.0)]
    assert D.next_point(rows, 2, 4, next_probe, served=True) == ("served", 2, 1, 0)  # the best count at C=1
    assert D.next_point(rows, 2, 4, next_probe)[0] == "pipeline"  # served=False: none (and never ingest)
    served = {"kind": "served", "tasks": 2, "cpus_per_task": 1, "status": "ok", "samples_per_sec": 50.0}
    nxt = [D.next_point(rows + [served] * k, 2, 4, next_probe, served=True) for k in (1, 3)]
    assert nxt[0][0] == "pipeline"  # one served probe so far: the planner goes on
    assert all(p is None or p[0] != "ingest" for p in nxt)
