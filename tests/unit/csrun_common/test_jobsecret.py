"""csrun_common.jobsecret: the job's secret, its format, and a process' own when none is given."""
import pytest

from csrun_common import jobsecret
from csrun_common.env import JOB_SECRET, EnvError


def test_a_process_without_one_makes_its_own_and_exports_it():
    env: dict[str, str] = {}
    key = jobsecret.job_secret(env)
    assert len(key) == jobsecret.SECRET_BYTES and env[JOB_SECRET.name] == key.hex()
    assert jobsecret.job_secret(env) == key  # the processes it starts read the same


def test_a_malformed_secret_is_refused_without_showing_it():
    for bad in ("zz" * 32, "ab" * 8):
        with pytest.raises(EnvError) as ei:
            jobsecret.job_secret({JOB_SECRET.name: bad})
        assert JOB_SECRET.name in str(ei.value) and bad not in str(ei.value)


def test_each_launch_gets_a_fresh_one():
    a = jobsecret.with_new_secret({JOB_SECRET.name: "ab" * 32, "OTHER": "1"})
    b = jobsecret.with_new_secret(a)
    assert a["OTHER"] == "1" and len({a[JOB_SECRET.name], b[JOB_SECRET.name], "ab" * 32}) == 3
    assert len(bytes.fromhex(a[JOB_SECRET.name])) == jobsecret.SECRET_BYTES
