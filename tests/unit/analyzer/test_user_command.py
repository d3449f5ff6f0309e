"""analyzer/user_command.py: the user's command split into run.py and its arguments, and the target rate found."""
from __future__ import annotations

import json

import pytest

from analyzer import user_command as U
from csrun_common.errors import CsrunError


def test_split_command(tmp_path):
    (tmp_path / "run.py").write_text("")
    c = U.split_command(["python", "run.py", "--mode", "validate_only"], str(tmp_path))
    assert c.run_py == str((tmp_path / "run.py").resolve()) and c.argv == ["--mode", "validate_only"]
    c = U.split_command(["run.py"], str(tmp_path))
    assert c.python_word is None
    with pytest.raises(CsrunError):
        U.split_command([], str(tmp_path))
    with pytest.raises(CsrunError):
        U.split_command(["python", "-c", "1"], str(tmp_path))


def test_find_target(tmp_path):
    assert U.find_target(str(tmp_path))[0] is None
    (tmp_path / "performance").mkdir()
    (tmp_path / "performance" / "performance.json").write_text(json.dumps({"est_samples_per_sec": 1234.5}))
    v, src = U.find_target(str(tmp_path))
    assert v == 1234.5 and "previous run" in src
    (tmp_path / "compile_report.txt").write_text("Estimated throughput: 2,500.5 samples/s\n")
    v, src = U.find_target(str(tmp_path))
    assert v == 2500.5 and "compile_report.txt" in src
    (tmp_path / "compile_report.json").write_text(json.dumps({"est_samples_per_sec": 999}))
    assert U.find_target(str(tmp_path))[0] == 999.0
