"""A worker killed with SIGKILL mid-run must not hang the chief: training goes on with the other
workers; when none is left the chief fails within 60 s naming the workers' nodes (local
processes, no supervisor: nothing replaces them). Under a bare srun --kill-on-bad-exit=1 without
csrun's supervisor the step ends and srun names the node; csrun_wse runs every task through
csrun_runtime.supervise, which replaces the worker instead (tests/integration/test_elastic_cluster.py)."""
from __future__ import annotations

import json
import re
import signal
import subprocess
import time

import pytest

from tests.fixtures.runtime import helpers

pytestmark = [pytest.mark.tf, pytest.mark.slow]
pytest.importorskip("tensorflow")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return helpers.prepare_digits(tmp_path_factory.mktemp("digits") / "data")


def test_killed_workers(data, tmp_path):
    params = helpers.digits_params(tmp_path, data, log_steps=100, checkpoint_steps=0,
                                   eval_frequency=None, input_timeout_secs=30)
    md = tmp_path / "md"
    job = helpers.LocalJob(["--params", str(params), "--mode", "train", "--max_steps", "1000000",
                            "--model_dir", str(md)], 2, tmp_path / "logs")
    try:
        helpers.wait_for(lambda: "global_step = 100," in job.log(0), 180, "training to start")
        # 1) kill worker 1 (node3): training goes on with worker 0
        job.kill(2)
        helpers.wait_for(lambda: "input worker 1 on node3" in job.log(0) and "stopped" in job.log(0),
                 40, "the chief to notice worker 1")
        steps_then = max(int(s) for s in re.findall(r"global_step = (\d+),", job.log(0)))
        helpers.wait_for(lambda: max(int(s) for s in re.findall(r"global_step = (\d+),", job.log(0)))
                 >= steps_then + 300, 60, "training to go on with worker 0")
        assert job.procs[0].poll() is None
        # 2) kill worker 0 (node2) too: the chief fails within 60 s naming the nodes
        t_kill = time.monotonic()
        job.kill(1)
        code = job.procs[0].wait(timeout=90)
        elapsed = time.monotonic() - t_kill
    finally:
        job.cleanup()
    chief = job.log(0)
    assert code != 0, chief
    assert elapsed < 60, f"chief took {elapsed:.0f} s"
    err = [line for line in chief.splitlines() if line.startswith("ERROR:")]
    assert err and "node2" in err[0] and "node3" in err[0], chief
    (rdv,) = helpers.rendezvous_dirs(md)
    assert json.loads((rdv / "done.json").read_text())["status"] == "failed"


@pytest.mark.cluster
def test_srun_kill_on_bad_exit_names_the_node(slurm_cluster, data, tmp_path):
    from tests.integration.test_runtime_service import _srun_het

    params = helpers.digits_params(tmp_path, data, log_steps=100, eval_frequency=None)
    md = tmp_path / "md"
    cmd = _srun_het(["--params", str(params), "--mode", "train", "--max_steps", "1000000",
                     "--model_dir", str(md)], 2)
    log = tmp_path / "srun.log"
    proc = subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                            cwd=str(helpers.REPO), env=slurm_cluster["env"])
    try:
        helpers.wait_for(lambda: "global_step = 100," in log.read_text(), 300, "training to start")
        (rdv,) = helpers.rendezvous_dirs(md)
        reg = json.loads((rdv / "workers" / "1.json").read_text())
        import os
        os.kill(reg["pid"], signal.SIGKILL)
        t_kill = time.monotonic()
        code = proc.wait(timeout=90)
        elapsed = time.monotonic() - t_kill
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
            subprocess.run(["scancel", "--name=csrun-runtime-test"], env=slurm_cluster["env"])
    out = log.read_text()
    assert code != 0, out
    assert elapsed < 60, f"step took {elapsed:.0f} s to end"
    assert reg["node"] in out and re.search(r"srun: error: .*" + reg["node"], out), out
