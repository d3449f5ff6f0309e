"""launcher/slurm/site.py on canned Slurm output (the text Slurm 22.05 prints, recorded on the
test cluster): ``--test-only``, sacctmgr's lists, reservations and features, the version and
config values."""
import subprocess

from csrun_common.errors import SlurmUnavailable
from launcher import slurm


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
