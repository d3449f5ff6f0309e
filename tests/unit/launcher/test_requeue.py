"""launcher/requeue.py: the --requeue spec (signal, budget, time limit): pure checks, one line naming the flag."""
import pytest

from csrun_common.errors import CsrunError
from launcher.requeue import RequeueSpec, parse_signal_spec


@pytest.mark.parametrize("spec,expected", [
    ("USR2@90", ("USR2", 90)), ("SIGUSR1@30", ("USR1", 30)), ("usr2", ("USR2", 60)), ("12@5", ("USR2", 5)),
    ("TERM@10", ("TERM", 10)),
])
def test_signal_spec(spec, expected):
    assert parse_signal_spec(spec) == expected


@pytest.mark.parametrize("spec,why", [
    ("KILL@10", "cannot be the warning signal"), ("USR2@0", "1..65535"), ("USR2@70000", "1..65535"),
    ("USR2@", "not SIGNAL@SECONDS"), ("NOPE@3", "cannot be the warning signal"), ("99@3", "no signal number 99"),
])
def test_bad_signal_spec(spec, why):
    with pytest.raises(CsrunError, match=why) as info:
        parse_signal_spec(spec)
    assert str(info.value).startswith(f"--requeue-signal {spec!r}")


def test_requeue_spec_budget_and_time_limit():
    spec = RequeueSpec.parse("USR2@90", 3)
    assert (spec.sbatch_option(), spec.stop_signals(), spec.max_requeues) == ("--signal=USR2@90", "USR2:TERM", 3)
    assert RequeueSpec.parse("TERM@5", 0).stop_signals() == "TERM"
    with pytest.raises(CsrunError, match="--max-requeues -1: must be 0 or more"):
        RequeueSpec.parse("USR2@90", -1)
    spec.check_time_limit(None)
    spec.check_time_limit(91)
    with pytest.raises(CsrunError, match=r"lead time 90 s must be shorter than the time limit \(--time: 60 s\)"):
        spec.check_time_limit(60)
