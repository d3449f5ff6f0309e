"""Unit tests of launcher/slurm/, the one package that runs Slurm commands, on CANNED
output of sinfo, squeue, sacct and sbatch (``subprocess.run`` patched, as torchx's Slurm
scheduler tests do): parsing, timeouts, errors and their one-line messages. No cluster."""
from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from csrun_common.errors import CsrunError, SlurmUnavailable
from launcher import slurm

SINFO_NODES = """\
node1|2|gpu:1|idle|debug*
node2|2|(null)|idle|debug*
node3|4|(null)|alloc|debug*
node3|4|(null)|alloc|big
"""


@dataclass
class Canned:
    """A stand-in for ``subprocess.run``: answers each Slurm command (by its binary's name)
    with canned ``(returncode, stdout, stderr)`` and records every call."""

    answers: dict[str, list[tuple[int, str, str]]]
    calls: list[tuple[list[str], dict]] = field(default_factory=list)

    def __call__(self, argv, **kwargs):
        self.calls.append((list(argv), kwargs))
        name = Path(argv[0]).name
        queue = self.answers[name]
        rc, out, err = queue.pop(0) if len(queue) > 1 else queue[0]
        return subprocess.CompletedProcess(argv, rc, out, err)

    def argv(self, i: int = -1) -> list[str]:
        return self.calls[i][0]


@pytest.fixture()
def canned(monkeypatch):
    """Patch ``subprocess.run`` and the PATH lookup; returns a function that installs the
    answers and gives the :class:`Canned` recorder."""
    monkeypatch.delenv("SLURM_CONF", raising=False)
    monkeypatch.setattr(slurm.command.shutil, "which", lambda name: f"/usr/bin/{name}")

    def install(**answers: list[tuple[int, str, str]]) -> Canned:
        c = Canned({k: list(v) for k, v in answers.items()})
        monkeypatch.setattr(slurm.command.subprocess, "run", c)
        return c

    return install


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


# --------------------------------------------------------------------------- sbatch
def test_submit_batch_returns_the_job_id(canned):
    c = canned(sbatch=[(0, "4242;cluster\n", "")])
    assert slurm.submit_batch("#!/bin/bash\ntrue\n") == "4242"
    argv, kwargs = c.calls[0]
    assert argv == ["/usr/bin/sbatch", "--parsable"] and kwargs["input"] == "#!/bin/bash\ntrue\n"


def test_submit_batch_refused_is_one_line(canned):
    canned(sbatch=[(1, "", "sbatch: error: Batch job submission failed: Invalid partition name specified\n")])
    with pytest.raises(CsrunError) as e:
        slurm.submit_batch("#!/bin/bash\ntrue\n")
    assert str(e.value) == ("sbatch refused the job: sbatch: error: Batch job submission failed: Invalid partition "
                            "name specified")


# --------------------------------------------------------------------------- functions as jobs (submitit)
def test_function_job_spec_becomes_the_sbatch_script(canned, tmp_path):
    canned()
    spec = slurm.FunctionJobSpec(folder=tmp_path / "sub", job_name="probe_1", cpus_per_task=4, partition="cpu",
                                 account="acct", exclude="node1", time_min=7, chdir="/work/dir",
                                 python=("singularity", "exec", "-B", "/data", "img.sif", "python3"),
                                 srun_args=("--container-image=x",))
    ex = slurm.function_executor(spec)
    text = ex._make_submission_file_text(ex._submitit_command_str, "uid")
    lines = text.splitlines()
    for want in ("#SBATCH --job-name=probe_1", "#SBATCH --nodes=1", "#SBATCH --ntasks-per-node=1",
                 "#SBATCH --cpus-per-task=4", "#SBATCH --exclusive", "#SBATCH --partition=cpu",
                 "#SBATCH --account=acct", "#SBATCH --exclude=node1", "#SBATCH --time=7",
                 "#SBATCH --chdir=/work/dir"):
        assert want in lines, want
    assert not any(ln.startswith("#SBATCH --error") for ln in lines)  # one log: stderr to stdout
    step = next(ln for ln in lines if ln.startswith("srun "))
    assert " --cpus-per-task=4 --cpu-bind=none --kill-on-bad-exit=1 --container-image=x " in step
    assert step.endswith(f"singularity exec -B /data img.sif python3 -u -m submitit.core._submit {tmp_path / 'sub'}")


def test_function_job_spec_leaves_out_what_is_not_given(canned, tmp_path):
    canned()
    text = slurm.function_executor(slurm.FunctionJobSpec(folder=tmp_path, job_name="j", exclusive=False,
                                                         time_min=0))._make_submission_file_text("x", "u")
    for absent in ("--partition", "--account", "--exclude", "--exclusive", "--chdir", "--cpus-per-task"):
        assert absent not in text
    assert "#SBATCH --time=1" in text.splitlines()


class _FakeCommand:
    """Stands for submitit's ``CommandFunction`` (how it runs sbatch): a canned answer."""

    answer: str | Exception = ""

    def __init__(self, command, verbose=True, cwd=None, env=None):
        self.command = command

    def __call__(self):
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def _double(x: int) -> int:
    return 2 * x


