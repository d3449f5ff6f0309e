"""``csrun_wse --survive-node-loss`` (docs/RESILIENCE.md "A lost node"), across launcher/layout.py,
launcher/builders.py, launcher/cli.py, csrun_common/roles.py, csrun_runtime/rendezvous.py,
csrun_runtime/elastic.py and csrun_runtime/tensorflow/worker.py: the two srun lines, the
refusals, the role of an adopted worker and the one-winner claim of an adoption order."""
from __future__ import annotations

import shlex
import subprocess

import pytest
from click.testing import CliRunner

from csrun_common.roles import resolve_role
from csrun_runtime.elastic import WorkerWatch
from csrun_runtime.rendezvous import Rendezvous
from launcher.builders import WseRequest
from launcher.cli import csrun_wse
from launcher.layout import plan_layout
from tests.unit.golden import assert_golden


def _req(**kw) -> WseRequest:
    layout = plan_layout(3, 1, 1, gres="gpu:1", node_cpus=2)
    return WseRequest(layout=layout, command=("python", "run.py"), python="python", exclude_node="node1",
                      worker_job=True, rendezvous_key="wse-abc", **kw)


def test_the_chief_and_the_input_workers_are_two_jobs():
    req = _req()
    chief, workers = req.materialize_srun(), req.materialize_worker_srun()
    assert ":" not in chief and "--gres=gpu:1" in chief and "--kill-on-bad-exit=1" in chief
    assert workers is not None and "--no-kill" in workers and "--kill-on-bad-exit=1" not in workers
    assert "--nodes=2" in workers and "--exclude=node1" in workers
    export = next(o for o in workers if o.startswith("--export="))
    assert "CSRUN_ROLE=worker" in export and "CSRUN_TASK_OFFSET=0" in export and "CSRUN_WORKER_JOB=1" in export
    assert ("CSRUN_RENDEZVOUS_KEY", "wse-abc") in req.job_env()
    lines = req.srun_line().splitlines()
    assert len(lines) == 2 and lines[0].endswith(" &") and "--no-kill" in lines[0]


def test_without_the_flag_one_het_job():
    layout = plan_layout(3, 1, 1, gres="gpu:1", node_cpus=2)
    req = WseRequest(layout=layout, command=("python", "run.py"), python="python")
    assert req.materialize_worker_srun() is None and ":" in req.materialize_srun()
    assert all(k != "CSRUN_RENDEZVOUS_KEY" for k, _ in req.job_env())


@pytest.mark.parametrize("args, needle", [
    (["--total-nodes", "2"], "--survive-node-loss: the input workers' job would have 1 node(s)"),
    (["--total-nodes", "2", "--use-sbatch"], "--survive-node-loss: the input workers' job would have 1 node(s)"),
])
def test_refusals(args, needle, monkeypatch):
    monkeypatch.delenv("SLURM_CONF", raising=False)
    res = CliRunner().invoke(csrun_wse, ["--dry-run", "--survive-node-loss", "--tasks-per-node", "1",
                                         "--cpus-per-task", "1", *args, "python", "run.py"])
    assert res.exit_code == 2, res.output
    assert needle in res.output and "Traceback" not in res.output


HOSTILE = "a'; echo foo"


def test_the_batch_script_starts_the_workers_job_outside_its_own(tmp_path):
    """sbatch path: the script's job is the chief's alone; the workers' srun runs outside it (no
    SLURM_* but SLURM_CONF), in a process group of its own, named after the allocation, waited
    for and cancelled by the EXIT trap; each allocation has a rendezvous key of its own."""
    req = WseRequest(layout=plan_layout(3, 1, 1, gres="gpu:1", node_cpus=2), python="python",
                     command=("python", "run.py", "--model_dir", HOSTILE), exclude_node="node1",
                     worker_job=True, rendezvous_key="wse-abc")
    script = req.materialize_sbatch()
    assert_golden("wse_3nodes_survive.sbatch", script)
    sbatch = [ln for ln in script.splitlines() if ln.startswith("#SBATCH")]
    assert "#SBATCH --nodes=1" in sbatch and "#SBATCH hetjob" not in sbatch and "--het-group" not in script
    # the workers' srun execs, the chief's is waited for
    assert "exec srun" in script and "\n{ srun --label --verbose \\\n" in script
    assert 'export CSRUN_RENDEZVOUS_KEY=wse-abc.r"${SLURM_RESTART_COUNT:-0}"' in script
    path = tmp_path / "job.sh"
    path.write_text(script)
    check = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    # the hostile argument reaches both sruns as one word
    assert script.count(shlex.quote(HOSTILE)) == 2


