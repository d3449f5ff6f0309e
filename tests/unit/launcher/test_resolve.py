"""launcher/resolve.py: a dry run that does not wait for sinfo when slurmctld is down, and the site's
names (QOS, reservation, feature) checked against Slurm's, on canned Slurm output."""
from __future__ import annotations

import pytest

from csrun_common.errors import CsrunError, SlurmUnavailable
from launcher import resolve, slurm
from launcher.config import load_config
from launcher.policy import SitePolicy
from tests.unit.launcher.slurm.test_site import canned


def test_dry_run_does_not_wait_for_sinfo_when_the_ping_says_down(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("CSRUN_CONFIG", raising=False)

    def never(*a, **k):
        raise AssertionError("sinfo asked although scontrol ping said DOWN")

    monkeypatch.setattr(slurm, "list_nodes", never)
    for state in ("down", "timeout"):
        monkeypatch.setattr(slurm, "ping", lambda timeout=1.0, env=None, s=state: (s, f"slurmctld {s}"))
        view = resolve.cluster_view("", "slurm.partition", load_config(), dry_run=True)
        assert not view.online and view.note.startswith(f"slurmctld {state};")
    monkeypatch.setattr(slurm, "ping", lambda timeout=1.0, env=None: ("down", "slurmctld does not answer (x)"))
    with pytest.raises(SlurmUnavailable, match="slurmctld does not answer"):
        resolve.cluster_view("", "slurm.partition", load_config(), dry_run=False)
    monkeypatch.setattr(slurm, "ping", lambda timeout=1.0, env=None: ("timeout", "no answer"))
    with pytest.raises(AssertionError, match="sinfo asked"):  # a real launch asks sinfo after a slow ping
        resolve.cluster_view("", "slurm.partition", load_config(), dry_run=False)


def test_unknown_site_names_are_refused_naming_the_valid_ones(monkeypatch):
    canned(monkeypatch, {"sacctmgr": (0, "debug\nnormal\n", ""), "scontrol": (0, "ReservationName=maint\n", ""),
                         "sinfo": (0, "skylake\n", "")})
    with pytest.raises(CsrunError, match=r"^--qos 'fast': no such QOS in Slurm \(QOS: debug, normal\)$"):
        resolve.check_site_names(SitePolicy(qos="fast"), {"qos": "--qos"})
    with pytest.raises(CsrunError, match=r"^slurm\.reservation 'other': no such reservation in Slurm \(reservations: "
                                         r"maint\)$"):
        resolve.check_site_names(SitePolicy(reservation="maint,other"), {"reservation": "slurm.reservation"})
    with pytest.raises(CsrunError, match=r"--constraint 'ib': no such feature in Slurm \(features: skylake\)"):
        resolve.check_site_names(SitePolicy(constraint="skylake&ib"), {})
    resolve.check_site_names(SitePolicy(qos="debug", reservation="maint", constraint="skylake"), {})


def test_account_and_qos_unchecked_without_accounting(monkeypatch):
    canned(monkeypatch, {"sacctmgr": (1, "", "You are not running a supported accounting_storage plugin\n")})
    resolve.check_site_names(SitePolicy(account="anything", qos="anything"), {})
