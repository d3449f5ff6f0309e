"""``csrun_wse --chief-input-cpus`` on the PyTorch chief (csrun_runtime/pytorch/own_input.py,
docs/CHIEF-INPUT.md): the chief and its supervised input worker 0 run locally with the
environment csrun_wse gives the tasks (no Slurm), and the pieces of :class:`OwnInput`."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

from csrun_runtime.params import ParamsError  # noqa: E402
from csrun_runtime.pytorch.own_input import OwnInput  # noqa: E402
from csrun_runtime.pytorch.remote import READ_AHEAD_BATCHES  # noqa: E402
from csrun_runtime.pytorch.runner import NOT_WIRED  # noqa: E402
from tests.fixtures.runtime.helpers import task_env, worker_reports  # noqa: E402
from tests.unit.paths import REPO


def _role():
    from csrun_common.roles import resolve_role

    return resolve_role(task_env("chief", 0, 0, 1, 2, "node1", 0, "77"))


def test_without_the_variable_nothing_happens():
    own = OwnInput(_role(), {})
    own.place()
    own.start()
    own.stop()
    assert own.split is None and own.worker is None and own.missing() == 0 and own.describe() == {}


def test_a_bad_value_is_a_params_error_naming_the_variable():
    with pytest.raises(ParamsError, match="CSRUN_CHIEF_INPUT_CPUS"):
        OwnInput(_role(), {"CSRUN_CHIEF_INPUT_CPUS": "two"}).place()


def test_asked_for_but_not_started_writes_no_report():
    """eval/validate/compile (or nothing left to train) start no worker 0: the chief waits for
    one report fewer after done.json."""
    own = OwnInput(_role(), {"CSRUN_CHIEF_INPUT_CPUS": "1"})
    assert own.missing() == 1


def test_chief_input_is_wired_for_pytorch():
    assert "CSRUN_CHIEF_INPUT_CPUS" not in NOT_WIRED


def test_the_chief_runs_input_worker_0_in_its_own_task(tmp_path):
    """The chief (CSRUN_CHIEF_INPUT_CPUS=1, 2 input workers) starts worker 0 under
    csrun_runtime.supervise in its task; the task worker is worker 1 (CSRUN_WORKER_OFFSET=1, as
    csrun_wse numbers them). Worker 0 streams as streamer 0 of 2, reports component
    ``chief-input`` on the chief's node, leaves on done.json; performance.json has
    ``chief_input`` and worker 0's batches."""
    md = tmp_path / "md"
    job = str(os.getpid())
    extra = {"PYTHONPATH": str(REPO), "CSRUN_EXECUTION_MODE": "pytorch"}
    cmd = [sys.executable, str(REPO / "examples/digits_pt/run.py"), "--mode", "train", "--max_steps", "300",
           "--model_dir", str(md)]
    envs = [task_env("chief", 0, 0, 1, 2, "node1", 0, job, {**extra, "CSRUN_CHIEF_INPUT_CPUS": "1"}),
            task_env("worker", 1, 1, 1, 2, "node2", 1, job, extra)]
    logs = [tmp_path / f"task{i}.log" for i in range(2)]
    procs = [subprocess.Popen(cmd, env=e, cwd=tmp_path, stdout=open(log, "w"), stderr=subprocess.STDOUT)
             for e, log in zip(envs, logs, strict=True)]
    try:
        codes = [p.wait(timeout=240) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    chief_log = logs[0].read_text()
    assert codes == [0, 0], chief_log[-3000:]
    assert "input worker 0 runs in the chief's task (pid " in chief_log
    assert "not wired for PyTorch" not in chief_log
    assert "input worker 0 in the chief's task left with 0" in chief_log
    reports = worker_reports(md)
    assert sorted(reports) == [0, 1]
    assert reports[0]["component"] == "chief-input" and reports[0]["node"] == "node1"
    assert reports[0]["num_streamers"] == 2 and reports[0]["streaming_rank"] == 0
    assert reports[0]["chief_status"] == "ok"
    assert reports[1]["component"] == "worker" and reports[1]["streaming_rank"] == 1
    perf = json.loads((md / "performance" / "performance.json").read_text())
    for i in (0, 1):  # read ahead of what the chief took: runconfig.input_read_ahead_batches (32) at most
        # (input worker 0 at nice 10 may start after the 300 fast steps: it then reads nothing, where it
        # used to read a 4 MiB window of batches the chief never took)
        ahead = reports[i]["batches"] - perf["batches_per_worker"].get(str(i), 0)
        assert ahead <= READ_AHEAD_BATCHES, (reports[i], perf)
    ci = perf["chief_input"]
    assert ci["worker"] == 0 and ci["cpus"] == 1 and ci["nice"] == 10 and ci["pid"] > 0 and ci["node"] == "node1"
    assert ci["pinned"] == (ci["training_cpus"] != ci["input_cpus"])
    assert set(perf["batches_per_worker"]) == {"0", "1"}
    assert sum(perf["batches_per_worker"].values()) == 300


def test_the_launcher_refuses_what_the_runtime_leaves_unwired():
    from launcher.cli import NOT_WIRED_FOR_PYTORCH

    assert set(NOT_WIRED_FOR_PYTORCH.values()) == set(NOT_WIRED.values())
