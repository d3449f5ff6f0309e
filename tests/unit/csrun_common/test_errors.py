"""csrun_common/errors.py: the one error family a CLI reports as one line, exit status 2 unless the
raiser says otherwise."""
from __future__ import annotations

from csrun_common import exits
from csrun_common.errors import ConfigError, CsrunError, SlurmUnavailable


def test_bad_input_exits_2_and_a_failed_run_says_its_own_status():
    assert CsrunError("--qos 'a b': not a Slurm name").exit_code == exits.USAGE == 2
    assert CsrunError("the run failed", exit_code=exits.FAILED).exit_code == 1
    assert str(CsrunError("--qos 'a b': not a Slurm name")) == "--qos 'a b': not a Slurm name"


def test_the_config_and_slurm_errors_are_of_the_family():
    for cls in (ConfigError, SlurmUnavailable):
        e = cls("x")
        assert isinstance(e, CsrunError) and e.exit_code == exits.USAGE
