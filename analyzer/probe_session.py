"""Probe sessions: the I/O of probing.

A :class:`ProbeSession` is one node agent (:mod:`analyzer.probe_agent`) run as a local process
(``--local``) or as a submitit job holding one exclusive CPU node
(:func:`launcher.slurm.submit_function`); the agent starts ``M`` persistent probe workers that
load run.py once. Each probe is a command file the workers pick up (see
:mod:`analyzer.probe_worker`); the session waits for the ``T`` results with a per-probe
timeout. :class:`ChiefApart` runs a served probe's chief on this machine for a 1-CPU probe
node. Units: seconds.
"""
from __future__ import annotations

import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from csrun_common.atomic import write_json
from csrun_common.errors import CsrunError
from launcher import slurm
from launcher.container import Container
from launcher.slurm import stop_process_group

from .probe_agent import agent
from .probe_plan import PROBE_KIND, SERVED_KIND, summarize

if TYPE_CHECKING:
    import submitit


class ProbeLoadError(RuntimeError):
    """The probe workers could not load run.py / the input_fn (message: the first error)."""


@dataclass
class Timing:
    """Durations (seconds) of the probe phases, derived from the time budget."""

    warmup_s: float
    measure_s: float
    load_timeout_s: float
    first_probe_timeout_s: float
    barrier_timeout_s: float

    @classmethod
    def for_budget(cls, budget_s: float) -> Timing:
        """Timings for a ``budget_s`` probing budget (about ten probes after the load)."""
        per = max(budget_s - 15.0, 10.0) / 9.0
        measure = min(max(0.55 * per, 1.5), 10.0)
        warmup = min(max(0.25 * per, 0.75), 5.0)
        return cls(warmup_s=warmup, measure_s=measure,
                   load_timeout_s=max(60.0, min(budget_s, 300.0)),
                   first_probe_timeout_s=min(max(10.0, budget_s / 3.0), 60.0) + warmup + measure,
                   barrier_timeout_s=max(10.0, 3 * measure))


@dataclass
class Target:
    """Where probes run: ``local`` or a Slurm CPU node (``partition``, ``exclude`` node,
    ``container`` from launcher.container, ``node_cpus`` from sinfo)."""

    local: bool = True
    partition: str = ""
    account: str = ""
    exclude: str = ""
    container: Container | None = None
    node_cpus: int | None = None
    python: str = sys.executable


