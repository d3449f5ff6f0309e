"""csrun_runtime.preemption: the stop-signal hook, the allocation records of a requeued run,
and the rendezvous key of a requeued job (no TensorFlow, no Slurm)."""
import os
import signal
import time

import pytest

from csrun_common.atomic import read_json
from csrun_common.roles import resolve_role
from csrun_runtime import preemption


@pytest.fixture()
def handlers():
    """Restore the signal dispositions and forget the recorded signal after a test."""
    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM)}
    preemption.reset()
    yield
    for s, h in old.items():
        signal.signal(s, h)
    preemption.reset()


def test_nothing_installed_without_the_variable(handlers):
    assert preemption.install_from_env({}) == []
    assert signal.getsignal(signal.SIGUSR2) == signal.SIG_DFL


def test_signal_is_recorded_and_the_task_lives_on(handlers, capfd):
    assert preemption.install_from_env({preemption.STOP_SIGNALS_ENV: "USR2:TERM"}) == ["SIGUSR2", "SIGTERM"]
    preemption.set_label("[worker 3 node2] ", is_chief=False)
    assert not preemption.stop_requested() and preemption.exit_code() == 0
    t0 = time.time()
    os.kill(os.getpid(), signal.SIGUSR2)
    os.kill(os.getpid(), signal.SIGTERM)  # the first signal is the one recorded
    assert preemption.stop_requested() and preemption.stop_signal() == "SIGUSR2"
    assert preemption.stop_time() >= t0 and preemption.exit_code() == preemption.REQUEUE_EXIT == 75
    err = capfd.readouterr().err
    assert "INFO:csrun:[worker 3 node2] received SIGUSR2: the input worker keeps serving" in err
    assert "received SIGTERM" in err


def test_install_ignores_unknown_and_uncatchable_names(handlers):
    assert preemption.install(["NOPE", "KILL", "", "SIGUSR1"]) == ["SIGUSR1"]


def test_requeue_count_comes_from_slurm_or_csrun():
    assert preemption.allocation_index({"SLURM_RESTART_COUNT": "2"}) == 2
    assert preemption.allocation_index({preemption.REQUEUE_COUNT_ENV: "1"}) == 1
    assert preemption.allocation_index({}) == 0


def alloc(start, end, stopped, requeue=0):
    return preemption.Allocation(job_id="7", requeue=requeue, node="node1", start_step=start, end_step=end,
                                 target=300, stopped_by=stopped, process_start=1.0, first_step_at=2.0,
                                 signal_at=3.0 if stopped else None, ended_at=4.0)


def test_allocations_of_a_run_are_chained_by_their_steps(tmp_path):
    lines = []
    preemption.record_allocation(tmp_path, alloc(0, 300, None), lines.append)  # an earlier, finished run
    first = preemption.record_allocation(tmp_path, alloc(0, 120, "SIGUSR2"), lines.append)
    assert first["allocations"] == 1 and first["steps_per_allocation"] == [120]
    second = preemption.record_allocation(tmp_path, alloc(120, 250, "SIGTERM", 1), lines.append)
    third = preemption.record_allocation(tmp_path, alloc(250, 300, None, 2), lines.append)
    assert third["allocations"] == 3 and third["steps_per_allocation"] == [120, 130, 50]
    assert third["global_steps_per_allocation"] == [[0, 120], [120, 250], [250, 300]]
    assert second["stopped_by"] == "SIGTERM" and third["stopped_by"] is None
    recs = read_json(tmp_path / "performance" / "allocations.json")["allocations"]
    assert [r["steps"] for r in recs] == [300, 120, 130, 50]
    assert lines[-2] == "allocation 3 of this run (job 7, requeue 2): global steps 251..300 (50 steps)"
    assert lines[-1] == "the run took 3 allocation(s) so far; steps in each: 120, 130, 50"


def test_a_failed_allocation_that_kept_no_step_says_so(tmp_path):
    """Issue 44: a run that failed at step 2 before any checkpoint logged "global steps 1..0 (0 steps)"."""
    lines: list[str] = []
    preemption.record_allocation(tmp_path, alloc(0, 0, None), lines.append)
    assert lines[0] == "allocation 1 of this run (job 7, requeue 0): no step kept past global step 0 (no checkpoint " \
                       "after it)"


