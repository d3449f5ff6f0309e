"""Checkpoint and stop on a signal, for ``csrun_wse --requeue`` (docs/REQUEUE.md).

Slurm warns a job before its time limit with the signal of sbatch(1) ``--signal`` (csrun's
default SIGUSR2, 90 s ahead) and ends a preempted or ``scontrol requeue``-d job with
SIGTERM, then SIGKILL ``KillWait`` seconds later (slurm.conf(5) ``KillWait``: "The interval,
in seconds, given to a job's processes between the SIGTERM and SIGKILL signals"). csrun_wse
exports the signals to catch in ``CSRUN_STOP_SIGNALS`` (e.g. ``USR2:TERM``);
:func:`install_from_env` runs when the runtime is imported, so that a signal arriving while
TensorFlow still loads does not kill the task.

The handler only records the signal (:func:`stop_requested`); every task keeps running:

- the chief's training loop (:class:`csrun_runtime.loop.TrainingDriver`) asks between two
  steps, saves a checkpoint at the global step it reached, records the allocation
  (:func:`record_allocation`) and the chief exits with :data:`REQUEUE_EXIT` after its input
  workers left (:func:`wait_workers_left`), so that the job step's exit status is that code;
- an input worker keeps no state: it keeps serving until the chief's ``done.json`` and
  leaves with status 0 (it must not die of the signal before the chief has saved).

Ctrl-C and SIGTERM (:func:`install_interrupts`, every task ``run()`` starts): SIGINT and
SIGTERM stop a run cleanly whether or not ``--requeue`` asked for it. Inside a
:func:`deferred` block (the chief's training loop, an input worker's serving) the handler only
records the signal, as above: the loop saves a checkpoint at the step it reached, writes the
verdict and ``performance.json`` (``stopped_by``) and the chief exits ``128 + signal`` (130,
143) -- or :data:`REQUEUE_EXIT` when the signal is one of ``CSRUN_STOP_SIGNALS``. A signal
landing during a checkpoint save is therefore acted on after the save (and
``tf.train.CheckpointManager`` writes the ``checkpoint`` file naming the newest checkpoint only
after its data and index files are complete, so a SIGKILL mid-save leaves the previous one
the newest). Outside such a block (importing, validating, waiting for workers) the handler
raises :class:`Interrupted`, which :mod:`csrun_runtime.lifecycle` turns into one log
line and that exit status: no Python traceback either way.

The job is then requeued (by csrun's batch script, by Slurm itself on preemption or
``scontrol requeue``) and the next allocation restores the newest checkpoint
(``runconfig.autoload_last_checkpoint``), so the global steps of the allocations follow each
other with no gap and no repeat. ``<model_dir>/performance/allocations.json`` lists every
allocation (job, requeue count, first and last global step, the signal that stopped it and
when) and ``performance.json`` says how many allocations the run took and the steps of each.
"""
from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from csrun_common.atomic import read_json, write_json

# REQUEUE_EXIT: the exit status of a chief that saved a checkpoint and stopped on a signal
# (EX_TEMPFAIL); STOP_SIGNALS_ENV: the signals to turn into "checkpoint and stop" (names without
# SIG, ":"-separated); REQUEUE_COUNT_ENV: relaunches by csrun_wse on the srun path. Declared
# once in csrun_common for both sides (docs/ENV.md).
from csrun_common.env import REQUEUE_COUNT as REQUEUE_COUNT_ENV
from csrun_common.env import STOP_SIGNALS as STOP_SIGNALS_ENV
from csrun_common.exits import REQUEUE as REQUEUE_EXIT

__all__ = ["REQUEUE_EXIT", "STOP_SIGNALS_ENV", "REQUEUE_COUNT_ENV", "install", "install_from_env", "set_label",
           "stop_requested", "stop_signal", "stop_time", "exit_code", "Allocation", "record_allocation",
           "run_allocations", "allocation_history",
           "WORKER_KEYS", "wait_workers_left", "reset", "install_interrupts", "deferred", "Interrupted",
           "INTERRUPT_SIGNALS", "requeue_requested", "waiting_for_input", "adopt_stop", "stop_signum"]

#: Under ``<model_dir>/performance/``: the allocations of every run in this model_dir.
ALLOCATIONS_FILE = "allocations.json"
#: The keys of a source's ``describe()`` each allocation keeps (:attr:`Allocation.workers`), so
#: that the run's history of lost, replaced, given-up and paused input workers outlives a requeue.
WORKER_KEYS = ("workers_lost", "workers_replaced", "workers_given_up", "workers_paused")