def test_submit_function_parses_sbatch(canned, tmp_path, monkeypatch):
    import submitit

    canned()
    monkeypatch.setattr(submitit.core.core.utils, "CommandFunction", _FakeCommand)
    monkeypatch.setattr(_FakeCommand, "answer", "Submitted batch job 4242")
    job = slurm.submit_function(slurm.FunctionJobSpec(folder=tmp_path, job_name="j"), _double, 21)
    assert job.job_id == "4242" and job.paths.submitted_pickle.exists()


def test_submit_function_refused_is_one_line(canned, tmp_path, monkeypatch, capsys):
    import submitit

    canned()
    monkeypatch.setattr(submitit.core.core.utils, "CommandFunction", _FakeCommand)
    monkeypatch.setattr(_FakeCommand, "answer", submitit.core.utils.FailedJobError(
        "sbatch: error: some detail\nsbatch: error: Batch job submission failed: Invalid account or "
        "account/partition combination specified"))
    with pytest.raises(CsrunError) as e:
        slurm.submit_function(slurm.FunctionJobSpec(folder=tmp_path, job_name="probe"), _double, 1)
    assert str(e.value) == ("sbatch refused the job probe: sbatch: error: Batch job submission failed: Invalid "
                            "account or account/partition combination specified")
    assert capsys.readouterr().err == ""


class _Job:
    """Stands for a submitit job: its id, its result file, the state its sacct watcher
    gives (``done``) and its cancel calls."""

    def __init__(self, folder: Path, returned: bool = False, sacct_done: bool = False):
        self.job_id = "42"
        self.paths = type("Paths", (), {"result_pickle": folder / "42_0_result.pkl"})()
        if returned:
            self.paths.result_pickle.write_bytes(b"")
        self.sacct_done = sacct_done
        self.cancelled: list[bool] = []

    def done(self) -> bool:
        return self.sacct_done

    def cancel(self, check: bool = True) -> None:
        self.cancelled.append(check)


SCONTROL_NO_ACCOUNTING = "AccountingStorageHost   = localhost\nAccountingStorageType   = accounting_storage/none\n"
SCONTROL_ACCOUNTING = "AccountingStorageType   = accounting_storage/slurmdbd\nClusterName = c\n"


@pytest.fixture()
def no_cache(monkeypatch):
    monkeypatch.setattr(slurm.queries, "_ACCOUNTING", {})


@pytest.mark.parametrize("returned, squeue, active", [
    (True, None, False),                           # submitit's result file: the function returned
    (False, (0, "42|RUNNING\n", ""), True),
    (False, (0, "42|PENDING\n", ""), True),
    (False, (0, "42|COMPLETING\n", ""), False),
    (False, (0, "42|CANCELLED\n", ""), False),
    (False, (1, "", "slurm_load_jobs error: Invalid job id specified"), False),   # forgotten, no accounting
    (False, (1, "", "slurm_load_jobs error: Unable to contact slurm controller"), True),  # unknown: active
])
def test_job_active_without_accounting(canned, no_cache, tmp_path, returned, squeue, active):
    c = canned(squeue=[squeue or (0, "", "")], sacct=[(1, "", "Slurm accounting storage is disabled")],
               scontrol=[(0, SCONTROL_NO_ACCOUNTING, "")])
    assert slurm.job_active(_Job(tmp_path, returned=returned)) is active
    assert (c.calls == []) is returned  # a returned function asks Slurm nothing more


def test_job_active_with_accounting_trusts_submitits_state(canned, no_cache, tmp_path):
    c = canned(squeue=[(0, "42|RUNNING\n", "")], scontrol=[(0, SCONTROL_ACCOUNTING, "")])
    assert slurm.job_active(_Job(tmp_path, sacct_done=True)) is False  # sacct: ended, e.g. killed
    assert slurm.job_active(_Job(tmp_path, sacct_done=False)) is True
    assert [Path(a[0]).name for a, _ in c.calls].count("scontrol") == 1  # asked once per SLURM_CONF


def test_accounting_enabled(canned, no_cache):
    canned(scontrol=[(0, SCONTROL_NO_ACCOUNTING, "")])
    assert slurm.accounting_enabled() is False
    slurm.queries._ACCOUNTING.clear()
    canned(scontrol=[(0, SCONTROL_ACCOUNTING, "")])
    assert slurm.accounting_enabled() is True
    slurm.queries._ACCOUNTING.clear()
    canned(scontrol=[(1, "", "slurm_load_ctl_conf error: Unable to contact slurm controller")])
    assert slurm.accounting_enabled() is False


def test_cancel_job_uses_submitits_cancel_unless_it_returned(tmp_path):
    job = _Job(tmp_path)
    slurm.cancel_job(job)
    assert job.cancelled == [False]
    (tmp_path / "returned").mkdir()
    done = _Job(tmp_path / "returned", returned=True)
    slurm.cancel_job(done)
    assert done.cancelled == []
