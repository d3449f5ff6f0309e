"""launcher/slurm/command.py: a Slurm client or config missing runs nothing, a timeout is one line."""
from __future__ import annotations

import subprocess

import pytest

from csrun_common.errors import SlurmUnavailable
from launcher import slurm
from tests.unit.launcher.slurm.test_queries import SINFO_NODES


def test_timeout_is_one_line(canned, monkeypatch):
    canned(sinfo=[(0, "", "")])

    def hang(argv, **kwargs):
        raise subprocess.TimeoutExpired(argv, kwargs["timeout"])

    monkeypatch.setattr(slurm.command.subprocess, "run", hang)
    with pytest.raises(SlurmUnavailable, match=r"^sinfo did not answer in 5 s: is slurmctld running and reachable\?$"):
        slurm.list_nodes()


def test_missing_client_and_missing_conf_run_nothing(canned, monkeypatch, tmp_path):
    c = canned(sinfo=[(0, SINFO_NODES, "")])
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "nope.conf"))
    with pytest.raises(SlurmUnavailable, match=r"SLURM_CONF=.*nope\.conf: no such file"):
        slurm.list_nodes()
    monkeypatch.delenv("SLURM_CONF")
    monkeypatch.setattr(slurm.command.shutil, "which", lambda name: None)
    with pytest.raises(SlurmUnavailable, match="sinfo: not found on PATH; is the Slurm client installed"):
        slurm.list_nodes()
    assert c.calls == []
    # the SLURM_CONF of a given environment is checked, not this process's
    with pytest.raises(SlurmUnavailable, match="other.conf: no such file"):
        slurm.queued_jobs(env={"SLURM_CONF": str(tmp_path / "other.conf")})
