"""launcher/slurm/functions.py on canned Slurm output: a Python function as a job through submitit (its
sbatch script, its submission, whether it is active, its cancel)."""
from __future__ import annotations

from pathlib import Path

import pytest

from csrun_common.errors import CsrunError
from launcher import slurm


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


def test_cancel_job_uses_submitits_cancel_unless_it_returned(tmp_path):
    job = _Job(tmp_path)
    slurm.cancel_job(job)
    assert job.cancelled == [False]
    (tmp_path / "returned").mkdir()
    done = _Job(tmp_path / "returned", returned=True)
    slurm.cancel_job(done)
    assert done.cancelled == []
