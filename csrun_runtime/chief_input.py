"""The chief's own input worker: ``CSRUN_CHIEF_INPUT_CPUS=N`` (docs/CHIEF-INPUT.md).

The accelerator host's CPUs sit mostly idle while the chief only consumes (Pecan, USENIX ATC'24,
"AutoPlacement": place input workers on the accelerator host's idle CPUs beside remote ones).
With ``CSRUN_CHIEF_INPUT_CPUS=N`` the chief starts **input worker 0** as a separate process of
its own Slurm task: the same command (``sys.orig_argv``) under
``python -m csrun_runtime.supervise``, with ``CSRUN_ROLE=chief-input``. It is an ordinary
input worker of ``CSRUN_NUM_WORKERS`` (its shard, seed, ``TF_CONFIG`` index, dispatcher,
replacement after a death: :mod:`csrun_runtime.tensorflow.worker`, :mod:`csrun_runtime.supervise`), so
the data is sharded over W+1 producers with no other change, and autoscale, which opens
streams in index order and pauses the last one opened, uses it first and removes it last.

A process, not a thread of the chief: a GIL-bound ``input_fn`` would otherwise take the GIL
from the training loop. Kept off the training step's CPUs by :func:`split_cpus`:

* when the task may run on exactly as many CPUs as it holds (its affinity has its
  ``CSRUN_CPUS_PER_TASK`` CPUs: Slurm binds tasks with ``task/affinity`` or ``task/cgroup``, or
  the task holds every CPU it can see) and ``N`` is fewer, the worker is pinned to the last
  ``N`` of them and the chief's threads to the others (``sched_setaffinity(2)``);
* otherwise (``N`` equals the task's CPUs, or Slurm does not bind tasks: ``TaskPlugin=task/none``)
  the worker shares the CPUs with training at ``nice 10``, so the training step's threads run
  first and the worker takes the CPU time they leave; its pipeline is held to ``N`` threads.

Pure Python, no TensorFlow: :mod:`csrun_runtime.supervise` imports it.
"""
from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from csrun_common import env as codec
from csrun_common.roles import CHIEF_INPUT, CHIEF_INPUT_ENV, Role

__all__ = ["NICE", "PIN_ENV", "NICE_ENV", "CpuSplit", "requested", "split_cpus", "pin_threads", "place",
           "record", "apply_placement", "worker_env", "ChiefInputWorker"]

log = logging.getLogger("csrun.runtime")

#: Set for the chief's input worker: the CPUs (comma-separated) its supervisor pins itself to
#: before it starts the worker (the worker's threads inherit them).
PIN_ENV = codec.PIN_CPUS
#: Set for the chief's input worker: the niceness its supervisor adds before starting it.
NICE_ENV = codec.NICE
#: The niceness of the chief's input worker: below the training step on a shared CPU
#: (setpriority(2): a process at nice 10 gets about a tenth of the CPU time of one at 0 under CFS).
NICE = 10


def requested(env: Mapping[str, str]) -> int:
    """CPUs of the chief's task given to its input worker (``CSRUN_CHIEF_INPUT_CPUS``; 0 when
    unset or empty). Raises ``ValueError`` naming the variable for a value that is not an
    integer ≥ 0."""
    raw = (env.get(CHIEF_INPUT_ENV) or "").strip()
    if not raw:
        return 0
    try:
        n = int(raw)
    except ValueError:
        raise ValueError(f"{CHIEF_INPUT_ENV}={raw!r} is not an integer") from None
    if n < 0:
        raise ValueError(f"{CHIEF_INPUT_ENV}={n} must be >= 0")
    return n


@dataclass(frozen=True)
class CpuSplit:
    """Where the chief's training step and its input worker run.

    ``training`` / ``input``: CPU ids (equal when they share); ``pinned``: disjoint CPUs set
    with ``sched_setaffinity(2)``; ``threads``: the input pipeline's thread cap (its
    ``CSRUN_CPUS_PER_TASK``); ``reason``: one sentence for the log.
    """

    training: tuple[int, ...]
    input: tuple[int, ...]
    pinned: bool
    threads: int
    reason: str

    def describe(self) -> dict[str, Any]:
        """The record performance.json keeps (``chief_input``)."""
        return {"cpus": self.threads, "pinned": self.pinned, "training_cpus": list(self.training),
                "input_cpus": list(self.input), "nice": NICE, "reason": self.reason}


def split_cpus(allowed: Sequence[int], task_cpus: int | None, n: int) -> CpuSplit:
    """Split the chief task's CPUs between training and its input worker (module docstring).

    Args:
        allowed: the CPUs the task may run on (``os.sched_getaffinity(0)``).
        task_cpus: the task's CPUs in Slurm (``CSRUN_CPUS_PER_TASK``; ``None`` when unknown).
        n: CPUs for the input worker (``CSRUN_CHIEF_INPUT_CPUS``), ≥ 1.

    Returns:
        A :class:`CpuSplit`: pinned to the last ``n`` of ``allowed`` when ``allowed`` has
        exactly ``task_cpus`` CPUs (the task is bound to its CPUs) and ``n`` is fewer; else
        shared.

    Raises:
        ValueError: ``n < 1`` or no CPU allowed.
    """
    cpus = tuple(sorted(set(allowed)))
    if n < 1 or not cpus:
        raise ValueError(f"chief input: n={n} CPUs of {len(cpus)} allowed")
    bound = task_cpus is not None and len(cpus) == task_cpus
    if bound and n < len(cpus):
        train, inp = cpus[:len(cpus) - n], cpus[len(cpus) - n:]
        return CpuSplit(train, inp, True, n,
                        f"training on CPU(s) {_ids(train)}, input worker 0 on CPU(s) {_ids(inp)} "
                        f"(the task may run on exactly its {len(cpus)} CPU(s))")
    if bound:
        why = f"all {len(cpus)} CPU(s) of the chief's task go to input"
    else:
        why = (f"the task may run on {len(cpus)} CPU(s) and holds "
               f"{task_cpus if task_cpus is not None else 'an unknown number'}: Slurm does not bind "
               f"tasks to CPUs here")
    return CpuSplit(cpus, cpus, False, n,
                    f"{why}; input worker 0 shares CPU(s) {_ids(cpus)} with training at nice {NICE}, "
                    f"its pipeline held to {n} thread(s)")


