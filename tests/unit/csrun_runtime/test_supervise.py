"""Lost input workers: the task's supervisor (csrun_runtime/supervise.py; real child processes
killed with SIGKILL). The cluster test through csrun_wse is
tests/integration/test_elastic_cluster.py."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil

from csrun_runtime.elastic import MAX_DEATHS
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


def test_a_stop_signal_repeated_while_the_task_leaves_does_not_kill_it(tmp_path):
    """Slurm may deliver ``--requeue``'s SIGUSR2 to a het job's step more than once: a copy that
    arrives after the child ended, as the supervisor returns, must not end the task by the signal
    (srun then reports the task "failed first: User defined signal 2" and the job's status is 143)."""
    starts = tmp_path / "starts"
    task = _supervised_task(starts)
    try:
        _starts(starts, 1, task)
        while task.poll() is None:  # a copy every 2 ms until the task has left
            task.send_signal(signal.SIGUSR2)
            time.sleep(0.002)
        assert task.wait(timeout=30) == 0
    finally:
        if task.poll() is None:
            task.kill()
