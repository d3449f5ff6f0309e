"""Lost input workers: the task's supervisor (real child processes killed with SIGKILL) and the
chief's record of losses and replacements (csrun_runtime.supervise, csrun_runtime.elastic).
The cluster test through csrun_wse is tests/integration/test_elastic_cluster.py."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil

from csrun_common.atomic import write_json
from csrun_runtime.elastic import MAX_DEATHS, WorkerWatch
from csrun_runtime.rendezvous import Rendezvous
from csrun_runtime.supervise import is_input_worker, supervise

#: A child that counts its starts in a file, tells the supervisor its rendezvous, and kills
#: itself with SIGKILL while it has started fewer than DIE times; then exits with RC.
CHILD = """
import os, signal, sys
from csrun_runtime.elastic import tell_supervisor
counter, rdv, die, rc = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
n = int(open(counter).read()) + 1 if os.path.exists(counter) else 1
open(counter, "w").write(str(n))
assert os.environ["CSRUN_WORKER_ATTEMPT"] == str(n - 1)
tell_supervisor(rdv, 2)
if n <= die:
    os.kill(os.getpid(), signal.SIGKILL)
sys.exit(rc)
"""


def _child(tmp_path, die: int, rc: int = 0) -> list[str]:
    rdv = Rendezvous(tmp_path / "md", "7.0")
    rdv.reset()
    return [sys.executable, "-c", CHILD, str(tmp_path / "count"), str(rdv.dir), str(die), str(rc)]


def _env() -> dict[str, str]:
    return {**os.environ, "SLURMD_NODENAME": "node3", "SLURM_PROCID": "3"}


def test_exit_status_passes_through(tmp_path):
    assert supervise(_child(tmp_path, die=0, rc=0), _env()) == 0
    assert supervise(_child(tmp_path / "b", die=0, rc=2), _env()) == 2
    assert (tmp_path / "count").read_text() == "1"
    assert Rendezvous(tmp_path / "md", "7.0").lost(2) == []


def test_killed_worker_is_replaced_and_deaths_recorded(tmp_path, capsys):
    assert supervise(_child(tmp_path, die=2), _env()) == 0
    assert (tmp_path / "count").read_text() == "3"  # two replacements
    deaths = Rendezvous(tmp_path / "md", "7.0").lost(2)
    assert [(d["signal"], d["deaths"], d["given_up"], d["node"]) for d in deaths] == \
        [("SIGKILL", 1, False, "node3"), ("SIGKILL", 2, False, "node3")]
    err = capsys.readouterr().err
    assert "input worker task 3 on node3" in err and "starting its replacement (2 of 2)" in err


def test_worker_dying_max_times_is_given_up(tmp_path, capsys):
    assert supervise(_child(tmp_path, die=10), _env()) == 0
    assert (tmp_path / "count").read_text() == str(MAX_DEATHS)
    deaths = Rendezvous(tmp_path / "md", "7.0").lost(2)
    assert [d["given_up"] for d in deaths] == [False] * (MAX_DEATHS - 1) + [True]
    assert "given up" in capsys.readouterr().err


def test_only_input_workers_are_supervised():
    base = {"SLURM_JOB_ID": "5", "CSRUN_NUM_WORKERS": "2", "CSRUN_TASK_OFFSET": "1"}
    assert is_input_worker({**base, "CSRUN_ROLE": "worker", "SLURM_PROCID": "2"})
    assert not is_input_worker({**base, "CSRUN_ROLE": "chief", "SLURM_PROCID": "0",
                                "CSRUN_TASK_OFFSET": "0"})
    assert not is_input_worker({})  # not under csrun_wse: exec as is
    assert not is_input_worker({**base, "CSRUN_ROLE": "worker", "SLURM_PROCID": "9"})  # bad role


class Source:
    """The two things WorkerWatch asks of the chief's ServiceSource (plain data, no TF)."""

    def __init__(self):
        self.counts = {0: 5, 1: 5}
        self.stopped_set: set[int] = set()
        self.reopened: list[int] = []

    def stopped(self) -> set[int]:
        return set(self.stopped_set)

    def reopen(self, index, registration) -> str:
        self.reopened.append(index)
        self.stopped_set.discard(index)
        return "reopened"


def test_watch_records_loss_replacement_and_stream(tmp_path):
    rdv = Rendezvous(tmp_path, "1.0")
    rdv.reset()
    regs = {i: {"status": "ok", "node": f"node{i + 2}", "pid": 100 + i, "attempt": 0} for i in (0, 1)}
    watch, src = WorkerWatch(rdv, regs), Source()
    t_death = time.time() - 1.0
    rdv.mark_lost(1, {"time": t_death, "pid": 101, "node": "node3", "signal": "SIGKILL",
                      "deaths": 1, "given_up": False})
    watch.poll(src)
    assert [(r["index"], r["node"], r["time"]) for r in watch.lost] == [(1, "node3", round(t_death, 3))]
    assert watch.awaiting() == {1}
    src.stopped_set.add(1)  # the stream error arrives later: the same loss, not a second one
    watch.poll(src)
    assert len(watch.lost) == 1 and src.reopened == []
    write_json(rdv.workers_dir / "1.json", {**regs[1], "pid": 201, "attempt": 1})
    watch.poll(src)
    assert src.reopened == [1] and watch.awaiting() == set()
    (rep,) = watch.replaced
    assert rep["index"] == 1 and rep["pid"] == 201 and rep["seconds_after_loss"] >= 1.0
    assert "streaming_again" not in rep
    src.counts[1] += 1
    watch.poll(src)
    assert rep["seconds_loss_to_stream"] >= 1.0
    assert watch.describe()["workers_given_up"] == []


