"""The Python API of recorded runs, which the ``csrun`` verbs use too: :func:`launch` (csrun_wse's
options, typed) returns a :class:`Run`; :func:`attach` finds one by run id, job id or model_dir
in any process; a :class:`Run` pickles (it holds its id and where its record is, nothing live).

    run = launch(["python-ws", "run.py", "--mode", "train"], nodes=3, use_sbatch=True)
    run.wait(timeout=600); run.state(); run.performance()
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from csrun_common.env import RUN_ID
from csrun_common.errors import CsrunError

from .. import slurm
from ..config import load_config
from . import logs, poll, states
from .record import RunRecord, RunStore, state_dir
from .view import RunStatus

if TYPE_CHECKING:
    from ..flags import WseFlags

#: Seconds :meth:`Run.cancel` with ``checkpoint`` waits for the tasks to save and leave after the
#: stop signal before it cancels the job (a checkpoint save of the test's models takes < 1 s;
#: Slurm's own KillWait default is 30 s).
CHECKPOINT_GRACE_S = 60.0
#: The stop signal of ``cancel --checkpoint``: SIGINT, which the runtime turns into "save a
#: checkpoint at this step and stop" in every task, and which is never one of ``--requeue``'s
#: signals (so the batch script does not requeue the job; csrun_runtime/preemption.py).
STOP_SIGNAL = "INT"


def store(configured: str | None = None) -> RunStore:
    """The run index of this user (the site config's ``runs.state_dir`` unless ``configured``)."""
    return RunStore(state_dir(load_config().state_dir if configured is None else configured))


@dataclass(frozen=True)
class Run:
    """A recorded run: ``run_id``, the state directory of its index and its model_dir (where
    the record's other copy is). Every method reads the record afresh."""

    run_id: str
    state_root: str
    model_dir: str | None = None

    @property
    def store(self) -> RunStore:
        """The index this run is recorded in."""
        return RunStore(Path(self.state_root))

    def record(self) -> RunRecord:
        """The record as it is now."""
        return self.store.load(self.run_id, self.model_dir)

    def status(self) -> RunStatus:
        """The full status: one ``squeue`` and at most one ``sacct`` (:func:`launcher.runs.poll.refresh`)."""
        return poll.refresh(self.store, [self.record()])[self.run_id]

    def state(self) -> str:
        """One of :data:`launcher.runs.states.STATES`."""
        return self.status().state

    def wait(self, timeout: float | None = None) -> str:
        """The run's state once terminal or after ``timeout`` s (:func:`launcher.runs.poll.wait_all`)."""
        return poll.wait_all(self.store, [self.record()], timeout)[self.run_id].state

    def logs(self, role: str | None = None, task: int | None = None, attempt: int | None = None,
             tail: int | None = None, grep: str | None = None, follow: bool = False) -> Iterator[logs.LogLine]:
        """The lines of one attempt's tasks (:func:`launcher.runs.logs.read`), or with ``follow``
        every line as it is written until the run ends (:func:`launcher.runs.logs.follow`)."""
        if not follow:
            yield from logs.read(self.record(), role, task, attempt, tail, grep)
            return
        if attempt is not None:
            raise CsrunError("--follow with --attempt: follow reads the newest attempt on")
        yield from logs.follow(self.record, self._ended, role, task, tail, grep)

    def _ended(self) -> bool:
        return self.state() in states.TERMINAL

    def performance(self) -> dict[str, Any] | None:
        """The run's ``performance/performance.json`` (``None`` before it is written)."""
        from .view import performance

        return performance(self.record())

    def cancel(self, checkpoint: bool = True, grace: float = CHECKPOINT_GRACE_S) -> str:
        """Cancel the run; idempotent. With ``checkpoint`` a running job's tasks first get
        :data:`STOP_SIGNAL` (they save a checkpoint at their step and leave) and ``grace``
        seconds to end, then ``scancel``. Returns what was done, one line."""
        status = self.status()
        if status.state in states.TERMINAL:
            return f"{self.run_id} already ended: {status.state}" + (f" ({status.reason})" if status.reason else "")
        self.store.update(self.run_id, lambda r: setattr(r, "cancel", {"time": time.time(), "checkpoint": checkpoint}),
                          self.model_dir)
        rec = self.record()
        if not rec.jobs:
            return self._cancel_launcher(rec)
        job = rec.jobs[-1]
        if checkpoint and status.state == states.RUNNING:
            slurm.signal_job(job, STOP_SIGNAL)
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline and self.state() not in states.TERMINAL:
                time.sleep(1.0)
        slurm.signal_job(job)
        return f"{self.run_id}: job {job} cancelled" + (" after its checkpoint" if checkpoint else "")

    def _cancel_launcher(self, rec: RunRecord) -> str:
        """An srun-path run whose job id is unknown: SIGINT to its launcher on this host."""
        info = rec.launcher or {}
        if info.get("host") != os.uname().nodename or not info.get("pid"):
            raise CsrunError(f"RUN {self.run_id}: no job id recorded yet and its launcher runs on "
                             f"{info.get('host')}: cancel it there")
        try:
            os.kill(int(info["pid"]), signal.SIGINT)  # the launcher passes it on to srun's tasks
        except ProcessLookupError:
            return f"{self.run_id}: its launcher had already ended"
        return f"{self.run_id}: its launcher (pid {info['pid']}) interrupted"


def attach(ref: str | os.PathLike[str], state: str | None = None) -> Run:
    """The run ``ref`` names: a run id, a Slurm job id or a model_dir (its newest run), in this
    user's index (:func:`store`) or beside the model_dir. Raises :class:`CsrunError` naming the
    closest run ids when there is none."""
    st = store(state)
    rec = st.find(os.fspath(ref))
    return Run(rec.run_id, str(st.root), rec.model_dir)


def runs(state: str | None = None) -> list[Run]:
    """Every run in this user's index, newest first."""
    st = store(state)
    return [Run(r.run_id, str(st.root), r.model_dir) for r in st.all()]


def wse_flags(**options: Any) -> WseFlags:
    """:class:`launcher.flags.WseFlags` of csrun_wse's options by parameter name (``nodes=3``,
    ``use_sbatch=True``, ``qos="debug"``, ...). Raises ``TypeError`` naming an unknown one."""
    from ..flags import WseFlags  # lazy: csrun's verbs do not launch
    try:
        return WseFlags.from_click(dict(options))
    except TypeError as e:
        raise TypeError(f"launch(): {e}") from None


def launch(command: Sequence[str], *, cwd: str | os.PathLike[str] | None = None,
           env: Mapping[str, str] | None = None, timeout: float = 300.0, **options: Any) -> Run:
    """Launch ``command`` with csrun_wse and the typed ``options`` (:func:`wse_flags`) and
    return its :class:`Run`. With ``use_sbatch`` it returns once the job is queued; on the srun
    path csrun_wse runs on as a child of its own session and this returns once its record is
    written. Raises :class:`CsrunError` with csrun_wse's last error line when it refuses."""
    from ..flags import WSE_OPTIONS  # lazy: csrun's verbs do not launch
    from .recorder import flag_argv

    flags = wse_flags(**options)
    if flags.dry_run or flags.check:
        raise CsrunError("launch(): dry_run and check launch nothing; run csrun_wse for them")
    child_env = dict(os.environ if env is None else env)
    st = RunStore(state_dir(load_config(child_env).state_dir, child_env))
    run_id = child_env[RUN_ID.name] = st.new_id("csrun_wse")
    argv = [sys.executable, "-c", "import sys; from launcher.cli import csrun_wse; sys.exit(csrun_wse())",
            *flag_argv(WSE_OPTIONS, flags), *command]
    if flags.use_sbatch:
        proc = subprocess.run(argv, cwd=cwd, env=child_env, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise CsrunError((proc.stderr.strip().splitlines() or [f"csrun_wse exited {proc.returncode}"])[-1])
    else:
        _start_srun_launcher(argv, cwd, child_env, st, run_id, timeout)
    rec = st.load(run_id)
    return Run(run_id, str(st.root), rec.model_dir)


def _start_srun_launcher(argv: list[str], cwd: Any, env: dict[str, str], st: RunStore, run_id: str,
                         timeout: float) -> None:
    """csrun_wse on the srun path, in a session of its own (its output in the index, beside the
    record); returns once the record exists, raises :class:`CsrunError` if it ends first."""
    st.index.mkdir(parents=True, exist_ok=True)
    out = open(st.index / f"{run_id}.launcher.log", "w")  # noqa: SIM115 - handed to the child
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    out.close()
    deadline = time.monotonic() + timeout
    while not st.index_path(run_id).exists():
        if proc.poll() is not None:
            lines = Path(out.name).read_text(errors="replace").strip().splitlines()
            raise CsrunError(lines[-1] if lines else f"csrun_wse exited {proc.returncode}")
        if time.monotonic() > deadline:
            raise CsrunError(f"csrun_wse wrote no record in {timeout:.0f} s")
        time.sleep(0.1)
