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
  input worker. The task starts a replacement one second later (see below):
  the same command in the same environment, so the same worker index, files and seed
  (:mod:`csrun_runtime.tensorflow.worker`), with ``CSRUN_WORKER_ATTEMPT`` one higher; it attaches to the
  same dispatcher and the chief reopens its stream (:mod:`csrun_runtime.elastic`);
- after :data:`MAX_DEATHS` such deaths the worker is given up with a warning and the task
  exits 0, so that the job step goes on with the other input workers.

Why a process inside the task rather than a new job step: with Slurm 22.05 a het srun does not
keep ``--kill-on-bad-exit`` apart per component (measured on the test cluster with
``--kill-on-bad-exit=1`` on the chief's component and ``=0`` on the workers': killing a worker
ended the whole step in 4 of 7 runs, killing the chief left the workers running in 2 of 3),
so an input worker's task must never exit abnormally for the job to survive its loss; and the
task's CPUs stay allocated to it, so the replacement needs no new allocation.
docs/RESILIENCE.md "Lost input workers" states what this covers (a killed process); docs/RESILIENCE.md "A lost node"
what covers a lost node (below).

The input worker a chief starts in its own task (the chief's input CPUs,
:mod:`csrun_runtime.chief_input`) runs under this module too; its supervisor first takes the
CPUs and niceness the chief chose (``CSRUN_PIN_CPUS``, ``CSRUN_NICE``), which the worker inherits.

