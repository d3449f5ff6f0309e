"""One task's life, the same for every framework backend: the core owns it, a backend supplies
:class:`csrun_runtime.backend.Hooks` (the shape of Ray Train's ``train/backend.py``).

:func:`run` is what a backend's ``run()`` (the one call a run.py makes) hands its hooks to: in
capture mode (:func:`csrun_runtime.capture.load_entry`) it records the run.py's functions and
params; else :func:`main`: the task's role (:func:`csrun_runtime.task.begin`), the stop signals
(:mod:`csrun_runtime.preemption`), the params (:meth:`Hooks.resolve`), then the role's task. An
input worker runs with its signals only recorded (it serves until the chief's ``done.json``). The
chief (:class:`ChiefLife`):

1. with input workers, the job step's rendezvous (:class:`csrun_runtime.rendezvous.Rendezvous`,
   reset) and the chief's services, started with it (:data:`CHIEF_SERVICES`: its heartbeat);
2. the mode (:meth:`ChiefTask.run_mode`), or nothing on a trainer rank other than 0 for a mode that
   runs on rank 0 alone;
3. the exit-code ladder (:func:`failure`): bad params or a contract violation 2, a runtime failure 1
   in one line (an unknown exception with its traceback), a stop signal its status (75, 130, 143);
4. ``done.json`` (``ok``, ``stopped`` or ``failed``, and why), the chief's :meth:`ChiefTask.close`,
   the input workers' reports awaited (the chief exits last: the job step's status is then the
   chief's), the services stopped, and with several trainer ranks their last agreement
   (:func:`csrun_runtime.rankgroup.leave`).

Imports neither framework.
"""
from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

from csrun_common import exits
from csrun_common.modes import TRAIN_MODES
from csrun_common.roles import Role, RoleError

from . import capture, preemption
from .backend import ChiefTask, Failure, Hooks
from .params import ParamsError, Resolved
from .rankgroup import STOP_CODES, RankGroup, RankLost, leave
from .rendezvous import Heartbeat, Rendezvous
from .streams import InputStalled
from .task import begin, flush_exit, process_start_time, resolve_logged

__all__ = ["run", "main", "ChiefLife", "failure", "done_status", "rank_idle", "open_rendezvous", "Service",
           "CHIEF_SERVICES", "REPORTS_WAIT_SECS", "REPORTS_WAIT_FAILED_SECS", "OUTSIDE_THE_LOOP"]

log = logging.getLogger("csrun.runtime")

# csrun_wse --requeue: its signals are caught from the moment a runner imports this module (when
# run.py imports the runtime), before the framework loads (csrun_runtime/preemption.py).
preemption.install_from_env()

#: Seconds the chief waits for its input workers' reports after ``done.json``; after a failure
#: longer: a worker still importing its framework needs more than a stop's 10 s.
REPORTS_WAIT_SECS, REPORTS_WAIT_FAILED_SECS = 10.0, 30.0
#: What the chief says of a stop signal that arrived outside the training loop.
OUTSIDE_THE_LOOP = "outside the training loop: no step trained since, nothing more saved"


class Service(Protocol):
    """Something the chief runs beside its mode for the job step's life: started (by its factory
    in :data:`CHIEF_SERVICES`) once the rendezvous is reset, stopped after the workers' reports."""

    def stop(self) -> None:
        """Stop it (idempotent)."""
        ...


def _heartbeat(role: Role, resolved: Resolved, rdv: Rendezvous) -> Service:
    """The chief's heartbeat (``chief.alive``): its input workers leave when it goes stale."""
    return Heartbeat(rdv, "chief").start()


#: The chief's services, in start order: factories ``(role, resolved, rendezvous) -> Service``.
CHIEF_SERVICES: tuple[Callable[[Role, Resolved, Rendezvous], Service], ...] = (_heartbeat,)


