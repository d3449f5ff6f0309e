"""csrun_common/datapaths.py: the launcher's check and the runtime resolve a relative data_dir alike."""
from __future__ import annotations

import sys

from launcher import preflight
from tests.unit.launcher.test_preflight import failed, write_params

PY = sys.executable


def test_the_check_and_the_runtime_resolve_a_relative_data_dir_alike(tmp_path, monkeypatch):
    """issue 33 item 10: one rule (csrun_common.datapaths), the launch directory's, in the
    pre-submission check and in the runtime's data_dir view (csrun_runtime.sharding)."""
    from csrun_common.datapaths import data_path_exists, resolve_data_path
    from csrun_runtime.sharding import make_data_dir_view

    launch = tmp_path / "launch"
    (launch / "data").mkdir(parents=True)
    (launch / "data" / "a.tfrecord").write_text("")
    assert resolve_data_path("data", launch) == str(launch / "data")
    assert resolve_data_path("/abs/data", launch) == "/abs/data" and resolve_data_path("gs://b/d", launch) == "gs://b/d"
    assert data_path_exists("data/*.tfrecord", launch) and not data_path_exists("data/*.png", launch)
    monkeypatch.chdir(launch)  # a task runs in the launch directory
    assert resolve_data_path("data") == str(launch / "data")
    own = {str((launch / "data" / "a.tfrecord").resolve())}
    view = make_data_dir_view("data", own, set(), tmp_path / "view")
    assert view.data_dir != "data" and not view.notes  # the runtime found it where the check does
    write_params(tmp_path / "p.yaml", train_input={"data_dir": "data"})
    (tmp_path / "run.py").write_text("")
    assert not failed(preflight.command_checks([PY, str(tmp_path / "run.py"), "--params", str(tmp_path / "p.yaml")],
                                               launch, False))