A lost **node** (``csrun_wse --survive-node-loss``): the input workers then run as their own
Slurm job, submitted with ``--no-kill`` (sbatch(1)/srun(1): "Do not automatically terminate a
job if one of the nodes it has been allocated fails"), which Slurm keeps running on its other
nodes, while a het job is ended whole. A lost node takes its tasks' supervisors with it, so the
chief orders each of its workers a new home (``workers/<i>.orphan.json``,
:mod:`csrun_runtime.elastic`); the supervisor of every task of that job looks for orders every
second while its own worker runs, and the one that claims an order
(:meth:`~csrun_runtime.rendezvous.Rendezvous.claim_adoption`) starts the lost worker as a second
child on its own node and CPUs: the same command with ``CSRUN_WORKER_INDEX`` (the lost index:
its files, seed and dispatcher) and the ordered ``CSRUN_WORKER_ATTEMPT``. A supervisor that
already runs adopted workers waits one second per worker before claiming, so orders spread over
the surviving tasks. An adopted worker that dies is not restarted here: the chief orders again.

Signals sent to the task (SIGTERM of a cancel or preemption, SIGUSR2 of ``--requeue``,
SIGINT, SIGHUP, SIGUSR1) are passed on to the child and stop any further replacement; a child
that dies of one of them is not replaced either (Slurm may signal it before its supervisor).

When Slurm ends a job step outright (srun's "forcing job termination" after csrun_wse was
interrupted, a step cancelled), slurmstepd SIGKILLs the step's processes one by one, so a worker
may die of SIGKILL a moment before its supervisor. Two rules keep that from becoming a
"replacement" that outlives the step (measured on the test cluster: the replacement kept the
step's output pipes open, slurmstepd logged "Abandoning IO 60 secs after job shutdown
initiated" and the job stayed in squeue 65 s after csrun_wse exited):

- a replacement starts :data:`REPLACE_AFTER_S` after the death, not at once (the death is
  recorded at once): a supervisor that is being killed with its step is gone by then;
- every child is started with ``PR_SET_PDEATHSIG`` = SIGKILL (prctl(2)): it dies with its
  supervisor, whatever killed that.

Imports nothing heavy: no TensorFlow in the supervising process.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from csrun_common import exits
from csrun_common.atomic import read_json
from csrun_common.env import ROLE
from csrun_common.roles import ADOPT_ENV, WORKER_JOB_ENV, RoleError

from .chief_input import apply_placement
from .elastic import ATTEMPT_ENV, MAX_DEATHS, STATE_ENV
from .ranks import RankEnvError, rank_environment
from .rendezvous import Rendezvous

__all__ = ["MAX_DEATHS", "is_input_worker", "supervise", "main"]

#: Signals passed on to the child; any of them stops further replacements.
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)

#: Seconds between an input worker's death by a signal the task did not receive and the start
#: of its replacement: long enough for a step-wide SIGKILL (slurmstepd's walk over the step's
#: processes, milliseconds) to reach the supervisor first, short beside a worker's start-up.
REPLACE_AFTER_S = 1.0

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _dies_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child get SIGKILL when the supervisor dies
    (prctl(2) ``PR_SET_PDEATHSIG``), or ``None`` off Linux. The child exits at once if the
    supervisor died between fork and prctl (its parent is then no longer the supervisor)."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved before fork, not in the child
    parent = os.getpid()

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:
            os._exit(1)

    return preexec


def _start(argv: Sequence[str], env: Mapping[str, str]) -> subprocess.Popen:
    """Start an input worker process (the task's own or an adopted one) that dies with its supervisor."""
    # preexec_fn is safe here: the supervisor runs no threads
    return subprocess.Popen(list(argv), env=dict(env), preexec_fn=_dies_with_parent())


def _stopped_within(seconds: float, stopping: list[int]) -> bool:
    """Wait up to ``seconds``; whether a stop signal arrived meanwhile (the wait ends then)."""
    deadline = time.monotonic() + seconds
    while not stopping and (left := deadline - time.monotonic()) > 0:
        time.sleep(min(left, 0.05))
    return bool(stopping)


def is_input_worker(env: Mapping[str, str]) -> bool:
    """Whether the task described by ``env`` (the csrun_wse role contract, docs/CONTRACT.md
    "Role of a task") is an input worker; ``False`` for the chief, for a task outside
    csrun_wse and for an environment that does not resolve (the command then reports it)."""
    from csrun_common.roles import RoleError, resolve_role  # light: no TensorFlow

    if not env.get(ROLE):
        return False
    try:
        return resolve_role(env).kind == "worker"
    except RoleError:
        return False


def _rank_env(env: Mapping[str, str]) -> dict[str, str]:
    """:func:`csrun_runtime.ranks.rank_environment` of ``env``; a failure is said in one line
    and the task goes on without the variables (the rank's runtime then names what is missing)."""
    try:
        return rank_environment(env)
    except (RankEnvError, RoleError, ValueError) as exc:
        _say(f"trainer rank environment: {exc}")
        return {}


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
        After a stop signal the process ignores the stop signals from then on: Slurm may deliver
        one more than once, and a late copy must not end the leaving task by the signal.
    """
    stopping: list[int] = []
    child: list[subprocess.Popen] = []

    def forward(signum: int, _frame: object) -> None:
        stopping.append(signum)
        for proc in child:  # the task's own worker and any it adopted (--survive-node-loss)
            if proc.poll() is None:
                proc.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED}
    fd, state_file = tempfile.mkstemp(prefix="csrun-worker-", suffix=".json")
    os.close(fd)
    try:
        return _supervise_loop(argv, {**env, STATE_ENV: state_file}, max_deaths, child, stopping)
    finally:
        os.unlink(state_file)
        for sig, handler in previous.items():  # stopped: later copies ignored (Python's exit resets handlers)
            signal.signal(sig, signal.SIG_IGN if stopping else handler)


def _supervise_loop(argv: Sequence[str], env: Mapping[str, str], max_deaths: int,
                    child: list[subprocess.Popen], stopping: list[int]) -> int:
    deaths = 0
    node = env.get("SLURMD_NODENAME", "?")
    where = f"input worker task {env.get('SLURM_PROCID', '?')} on {node}"
    adopter = Adopter(argv, env, child, stopping) if env.get(WORKER_JOB_ENV) == "1" else None
    while True:
        proc = _start(argv, {**env, ATTEMPT_ENV: str(deaths)})
        child.append(proc)
        rc = _wait(proc, adopter)
        died = time.time()
        if rc >= 0:
            return _after(adopter, rc)
        if stopping or -rc in FORWARDED:
            return _after(adopter, 0)
        deaths += 1
        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = f"signal {-rc}"
        given_up = deaths >= max_deaths
        _record_death(env[STATE_ENV], {"time": died, "pid": proc.pid, "node": node,
                                       "signal": name, "deaths": deaths, "given_up": given_up})
        if given_up:
            _say(f"WARNING: {where} (pid {proc.pid}) died of {name}, {deaths} time(s): given up; "
                 f"the job goes on with the other input workers")
            return _after(adopter, 0)
        if _stopped_within(REPLACE_AFTER_S, stopping):  # ended with its step, not lost
            return _after(adopter, 0)
        _say(f"{where} (pid {proc.pid}) died of {name} at {time.strftime('%H:%M:%S', time.localtime(died))}; "
             f"starting its replacement ({deaths} of {max_deaths - 1})")


def _wait(proc: subprocess.Popen, adopter: Adopter | None) -> int:
    """Wait for the task's own worker; meanwhile carry out adoption orders (every second)."""
    if adopter is None:
        return proc.wait()
    while True:
        try:
            return proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            adopter.poll()


def _after(adopter: Adopter | None, rc: int) -> int:
    """The task's exit status once its own worker is done: adopted workers are waited for
    (they leave with the chief's ``done.json`` as every worker does), while still adopting."""
    if adopter is not None:
        adopter.wait()
    return rc


class Adopter:
    """Carries out the chief's adoption orders in one task of the input workers' job
    (``--survive-node-loss``; see the module docstring).

    Args:
        argv: the input worker's command (the task's own).
        env: the task's environment, ``CSRUN_SUPERVISOR_STATE`` included (where its own
            worker wrote the rendezvous directory).
        child: the supervisor's list of child processes (adopted ones are added, so that
            forwarded signals reach them).
        stopping: the stop signals the task received (none is adopted after one).
    """

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], child: list[subprocess.Popen],
                 stopping: list[int]):
        self.argv, self.env, self.child, self.stopping = list(argv), dict(env), child, stopping
        self.adopted: list[tuple[int, int, subprocess.Popen]] = []  # (index, attempt, process)
        self.seen: set[tuple[int, int]] = set()
        self._not_before: dict[tuple[int, int], float] = {}
        self._rdv: Rendezvous | None = None

    def _rendezvous(self) -> Rendezvous | None:
        """The job step's rendezvous, once the task's own worker has written it to the state
        file (read until then; it names the same directory for every attempt of that worker)."""
        if self._rdv is None:
            state = read_json(self.env[STATE_ENV])
            if state:
                rdv = Path(state["rendezvous"])
                self._rdv = Rendezvous(rdv.parent.parent, rdv.name)
        return self._rdv

    def poll(self) -> None:
        """Claim and start every open order this task may take now."""
        rdv = None if self.stopping else self._rendezvous()
        if rdv is None:
            return
        now = time.monotonic()
        busy = sum(1 for _, _, p in self.adopted if p.poll() is None)
        for index, order in sorted(rdv.adoption_orders().items()):
            key = (index, int(order.get("attempt") or 0))
            if key in self.seen:
                continue
            # a supervisor with adopted workers lets others claim first (one second each)
            start = self._not_before.setdefault(key, now + busy)
            if now < start:
                continue
            self.seen.add(key)
            me = {"node": self.env.get("SLURMD_NODENAME"), "procid": self.env.get("SLURM_PROCID"),
                  "pid": os.getpid(), "time": time.time()}
            if not rdv.claim_adoption(index, key[1], me):
                continue
            env = {k: v for k, v in self.env.items() if k != STATE_ENV}
            env.update({ADOPT_ENV: str(index), ATTEMPT_ENV: str(key[1])})
            proc = _start(self.argv, env)
            self.adopted.append((index, key[1], proc))
            self.child.insert(0, proc)  # forwarded signals reach it; child[-1] stays the task's own
            _say(f"input worker {index}, lost with node {order.get('lost_node')}, starts again on "
                 f"{me['node']} (task {me['procid']}, pid {proc.pid}, replacement {key[1]})")
            busy += 1

    def wait(self) -> None:
        """Wait for every adopted worker to exit, still adopting meanwhile."""
        while any(p.poll() is None for _, _, p in self.adopted):
            time.sleep(1.0)
            self.poll()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m csrun_runtime.supervise CMD...``: exec CMD for the chief, supervise it for an
    input worker (see the module docstring). Exit 127 when CMD cannot be executed."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        _say("usage: python -m csrun_runtime.supervise CMD [ARG...]")
        return exits.USAGE
    env = dict(os.environ)
    try:
        if not is_input_worker(env):
            env.update(_rank_env(env))  # a trainer rank of several: torchrun's variables, TF_CONFIG
            os.execvpe(args[0], args, env)
        apply_placement(env)  # the chief's own input worker: its CPUs and niceness, inherited
        return supervise(args, env)
    except OSError as exc:
        _say(f"cannot execute {args[0]!r}: {exc.strerror}")
        return exits.EXEC_FAILED


if __name__ == "__main__":
    sys.exit(main())