#: Signals that stop a run cleanly in every task ``run()`` starts (:func:`install_interrupts`).
INTERRUPT_SIGNALS = ("SIGINT", "SIGTERM")


class Interrupted(BaseException):
    """SIGINT/SIGTERM outside a :func:`deferred` block: the task stops where it is (a
    ``BaseException``, like ``KeyboardInterrupt``, so ``except Exception`` lets it through).
    ``signal``: the signal's name (``"SIGINT"``); ``code``: ``128 + signal number``."""

    def __init__(self, name: str, signum: int):
        super().__init__(name)
        self.signal, self.code = name, 128 + int(signum)


@dataclass
class _StopRequest:
    signal: str | None = None
    at: float | None = None  # wall clock (time.time()) of the first signal
    signum: int = 0
    requeue: bool = False  # the first signal is one of CSRUN_STOP_SIGNALS (--requeue)


_request = _StopRequest()
_label = {"text": "INFO:csrun:", "role": "task"}
_requeue_signals: set[str] = set()  # installed from CSRUN_STOP_SIGNALS
_defer = {"depth": 0, "waiting": False}


def reset() -> None:
    """Forget a recorded signal and which signals are ``--requeue``'s (tests; a process
    normally stops once)."""
    _requeue_signals.clear()
    _request.signal = None
    _request.at = None
    _request.signum = 0
    _request.requeue = False
    _label.update(text="INFO:csrun:", role="task")


def set_label(prefix: str, is_chief: bool) -> None:
    """How the signal handler names this task on stderr (the runtime's log prefix)."""
    _label["text"] = f"INFO:csrun:{prefix}"
    _label["role"] = "chief" if is_chief else "input worker"


def _handler(signum: int, _frame: Any) -> None:
    """Record the first signal; the training loop acts between two calls. Raises
    :class:`Interrupted` for SIGINT/SIGTERM outside a :func:`deferred` block and for any stop
    signal inside :func:`waiting_for_input`. Writes one line with ``os.write``: no lock is
    taken inside a signal handler."""
    name = signal.Signals(signum).name
    first = _request.signal is None
    if first:
        _request.signal, _request.at = name, time.time()
        _request.signum, _request.requeue = int(signum), name in _requeue_signals
    if first and name not in _requeue_signals and _defer["depth"] == 0:  # later ones: recorded
        raise Interrupted(name, signum)
    waiting, _defer["waiting"] = _defer["waiting"], False
    what = ("saves a checkpoint at the step it reached and stops" if _label["role"] == "chief"
            else "keeps serving until the chief has saved")
    try:
        os.write(2, f"{_label['text']}received {name}: the {_label['role']} {what}\n".encode())
    except OSError:
        pass
    if waiting:  # blocked on the next batch: stop waiting (waiting_for_input)
        raise Interrupted(name, signum)


def install(names: Iterable[str]) -> list[str]:
    """Catch the signals ``names`` (``"USR2"``, ``"TERM"``, with or without ``SIG``) with
    the recording handler; returns those installed. Only the main thread may install
    handlers (Python's ``signal.signal``): elsewhere nothing is installed."""
    if threading.current_thread() is not threading.main_thread():
        return []
    done = []
    for raw in names:
        name = raw.strip().upper()
        if not name:
            continue
        sig = getattr(signal, name if name.startswith("SIG") else f"SIG{name}", None)
        if not isinstance(sig, signal.Signals) or sig in (signal.SIGKILL, signal.SIGSTOP):
            continue
        signal.signal(sig, _handler)
        _requeue_signals.add(sig.name)
        done.append(sig.name)
    return done


def install_interrupts() -> list[str]:
    """Catch SIGINT and SIGTERM (Ctrl-C; ``scancel``; srun ending a step) with the recording
    handler, in addition to ``--requeue``'s signals; returns those newly installed. Inside a
    :func:`deferred` block the signal is recorded and the loop stops at its next step
    boundary; outside, the handler raises :class:`Interrupted`. Main thread only (nothing
    is installed elsewhere)."""
    if threading.current_thread() is not threading.main_thread():
        return []
    done = []
    for name in INTERRUPT_SIGNALS:
        if name in _requeue_signals:
            continue
        signal.signal(getattr(signal, name), _handler)
        done.append(name)
    return done