def test_the_workers_job_runs_outside_the_chief_s_job():
    """The subshell of the batch script that starts the workers' srun, run by bash with a
    batch job's variables: srun sees none of them but SLURM_CONF (else it would start a step
    of the chief's job)."""
    script = WseRequest(layout=plan_layout(3, 1, 1, gres="gpu:1", node_cpus=2), command=("python", "run.py"),
                        python="python", worker_job=True, rendezvous_key="k").materialize_sbatch()
    scrub = next(ln for ln in script.splitlines() if "${!SLURM@}" in ln)
    env = {"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "12", "SLURM_NTASKS_PER_NODE": "1", "SLURM_CONF": "/x.conf",
           "SBATCH_PARTITION": "p", "SRUN_CPUS_PER_TASK": "1", "SALLOC_X": "1", "SLURMD_NODENAME": "node1"}
    out = subprocess.run(["bash", "-c", f"{scrub}\nenv"], env=env, capture_output=True, text=True).stdout
    names = {ln.split("=", 1)[0] for ln in out.splitlines()}
    assert "SLURM_CONF" in names and "PATH" in names
    assert not names & {"SLURM_JOB_ID", "SLURM_NTASKS_PER_NODE", "SBATCH_PARTITION", "SRUN_CPUS_PER_TASK",
                        "SALLOC_X", "SLURMD_NODENAME"}, names


def test_dry_run_of_the_batch_path_prints_the_script(monkeypatch):
    monkeypatch.delenv("SLURM_CONF", raising=False)
    res = CliRunner().invoke(csrun_wse, ["--dry-run", "--use-sbatch", "--survive-node-loss", "--total-nodes", "3",
                                         "--tasks-per-node", "1", "--cpus-per-task", "1", "python", "run.py"])
    assert res.exit_code == 0, res.output
    assert res.stdout.startswith("#!/bin/bash\n") and "--no-kill" in res.stdout
    assert "csrun_workers_job=\"csrun_wse-workers.${SLURM_JOB_ID}" in res.output


def test_single_task_nodes_are_refused():
    from csrun_common.errors import CsrunError
    from launcher.cli import _worker_job
    from launcher.flags import WseFlags

    layout = plan_layout(4, 1, 1, single_task_nodes=1, gres="gpu:1", node_cpus=2)
    with pytest.raises(CsrunError, match="--survive-node-loss with --single-task-nodes 1: single-task nodes"):
        flags = WseFlags(survive_node_loss=True, use_sbatch=False, layout={**WseFlags().layout, "single_task_nodes": 1})
        _worker_job(flags, layout)


def test_an_adopted_worker_takes_the_lost_index_and_the_shared_key():
    env = {"CSRUN_ROLE": "worker", "SLURM_PROCID": "0", "CSRUN_NUM_WORKERS": "2", "SLURM_JOB_ID": "77",
           "CSRUN_RENDEZVOUS_KEY": "wse-abc"}
    assert resolve_role(env).worker_index == 0 and resolve_role(env).rendezvous_key == "wse-abc"
    assert resolve_role({**env, "CSRUN_WORKER_INDEX": "1"}).worker_index == 1
    with pytest.raises(ValueError, match="outside"):
        resolve_role({**env, "CSRUN_WORKER_INDEX": "2"})