def test_every_allocations_workers_are_kept(tmp_path):
    """Issue 42: each allocation's lost, replaced and paused input workers survive the requeues
    (performance.json's top-level ``workers_*`` are the last allocation's alone)."""
    lost = [{"index": 2, "node": "node3", "reason": "its process died"}]
    first = alloc(0, 120, "SIGUSR2")
    first.workers = {"workers_lost": lost, "workers_replaced": [{"index": 2, "attempt": 1}], "workers_paused": [3]}
    preemption.record_allocation(tmp_path, first)
    preemption.record_allocation(tmp_path, alloc(120, 250, "SIGTERM", 1))
    third = preemption.record_allocation(tmp_path, alloc(250, 300, None, 2))
    history = third["allocation_history"]
    assert [(h["allocation"], h["requeue"], h["start_step"], h["end_step"]) for h in history] == [
        (1, 0, 0, 120), (2, 1, 120, 250), (3, 2, 250, 300)]
    assert history[0]["workers_lost"] == lost and history[0]["workers_paused"] == [3]
    assert history[0]["workers_replaced"][0]["index"] == 2 and history[0]["workers_given_up"] == []
    assert history[1]["workers_lost"] == [] and history[2]["stopped_by"] is None


def test_a_gap_starts_a_new_run():
    recs = [{"start_step": 0, "end_step": 100, "stopped_by": "SIGUSR2"},
            {"start_step": 80, "end_step": 200, "stopped_by": None}]  # resumed from an older checkpoint
    assert preemption.run_allocations(recs) == recs[1:]
    assert preemption.run_allocations([]) == []


def test_wait_workers_left():
    seen = {}
    assert preemption.wait_workers_left(lambda: seen, 0, timeout=1)
    t0 = time.monotonic()
    assert not preemption.wait_workers_left(lambda: seen, 2, timeout=0.3)
    assert 0.3 <= time.monotonic() - t0 < 5  # the timeout is honoured (loose: a loaded host)
    assert preemption.wait_workers_left(lambda: {0: {}, 1: {}}, 2, timeout=1)


def test_rendezvous_key_of_a_requeued_job():
    base = {"CSRUN_ROLE": "worker", "SLURM_PROCID": "1", "CSRUN_TASK_OFFSET": "1", "CSRUN_NUM_WORKERS": "1",
            "SLURM_JOB_ID": "42", "SLURM_STEP_ID": "0"}
    assert resolve_role(base).rendezvous_key == "42.0"
    assert resolve_role({**base, "SLURM_RESTART_COUNT": "0"}).rendezvous_key == "42.0"
    assert resolve_role({**base, "SLURM_RESTART_COUNT": "2"}).rendezvous_key == "42.0.r2"


def test_interrupt_outside_the_loop_raises_quietly(handlers):
    assert preemption.install_interrupts() == ["SIGINT", "SIGTERM"]
    with pytest.raises(preemption.Interrupted) as e:
        os.kill(os.getpid(), signal.SIGTERM)
    assert e.value.signal == "SIGTERM" and e.value.code == 143
    assert not isinstance(e.value, Exception)  # `except Exception` lets it through, as KeyboardInterrupt


def test_interrupt_inside_deferred_is_recorded_and_later_signals_too(handlers, capfd):
    preemption.install_interrupts()
    with preemption.deferred():
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGTERM)  # Slurm ending the step follows with SIGTERM
        assert preemption.stop_requested() and preemption.stop_signal() == "SIGINT"
    assert preemption.exit_code() == 130 and not preemption.requeue_requested()
    os.kill(os.getpid(), signal.SIGTERM)  # after the first, nothing raises any more
    assert "received SIGINT: the task" in capfd.readouterr().err


def test_requeue_signals_keep_exit_75(handlers):
    preemption.install_from_env({preemption.STOP_SIGNALS_ENV: "USR2:TERM"})
    assert preemption.install_interrupts() == ["SIGINT"]  # TERM stays --requeue's
    os.kill(os.getpid(), signal.SIGTERM)  # outside a deferred block: recorded, never raised
    assert preemption.requeue_requested() and preemption.exit_code() == preemption.REQUEUE_EXIT


def test_a_stop_signal_ends_a_wait_for_input_but_not_a_step(handlers):
    preemption.install_interrupts()
    with preemption.deferred():
        with pytest.raises(preemption.Interrupted):
            with preemption.waiting_for_input():  # an input-bound loop blocked on its next batch
                os.kill(os.getpid(), signal.SIGINT)
        assert preemption.stop_signal() == "SIGINT"
        with pytest.raises(preemption.Interrupted):  # a signal already recorded: no new wait
            with preemption.waiting_for_input():
                pass