class ProbeSession:
    """One node agent (:func:`analyzer.probe_agent.agent`) and its ``workers`` persistent
    probe workers.

    On a cluster the agent is a submitit job (:func:`launcher.slurm.submit_function`): one
    task holding all the CPUs of one exclusive CPU node (``node_cpus``; the GRES node
    excluded), in the site's container, with a time limit a few minutes past the session's
    deadline; it is stopped with submitit's ``Job.cancel`` (``scancel``). With ``--local``
    the agent is a local process, stopped with :func:`launcher.slurm.stop_process_group`.
    Either way each probe is a command file the workers pick up (why: docs/DESIGN.md "The
    analyzer's probes").

    ``run_py``/``argv``/``cwd``: the user's command (argv after run.py). ``workdir``: a
    fresh directory (inside the analyzer's output directory) for the spec, command,
    barrier and result files, the workers' logs and the job's files (``job/``).
    ``deadline``: when the workers stop by themselves (seconds since the epoch).
    """

    #: Seconds between two asks of Slurm whether the probe job still runs.
    STATE_POLL_S = 2.0

    def __init__(self, run_py: str, argv: list[str], cwd: str, workdir: Path, target: Target,
                 workers: int, deadline: float):
        self.run_py, self.argv, self.cwd = run_py, list(argv), cwd
        self.workdir, self.target, self.workers = Path(workdir), target, int(workers)
        self.deadline = deadline
        self.proc: subprocess.Popen | None = None
        self.job: submitit.Job[int] | None = None
        self.seq = 0
        self.hellos: list[dict] = []
        self.job_name = f"cs_input_analyzer_probe_{os.getpid()}_{int(time.time() * 1000) % 10**8}"
        self._active = (0.0, True)  # (monotonic time of the last ask, the answer)

    # -- lifecycle -------------------------------------------------------------------------
    def start(self, load_timeout_s: float, tick: Callable[[], None] = lambda: None) -> list[dict]:
        """Start the agent; wait until every worker has loaded run.py. Returns the workers' hellos
        (``host``, ``node``, ``cpu_count``, ``allowed_cpus``, ``load_s``). Raises
        :class:`ProbeLoadError`: the first load error, sbatch's refusal, or no hellos within
        ``load_timeout_s`` seconds (with the job's queue state when it never ran)."""
        spec_path = self._write_spec()
        if self.target.local:
            self._start_local(spec_path)
        else:
            self._submit(spec_path)
        return self._wait_for_hellos(load_timeout_s, tick)

    def _write_spec(self) -> Path:
        for d in ("cmd", "res", "bar", "logs"):
            (self.workdir / d).mkdir(parents=True, exist_ok=True)
        spec = {"run_py": self.run_py, "argv": self.argv, "cwd": self.cwd,
                "workdir": str(self.workdir), "mode": "serve", "deadline": self.deadline + 30}
        spec_path = self.workdir / "spec.json"
        write_json(spec_path, spec, indent=1)
        return spec_path

    def _start_local(self, spec_path: Path) -> None:
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"))
        with open(self.workdir / "logs" / "agent.log", "ab") as log:
            self.proc = subprocess.Popen(
                [self.target.python, "-m", "analyzer.probe_agent", str(self.workers), str(spec_path)],
                stdout=log, stderr=subprocess.STDOUT, cwd=self.cwd, env=env, start_new_session=True)

    def _submit(self, spec_path: Path) -> None:
        """The agent as a submitit job on one exclusive CPU node (see the class docstring)."""
        t = self.target
        container = t.container
        spec = slurm.FunctionJobSpec(
            folder=self.workdir / "job", job_name=self.job_name, cpus_per_task=t.node_cpus, exclusive=True,
            partition=t.partition, account=t.account, exclude=t.exclude,
            # past the workers' own deadline (+30 s) and the agent's (+10 s): the job
            # cannot outlive an analysis that was killed
            time_min=math.ceil((self.deadline + 40 - time.time()) / 60) + 2, chdir=self.cwd,
            python=tuple(container.wrap([t.python]) if container is not None else [t.python]),
            srun_args=tuple(container.srun_options()) if container is not None else ())
        try:
            self.job = slurm.submit_function(spec, agent, str(spec_path), self.workers)
        except CsrunError as exc:
            raise ProbeLoadError(str(exc)) from None

    def _wait_for_hellos(self, load_timeout_s: float, tick: Callable[[], None]) -> list[dict]:
        t_end = time.monotonic() + load_timeout_s
        while True:
            tick()
            self.hellos = self._read("hello_*.json")
            errs = [h for h in self.hellos if h.get("error")]
            if errs:
                self.close(force=True)
                raise ProbeLoadError(errs[0]["error"])
            if len(self.hellos) >= self.workers:
                return sorted(self.hellos, key=lambda h: h["index"])
            if not self.alive():
                tail = self._log_tail()
                how = self._ended_how()
                self.close(force=True)
                raise ProbeLoadError(f"the probe workers exited ({how}) before "
                                     f"loading run.py{': ' + tail if tail else ''}")
            if time.monotonic() > t_end:
                state = self._job_state()
                self.close(force=True)
                waited = f" (the probe job was still {state} in the Slurm queue)" if state == "PENDING" else ""
                raise ProbeLoadError(f"the probe workers did not load run.py within {load_timeout_s:.0f} s{waited}")
            time.sleep(0.2)

    def _read(self, pattern: str) -> list[dict]:
        out = []
        for p in self.workdir.glob(pattern):
            try:
                out.append(json.loads(p.read_text()))
            except (OSError, json.JSONDecodeError):
                pass
        return out

    def _log_tail(self) -> str:
        """The last non-empty line of the agent's log (the job's, on a cluster) and the
        workers' logs."""
        logs = [self.job.paths.stdout] if self.job is not None else []
        lines: list[str] = []
        for p in logs + sorted((self.workdir / "logs").glob("*.log")):
            try:
                lines += [ln for ln in p.read_text(errors="replace").splitlines() if ln.strip()]
            except OSError:
                pass
        return lines[-1][:300] if lines else ""

    def _job_state(self) -> str | None:
        if self.job is None:
            return None
        try:
            return slurm.job_state(str(self.job.job_id))
        except CsrunError:
            return None

    def _ended_how(self) -> str:
        if self.proc is not None:
            return f"status {self.proc.returncode}"
        return f"probe job {self.job.job_id if self.job else '?'}: {self._job_state() or 'ended'}"

    def alive(self) -> bool:
        """Whether the agent still runs: the local process, or the probe job pending or
        running (:func:`launcher.slurm.job_active`, asked at most every
        :attr:`STATE_POLL_S` seconds)."""
        if self.job is not None:
            asked, active = self._active
            if active and time.monotonic() - asked >= self.STATE_POLL_S:
                self._active = (time.monotonic(), slurm.job_active(self.job))
            return self._active[1]
        return self.proc is not None and self.proc.poll() is None

    def close(self, force: bool = False, wait_s: float = 5.0) -> None:
        """Stop the workers: an ``exit`` command; with ``force``, or when they do not leave
        within ``wait_s`` seconds, the probe job is cancelled (submitit's ``Job.cancel``) or
        the local agent's process group stopped (:func:`launcher.slurm.stop_process_group`)."""
        if self.proc is None and self.job is None:
            return
        if not force and self.alive():
            self._send({"kind": "exit"})
            force = not self._left(wait_s)
        if self.job is not None:
            if force:
                slurm.cancel_job(self.job)
            self._active = (time.monotonic(), False)
            return
        if self.proc is not None and self.proc.poll() is None:
            stop_process_group(self.proc, grace=5.0)
        # Workers watch their parent; make sure none is left even if the agent was killed.
        for h in self.hellos:
            _kill_pid(int(h.get("pid", 0)))

    def _left(self, wait_s: float) -> bool:
        """Wait up to ``wait_s`` seconds for the agent to leave (the job's result file, or
        the local process's exit)."""
        t_end = time.monotonic() + wait_s
        while time.monotonic() < t_end:
            if self.job is not None and slurm.job_returned(self.job):
                return True
            if self.job is None and (self.proc is None or self.proc.poll() is not None):
                return True
            time.sleep(0.2)
        return False


    def _send_placeholder(self, seq: int) -> None:
        """Command ``seq`` as one every node process skips (tasks 0): later numbers stay in step."""
        write_json(self.workdir / "cmd" / f"{seq}.json", {"seq": seq, "kind": PROBE_KIND, "tasks": 0})

    def _send(self, cmd: dict) -> int:
        seq = self.seq
        cmd = dict(cmd, seq=seq)
        write_json(self.workdir / "cmd" / f"{seq}.json", cmd)
        self.seq += 1
        return seq

    # -- probes ----------------------------------------------------------------------------
    def probe(self, kind: str, tasks: int, cpus: int, timing: Timing, timeout_s: float,
              cache_elements: int = 64, tick: Callable[[], None] = lambda: None,
              extra: dict | None = None) -> dict:
        """Run one probe; returns its probe-table row (see :data:`analyzer.model.PROBE_COLUMNS`)
        with ``status`` ``ok``, ``failed`` (a worker's error, e.g. the input_fn raised) or
        ``timeout`` (the session is then dead: start a new one). ``extra``: more keys of
        the probe command (see :mod:`analyzer.probe_worker`)."""
        n = int(self.target.node_cpus or len(self.hellos[0]["allowed_cpus"]))
        T = tasks
        started = time.time()
        t0 = time.monotonic()
        seq = self._send({"kind": kind, "tasks": tasks, "cpus_per_task": cpus,
                          "warmup_s": timing.warmup_s, "measure_s": timing.measure_s,
                          "barrier_timeout_s": timing.barrier_timeout_s,
                          "cache_elements": int(cache_elements), **(extra or {})})
        status, error, results = "timeout", f"no result within {timeout_s:.0f} s (a hanging input_fn?)", []
        while time.monotonic() - t0 < timeout_s:
            tick()
            results = self._read(f"res/{seq}_*.json")
            errs = [r for r in results if r.get("error")]
            if errs:  # invalid: the DataLoader cannot be built at this point (the planner skips it)
                status, error = ("invalid" if errs[0].get("invalid") else "failed"), errs[0]["error"]
                break
            if len(results) >= T:
                status, error = "ok", ""
                break
            if not self.alive():
                status, error = "failed", "the probe workers exited" + (
                    f": {self._log_tail()}" if self._log_tail() else "")
                break
            time.sleep(0.1)
        if status in ("failed", "invalid") and len(results) < T and self.alive():
            # Let the other workers finish their share (bounded) so the session stays usable.
            t_wait = time.monotonic() + timing.warmup_s + timing.measure_s + timing.barrier_timeout_s + 5
            while len(self._read(f"res/{seq}_*.json")) < T and time.monotonic() < t_wait:
                tick()
                time.sleep(0.1)
        node = (self.hellos[0].get("node") if self.hellos else "") or ""
        return summarize(kind, tasks, cpus, n, results if status == "ok" else [], status, error,
                         started=started, elapsed=time.monotonic() - t0, warmup=timing.warmup_s, node=node,
                         probe_id=seq)


