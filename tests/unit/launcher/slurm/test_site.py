"""launcher.slurm's preflight, site-name and version queries on canned Slurm output (the text
Slurm 22.05 prints, recorded on the test cluster), and the interrupt exit status."""
import signal
import subprocess

import pytest

from csrun_common.errors import CsrunError, SlurmUnavailable
from launcher import resolve, slurm
from launcher.policy import SitePolicy


def canned(monkeypatch, answers):
    """Replace every Slurm query by ``answers[argv[0]]`` = (returncode, stdout, stderr) or an
    exception; records the argv lists asked."""
    asked = []

    def fake(argv, env=None, timeout=slurm.QUERY_TIMEOUT_S, input_text=None):
        asked.append(list(argv))
        ans = answers[argv[0]]
        if isinstance(ans, Exception):
            raise ans
        rc, out, err = ans
        return subprocess.CompletedProcess(argv, rc, out, err)

    monkeypatch.setattr(slurm.command, "run", fake)
    return asked


def test_sbatch_test_only_fits(monkeypatch):
    asked = canned(monkeypatch, {"sbatch": (0, "", "sbatch: Job 12 to start at 2026-11-22T23:55:42 using 6 "
                                                "processors on node[1-3]\n")})
    ans = slurm.test_only_batch("#!/bin/bash\n")
    assert ans.ok and ans.start == "2026-11-22T23:55:42" and asked == [["sbatch", "--test-only"]]


def test_sbatch_test_only_cannot_run(monkeypatch):
    canned(monkeypatch, {"sbatch": (1, "", "allocation failure: Requested node configuration is not available\n")})
    ans = slurm.test_only_batch("#!/bin/bash\n")
    assert not ans.ok and ans.start is None
    assert ans.reason == "allocation failure: Requested node configuration is not available"


def test_srun_test_only_tests_each_component(monkeypatch):
    err = ("srun: Job 5 to start at 2026-11-22T23:55:34 using 1 processors on nodes node1 in partition batch\n"
           "srun: Job 6 to start at 2026-11-22T23:55:40 using 2 processors on nodes node[2-3] in partition batch\n")
    asked = canned(monkeypatch, {"srun": (0, "", err)})
    ans = slurm.test_only_srun(["srun", "--nodes=1", "true", ":", "--nodes=2", "true"])
    assert ans.ok and ans.start == "2026-11-22T23:55:40"  # the latest component decides
    assert asked[0][:2] == ["srun", "--test-only"] and asked[0].count(":") == 1


def test_sacctmgr_lists_and_no_accounting(monkeypatch):
    canned(monkeypatch, {"sacctmgr": (0, "csrun\nresearch\nroot\n", "")})
    assert slurm.accounts() == ["csrun", "research", "root"]
    canned(monkeypatch, {"sacctmgr": (1, "", "You are not running a supported accounting_storage plugin\n"
                                              "Only 'accounting_storage/slurmdbd' is supported.\n")})
    assert slurm.accounts() is None and slurm.qos_names() is None
    canned(monkeypatch, {"sacctmgr": SlurmUnavailable("sacctmgr did not answer in 5 s")})
    assert slurm.qos_names() is None


def test_reservations_and_features(monkeypatch):
    canned(monkeypatch, {"scontrol": (0, "No reservations in the system\n", ""),
                         "sinfo": (0, "(null)\nskylake,ib\nskylake\n", "")})
    assert slurm.reservations() == [] and slurm.node_features() == ["ib", "skylake"]
    canned(monkeypatch, {"scontrol": (0, "ReservationName=maint StartTime=2026-11-23T00:00:00 EndTime=...\n"
                                         "ReservationName=gpu_rsv StartTime=...\n", "")})
    assert slurm.reservations() == ["gpu_rsv", "maint"]


def test_version_parsing(monkeypatch):
    assert slurm.parse_slurm_version("slurm-wlm 22.05.8") == (22, 5, 8)
    assert slurm.parse_slurm_version("slurm 24.11.0-0rc1") == (24, 11, 0)
    assert slurm.parse_slurm_version("slurm 23.02") == (23, 2, 0)
    assert slurm.parse_slurm_version("nothing") is None
    canned(monkeypatch, {"sinfo": (0, "slurm-wlm 22.05.8\n", "")})
    assert slurm.slurm_release() == (22, 5, 8)
    canned(monkeypatch, {"sinfo": SlurmUnavailable("sinfo: not found on PATH")})
    assert slurm.slurm_release() is None


def test_config_values(monkeypatch):
    text = ("Configuration data as of 2026-11-23T00:00:00\nKillWait                = 5 sec\n"
            "MaxBatchRequeue         = 5\nMinJobAge               = 60 sec\n")
    canned(monkeypatch, {"scontrol": (0, text, "")})
    assert slurm.config_values(["KillWait", "MaxBatchRequeue"]) == {"KillWait": "5 sec", "MaxBatchRequeue": "5"}


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


@pytest.mark.parametrize("rc,received,expected", [
    (0, [], 0), (3, [], 3), (-9, [], 137), (-2, [], 130),
    (137, [signal.SIGINT], 130), (0, [signal.SIGINT], 130), (143, [signal.SIGTERM], 143),
    (1, [signal.SIGTERM, signal.SIGINT], 143),
])
def test_exit_status_says_what_the_user_did(rc, received, expected):
    assert slurm.exit_status(rc, received) == expected


def test_check_reports_killwait_and_a_lower_maxbatchrequeue(monkeypatch):
    from launcher import preflight
    from launcher.builders import WseRequest
    from launcher.layout import plan_layout
    from launcher.requeue import RequeueSpec

    req = WseRequest(layout=plan_layout(2, 2, 1, 0, False, "gpu:1", 2), command=("python", "x.py"), python="python",
                     requeue=RequeueSpec("USR2", 90, 5))
    monkeypatch.setattr(slurm, "config_values", lambda keys, env=None: {"KillWait": "30 sec", "MaxBatchRequeue": "2"})
    check = preflight.requeue_check(req)
    assert check is not None and check.ok
    assert "KillWait 30 sec" in check.detail and "MaxBatchRequeue is 2, below --max-requeues 5" in check.detail
    monkeypatch.setattr(slurm, "config_values", lambda keys, env=None: {"KillWait": "5 sec"})  # Slurm 22.05
    assert "MaxBatchRequeue" not in preflight.requeue_check(req).detail
    assert preflight.requeue_check(WseRequest(layout=req.layout, command=req.command, python="python")) is None