@contextmanager
def deferred() -> Iterator[None]:
    """A block in which SIGINT/SIGTERM are only recorded (:func:`stop_requested`), never
    raised: the code inside checks between steps, finishes a checkpoint save it started and
    stops. A signal that arrived before the block is raised as :class:`Interrupted` on entry."""
    if _request.signal is not None and not _request.requeue:
        raise Interrupted(_request.signal, _request.signum)
    _defer["depth"] += 1
    try:
        yield
    finally:
        _defer["depth"] -= 1


@contextmanager
def waiting_for_input() -> Iterator[None]:
    """Inside a :func:`deferred` block, a wait for input that a stop signal ends: the signal
    (any stop signal, ``--requeue``'s too) raises :class:`Interrupted` out of the wait, so an
    input-bound loop stops at the step it reached instead of after its next batch (which
    may take seconds; Slurm's KillWait does not wait). Raises at once when a stop signal
    arrived already."""
    if _request.signal is not None:
        raise Interrupted(_request.signal, _request.signum)
    _defer["waiting"] = True
    try:
        yield
    finally:
        _defer["waiting"] = False


def install_from_env(env: Mapping[str, str] | None = None) -> list[str]:
    """:func:`install` the signals of ``CSRUN_STOP_SIGNALS`` (csrun_wse ``--requeue``); returns those
    installed, none when it is unset (the default dispositions stay)."""
    value = (os.environ if env is None else env).get(STOP_SIGNALS_ENV, "")
    return install(value.replace(",", ":").split(":")) if value else []


def adopt_stop(signum: int, requeue: bool) -> None:
    """Record stop signal ``signum`` as if received (``requeue``: one of ``--requeue``'s) unless one was
    recorded already: a trainer rank stops as another did (:mod:`.rankgroup`). Raises ``ValueError`` for
    a number that is no signal."""
    if _request.signal is not None:
        return
    _request.signal, _request.at = signal.Signals(int(signum)).name, time.time()
    _request.signum, _request.requeue = int(signum), bool(requeue)


def stop_requested() -> bool:
    """A stop signal arrived: the chief should save and stop at its next step boundary."""
    return _request.signal is not None


def stop_signal() -> str | None:
    """The first stop signal's name (``"SIGUSR2"``) or ``None``."""
    return _request.signal


def stop_signum() -> int:
    """The first stop signal's number, 0 when none arrived."""
    return _request.signum if _request.signal is not None else 0


def stop_time() -> float | None:
    """Wall-clock time (``time.time()``) of the first stop signal, or ``None``."""
    return _request.at


def requeue_requested() -> bool:
    """Whether the stop signal is one of ``--requeue``'s (``CSRUN_STOP_SIGNALS``): the run asks to be relaunched."""
    return _request.signal is not None and _request.requeue


def exit_code() -> int:
    """:data:`REQUEUE_EXIT` after one of ``--requeue``'s signals, ``128 + N`` after an
    interrupt signal N (130 for SIGINT, 143 for SIGTERM: as a shell reports a command that
    signal ended), else 0 (the training reached its target)."""
    if _request.signal is None:
        return 0
    return REQUEUE_EXIT if _request.requeue else 128 + _request.signum


def allocation_index(env: Mapping[str, str] | None = None) -> int:
    """Requeues of this job so far: ``SLURM_RESTART_COUNT`` (sbatch(1): "the number of
    times the job has been restarted"), else csrun_wse's ``CSRUN_REQUEUE_COUNT`` on the
    srun path, else 0."""
    e = os.environ if env is None else env
    for key in ("SLURM_RESTART_COUNT", REQUEUE_COUNT_ENV):
        try:
            return int(e.get(key, ""))
        except ValueError:
            continue
    return 0