def run(hooks: Hooks, argv: Sequence[str] | None = None, exit: bool = True) -> int | None:
    """A backend's ``run()``: in capture mode record the hooks' functions and params (framework
    :attr:`csrun_runtime.facts.BackendFacts.name`) and return ``None``; else :func:`main`, then
    leave with its code through :func:`csrun_runtime.task.flush_exit` (``exit=False``: return it).
    Raises :class:`csrun_runtime.params.ParamsError` in capture mode for bad params."""
    if capture.active():
        resolved = hooks.resolve(list(sys.argv[1:] if argv is None else argv), _run_py())
        capture.record(*hooks.functions(), framework=hooks.facts.name, resolved=resolved)
        return None
    code = main(hooks, argv)
    if exit:
        flush_exit(code)
    return code


def _run_py() -> str | None:
    return sys.argv[0] if sys.argv and sys.argv[0] else None


def main(hooks: Hooks, argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    """Resolve the role (from ``env``, default ``os.environ``) and the params (from ``argv``,
    default ``sys.argv[1:]``), run the task; returns its exit code: 0 success, 1 a runtime
    failure, 2 a bad environment, command line or params, or a contract violation, 75/130/143
    stopped by a signal (a stopped input worker: 0)."""
    t_proc = process_start_time()
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        role, prefix = begin(env)
    except RoleError as e:
        log.error("environment: %s", e)
        return exits.USAGE
    preemption.install_from_env(env)
    preemption.set_label(prefix, role.is_chief)
    preemption.install_interrupts()  # Ctrl-C / SIGTERM: a clean stop, no traceback (preemption.py)
    try:
        resolved = resolve_logged(lambda: hooks.resolve(args, _run_py()), prefix, role.is_chief,
                                  hooks.warnings(os.environ if env is None else env))
        if resolved is None:
            return exits.USAGE
        if role.kind == "worker":
            return _input_worker(hooks, role, resolved)
        return ChiefLife(hooks, role, resolved, t_proc).run()
    except preemption.Interrupted as e:  # outside training and serving: stop where it is
        log.info("stopped by %s %s", e.signal, OUTSIDE_THE_LOOP if role.is_chief else "before serving")
        return e.code if role.is_chief else 0
    except KeyboardInterrupt:
        log.info("stopped by SIGINT")
        return exits.INTERRUPTED if role.is_chief else 0


def _input_worker(hooks: Hooks, role: Role, resolved: Resolved) -> int:
    """An input worker's task: a signal is only recorded, it serves until the chief's ``done.json``."""
    try:
        with preemption.deferred():
            return hooks.worker(role, resolved).run()
    except Exception:  # noqa: BLE001 - a runtime failure: logged with its traceback, exit 1
        log.exception("input worker failed")
        return exits.FAILED


def failure(error: BaseException, hooks: Hooks, ranks: RankGroup | None) -> Failure:
    """What the chief's ``error`` means: bad params (every problem a line) 2; the input stalled or
    a trainer rank lost 1, in one line; a stop signal outside the training loop its status
    (130, 143, 75), logged at INFO; the backend's own exceptions as :meth:`Hooks.failure` maps
    them (a contract violation 2); any other exception 1, with its traceback. Re-raises a
    ``BaseException`` that is none of these (``SystemExit``)."""
    if isinstance(error, ParamsError):
        return Failure(exits.USAGE, tuple(error.problems), reason=str(error))
    if isinstance(error, InputStalled | RankLost):
        return Failure(exits.FAILED, (str(error),))
    if isinstance(error, preemption.Interrupted):
        return Failure(error.code, (f"stopped by {error.signal} {OUTSIDE_THE_LOOP}",), level=logging.INFO,
                       reason=f"stopped by {error.signal}")
    if isinstance(error, KeyboardInterrupt):
        return Failure(exits.INTERRUPTED, ("stopped by SIGINT",), level=logging.INFO)
    own = hooks.failure(error, ranks)
    if own is not None:
        return own
    if isinstance(error, Exception):
        return Failure(exits.FAILED, (f"run failed: {error}",), traceback=True,
                       reason=f"{type(error).__name__}: {error}")
    raise error


def done_status(code: int) -> str:
    """``done.json``'s status for the chief's exit ``code``: ``ok`` (0), ``stopped`` (a stop's
    status, or a stop signal arrived), else ``failed``."""
    if code == 0:
        return "ok"
    return "stopped" if code in STOP_CODES or preemption.stop_requested() else "failed"


def rank_idle(role: Role, mode: str) -> bool:
    """A trainer rank other than 0 in a mode that runs on rank 0 alone (every mode but training)."""
    return role.world_size > 1 and mode not in TRAIN_MODES and not role.is_rank_zero


def open_rendezvous(role: Role, model_dir: Path) -> Rendezvous | None:
    """The job step's rendezvous, reset, for a chief with input workers in a launched job
    (``None`` in single-process mode and without input workers)."""
    if role.single_process or role.num_input_workers <= 0 or not role.rendezvous_key:
        return None
    rdv = Rendezvous(model_dir, role.rendezvous_key)
    rdv.reset()
    return rdv


class ChiefLife:
    """The chief's life around its mode (module docstring, steps 1 to 4).

    Args:
        hooks: the backend's hooks.
        role: the chief's role.
        resolved: the run's params.
        t_proc: the process's start (``time.time()`` seconds).
    """

    def __init__(self, hooks: Hooks, role: Role, resolved: Resolved, t_proc: float):
        self.hooks, self.role, self.resolved, self.t_proc = hooks, role, resolved, t_proc
        self.model_dir = Path(resolved.model_dir)
        self.rdv: Rendezvous | None = None
        self.services: list[Service] = []
        self.chief: ChiefTask | None = None

    def run(self) -> int:
        """Steps 1 to 4; returns the exit code."""
        self.model_dir.mkdir(parents=True, exist_ok=True)
        self.rdv = open_rendezvous(self.role, self.model_dir)
        if self.rdv is not None:
            self.services = [start(self.role, self.resolved, self.rdv) for start in CHIEF_SERVICES]
        code, reason, returned = exits.FAILED, "", False
        try:
            code = self._run_mode()
            returned = True
        except BaseException as e:  # noqa: BLE001 - the ladder decides; re-raises what it does not know
            got = failure(e, self.hooks, self.ranks)
            for line in got.lines:
                log.log(got.level, "%s", line, exc_info=e if got.traceback else None)
            code, reason = got.code, got.reason or "; ".join(got.lines)
        finally:
            self._end(code, reason)
        return leave(self.ranks, code, returned)

    @property
    def ranks(self) -> RankGroup | None:
        """The chief's trainer ranks, once joined."""
        return self.chief.ranks if self.chief is not None else None

    def _run_mode(self) -> int:
        mode = self.resolved.mode
        if rank_idle(self.role, mode):
            log.info("mode %s runs on trainer rank 0 alone; rank %d has nothing to do", mode, self.role.rank)
            return 0
        self.chief = self.hooks.chief(self.role, self.resolved, self.rdv, self.t_proc)
        return self.chief.run_mode()

    def _end(self, code: int, reason: str) -> None:
        """Step 4: ``done.json``, the chief closed, the reports awaited, the services stopped."""
        status = done_status(code)
        if self.rdv is not None:
            self.rdv.mark_done(status, reason[:2000])
        if self.chief is not None:
            self.chief.close()
        if self.rdv is not None:
            missing = self.chief.missing_reports() if self.chief is not None else 0
            preemption.wait_workers_left(self.rdv.reports, self.role.num_input_workers - missing,
                                         REPORTS_WAIT_FAILED_SECS if status == "failed" else REPORTS_WAIT_SECS)
        for service in reversed(self.services):
            service.stop()
