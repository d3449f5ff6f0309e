"""``--autoscale``'s pure parts: the bounds (csrun_common.autoscale), the task variable, the
decision rules and the tf.data service AutoScaler estimate (csrun_runtime.autoscale), and the
CLI's flags with canned Slurm answers. The controller itself runs on the test cluster
(tests/integration/test_autoscale_cluster.py)."""
import math

import pytest

from csrun_common.autoscale import ENV, AutoscaleSpec, parse_env, plan_autoscale
from csrun_runtime.autoscale import HIGH_WAIT, LOW_WAIT, Window, decide, tf_autoscaler_estimate
from launcher import cli
from tests.unit.test_cli_prod import cluster, invoke  # noqa: F401 - the fixture

SPEC = AutoscaleSpec(1, 1, 6, "rate", 10.0)


def test_plan_defaults_and_env_round_trip():
    spec = plan_autoscale(6, None, None, None)
    assert spec == AutoscaleSpec(1, 1, 6, "rate", 10.0)
    assert spec.to_env() == "1:1:6:rate:10"
    assert parse_env({ENV: "2:1:4:step:7.5"}, 6) == AutoscaleSpec(2, 1, 4, "step", 7.5)
    assert parse_env({}, 6) is None and parse_env({ENV: " "}, 6) is None
    assert plan_autoscale(6, 3, 2, 5) == AutoscaleSpec(3, 2, 5, "rate", 10.0)


@pytest.mark.parametrize("args, message", [
    ((0, None, None, None), "--autoscale: the layout has no input-worker task"),
    ((4, None, None, 5), "--max-workers 5: the layout has only 4 input-worker task(s)"),
    ((4, None, 3, 2), "--min-workers 3: more than --max-workers 2"),
    ((4, 4, 1, 3), "--initial-workers 4: must lie in [--min-workers 1, --max-workers 3]"),
    ((4, None, 0, None), "--min-workers 0: must be a positive integer"),
    ((4, None, None, 0), "--max-workers 0: must be a positive integer"),
])
def test_plan_refuses_bounds_naming_the_flag(args, message):
    with pytest.raises(ValueError) as exc:
        plan_autoscale(*args)
    assert str(exc.value).startswith(message)


def test_plan_refuses_policy_and_window():
    with pytest.raises(ValueError, match=r"--autoscale-policy 'fast': must be one of rate, step"):
        plan_autoscale(4, None, None, None, "fast")
    with pytest.raises(ValueError, match=r"--autoscale-window 0.5: must be at least 1 second"):
        plan_autoscale(4, None, None, None, "rate", 0.5)


@pytest.mark.parametrize("raw", ["1:1:6", "a:1:6:rate:10", "1:1:9:rate:10"])
def test_parse_env_names_the_variable(raw):
    with pytest.raises(ValueError, match=rf"^{ENV}='{raw}': "):
        parse_env({ENV: raw}, 6)


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


def test_cli_exports_the_setting_and_refuses_bounds_without_autoscale(cluster):  # noqa: F811
    code, out, err = invoke(cli.csrun_wse, ["--dry-run", "--total-nodes", "3", "--tasks-per-node", "2",
                                            "--autoscale", "--max-workers", "4", "--autoscale-policy", "step",
                                            "python", "x.py"])
    assert code == 0, err
    assert out.count("CSRUN_AUTOSCALE=1:1:4:step:10,") == 2
    code, out, err = invoke(cli.csrun_wse, ["--dry-run", "--max-workers", "4", "python", "x.py"])
    assert code == 2 and err.strip() == "csrun_wse: error: --max-workers 4: needs --autoscale" and not out
    code, _, err = invoke(cli.csrun_wse, ["--dry-run", "--total-nodes", "2", "--tasks-per-node", "1",
                                          "--autoscale", "--max-workers", "3", "python", "x.py"])
    assert code == 2 and err.strip().startswith("csrun_wse: error: --max-workers 3: the layout has only 1")
    code, out, _ = invoke(cli.csrun_wse, ["--dry-run", "--total-nodes", "3", "python", "x.py"])
    assert code == 0 and "CSRUN_AUTOSCALE" not in out
