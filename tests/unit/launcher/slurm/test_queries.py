"""launcher/slurm/queries.py on CANNED output of sinfo, squeue, sacct and scontrol
(``subprocess.run`` patched, as torchx's Slurm scheduler tests do): nodes, job states, the
queue, accounting, the controller's ping; parsing, errors and their one-line messages. No
cluster."""
from __future__ import annotations

import time

import pytest

from csrun_common.errors import CsrunError, SlurmUnavailable
from launcher import slurm

SINFO_NODES = """\
node1|2|gpu:1|idle|debug*
node2|2|(null)|idle|debug*
node3|4|(null)|alloc|debug*
node3|4|(null)|alloc|big
"""


# --------------------------------------------------------------------------- sinfo
def test_list_nodes_parses_sinfo(canned):
    c = canned(sinfo=[(0, SINFO_NODES, "")])
    nodes = slurm.list_nodes()
    assert [(n.name, n.cpus, n.gres, n.state, n.partition) for n in nodes] == [
        ("node1", 2, "gpu:1", "idle", "debug"), ("node2", 2, "", "idle", "debug"),
        ("node3", 4, "", "alloc", "debug"), ("node3", 4, "", "alloc", "big")]
    assert c.argv() == ["/usr/bin/sinfo", "--noheader", "--Node", "--format=%N|%c|%G|%t|%P"]
    assert c.calls[0][1]["timeout"] == slurm.QUERY_TIMEOUT_S


def test_list_nodes_of_a_partition_and_cpu_node_cpus(canned):
    c = canned(sinfo=[(0, "node3|4|(null)|alloc|big\n", "")])
    nodes = slurm.list_nodes("big")
    assert c.argv()[-1] == "--partition=big"
    assert slurm.cpu_node_cpus(nodes) == 4
    all_nodes = [slurm.NodeInfo("node1", 8, "gpu:1", "idle", "p"), slurm.NodeInfo("node2", 2, "", "idle", "p")]
    assert slurm.cpu_node_cpus(all_nodes, exclude="node1") == 2
    assert slurm.cpu_node_cpus(all_nodes[:1], exclude="node1") == 8  # only the GRES node: its CPUs


def test_unknown_partition_names_the_flag_and_the_known_ones(canned):
    canned(sinfo=[(0, "", ""), (0, SINFO_NODES, "")])
    with pytest.raises(CsrunError) as e:
        slurm.list_nodes("nope", flag="slurm.partition")
    assert str(e.value) == "slurm.partition 'nope': no such partition in Slurm (partitions: big, debug)"
    assert e.value.exit_code == 2


def test_no_nodes_at_all(canned):
    canned(sinfo=[(0, "garbage line\n", "")])
    with pytest.raises(CsrunError, match="sinfo reports no nodes"):
        slurm.list_nodes()


def test_unreachable_controller_is_one_line(canned):
    canned(sinfo=[(1, "", "sinfo: error: some detail\nslurm_load_partitions: Unable to contact slurm "
                              "controller (connect failure)\n")])
    with pytest.raises(SlurmUnavailable) as e:
        slurm.list_nodes()
    assert str(e.value) == ("cannot reach slurmctld (sinfo: slurm_load_partitions: Unable to contact slurm "
                            "controller (connect failure))")
    assert "\n" not in str(e.value) and e.value.exit_code == 2


def test_node_hosts(canned):
    c = canned(sinfo=[(0, "node1|hostA\nnode2|hostA\nnode3|\n\n", "")])
    assert slurm.node_hosts("debug") == {"node1": "hostA", "node2": "hostA", "node3": "node3"}
    assert c.argv() == ["/usr/bin/sinfo", "--noheader", "--Node", "--format=%N|%n", "--partition=debug"]


def test_version(canned, monkeypatch):
    canned(sinfo=[(0, "slurm-wlm 22.05.8\n", "")])
    assert slurm.version() == "slurm-wlm 22.05.8"
    monkeypatch.setattr(slurm.command.shutil, "which", lambda name: None)
    assert slurm.version() is None