def test_one_claimant_wins_an_order(tmp_path):
    rdv = Rendezvous(tmp_path, "k")
    rdv.reset()
    rdv.order_adoption(1, {"index": 1, "attempt": 1})
    rdv.write_report(0, {"elements": 5})
    assert rdv.adoption_orders() == {1: {"index": 1, "attempt": 1}}
    assert rdv.reports() == {0: {"elements": 5}}  # orders and reports are told apart
    assert rdv.claim_adoption(1, 1, {"node": "node2"}) is True
    assert rdv.claim_adoption(1, 1, {"node": "node4"}) is False
    assert rdv.claim_adoption(1, 2, {"node": "node4"}) is True


class _Source:
    counts: dict[int, int] = {}

    def __init__(self, stopped):
        self._stopped = stopped

    def stopped(self):
        return set(self._stopped)

    def reopen(self, index, registration):
        return "resumed"


def test_the_chief_orders_an_adoption_only_for_a_stale_worker_no_supervisor_replaces(tmp_path, monkeypatch):
    rdv = Rendezvous(tmp_path, "k")
    rdv.reset()
    watch = WorkerWatch(rdv, {0: {"node": "node2", "pid": 1}, 1: {"node": "node3", "pid": 2}}, adopt=True)
    rdv.touch("workers/0")
    rdv.touch("workers/1")
    watch.poll(_Source({1}))
    assert rdv.adoption_orders() == {}  # heartbeat fresh: no order yet
    monkeypatch.setattr(rdv, "age", lambda name: 30.0)
    watch.poll(_Source({1}))
    (order,) = rdv.adoption_orders().values()
    assert order["index"] == 1 and order["attempt"] == 1 and order["lost_node"] == "node3"
    assert watch.awaiting() == {1}
    rdv.register_worker(1, {"status": "ok", "attempt": 1, "node": "node2", "pid": 3})
    watch.poll(_Source(set()))
    (rep,) = watch.describe()["workers_replaced"]
    assert rep["index"] == 1 and rep["node"] == "node2" and watch.awaiting() == set()


def test_with_requeue_the_budget_is_checked_before_the_workers_job_starts(tmp_path):
    """``--requeue`` and ``--survive-node-loss`` together: an allocation past the budget exits
    before starting the workers' job, and the requeue decision comes after the workers' grace;
    one ``exit "$csrun_rc"``; valid bash."""
    from launcher.requeue import RequeueSpec

    script = _req(requeue=RequeueSpec("USR2", 90, 3)).materialize_sbatch()
    budget, workers = script.index("csrun_max_requeues=3"), script.index("exec srun --job-name=")
    grace, requeue = script.index("csrun_waited=0"), script.index('scontrol requeue "$SLURM_JOB_ID"')
    assert budget < workers < grace < requeue
    assert script.count('exit "$csrun_rc"') == 1 and "#SBATCH --requeue" in script
    path = tmp_path / "job.sh"
    path.write_text(script)
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0


def test_a_replaced_worker_that_comes_back_sees_its_successor(tmp_path):
    """A worker the chief took for lost (stale heartbeat) but that lives on finds the later
    attempt's registration and leaves (docs/RESILIENCE.md "A lost node"); its own or an earlier one does not."""
    from types import SimpleNamespace

    from csrun_runtime.tensorflow.worker import InputWorker

    rdv = Rendezvous(tmp_path, "k")
    rdv.reset()
    old = SimpleNamespace(rdv=rdv, index=1, attempt=0)
    assert InputWorker.superseded(old) is None  # nothing registered yet
    rdv.register_worker(1, {"index": 1, "attempt": 0, "node": "node3", "status": "ok"})
    assert InputWorker.superseded(old) is None  # its own registration
    rdv.register_worker(1, {"index": 1, "attempt": 1, "node": "node2", "status": "ok"})
    assert InputWorker.superseded(old)["node"] == "node2"
    assert InputWorker.superseded(SimpleNamespace(rdv=rdv, index=1, attempt=1)) is None