def test_watch_gives_up_with_the_supervisor(tmp_path):
    rdv = Rendezvous(tmp_path, "1.0")
    rdv.reset()
    watch, src = WorkerWatch(rdv, {0: {"status": "ok", "node": "node2", "pid": 1}}), Source()
    for k in range(1, MAX_DEATHS + 1):
        rdv.mark_lost(0, {"time": time.time(), "pid": k, "node": "node2", "signal": "SIGKILL",
                          "deaths": k, "given_up": k == MAX_DEATHS})
    watch.poll(src)
    assert [g["deaths"] for g in watch.given_up] == [MAX_DEATHS]
    assert watch.awaiting() == set()


#: A child that appends its pid to the file ``sys.argv[1]`` as it starts, then sleeps.
STARTS = "import os, sys, time; open(sys.argv[1], 'a').write(f'{os.getpid()}\\n'); time.sleep(60)"


def _supervised_task(starts) -> subprocess.Popen:
    """``python -m csrun_runtime.supervise`` as an input worker's task, running :data:`STARTS`
    with the file ``starts``."""
    env = {**os.environ, "CSRUN_ROLE": "worker", "SLURM_PROCID": "1", "CSRUN_TASK_OFFSET": "1",
           "CSRUN_NUM_WORKERS": "1", "SLURM_JOB_ID": "42", "SLURM_STEP_ID": "0"}
    assert is_input_worker(env)
    return subprocess.Popen([sys.executable, "-m", "csrun_runtime.supervise", sys.executable, "-c", STARTS,
                             str(starts)], env=env)


def test_a_stopped_worker_task_leaves_the_status_to_the_chief(tmp_path):
    """srun(1) reports the worst status of a step's tasks: a worker's task ending 143 (exited
    or killed) after Slurm's SIGTERM hid the chief's own exit 3; it exits 0 instead."""
    starts = tmp_path / "starts"
    task = _supervised_task(starts)
    try:
        _starts(starts, 1, task)
        task.send_signal(signal.SIGTERM)
        assert task.wait(timeout=30) == 0
    finally:
        if task.poll() is None:
            task.kill()


def _starts(path, n: int, task) -> list[int]:
    t0 = time.monotonic()
    while not path.exists() or len(path.read_text().split()) < n:
        assert task.poll() is None, "the supervised task ended before its child started"
        assert time.monotonic() - t0 < 30, "the supervised child never started"
        time.sleep(0.02)
    return [int(p) for p in path.read_text().split()]


def _gone(pid: int, timeout: float) -> bool:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def test_a_worker_killed_with_its_step_is_not_replaced(tmp_path):
    """Slurm ends a step by SIGKILLing its processes one by one; the worker may die first. Its
    supervisor, killed 0.3 s later (the CI run that found this: the replacement outlived the
    step and held its output open, so the job stayed in squeue 65 s), starts no replacement."""
    starts = tmp_path / "starts"
    task = _supervised_task(starts)
    try:
        (worker,) = _starts(starts, 1, task)
        os.kill(worker, signal.SIGKILL)
        time.sleep(0.3)
        task.kill()
        assert task.wait(timeout=10) == -signal.SIGKILL
        time.sleep(1.5)
        assert starts.read_text().split() == [str(worker)], "a replacement started"
    finally:
        if task.poll() is None:
            task.kill()


def test_a_lost_worker_is_replaced_a_second_after_its_death(tmp_path):
    starts = tmp_path / "starts"
    task = _supervised_task(starts)
    try:
        (worker,) = _starts(starts, 1, task)
        t0 = time.monotonic()
        os.kill(worker, signal.SIGKILL)
        first, second = _starts(starts, 2, task)
        assert first == worker and time.monotonic() - t0 >= 1.0
        task.send_signal(signal.SIGTERM)
        assert task.wait(timeout=30) == 0 and _gone(second, 10)
    finally:
        if task.poll() is None:
            task.kill()


def test_the_worker_dies_with_its_supervisor(tmp_path):
    """A supervisor killed outright (SIGKILL: the step's end, the OOM killer) takes its worker
    with it (``PR_SET_PDEATHSIG``), so no worker outlives its task."""
    starts = tmp_path / "starts"
    task = _supervised_task(starts)
    try:
        (worker,) = _starts(starts, 1, task)
        task.kill()
        assert task.wait(timeout=10) == -signal.SIGKILL
        assert _gone(worker, 10), "the worker outlived its supervisor"
    finally:
        if task.poll() is None:
            task.kill()
