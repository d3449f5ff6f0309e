"""csrun_runtime/chief_input.py: input worker 0 in the chief's own task (docs/CHIEF-INPUT.md): the
role of the process the chief starts, the CPU split, and the placement its supervisor really
applies. The launcher's side is in tests/unit/features/test_chief_input.py."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from csrun_common.roles import CHIEF_INPUT_ENV, resolve_role
from csrun_runtime import chief_input
from csrun_runtime.chief_input import NICE, NICE_ENV, PIN_ENV, requested, split_cpus, worker_env


def test_the_chiefs_worker_resolves_as_input_worker_zero_of_the_job():
    chief_env = {"CSRUN_ROLE": "chief", "SLURM_PROCID": "0", "CSRUN_TASK_OFFSET": "0", "CSRUN_WORKER_OFFSET": "1",
                 "CSRUN_NUM_WORKERS": "4", "CSRUN_CPUS_PER_TASK": "3", "SLURM_JOB_ID": "7", CHIEF_INPUT_ENV: "1",
                 "SLURMD_NODENAME": "node1"}
    chief = resolve_role(chief_env)
    assert chief.is_chief and requested(chief_env) == 1
    split = split_cpus([4, 5, 6], 3, 1)
    env = worker_env(chief_env, chief, split)
    role = resolve_role(env)
    assert role.kind == "worker" and role.worker_index == 0 and role.num_input_workers == 4 and role.chief_input
    assert role.cpus_per_task == 1 and role.rendezvous_key == chief.rendezvous_key
    assert role.describe() == "input worker 0 in the chief's task on node1"
    assert env[PIN_ENV] == "6" and env[NICE_ENV] == str(NICE) and CHIEF_INPUT_ENV not in env
    # the chief's other task on its node is input worker 1
    other = resolve_role({**chief_env, "SLURM_PROCID": "1"})
    assert other.worker_index == 1


def test_split_pins_apart_only_when_slurm_binds_the_task():
    bound = split_cpus([3, 1, 2, 0], 4, 2)
    assert bound.pinned and bound.training == (0, 1) and bound.input == (2, 3) and bound.threads == 2
    shared = split_cpus([0, 1], 2, 2)  # all the task's CPUs go to input: shared, niced
    assert not shared.pinned and shared.training == shared.input == (0, 1)
    unbound = split_cpus([0, 1, 2, 3], 1, 1)  # TaskPlugin=task/none: the mask is not the task's
    assert not unbound.pinned and "does not bind" in unbound.reason
    assert not split_cpus([0, 1], None, 1).pinned
    with pytest.raises(ValueError):
        split_cpus([0, 1], 2, 0)


@pytest.mark.parametrize("raw,want", [("", 0), ("2", 2), (" 0 ", 0)])
def test_requested(raw, want):
    assert requested({CHIEF_INPUT_ENV: raw}) == want


@pytest.mark.parametrize("raw", ["x", "-1"])
def test_requested_refuses_a_bad_value_naming_the_variable(raw):
    with pytest.raises(ValueError, match=CHIEF_INPUT_ENV):
        requested({CHIEF_INPUT_ENV: raw})


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="Linux affinity")
def test_the_supervisor_applies_the_cpus_and_niceness_the_worker_inherits(tmp_path):
    """A real supervisor process started as the chief starts it: the worker it runs sees the
    pinned CPU and nice 10 (and a plain chief task would see neither)."""
    cpu = min(os.sched_getaffinity(0))
    chief_env = {**os.environ, "CSRUN_ROLE": "chief", "SLURM_PROCID": "0", "CSRUN_TASK_OFFSET": "0",
                 "CSRUN_WORKER_OFFSET": "1", "CSRUN_NUM_WORKERS": "2", "SLURM_JOB_ID": "7",
                 "CSRUN_CPUS_PER_TASK": str(len(os.sched_getaffinity(0)))}
    split = chief_input.CpuSplit((cpu,), (cpu,), True, 1, "test")
    probe = ("import json, os; print(json.dumps({'cpus': sorted(os.sched_getaffinity(0)), "
             "'nice': os.nice(0), 'role': os.environ['CSRUN_ROLE']}))")
    env = worker_env(chief_env, resolve_role(chief_env), split)
    base = os.nice(0)
    out = subprocess.run([sys.executable, "-m", "csrun_runtime.supervise", sys.executable, "-c", probe],
                         env=env, capture_output=True, text=True, timeout=60, check=True).stdout
    seen = json.loads(out.strip().splitlines()[-1])
    assert seen == {"cpus": [cpu], "nice": min(19, base + NICE), "role": "chief-input"}


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="Linux affinity")
def test_pin_threads_pins_every_thread_of_the_process():
    code = ("import os, threading, time, json\n"
            "from csrun_runtime.chief_input import pin_threads\n"
            "ev = threading.Event(); t = threading.Thread(target=ev.wait); t.start()\n"
            f"n = pin_threads([{min(os.sched_getaffinity(0))}])\n"
            "cpus = {tid: sorted(os.sched_getaffinity(int(tid))) for tid in os.listdir('/proc/self/task')}\n"
            "ev.set(); t.join(); print(json.dumps({'n': n, 'cpus': cpus}))")
    out = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                                    check=True).stdout)
    assert out["n"] >= 2 and all(c == [min(os.sched_getaffinity(0))] for c in out["cpus"].values())