class ChiefApart:
    """The chief of a ``served`` probe run on this (the driver's) machine, for a probe node
    too small to hold an input worker and the chief on separate CPUs (1 CPU): a
    ``python -m analyzer.probe_worker`` process in ``once`` mode, index 0, sharing the session's
    work directory (rendezvous, barrier and result files), kept off the probe node's CPUs
    when that node is on this host (the test cluster)."""

    def __init__(self, session: ProbeSession):
        self.session = session
        self.proc: subprocess.Popen | None = None

    def run(self, tasks: int, cpus: int, timing: Timing, timeout_s: float, cache_elements: int,
            tick: Callable[[], None], extra: dict[str, Any] | None = None) -> dict:
        """Start the chief, wait until it has loaded run.py (bounded by the load timeout),
        then run the served probe with the node's processes as its input workers. Returns
        the probe-table row (``chief_apart`` True); a chief that fails to load gives a
        ``failed`` row. ``extra``: more command keys (PyTorch: ``dataloader_workers``)."""
        s = self.session
        extra = dict(extra or {})
        seq = s.seq
        node_hello = s.hellos[0] if s.hellos else {}
        avoid = node_hello.get("allowed_cpus") if node_hello.get("host") == socket.gethostname() else []
        cmd = {"seq": seq, "kind": SERVED_KIND, "tasks": tasks, "cpus_per_task": cpus,
               "warmup_s": timing.warmup_s, "measure_s": timing.measure_s,
               "barrier_timeout_s": timing.barrier_timeout_s, "cache_elements": int(cache_elements),
               "chief_apart": True, "chief_avoid_cpus": avoid or [], **extra}
        hello = s.workdir / f"chief_hello_{seq}.json"
        spec = {"run_py": s.run_py, "argv": s.argv, "cwd": s.cwd, "workdir": str(s.workdir), "mode": "once",
                "index": 0, "hello": str(hello), "probe": cmd, "out": str(s.workdir / "res" / f"{seq}_0.json")}
        spec_path = s.workdir / f"chief_spec_{seq}.json"
        spec_path.write_text(json.dumps(spec, indent=1))
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"))
        started, t0 = time.time(), time.monotonic()
        with open(s.workdir / "logs" / f"chief_{seq}.log", "ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "analyzer.probe_worker", str(spec_path)], stdout=log,
                                         stderr=subprocess.STDOUT, cwd=s.cwd, env=env, start_new_session=True)
        try:
            error = ""
            t_end = time.monotonic() + timing.load_timeout_s
            while not hello.exists():
                tick()
                if self.proc.poll() is not None or time.monotonic() > t_end:
                    error = "the served probe's chief (on this machine) did not load run.py"
                    break
                time.sleep(0.1)
            if not error:
                info = json.loads(hello.read_text())
                error = info.get("error") or ""
            if error:
                s.seq += 1  # the command number is spent: keep the node's sequence in step
                s._send_placeholder(seq)
                n = int(s.target.node_cpus or len(node_hello.get("allowed_cpus") or [1]))
                return summarize(SERVED_KIND, tasks, cpus, n, [], "failed", error, started=started,
                                 elapsed=time.monotonic() - t0, warmup=timing.warmup_s,
                                 node=node_hello.get("node", ""), probe_id=seq)
            row = s.probe(SERVED_KIND, tasks, cpus, timing, timeout_s, cache_elements, tick,
                          extra={"chief_apart": True, "chief_avoid_cpus": avoid or [], **extra})
            row["chief_apart"] = True
            return row
        finally:
            self.stop()

    def stop(self) -> None:
        """Stop the chief's process group if it is still there (it leaves by itself once its
        result is written)."""
        if self.proc is not None and self.proc.poll() is None:
            stop_process_group(self.proc, grace=2.0)


def _kill_pid(pid: int) -> None:
    if pid <= 1:
        return
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


