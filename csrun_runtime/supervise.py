"""Keep an input worker alive inside its Slurm task: ``python -m csrun_runtime.supervise CMD...``.

csrun_wse runs every task's command through this module (launcher/builders.py). For the chief
(and for any task that is not an input worker) it ``exec``-s the command: the chief's process
*is* the task, so its death is a bad exit that ends the whole job step at once
(srun(1) ``--kill-on-bad-exit=1``, kept on every het component).

For an input worker it starts the command as a child process and waits for it:

- the child exits with any status: the task exits with that status (0 when the chief finished,
  2 for a contract violation, 1 when the chief was lost, ...);
- the child dies of a signal other than the stop signals below (``kill -9``, the kernel's
  OOM killer, a segfault, an abort) while the task was not asked to stop: this is a *lost*
  input worker. The task starts a replacement at once:
  the same command in the same environment, so the same worker index, files and seed
  (:mod:`csrun_runtime.worker`), with ``CSRUN_WORKER_ATTEMPT`` one higher; it attaches to the
  same dispatcher and the chief reopens its stream (:mod:`csrun_runtime.elastic`);
- after :data:`MAX_DEATHS` such deaths the worker is given up with a warning and the task
  exits 0, so that the job step goes on with the other input workers.

Why a process inside the task rather than a new job step: with Slurm 22.05 a het srun does not
keep ``--kill-on-bad-exit`` apart per component (measured on the test cluster with
``--kill-on-bad-exit=1`` on the chief's component and ``=0`` on the workers': killing a worker
ended the whole step in 4 of 7 runs, killing the chief left the workers running in 2 of 3),
so an input worker's task must never exit abnormally for the job to survive its loss; and the
task's CPUs stay allocated to it, so the replacement needs no new allocation.
README "Lost input workers" states what this covers (a killed process) and what it does not
(a lost node: Slurm ends the job, sbatch(1) ``--no-kill`` aside).

The input worker a chief starts in its own task (``csrun_wse --chief-input-cpus``,
:mod:`csrun_runtime.chief_input`) runs under this module too; its supervisor first takes the
CPUs and niceness the chief chose (``CSRUN_PIN_CPUS``, ``CSRUN_NICE``), which the worker inherits.

Signals sent to the task (SIGTERM of a cancel or preemption, SIGUSR2 of ``--requeue``,
SIGINT, SIGHUP, SIGUSR1) are passed on to the child and stop any further replacement; a child
that dies of one of them is not replaced either (Slurm may signal it before its supervisor).
Imports nothing heavy: no TensorFlow in the supervising process.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from csrun_common.atomic import read_json

from .chief_input import apply_placement
from .elastic import ATTEMPT_ENV, MAX_DEATHS, STATE_ENV
from .rendezvous import Rendezvous

__all__ = ["MAX_DEATHS", "is_input_worker", "supervise", "main"]

#: Signals passed on to the child; any of them stops further replacements.
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


def is_input_worker(env: Mapping[str, str]) -> bool:
    """Whether the task described by ``env`` (the csrun_wse role contract, docs/CONTRACT.md
    "Role of a task") is an input worker; ``False`` for the chief, for a task outside
    csrun_wse and for an environment that does not resolve (the command then reports it)."""
    from csrun_common.roles import RoleError, resolve_role  # light: no TensorFlow

    if not env.get("CSRUN_ROLE"):
        return False
    try:
        return resolve_role(env).kind == "worker"
    except RoleError:
        return False


def _say(msg: str) -> None:
    print(f"csrun: {msg}", file=sys.stderr, flush=True)


def _record_death(state_file: str, info: dict[str, object]) -> None:
    """Append a death to the rendezvous (``workers/<i>.lost.json``) when the worker told where
    it is (:func:`csrun_runtime.elastic.tell_supervisor`); the chief reads it (:mod:`csrun_runtime.elastic`)."""
    state = read_json(state_file)
    if not state:
        return
    rdv = Path(state["rendezvous"])
    Rendezvous(rdv.parent.parent, rdv.name).mark_lost(int(state["index"]), info)


def supervise(argv: Sequence[str], env: Mapping[str, str], max_deaths: int = MAX_DEATHS) -> int:
    """Run ``argv`` as a child until it exits, replacing it after a death by a signal.

    Args:
        argv: the input worker's command.
        env: its environment (``CSRUN_WORKER_ATTEMPT`` is set on top of it).
        max_deaths: deaths after which the worker is given up (exit 0 with a warning).

    Returns:
        The exit status for the task: the child's own exit status; 0 when it died of a stop
        signal (TERM, INT, HUP, USR1, USR2: Slurm ending the step, e.g. after the chief's bad
        exit) or was given up. A stopped input worker is not a failure of its own: srun(1)
        reports the worst status of the step's tasks (measured: a worker task terminated
        after the chief exited 3 made srun exit 143), and the chief's task decides the job's.
    """
    stopping: list[int] = []
    child: list[subprocess.Popen] = []

    def forward(signum: int, _frame: object) -> None:
        stopping.append(signum)
        if child and child[-1].poll() is None:
            child[-1].send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED}
    fd, state_file = tempfile.mkstemp(prefix="csrun-worker-", suffix=".json")
    os.close(fd)
    try:
        return _supervise_loop(argv, {**env, STATE_ENV: state_file}, max_deaths, child, stopping)
    finally:
        os.unlink(state_file)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _supervise_loop(argv: Sequence[str], env: Mapping[str, str], max_deaths: int,
                    child: list[subprocess.Popen], stopping: list[int]) -> int:
    deaths = 0
    node = env.get("SLURMD_NODENAME", "?")
    where = f"input worker task {env.get('SLURM_PROCID', '?')} on {node}"
    while True:
        proc = subprocess.Popen(list(argv), env={**env, ATTEMPT_ENV: str(deaths)})
        child.append(proc)
        rc = proc.wait()
        if rc >= 0:
            return rc
        if stopping or -rc in FORWARDED:
            return 0
        deaths += 1
        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = f"signal {-rc}"
        given_up = deaths >= max_deaths
        _record_death(env[STATE_ENV], {"time": time.time(), "pid": proc.pid, "node": node,
                                       "signal": name, "deaths": deaths, "given_up": given_up})
        if given_up:
            _say(f"WARNING: {where} (pid {proc.pid}) died of {name}, {deaths} time(s): given up; "
                 f"the job goes on with the other input workers")
            return 0
        _say(f"{where} (pid {proc.pid}) died of {name} at {time.strftime('%H:%M:%S')}; "
             f"starting its replacement ({deaths} of {max_deaths - 1})")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m csrun_runtime.supervise CMD...``: exec CMD for the chief, supervise it for an
    input worker (see the module docstring). Exit 127 when CMD cannot be executed."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        _say("usage: python -m csrun_runtime.supervise CMD [ARG...]")
        return 2
    env = dict(os.environ)
    try:
        if not is_input_worker(env):
            os.execvp(args[0], args)
        apply_placement(env)  # the chief's own input worker: its CPUs and niceness, inherited
        return supervise(args, env)
    except OSError as exc:
        _say(f"cannot execute {args[0]!r}: {exc.strerror}")
        return 127


if __name__ == "__main__":
    sys.exit(main())
