"""``--autoscale``'s decision (csrun_runtime/autoscale.py): the window's rates, the decision rules
and the tf.data service AutoScaler estimate. The controller itself runs on the test cluster
(tests/integration/test_autoscale_cluster.py)."""
import math

from csrun_common.autoscale import AutoscaleSpec
from csrun_runtime.autoscale import HIGH_WAIT, LOW_WAIT, Window, decide, tf_autoscaler_estimate

SPEC = AutoscaleSpec(1, 1, 6, "rate", 10.0)


def test_window_rates():
    w = Window(wait_s=6.0, compute_s=4.0, samples=8000)
    assert w.seconds == 10.0 and w.wait_fraction == 0.6
    assert w.delivered == 800.0 and w.consumer_rate == 2000.0
    assert Window(0.0, 0.0, 0).wait_fraction == 0.0 and math.isinf(Window(1.0, 0.0, 10).consumer_rate)


def test_tf_autoscaler_estimate_is_consumer_rate_over_mean_worker_throughput():
    # 2 workers deliver 800 samples/s (400 each) to a consumer that takes 2000: ceil(2000 / 400) = 5
    assert tf_autoscaler_estimate(Window(6.0, 4.0, 8000), 2) == 5
    assert tf_autoscaler_estimate(Window(5.0, 5.0, 10000), 1) == 2  # exactly 2.0 -> 2
    assert tf_autoscaler_estimate(Window(1.0, 0.0, 0), 3) == 4       # nothing delivered: one more


def test_rate_policy_jumps_to_the_estimate_within_max():
    d = decide(SPEC, Window(6.0, 4.0, 8000), 2)
    assert (d.action, d.count, d.estimate) == ("add", 3, 5)
    assert "AutoScaler estimate is 5 worker(s)" in d.reason and "consumer 2000 samples/s" in d.reason
    assert decide(AutoscaleSpec(1, 1, 3, "rate"), Window(6.0, 4.0, 8000), 2).count == 1  # capped by max
    assert decide(SPEC, Window(1.5, 8.5, 8500), 5).count == 1  # 15 % wait: ceil(5.9) = 6, one more


def test_step_policy_adds_one():
    d = decide(AutoscaleSpec(1, 1, 6, "step"), Window(6.0, 4.0, 8000), 2)
    assert (d.action, d.count) == ("add", 1) and d.estimate == 5


def test_hold_at_max_and_between_thresholds():
    assert decide(AutoscaleSpec(1, 1, 2), Window(6.0, 4.0, 8000), 2).action == "hold"
    mid = (HIGH_WAIT + LOW_WAIT) / 2
    assert decide(SPEC, Window(mid * 10, (1 - mid) * 10, 1000), 3).action == "hold"


def test_remove_when_ahead_unless_the_measured_rate_says_all_are_needed():
    ahead = Window(0.05, 9.95, 50000)  # 0.5 % wait; consumer ~5025 samples/s
    assert decide(SPEC, ahead, 4).action == "remove"  # no worker rate measured yet: probe one down
    assert decide(SPEC, ahead, 4, capacity=1500.0).action == "hold"   # ceil(5025 * 1.1 / 1500) = 4
    d = decide(SPEC, ahead, 6, capacity=1500.0)
    assert (d.action, d.count, d.estimate) == ("remove", 1, 4)
    assert decide(SPEC, ahead, 1).action == "hold"  # --min-workers
    assert decide(SPEC, ahead, 3, floor=3).action == "hold"  # a removal from 3 made training wait
