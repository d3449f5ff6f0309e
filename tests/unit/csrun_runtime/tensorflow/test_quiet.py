"""csrun_runtime.tensorflow.quiet: which start-up lines are dropped, and when the runtime imports
TensorFlow quietly (the import itself is checked through csrun_wse in
tests/integration/test_prod_cluster.py)."""
import io
import sys

import pytest

from csrun_runtime.tensorflow import quiet

ABSL = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
ONEDNN = ("I0000 00:00:1795402961.617675   23419 port.cc:153] oneDNN custom operations are on. You may see "
          "slightly different numerical results due to floating-point round-off errors\n")


def test_only_the_two_start_up_lines_are_noise():
    assert quiet.is_noise(ABSL) and quiet.is_noise(ONEDNN)
    assert not quiet.is_noise("W0000 00:00:1.0 1 worker_impl.cc:592] Failed to send heartbeat\n")
    assert not quiet.is_noise("my note: oneDNN custom operations are on. (quoted)\n")
    assert not quiet.is_noise("user: " + ABSL)


def test_replay_keeps_everything_else_in_order(monkeypatch):
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    quiet._replay([ABSL, "first\n", ONEDNN, ABSL, "E0000 a real error\n", ONEDNN, "last"])
    assert err.getvalue() == "first\nE0000 a real error\nlast"


@pytest.mark.parametrize(("env", "argv0", "expected"), [
    ({"CSRUN_ROLE": "worker"}, "run.py", True),
    ({"CSRUN_ROLE": "chief", "TF_CPP_MIN_LOG_LEVEL": "1"}, "/x/run.py", True),
    ({}, "run.py", False),                                               # not a launched task
    ({"CSRUN_ROLE": "worker"}, "-m", False),                             # python -m (the supervisor)
    ({"CSRUN_ROLE": "worker"}, "-c", False),
    ({"CSRUN_ROLE": "worker", "TF_CPP_MIN_LOG_LEVEL": "0"}, "run.py", False),  # csrun_wse --verbose
    ({"CSRUN_ROLE": "worker", "CSRUN_VERBOSE": "1"}, "run.py", False),
])
def test_wanted(env, argv0, expected, monkeypatch):
    monkeypatch.delitem(sys.modules, "tensorflow", raising=False)
    assert quiet.wanted(env, argv0) is expected


def test_not_wanted_once_tensorflow_is_imported(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorflow", object())
    assert not quiet.wanted({"CSRUN_ROLE": "worker"}, "run.py")