# --------------------------------------------------------------------------- squeue / sacct
def test_job_state_from_squeue(canned):
    c = canned(squeue=[(0, "42|RUNNING\n", "")])
    assert slurm.job_state("42") == "RUNNING"
    assert c.argv() == ["/usr/bin/squeue", "--noheader", "--jobs=42", "--states=all", "--format=%i|%T"]


def test_job_state_falls_back_to_sacct(canned):
    c = canned(squeue=[(1, "", "slurm_load_jobs error: Invalid job id specified\n")],
               sacct=[(0, "42|CANCELLED by 0\n42.batch|CANCELLED\n42.0|CANCELLED\n", "")])
    assert slurm.job_state("42") == "CANCELLED"
    assert c.argv() == ["/usr/bin/sacct", "--noheader", "--parsable2", "--jobs=42", "--format=JobID,State"]


def test_job_state_without_accounting_is_unknown(canned):
    canned(squeue=[(1, "", "slurm_load_jobs error: Invalid job id specified\n")],
           sacct=[(1, "", "Slurm accounting storage is disabled\n")])
    assert slurm.job_state("42") is None


def test_job_state_unreachable_controller(canned):
    canned(squeue=[(1, "", "slurm_load_jobs error: Unable to contact slurm controller (connect failure)\n")])
    with pytest.raises(SlurmUnavailable, match=r"^cannot reach slurmctld \(squeue: slurm_load_jobs error: Unable"):
        slurm.job_state("42")


def test_queued_jobs(canned):
    canned(squeue=[(0, "12\n13\n\n14\n", "")])
    assert slurm.queued_jobs() == 3


def test_queued_job_ids(canned):
    c = canned(squeue=[(0, "12+0\n12+1\n\n14\n", ""), (0, "14\n", "")])
    assert slurm.queued_job_ids() == {"12+0", "12+1", "14"}
    assert slurm.queued_job_ids(running_only=True) == {"14"}
    assert c.argv(1) == ["/usr/bin/squeue", "--noheader", "--format=%i", "--states=RUNNING"]


SCONTROL_NO_ACCOUNTING = "AccountingStorageHost   = localhost\nAccountingStorageType   = accounting_storage/none\n"
SCONTROL_ACCOUNTING = "AccountingStorageType   = accounting_storage/slurmdbd\nClusterName = c\n"


def test_accounting_enabled(canned, no_cache):
    canned(scontrol=[(0, SCONTROL_NO_ACCOUNTING, "")])
    assert slurm.accounting_enabled() is False
    slurm.queries._ACCOUNTING.clear()
    canned(scontrol=[(0, SCONTROL_ACCOUNTING, "")])
    assert slurm.accounting_enabled() is True
    slurm.queries._ACCOUNTING.clear()
    canned(scontrol=[(1, "", "slurm_load_ctl_conf error: Unable to contact slurm controller")])
    assert slurm.accounting_enabled() is False

# --------------------------------------------------------------------------- a dry run without slurmctld
@pytest.mark.parametrize("text,state", [
    ("Slurmctld(primary) at vm is UP\n", "up"),
    ("Slurmctld(primary) at vm is DOWN\n*****\n** RESTORE SLURMCTLD DAEMON TO SERVICE **\n", "down"),
    ("Slurmctld(primary) at a is DOWN\nSlurmctld(backup) at b is UP\n", "up"),
    ("scontrol: error: resolve_ctls_from_dns_srv: res_nsearch error\n", "unknown"),
])
def test_parse_ping(text, state):
    assert slurm.parse_ping(text) == state


def test_ping_of_an_unreachable_controller_is_fast(tmp_path, monkeypatch):
    if not slurm.command.shutil.which("scontrol"):
        pytest.skip("no Slurm client here")
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=x\nSlurmctldHost=h(127.0.0.1)\nSlurmctldPort=1\nAuthType=auth/none\n"
                    "NodeName=n1 CPUs=1\nPartitionName=p Nodes=n1\n")
    t0 = time.monotonic()
    state, _ = slurm.ping(env={"SLURM_CONF": str(conf), "PATH": slurm.command.os.environ["PATH"]})
    assert time.monotonic() - t0 < 1.5 and state in ("down", "unknown", "timeout")
