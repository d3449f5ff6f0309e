"""``--autoscale``'s bounds (csrun_common/autoscale.py): the plan's defaults, its round trip through
the task variable, and refusals naming the flag or variable."""

import pytest

from csrun_common.autoscale import ENV, AutoscaleSpec, parse_env, plan_autoscale


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
