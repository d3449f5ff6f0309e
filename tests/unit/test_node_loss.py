"""``csrun_wse --survive-node-loss``: the two srun lines, the refusals, the role of an adopted
worker and the one-winner claim of an adoption order (README "A lost node")."""
from __future__ import annotations

import pytest
from click.testing import CliRunner

from csrun_common.roles import resolve_role
from csrun_runtime.elastic import WorkerWatch
from csrun_runtime.rendezvous import Rendezvous
from launcher.builders import WseRequest
from launcher.cli import csrun_wse
from launcher.layout import plan_layout


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
    (["--total-nodes", "3", "--use-sbatch"], "--survive-node-loss with --use-sbatch"),
])
def test_refusals(args, needle, monkeypatch):
    monkeypatch.delenv("SLURM_CONF", raising=False)
    res = CliRunner().invoke(csrun_wse, ["--dry-run", "--survive-node-loss", "--tasks-per-node", "1",
                                         "--cpus-per-task", "1", *args, "python", "run.py"])
    assert res.exit_code == 2, res.output
    assert needle in res.output and "Traceback" not in res.output


def test_single_task_nodes_are_refused():
    from csrun_common.errors import CsrunError
    from launcher.cli import _worker_job

    layout = plan_layout(4, 1, 1, single_task_nodes=1, gres="gpu:1", node_cpus=2)
    with pytest.raises(CsrunError, match="--survive-node-loss with --single-task-nodes 1: single-task nodes"):
        _worker_job({"survive_node_loss": True, "use_sbatch": False, "single_task_nodes": 1}, layout)


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
