"""The end-of-run verdict (csrun_runtime.artifacts.verdict / verdict_lines) and the worker rates'
record: pure parts, no TensorFlow, no Slurm. docs/VERDICT.md describes what they print."""

import pytest

from csrun_runtime import artifacts as A


def facts(**kw):
    base = dict(steps=1000, steady_steps=999, steady_time=10.0, steady_calls=40, batch_size=64)
    base.update(kw)
    return base


def test_input_bound_names_the_wait_the_slowest_worker_and_the_analyzer():
    v = A.verdict(**facts(wait_fraction=0.9632),
                  rates={"0": 3000.0, "1": 2500.0, "2": 0.0}, nodes={"0": "node2", "1": "node3"},
                  analyzer_command="cs_input_analyzer python run.py --params p.yaml --mode validate_only")
    assert v["bound"] == "input" and v["ended"] == "target reached" and not v["short_run"]
    assert v["steady_samples_per_sec"] == pytest.approx(999 * 64 / 10.0, rel=1e-4)
    assert v["slowest_input_worker"] == {"worker": "1", "node": "node3", "samples_per_sec": 2500.0}  # 2: paused
    assert v["sentence"] == (
        "input-bound: training waited for input 96.3 % of the time; the slowest input worker (1 on node3) "
        "delivered 2500.0 samples/s; run "
        "`cs_input_analyzer python run.py --params p.yaml --mode validate_only` to size the input workers")


def test_compute_bound_below_the_threshold_and_at_it():
    v = A.verdict(**facts(wait_fraction=0.006))
    assert v["bound"] == "compute" and v["input_wait_fraction"] == 0.006
    assert v["sentence"] == ("compute-bound: input waited 0.6 % of the time (input-bound above 10.0 %); "
                             "more input workers would not speed training up")
    assert A.verdict(**facts(wait_fraction=A.INPUT_BOTTLENECK_THRESHOLD))["bound"] == "compute"
    assert A.verdict(**facts(wait_fraction=A.INPUT_BOTTLENECK_THRESHOLD + 1e-3))["bound"] == "input"


def test_in_process_pipeline_is_named_as_such():
    v = A.verdict(**facts(wait_fraction=0.5), rates={"in-process": 1234.5})
    assert "the in-process input pipeline delivered 1234.5 samples/s" in v["sentence"]


def test_no_steady_state_gives_no_verdict_and_short_runs_are_flagged():
    none = A.verdict(**facts(steps=1, steady_steps=0, steady_time=0.0, steady_calls=0, wait_fraction=0.0),
                     ended="stopped by SIGINT")
    assert none["bound"] == "unknown" and none["steady_samples_per_sec"] is None
    assert none["ended"] == "stopped by SIGINT" and "only the first step" in none["sentence"]
    short = A.verdict(**facts(steady_time=0.5, steady_calls=2, wait_fraction=0.01))
    assert short["short_run"] and short["sentence"].endswith(
        "(short run: 0.50 s of steady state in 2 call(s), the figures are rough)")


def test_verdict_block_lines_are_short_and_keep_compile_apart():
    v = A.verdict(**facts(wait_fraction=0.9), rates={"0": 6000.0},
                  nodes={"0": "node2"}, ended="stopped by SIGTERM", analyzer_command="cs_input_analyzer python run.py")
    lines = A.verdict_lines(v, steps=1000, start_step=200, end_step=1200, batch_size=64, steady_steps=999,
                            steady_time=10.0, compile_time=3.4, programming_time=12.5,
                            compute_samples_per_sec=250000.0)
    assert lines[0] == "verdict (stopped by SIGTERM): 1000 step(s) trained, global step 200 -> 1200, batch_size 64"
    assert lines[1] == ("  steady state: 6393.6 samples/s over steps 2..N (999 steps in 10.000 s); "
                        "train step alone 250000.0 samples/s (the same steps, their compute time only)")
    assert lines[2] == "  apart: first step's trace and compile 3.400 s, process start to first step 12.500 s"
    # 6393.6 / 250000 = 2.6 % of the time in train steps, 90 % waiting, the rest 7.4 %
    assert lines[3] == ("  input wait: 90.0 % of the steady-state time; train steps 2.6 %, the rest 7.4 % "
                        "(checkpoints, logging)")
    assert lines[4] == "  input-bound: training waited for input 90.0 % of the time;"
    assert lines[-1] == "  run `cs_input_analyzer python run.py` to size the input workers"
    assert all(len(line) < 200 for line in lines)


def test_the_wait_for_the_other_ranks_is_a_share_of_its_own():
    """Issue 44, problem 7: with several trainer ranks the breakdown names the stop agreement's
    wait apart from "the rest" (PT 2 × 1 said the rest 32.3 % beside a 32.0 % wait for the ranks)."""
    v = A.verdict(**facts(wait_fraction=0.05))
    kw = dict(steps=1000, start_step=0, end_step=1000, batch_size=64, steady_steps=999, steady_time=10.0,
              compile_time=0.1, programming_time=1.0)
    lines = A.verdict_lines(v, compute_samples_per_sec=10000.0, rank_wait_fraction=0.32, **kw)
    # 6393.6 / 10000 = 63.9 % in train steps, 5 % input, 32 % the other ranks: the rest 0 %
    assert lines[3] == ("  input wait: 5.0 % of the steady-state time; train steps 63.9 %, waits for the other "
                        "ranks 32.0 %, the rest 0.0 % (checkpoints, logging)")
    no_rate = A.verdict_lines(v, rank_wait_fraction=0.32, **kw)
    assert no_rate[3] == "  input wait: 5.0 % of the steady-state time; waits for the other ranks 32.0 %"


def test_worker_rates_and_field_descriptions():
    assert A.worker_rates({"0": 100, "1": 50}, 64, 2.0) == {"0": 3200.0, "1": 1600.0}
    assert A.worker_rates({"0": 100}, 64, 0.0) == {}
    rec = A.performance_record(batch_size=64, steps=11, total_time=4.0, first_step_time=3.0,
                               compute_times=[0.01] * 10, wait_times=[0.05] * 10, loop_time_after_first=1.0,
                               programming_time=5.0)
    assert rec["est_samples_per_sec"] == pytest.approx(6400.0) and rec["input_wait_fraction"] == 0.5
    assert rec["compute_fraction"] == pytest.approx(0.1)
    # bimodal steps: the median (10 ms) is slower than the mean (6 ms); the step-alone rate is the mean's
    rec = A.performance_record(batch_size=60, steps=6, total_time=1.0, first_step_time=0.5,
                               compute_times=[0.01, 0.01, 0.01, 0.0, 0.0], wait_times=[0.0] * 5,
                               loop_time_after_first=0.031, programming_time=1.0)
    assert rec["est_samples_per_sec"] == pytest.approx(10000.0) and rec["median_step_time"] == 0.01
    assert A.performance_record(batch_size=60, steps=1, total_time=1.0, first_step_time=1.0, compute_times=[],
                                wait_times=[], loop_time_after_first=0.0,
                                programming_time=1.0)["est_samples_per_sec"] is None
    assert set(rec["fields"]) == {k for k in rec if k in A.PERFORMANCE_FIELDS}
    assert "compute-only" in rec["fields"]["est_samples_per_sec"]
