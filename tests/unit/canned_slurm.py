"""Canned Slurm for the CLI tests: five 2-CPU nodes, node1 with gpu:1, no accounting, Slurm
22.05.8 (launcher.slurm's query functions replaced), and a click runner that returns the exit
code, stdout and stderr. Import the ``cluster`` fixture into a test module to use it."""
from __future__ import annotations

import pytest
from click.testing import CliRunner

from launcher import slurm

NODES = [slurm.NodeInfo("node1", 2, "gpu:1", "idle", "batch")] + \
    [slurm.NodeInfo(f"node{i}", 2, "", "idle", "batch") for i in range(2, 6)]


@pytest.fixture()
def cluster(monkeypatch, tmp_path):
    """Canned Slurm: five 2-CPU nodes, node1 with gpu:1, no accounting, Slurm 22.05.8."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x.py").write_text("")  # every launch checks its script (launcher.preflight.presubmit)
    monkeypatch.delenv("CSRUN_CONFIG", raising=False)
    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL", raising=False)
    monkeypatch.delenv("CSRUN_VERBOSE", raising=False)
    monkeypatch.setattr(slurm, "list_nodes", lambda partition="", flag="--partition": list(NODES))
    monkeypatch.setattr(slurm, "slurm_release", lambda env=None: (22, 5, 8))
    monkeypatch.setattr(slurm, "accounts", lambda env=None: None)
    monkeypatch.setattr(slurm, "qos_names", lambda env=None: None)
    monkeypatch.setattr(slurm, "reservations", lambda env=None: [])
    monkeypatch.setattr(slurm, "node_features", lambda partition="", env=None: [])
    return monkeypatch


def invoke(command, args):
    result = CliRunner().invoke(command, args, prog_name=command.name)
    return result.exit_code, result.stdout, result.stderr
