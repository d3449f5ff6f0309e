"""csrun_runtime/pytorch/runner.py: the csrun features not wired for PyTorch are named."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


def test_features_not_wired_for_pytorch_are_named(monkeypatch):
    """Every csrun_wse feature is wired for PyTorch now (no warning); a variable listed in
    ``runner.NOT_WIRED`` (one is put there here) is named with its flag and value."""
    from csrun_runtime.pytorch import runner

    assert runner.not_wired({}) == [] and runner.not_wired({"CSRUN_CHIEF_INPUT_CPUS": "0"}) == []
    assert runner.not_wired({"CSRUN_AUTOSCALE": "2:1:3:rate:30", "CSRUN_WORKER_JOB": "1"}) == []
    monkeypatch.setattr(runner, "NOT_WIRED", {"CSRUN_AUTOSCALE": "--autoscale"})
    (w,) = runner.not_wired({"CSRUN_AUTOSCALE": "2:1:3:rate:30"})
    assert w.startswith("csrun_wse --autoscale (CSRUN_AUTOSCALE=2:1:3:rate:30) is not wired for PyTorch yet")