def _ids(cpus: Sequence[int]) -> str:
    return ",".join(map(str, cpus))


def pin_threads(cpus: Sequence[int]) -> int:
    """Pin every thread of this process (``/proc/self/task``) to ``cpus``; threads started
    later inherit it. ``sched_setaffinity(2)`` applies to one thread, hence the loop. Returns
    the threads pinned. Raises ``OSError`` when the kernel refuses the set."""
    done = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), set(cpus))
            done += 1
        except ProcessLookupError:  # a thread that ended meanwhile
            pass
    return done


def place(role: Role, env: Mapping[str, str]) -> CpuSplit | None:
    """The chief's side of ``CSRUN_CHIEF_INPUT_CPUS``, before its framework sizes its thread pools:
    with ``CSRUN_CHIEF_INPUT_CPUS=n`` in ``env``, split this task's CPUs between training and
    input worker 0 (:func:`split_cpus` of ``os.sched_getaffinity(0)`` and the role's
    ``cpus_per_task``) and, when they are disjoint, pin every thread of this process to the
    training CPUs now (:func:`pin_threads`). Returns the split, ``None`` without the variable
    (or with 0). Raises ``ValueError`` naming the variable for a bad value."""
    n = requested(env)
    if not n:
        return None
    split = split_cpus(sorted(os.sched_getaffinity(0)), role.cpus_per_task, n)
    if split.pinned:
        pin_threads(split.training)
    return split


def record(split: CpuSplit) -> dict[str, Any]:
    """performance.json's ``chief_input``: worker 0, :meth:`CpuSplit.describe`, ``chief_affinity`` (its CPUs)."""
    return {"worker": 0, **split.describe(), "chief_affinity": sorted(os.sched_getaffinity(0))}


def apply_placement(env: Mapping[str, str]) -> None:
    """In the chief input worker's supervisor, before it starts the worker: the CPUs of
    ``CSRUN_PIN_CPUS`` and the niceness of ``CSRUN_NICE``, both inherited by the worker.
    No-op when neither is set (every other task)."""
    pin = (env.get(PIN_ENV) or "").strip()
    if pin:
        os.sched_setaffinity(0, {int(c) for c in pin.split(",")})
    nice = (env.get(NICE_ENV) or "").strip()
    if nice:
        os.nice(int(nice))


def worker_env(env: Mapping[str, str], role: Role, split: CpuSplit) -> dict[str, str]:
    """The environment of the chief's input worker: the chief's, as input worker 0 of the
    ``chief-input`` component (docs/CONTRACT.md), with its CPUs, pinning and niceness. With
    several trainer ranks it is input worker ``g = rank`` (job-wide), so it feeds its own
    rank as that rank's slot 0 (:func:`csrun_common.ranks.worker_rank`; docs/MULTI-RANK.md)."""
    out = {k: v for k, v in env.items() if k != CHIEF_INPUT_ENV}
    out.update({codec.ROLE: CHIEF_INPUT, codec.TASK_OFFSET: str(role.procid or 0),
                codec.WORKER_OFFSET: str(role.rank if role.world_size > 1 else 0),
                codec.CPUS_PER_TASK: str(split.threads),
                NICE_ENV: str(NICE)})
    if split.pinned:
        out[PIN_ENV] = _ids(split.input)
    return out


class ChiefInputWorker:
    """The chief's input-worker process (module docstring): :meth:`start` it after the
    dispatchers are published, :meth:`stop` it after ``done.json``."""

    def __init__(self, proc: subprocess.Popen, split: CpuSplit):
        self.proc, self.split = proc, split

    @classmethod
    def start(cls, role: Role, split: CpuSplit, command: Sequence[str] | None = None,
              env: Mapping[str, str] | None = None) -> ChiefInputWorker:
        """Start ``python -m csrun_runtime.supervise COMMAND`` as input worker 0.

        ``command``: default this process's own command line (``sys.executable`` and
        ``sys.orig_argv[1:]``: the same run.py and arguments, or the same ``-m`` module).
        Raises ``OSError`` when it cannot be started."""
        cmd = list(command) if command is not None else [sys.executable, *sys.orig_argv[1:]]
        argv = [sys.executable, "-m", "csrun_runtime.supervise", *cmd]
        proc = subprocess.Popen(argv, env=worker_env(os.environ if env is None else env, role, split))
        log.info("input worker 0 runs in the chief's task (pid %d): %s", proc.pid, split.reason)
        return cls(proc, split)

    @property
    def pid(self) -> int:
        """The supervisor's pid (the worker is its child)."""
        return self.proc.pid

    def stop(self, timeout: float = 15.0) -> int | None:
        """Wait up to ``timeout`` seconds for the worker to leave (it leaves on ``done.json``
        after writing its report), then stop it (SIGTERM, which its supervisor passes on, and
        SIGKILL 5 s later). Returns its exit status, ``None`` if it had to be killed."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
        log.warning("input worker 0 in the chief's task did not leave within %.0f s; stopping it", timeout)
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return None
        return self.proc.returncode

    def describe(self) -> dict[str, Any]:
        """performance.json's ``chief_input``: the split and the worker's index."""
        return {"worker": 0, **self.split.describe()}