@dataclass
class Allocation:
    """One allocation of a training run (one job start, or one requeue of it).

    Attributes:
        job_id: ``SLURM_JOB_ID`` (``None`` outside Slurm); ``requeue``: requeues before it.
        start_step: the global step restored at the start; ``end_step``: the step saved at
            the end. Steps ``start_step+1 .. end_step`` were trained in this allocation.
        target: the training target (``max_steps``) of the run.
        stopped_by: the signal that stopped it (``"SIGUSR2"``), ``None`` when it reached the target.
        process_start, first_step_at, signal_at, ended_at: wall-clock times (``time.time()``
            seconds): the chief's process start, its first training step (``None`` when it
            stopped before one), the stop signal, the end of the allocation's training.
        workers: this allocation's ``workers_lost``, ``workers_replaced``, ``workers_given_up``
            and ``workers_paused`` (:data:`WORKER_KEYS`, as its source described them).
    """

    job_id: str | None
    requeue: int
    node: str | None
    start_step: int
    end_step: int
    target: int
    stopped_by: str | None
    process_start: float
    first_step_at: float | None
    signal_at: float | None
    ended_at: float
    workers: dict[str, Any] = field(default_factory=dict)

    @property
    def steps(self) -> int:
        """Global steps trained in this allocation."""
        return self.end_step - self.start_step


def _load(path: Path) -> list[dict[str, Any]]:
    data = read_json(path)
    recs = data.get("allocations") if isinstance(data, dict) else None
    return [r for r in recs if isinstance(r, dict)] if isinstance(recs, list) else []


def run_allocations(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The allocations of the run that ends with ``records[-1]``: walking back, an earlier
    allocation belongs to the run while it was stopped by a signal and the next one resumed
    from the very step it saved (a run that reached its target, or a gap, starts a new run).
    """
    if not records:
        return []
    chain = [records[-1]]
    for rec in reversed(records[:-1]):
        if rec.get("stopped_by") and rec.get("end_step") == chain[0].get("start_step"):
            chain.insert(0, rec)
        else:
            break
    return chain


def record_allocation(model_dir: str | os.PathLike[str], alloc: Allocation,
                      log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Append ``alloc`` to ``<model_dir>/performance/allocations.json`` (atomically) and
    return the keys ``performance.json`` gets: ``allocations`` (how many this run took so
    far), ``allocation`` (this one's number, 1-based), ``steps_per_allocation``,
    ``global_steps_per_allocation`` (``[start, end]`` pairs), ``stopped_by``. ``log`` gets
    the two lines the chief logs."""
    path = Path(model_dir) / "performance" / ALLOCATIONS_FILE
    records = _load(path)
    rec = {**asdict(alloc), "steps": alloc.steps}
    records.append(rec)
    write_json(path, {"allocations": records})
    chain = run_allocations(records)
    steps = [int(r["end_step"]) - int(r["start_step"]) for r in chain]
    if log is not None:
        kept = (f"global steps {alloc.start_step + 1}..{alloc.end_step} ({alloc.steps} steps)" if alloc.steps > 0
                else f"no step kept past global step {alloc.start_step} (no checkpoint after it)")
        log(f"allocation {len(chain)} of this run (job {alloc.job_id}, requeue {alloc.requeue}): {kept}"
            + (f", stopped by {alloc.stopped_by}" if alloc.stopped_by else ""))
        log(f"the run took {len(chain)} allocation(s) so far; steps in each: {', '.join(map(str, steps))}")
    return {"allocations": len(chain), "allocation": len(chain), "steps_per_allocation": steps,
            "global_steps_per_allocation": [[int(r["start_step"]), int(r["end_step"])] for r in chain],
            "stopped_by": alloc.stopped_by, "allocation_history": allocation_history(chain)}


def allocation_history(chain: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every allocation of the run (:func:`run_allocations`) with its steps, what stopped it and
    its input workers (:data:`WORKER_KEYS`; ``[]`` for an allocation recorded before they were
    kept): performance.json's ``allocation_history``."""
    return [{"allocation": i + 1, "job_id": r.get("job_id"), "requeue": r.get("requeue"),
             "start_step": r.get("start_step"), "end_step": r.get("end_step"), "stopped_by": r.get("stopped_by"),
             **{k: list((r.get("workers") or {}).get(k) or []) for k in WORKER_KEYS}}
            for i, r in enumerate(chain)]


def wait_workers_left(reports: Callable[[], Mapping[int, Any]], num_input_workers: int, timeout: float = 10.0) -> bool:
    """After ``done.json``, wait until every input worker wrote its report (it leaves right
    after, with status 0) or ``timeout`` seconds passed; returns whether all did. The chief
    then exits last, so that the job step's status is the chief's (srun reports a task ended
    by its termination as a failure of its own)."""
    deadline = time.monotonic() + timeout
    while True:  # looks at least once, however late this process is scheduled
        if len(reports()) >= num_input_workers:
            time.sleep(0.2)  # the workers' os._exit right after their report
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
