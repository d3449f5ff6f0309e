"""The adaptive probe planner and driver.

A *probe session* (:class:`ProbeSession`) is one node agent (:mod:`analyzer.probe_agent`)
run as a local process (``--local``) or as a submitit job holding one exclusive CPU node
(:func:`launcher.slurm.submit_function`); the agent starts ``M`` persistent probe workers
that load run.py once. Each probe is a command file the workers pick up (see
:mod:`analyzer.probe_worker`); the driver waits for the ``T`` results with a per-probe
timeout, and stops and restarts the session after a timeout.

The planner (:func:`next_probe`, pure) chooses probes adaptively:

1. bracket the space: ``1 × n`` (one task, all CPUs), ``n × 1`` (all tasks, one CPU each),
   ``1 × 1``;
2. measure the chief's ingest (tf.data service hops serving cached elements) once: it
   caps every multi-node layout; then one input worker serving the real pipeline to a
   chief (``served``, 1 CPU): what serving costs the input workers and the chief per
   sample, each measured in its own process (repeated once after step 4 and once more
   before stopping: the model takes the medians);
2b. measure once more (once only) a layout, or the ingest probe, whose only measurement was
   *contended* (other processes kept the node's CPUs busy during its window: see
   :data:`CONTENDED_CORES`), the brackets first; what stays contended is listed by
   :func:`disturbed` and leads the report (docs/ANALYZER.md);
3. repeat the best layout once, so the spread is known early;
4. if ``n × 1`` left the CPUs idle, oversubscribe (``M × 1`` with ``M > n``) to see
   whether throughput grows past the core count (I/O or latency bound);
5. then alternate: the unmeasured layout the current fit rates highest (where the curve
   bends between the brackets), and repeats of the best layouts until each has three;
6. stop when the next probe would not finish inside the time budget, or when every
   layout is measured and the best ones are repeated with under 5 % spread.

For a PyTorch run.py (the workers' hellos say ``framework: pytorch``) the tf.data service
ingest probe is left out (PyTorch streams over csrun's data plane, not tf.data service); its
``served`` probes (step 2, 4b) measure the chief's ingest over the data plane instead
(:mod:`csrun_runtime.pytorch.probe`: input workers streaming the DataLoader, the chief draining it),
and every pipeline probe also has a DataLoader ``num_workers``: :func:`analyzer.dataloader_plan.next_point`
sweeps it at each CPUs per task and runs the planner above at each one's best count; a probe
whose DataLoader cannot be built there is ``invalid`` (skipped, not a failure).

Units: samples/s, seconds, bytes.
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import psutil

from csrun_common.atomic import write_json
from csrun_common.errors import CsrunError
from csrun_runtime.probing import DEFAULT_FRAMEWORK
from launcher import slurm
from launcher.container import Container
from launcher.slurm import stop_process_group

from . import dataloader_plan
from .probe_agent import agent

if TYPE_CHECKING:
    import submitit

PROBE_KIND, INGEST_KIND, SERVED_KIND = "pipeline", "ingest", "served"
#: A probe is *contended* when other processes kept more than this share of the node's CPUs
#: busy during its window (a shared host); the planner measures it again.
CONTENDED_CORES = 0.2


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


# --------------------------------------------------------------------------- planner
def candidates(n: int, max_tasks: int) -> list[tuple[int, int]]:
    """Probe layouts ``(T, C)`` for a node with ``n`` CPUs and at most ``max_tasks``
    processes: powers of two and the extremes with ``T × C ≤ n``, plus one oversubscribed
    ``(min(2n, max_tasks), 1)`` when ``max_tasks > n``."""
    cs = sorted({1, n} | {2 ** i for i in range(20) if 2 ** i < n})
    out = []
    for c in cs:
        ts = sorted({1, n // c} | {2 ** i for i in range(20) if 2 ** i <= n // c})
        out += [(t, c) for t in ts if t <= max_tasks]
    if max_tasks > n:
        out.append((min(2 * n, max_tasks), 1))
    return out


def is_contended(value: Any) -> bool:
    """Whether a probe row's ``contended`` field says *contended*: ``True``, ``"True"``,
    ``1`` (a CSV read back); ``None``, NaN, ``False`` and ``"False"`` do not."""
    if isinstance(value, str):
        return value.strip().lower() in ("true", "1", "1.0")
    if value is None or is_nan(value):
        return False
    return bool(value)


def _clean_keys(rows: list[dict]) -> set[tuple[int, int]]:
    """Layouts with at least one successful probe that no other process disturbed."""
    return {(int(r["tasks"]), int(r["cpus_per_task"])) for r in rows
            if r.get("kind", PROBE_KIND) == PROBE_KIND and r.get("status") == "ok"
            and not is_contended(r.get("contended"))}


def disturbed(rows: list[dict]) -> list[dict[str, Any]]:
    """The probes whose every successful measurement was *contended*, grouped by kind and
    layout, in the order first probed.

    ``rows``: probe-table rows (dicts; ``contended`` as written by :func:`summarize` or read
    back from probes.csv). A group with one undisturbed ``ok`` row is not listed (the model
    and the ingest figures then drop its contended rows). Returns ``[{"kind", "tasks",
    "cpus_per_task", "node_cpus", "probes" (contended ok rows: 2 or more means it was measured
    again), "other_cores_busy_min", "other_cores_busy_max" (cores other processes kept busy,
    NaN when not recorded), "probe_ids"}]``.
    """
    groups: dict[tuple[str, int, int], list[dict]] = {}
    for r in rows:
        if r.get("status") != "ok":
            continue
        key = (str(r.get("kind") or PROBE_KIND), int(r["tasks"]), int(r["cpus_per_task"]))
        groups.setdefault(key, []).append(r)
    out = []
    for (kind, t, c), rs in groups.items():
        if not all(is_contended(r.get("contended")) for r in rs):
            continue
        load = [float(r["other_cores_busy"]) for r in rs if not is_nan(r.get("other_cores_busy"))]
        out.append({"kind": kind, "tasks": t, "cpus_per_task": c,
                    "node_cpus": max((int(r["node_cpus"]) for r in rs if not is_nan(r.get("node_cpus"))),
                                     default=0),
                    "probes": len(rs), "other_cores_busy_min": min(load, default=math.nan),
                    "other_cores_busy_max": max(load, default=math.nan),
                    "probe_ids": [r.get("probe_id") for r in rs]})
    return out


def _stats(rows: list[dict]) -> dict[tuple[int, int], dict[str, float]]:
    out: dict[tuple[int, int], list[float]] = {}
    util: dict[tuple[int, int], list[float]] = {}
    clean = _clean_keys(rows)
    for r in rows:
        if r.get("kind", PROBE_KIND) != PROBE_KIND or r.get("status") != "ok":
            continue
        if is_contended(r.get("contended")) and (int(r["tasks"]), int(r["cpus_per_task"])) in clean:
            continue
        key = (int(r["tasks"]), int(r["cpus_per_task"]))
        out.setdefault(key, []).append(float(r["samples_per_sec"]))
        if r.get("cpu_util") is not None and not is_nan(r.get("cpu_util")):
            util.setdefault(key, []).append(float(r["cpu_util"]))
    res = {}
    for k, v in out.items():
        mean = sum(v) / len(v)
        sd = math.sqrt(sum((x - mean) ** 2 for x in v) / (len(v) - 1)) if len(v) > 1 else math.nan
        res[k] = {"mean": mean, "count": len(v), "cv": sd / mean if mean > 0 and len(v) > 1 else math.nan,
                  "util": sum(util[k]) / len(util[k]) if util.get(k) else math.nan}
    return res


def is_nan(x: Any) -> bool:
    """True for NaN, ``None`` and anything that is not a number."""
    try:
        return math.isnan(float(x))
    except (TypeError, ValueError):
        return True


def next_probe(rows: list[dict], n: int, max_tasks: int, want_ingest: bool = True,
               predict: Callable[[int, int], float] | None = None,
               want_served: bool | None = None) -> tuple[str, int, int] | None:
    """The next probe ``(kind, T, C)`` after the probes in ``rows`` (dicts with ``kind``,
    ``status``, ``tasks``, ``cpus_per_task``, ``samples_per_sec``, ``cpu_util``), or
    ``None`` when nothing more is worth measuring. ``predict(T, C)`` is the current fit's
    node rate (samples/s), used to rank unmeasured layouts (default: rank by ``T × C``).
    ``want_served``: plan the ``served`` probes (default: ``want_ingest``; PyTorch: served
    probes over the data plane without the tf.data service ingest probe). The order is the
    module docstring's: the brackets here, then :func:`_ingest_step` (2, 2b),
    :func:`_spread_step` (3, 4, 4b) and :func:`_refine_step` (5)."""
    served_ok = (want_ingest if want_served is None else want_served) and max_tasks >= 2
    cands = candidates(n, max_tasks)
    attempted: dict[tuple[int, int], int] = {}
    for r in rows:
        if r.get("kind", PROBE_KIND) == PROBE_KIND:
            key = (int(r["tasks"]), int(r["cpus_per_task"]))
            attempted[key] = attempted.get(key, 0) + 1
    st = _stats(rows)
    # 1. brackets
    for key in dict.fromkeys([(1, n), (n, 1), (1, 1)]):
        if key in cands and key not in attempted:
            return PROBE_KIND, key[0], key[1]
    if not st:
        return None  # every bracket failed: nothing to refine
    return (_ingest_step(rows, n, cands, st, attempted, want_ingest, served_ok)
            or _spread_step(rows, n, cands, st, attempted, served_ok)
            or _refine_step(rows, n, cands, st, attempted, predict, served_ok))


def _ingest_step(rows: list[dict], n: int, cands: list[tuple[int, int]],
                 st: dict[tuple[int, int], dict[str, float]], attempted: dict[tuple[int, int], int],
                 want_ingest: bool, served_ok: bool) -> tuple[str, int, int] | None:
    """Steps 2 and 2b of :func:`next_probe`: the chief's ingest (it caps every multi-node
    layout: measured early) and the first served probe; then a layout or the ingest probe
    measured only while other processes were busy, once more (:func:`_measure_again`)."""
    if want_ingest and not any(r.get("kind") == INGEST_KIND for r in rows):
        return INGEST_KIND, 1, n
    if served_ok and not any(r.get("kind") == SERVED_KIND for r in rows):
        return SERVED_KIND, 2, 1
    return _measure_again(rows, n, cands, st, attempted, want_ingest)


def _spread_step(rows: list[dict], n: int, cands: list[tuple[int, int]],
                 st: dict[tuple[int, int], dict[str, float]], attempted: dict[tuple[int, int], int],
                 served_ok: bool) -> tuple[str, int, int] | None:
    """Steps 3, 4 and 4b of :func:`next_probe`: one repeat of the best layout (the spread is
    known early), oversubscription when ``n × 1`` left CPUs idle, a second served probe (its
    worker and chief costs are single windows otherwise)."""
    best = max(st, key=lambda k: st[k]["mean"])
    if all(v["count"] < 2 for v in st.values()) and attempted.get(best, 0) < 3:
        return PROBE_KIND, best[0], best[1]
    over = [c for c in cands if c[0] * c[1] > n]
    util_all = st.get((n, 1), {}).get("util", math.nan)
    if over and over[0] not in attempted and not is_nan(util_all) and util_all < 0.8:
        return PROBE_KIND, over[0][0], over[0][1]
    if served_ok and sum(1 for r in rows if r.get("kind") == SERVED_KIND) < 2:
        return SERVED_KIND, 2, 1
    return None


def _refine_step(rows: list[dict], n: int, cands: list[tuple[int, int]],
                 st: dict[tuple[int, int], dict[str, float]], attempted: dict[tuple[int, int], int],
                 predict: Callable[[int, int], float] | None, served_ok: bool) -> tuple[str, int, int] | None:
    """Step 5 of :func:`next_probe`: alternate the unmeasured layout the fit (``predict``, else
    ``T × C``) rates highest and repeats of the best three until each has three; then the
    rest unmeasured, a third served probe, and repeats of noisy layouts (spread over 5 %)."""
    rank = predict or (lambda t, c: float(t * c))
    unmeasured = [c for c in cands if c[0] * c[1] <= n and c not in attempted]
    best_rate = max(v["mean"] for v in st.values())
    promising = sorted((c for c in unmeasured if rank(*c) >= 0.7 * best_rate), key=lambda c: -rank(*c))
    top = sorted(st, key=lambda k: -st[k]["mean"])[:3]
    need_repeat = [k for k in top if st[k]["count"] < 3 and attempted.get(k, 0) < 4]
    if promising and (not need_repeat or len(rows) % 2 == 0):
        return PROBE_KIND, promising[0][0], promising[0][1]
    if need_repeat:
        k = min(need_repeat, key=lambda k: (st[k]["count"], -st[k]["mean"]))
        return PROBE_KIND, k[0], k[1]
    if unmeasured:
        k = max(unmeasured, key=lambda c: rank(*c))
        return PROBE_KIND, k[0], k[1]
    if served_ok and sum(1 for r in rows if r.get("kind") == SERVED_KIND) < 3:
        return SERVED_KIND, 2, 1
    noisy = [k for k in top if not is_nan(st[k]["cv"]) and st[k]["cv"] > 0.05 and attempted.get(k, 0) < 6]
    if noisy:
        k = max(noisy, key=lambda k: st[k]["cv"])
        return PROBE_KIND, k[0], k[1]
    return None


def _measure_again(rows: list[dict], n: int, cands: list[tuple[int, int]],
                   st: dict[tuple[int, int], dict[str, float]], attempted: dict[tuple[int, int], int],
                   want_ingest: bool) -> tuple[str, int, int] | None:
    """Step 2b of the planner: the first candidate layout (``cands``: those the processes
    allow) with a successful probe but none undisturbed and a single attempt (the brackets
    ``1 × n``, ``n × 1``, ``1 × 1`` first), else the ingest probe when its only run was
    contended; ``None`` when nothing is to be measured again."""
    clean = _clean_keys(rows)
    for key in dict.fromkeys([(1, n), (n, 1), (1, 1), *cands]):
        if key in cands and key in st and key not in clean and attempted.get(key, 0) < 2:
            return PROBE_KIND, key[0], key[1]
    ingest = [r for r in rows if r.get("kind") == INGEST_KIND]
    if want_ingest and len(ingest) == 1 and ingest[0].get("status") == "ok" \
            and is_contended(ingest[0].get("contended")):
        return INGEST_KIND, 1, n
    return None


# --------------------------------------------------------------------------- sessions
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
    Either way the probes themselves are command files the workers pick up: the planner
    chooses each probe from the results of the ones before, while the workers (TensorFlow
    and run.py loaded once) keep running, and submitit has no channel into a running job.

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
        """Start the agent; wait until every worker has loaded run.py (or failed).

        Returns the workers' hello records (``host``, ``node``, ``cpu_count``,
        ``allowed_cpus``, ``load_s``). Raises :class:`ProbeLoadError` with the first load
        error (the runtime's contract message when run.py or input_fn breaks it), sbatch's
        message when it refuses the probe job, or when the workers do not come up within
        ``load_timeout_s`` seconds (the probe job's queue state said when it never ran).
        """
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
        """A command ``seq`` every node process skips (tasks 0), so later commands keep
        their numbers."""
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


def summarize(kind: str, tasks: int, cpus: int, node_cpus: int, results: list[dict], status: str,
              error: str, started: float, elapsed: float, warmup: float, node: str, probe_id: int) -> dict:
    """One probe-table row from the per-process results of a probe.

    ``samples_per_sec`` is the sum of the processes' rates over their (overlapping)
    windows; ``cpu_cores_used`` the sum of their CPU-seconds per second; ``cpu_util`` that
    over the cores the probe was given (``min(T × C, n)``); ``cpu_seconds_per_sample`` the
    CPU-seconds over the samples; byte rates are bytes/s summed over the processes.
    """
    row: dict[str, Any] = {
        "probe_id": probe_id, "kind": kind, "tasks": int(tasks), "cpus_per_task": int(cpus),
        "node_cpus": int(node_cpus), "node": node, "status": status, "error": error,
        "samples_per_sec": math.nan, "task_rate_min": math.nan, "task_rate_max": math.nan,
        "cpu_cores_used": math.nan, "cpu_util": math.nan, "cpu_seconds_per_sample": math.nan,
        "read_bytes_per_sec": math.nan, "disk_read_bytes_per_sec": math.nan,
        "element_bytes_per_sec": math.nan, "window_s": math.nan, "warmup_s": warmup,
        "first_element_s": math.nan, "elapsed_s": elapsed, "started_at": started,
    }
    if status != "ok" or not results:
        return row
    rates = [float(r["samples_per_sec"]) for r in results]
    windows = [float(r["window_s"]) for r in results]
    cores = sum(float(r["cpu_seconds"]) / float(r["window_s"]) for r in results if r["window_s"] > 0)
    samples = sum(int(r["samples"]) for r in results)
    cpu_s = sum(float(r["cpu_seconds"]) for r in results)
    given = min(tasks * cpus, node_cpus) if kind == PROBE_KIND else node_cpus
    row.update({
        "samples_per_sec": sum(rates), "task_rate_min": min(rates), "task_rate_max": max(rates),
        "cpu_cores_used": cores, "cpu_util": cores / given if given else math.nan,
        "cpu_seconds_per_sample": cpu_s / samples if samples else math.nan,
        "read_bytes_per_sec": sum(r.get("read_chars", 0) / r["window_s"] for r in results),
        "disk_read_bytes_per_sec": sum(r.get("read_bytes", 0) / r["window_s"] for r in results),
        "element_bytes_per_sec": sum(r.get("element_bytes", 0) / r["window_s"] for r in results),
        "window_s": sum(windows) / len(windows),
        "first_element_s": max(float(r.get("first_element_s", 0.0)) for r in results),
    })
    host = [float(r["host_busy_cores"]) for r in results if r.get("host_busy_cores") is not None]
    if host:
        # CPU the rest of the machine used meanwhile (other jobs on a shared host).
        row["other_cores_busy"] = max(0.0, sum(host) / len(host) - cores)
        row["contended"] = bool(row["other_cores_busy"] > CONTENDED_CORES * node_cpus)
    if not all(r.get("synchronized", True) for r in results):
        row["error"] = "windows not synchronized (a process was late to the barrier)"
    if kind != PROBE_KIND and samples and len(results) >= 2:
        # The chief (process 0) and the input workers measured their CPU apart.
        chief_cpu = sum(float(r["cpu_seconds"]) for r in results if int(r.get("index", 0)) == 0)
        row["chief_cpu_seconds_per_sample"] = chief_cpu / samples
        row["worker_cpu_seconds_per_sample"] = (cpu_s - chief_cpu) / samples
        local = [float(r["local_cpu_seconds_per_sample"]) for r in results
                 if r.get("local_cpu_seconds_per_sample") is not None]
        if local:
            row["worker_local_cpu_seconds_per_sample"] = sum(local) / len(local)
        _chief_feed(row, [r for r in results if int(r.get("index", 0)) == 0])
    row["_elements_per_sec"] = sum(r["batches"] / r["window_s"] for r in results)
    batches = sum(int(r["batches"]) for r in results)
    if kind == PROBE_KIND and batches:
        row["samples_per_element"] = samples / batches
    return row


def _chief_feed(row: dict[str, Any], chiefs: list[dict]) -> None:
    """A served probe's chief fed through the runtime's device feed (PyTorch): its device
    (``feed_device``, e.g. ``cuda:0``; absent for TensorFlow) and the bytes/s it delivered
    there (``chief_feed_bytes_per_sec``), which the report names beside the ingest ceiling."""
    for r in chiefs:
        dev = (r.get("input") or {}).get("feed_device")
        if dev and r.get("window_s"):
            row["feed_device"] = str(dev)
            row["chief_feed_bytes_per_sec"] = float(r.get("element_bytes", 0)) / float(r["window_s"])


# --------------------------------------------------------------------------- driver
@dataclass
class ProbeRun:
    """What :func:`run_probes` found: the rows, the workers' hellos, notes and whether it
    stopped early (``stopped``: ``"budget"``, ``"done"``, ``"failing"``, ``"interrupted"``)."""

    rows: list[dict] = field(default_factory=list)
    hellos: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    stopped: str = ""
    framework: str = DEFAULT_FRAMEWORK
    node_cpus: int = 0
    load_s: float = 0.0
    load_times: list[float] = field(default_factory=list)
    timing: Timing | None = None


def max_workers(n: int) -> int:
    """Probe processes per node: ``2n`` (oversubscription) capped by memory (~1 GB each)
    and 32."""
    try:
        mem = psutil.virtual_memory().available
        by_mem = max(1, int(mem // (1.0 * 2 ** 30)) - 1)
    except Exception:  # noqa: BLE001
        by_mem = 2 * n
    return max(1, min(2 * n, by_mem, 32))


class RateModel(Protocol):
    """What the planner needs of a fitted model (:class:`analyzer.model.NodeModel`): the
    node's rate in samples/s for ``tasks`` × ``cpus`` per task."""

    def model_rate(self, tasks: int, cpus: int) -> float: ...


def run_probes(run_py: str, argv: list[str], cwd: str, workdir: Path, target: Target, budget_s: float,
               on_row: Callable[[dict], None] = lambda r: None, progress: bool = True,
               want_ingest: bool = True,
               fit_fn: Callable[[list[dict], int], RateModel] | None = None) -> ProbeRun:
    """Probe the input_fn adaptively within ``budget_s`` seconds (the load of run.py included).

    ``on_row(row)`` is called after every probe (the caller saves partial results).
    ``fit_fn(rows, n)`` returns the current fit (:class:`RateModel`) or raises; the planner
    (:func:`next_probe`) ranks unmeasured layouts by it. Raises :class:`ProbeLoadError`
    when run.py / the input_fn cannot be loaded.
    """
    return _Driver(_Spec(run_py, list(argv), cwd, Path(workdir), target), budget_s, on_row, progress,
                   want_ingest, fit_fn).run()


@dataclass(frozen=True)
class _Spec:
    """The user's command (``run_py``, its ``argv``, the working directory ``cwd``), the
    driver's directory and where the probes run."""

    run_py: str
    argv: list[str]
    cwd: str
    workdir: Path
    target: Target


class _Driver:
    """The probe loop of :func:`run_probes`: plan the next probe (:meth:`_choose`), check
    it fits the budget, make sure a session with enough processes runs
    (:meth:`_ensure_session`), run it (:meth:`_run`) and account for its row
    (:meth:`_record`), until the planner or the budget stops it."""

    def __init__(self, spec: _Spec, budget_s: float, on_row: Callable[[dict], None], progress: bool,
                 want_ingest: bool, fit_fn: Callable[[list[dict], int], RateModel] | None):
        self.spec, self.budget_s, self.on_row = spec, budget_s, on_row
        self.want_ingest, self.fit_fn = want_ingest, fit_fn
        self.want_served = want_ingest  # PyTorch: the served probes stay (over the data plane)
        self.t_start = time.monotonic()
        self.deadline = self.t_start + budget_s
        self.deadline_wall = time.time() + budget_s
        self.n = int(spec.target.node_cpus or len(os.sched_getaffinity(0)))
        self.M = max_workers(self.n)
        self.timing = Timing.for_budget(budget_s)
        self.out = ProbeRun(node_cpus=self.n, timing=self.timing)
        self.bar = _Progress(budget_s, progress)
        # Start with one process per CPU (the brackets need no more; the served probe needs
        # two); a session with M processes is started only when an oversubscribed probe is
        # worth its load time.
        self.base_workers = max(1, min(self.n, self.M), 2 if want_ingest and self.M >= 2 else 1)
        self.session: ProbeSession | None = None
        self.sessions = 0
        self.elapsed_by_key: dict[tuple[str, int, int], float] = {}
        self.failures: list[str] = []
        self.sweep = False  # the hellos' framework says; then the grid adds DataLoader num_workers
        self.dataloader_workers: int | None = None  # the next probe's DataLoader num_workers (a sweep's)

    def run(self) -> ProbeRun:
        """Probe until done; returns what was found (``stopped`` says why it ended)."""
        self.session = self._new_session(self.base_workers)
        self._learn_framework()
        try:
            while self._step():
                pass
        except KeyboardInterrupt:
            self.out.stopped = "interrupted"
        finally:
            if self.session is not None:
                self.session.close()
            self.bar.close()
        return self.out

    def _learn_framework(self) -> None:
        """The framework the probe processes loaded (their hellos) and what it changes
        (:class:`csrun_runtime.probing.ProbeFacts`): without an ingest hop of its own
        (PyTorch) no ``ingest`` probe, the ``served`` probes measure the chief's ingest over
        csrun's data plane (docs/INPUT-ANALYZER.md "PyTorch"); a DataLoader's worker count is
        swept (:func:`analyzer.dataloader_plan.next_point`)."""
        # the backend's facts (not its framework): once the probe processes are up
        from csrun_runtime.probing import facts

        fw = next((h["framework"] for h in self.out.hellos if h.get("framework")), None)
        if fw is None:
            return
        f = facts(fw)
        self.out.framework = fw
        self.sweep = f.dataloader_workers
        self.want_ingest = self.want_ingest and f.ingest_probe

    def _tick(self) -> None:
        self.bar.update(time.monotonic() - self.t_start)

    def _new_session(self, workers: int) -> ProbeSession:
        s = ProbeSession(self.spec.run_py, self.spec.argv, self.spec.cwd,
                         self.spec.workdir / f"session{self.sessions}", self.spec.target, workers,
                         deadline=self.deadline_wall + 60)
        self.sessions += 1
        self.bar.describe(f"loading run.py in {workers} probe process(es)")
        t0 = time.monotonic()
        self.out.hellos = s.start(max(self.timing.load_timeout_s, 30.0), self._tick)
        self.out.load_s = time.monotonic() - t0
        self.out.load_times.append(self.out.load_s)
        return s

    def _step(self) -> bool:
        """Plan and run one probe; False when probing stops (``out.stopped`` says why)."""
        nxt, have, remaining = self._choose()
        rows = self.out.rows
        if nxt is None:
            self.out.stopped = "done" if any(r.get("status") == "ok" for r in rows) else "failing"
            return False
        kind, T, C = nxt
        est = self.elapsed_by_key.get((kind, T, C)) or max(
            [self.timing.warmup_s + self.timing.measure_s + 2.0] + list(self.elapsed_by_key.values()))
        first = not rows
        if est > remaining and not first:
            # At least one probe runs, even when loading run.py used up the budget.
            self.out.stopped = "budget"
            return False
        if not self._ensure_session(have, est, first):
            self.out.stopped = "budget"
            return False
        if first and est > remaining:
            self.out.notes.append(f"loading run.py took {self.out.load_s:.0f} s of the {self.budget_s:.0f} s "
                                  f"budget: only one probe ran; give a larger --time-budget")
        return self._record(*self._run(kind, T, C))

    def _choose(self) -> tuple[tuple[str, int, int] | None, int, float]:
        """The next probe (:func:`next_probe`, ranked by the current fit), the processes it
        will have, and the seconds left. An oversubscribed probe that needs more processes
        than the session has restarts the session with ``M`` when a reload fits the budget;
        otherwise the planner chooses within the processes there are."""
        predict = self._predict()
        nxt = self._plan(self.M, predict)
        have = self.session.workers if self.session is not None else self.base_workers
        remaining = self.deadline - time.monotonic()
        if nxt is not None and nxt[0] == PROBE_KIND and nxt[1] > have:
            est_over = self.out.load_s + self.timing.warmup_s + self.timing.measure_s + 3.0
            if est_over > remaining:
                nxt = self._plan(have, predict)
            else:
                if self.session is not None:
                    self.session.close()
                self.session = None
                have = self.M
        return nxt, have, remaining

    def _plan(self, max_tasks: int, predict: Callable[[int, int], float] | None) -> tuple[str, int, int] | None:
        """:func:`next_probe`; where DataLoader workers are swept
        :func:`analyzer.dataloader_plan.next_point`, its ``num_workers`` kept in ``self.dataloader_workers``."""
        if not self.sweep:
            return next_probe(self.out.rows, self.n, max_tasks, self.want_ingest, predict)
        got = dataloader_plan.next_point(self.out.rows, self.n, max_tasks, next_probe, predict,
                                         served=self.want_served)
        if got is None:
            return None
        self.dataloader_workers = got[3]
        return got[0], got[1], got[2]

    def _predict(self) -> Callable[[int, int], float] | None:
        """The current fit's node rate, once two probes succeeded (None without a fit)."""
        if self.fit_fn is None or len([r for r in self.out.rows if r.get("status") == "ok"]) < 2:
            return None
        try:
            return self.fit_fn(self.out.rows, self.n).model_rate
        except Exception:  # noqa: BLE001 - planning goes on without a fit
            return None

    def _ensure_session(self, workers: int, est: float, first: bool) -> bool:
        """A running session (a new one of ``workers`` processes when there is none or it
        died); False when a new one's load would not leave time for the probe."""
        if self.session is not None and self.session.alive():
            return True
        if not first and time.monotonic() + self.out.load_s + est > self.deadline:
            return False
        self.session = self._new_session(workers)
        return True

    def _run(self, kind: str, T: int, C: int) -> tuple[dict, str, int, int]:
        """Run one probe in the session; returns its row and its key (an ingest probe runs
        the chief and up to two input workers, each in its own process)."""
        session = self.session
        assert session is not None  # _ensure_session
        timing = self.timing
        timeout = max(timing.first_probe_timeout_s, 3.0 * max(self.elapsed_by_key.values(), default=0.0))
        remaining = self.deadline - time.monotonic()
        timeout = min(timeout, max(remaining + 10.0, timing.warmup_s + timing.measure_s + 10.0))
        self.bar.describe(f"probe {len(self.out.rows) + 1}: {kind} {T} task(s) × {C} CPU(s)")
        cache = self._cache_elements()
        if kind == INGEST_KIND:
            T = min(session.workers, 3)
        if kind == SERVED_KIND and not self.spec.target.local and self.n < 2:
            # One CPU cannot hold the input worker and the chief apart: the chief runs here.
            extra = {"dataloader_workers": self.dataloader_workers} if self.sweep else {}
            row = ChiefApart(session).run(T, C, timing, timeout, cache, self._tick, extra)
            if self.sweep:
                row["dataloader_workers"] = self.dataloader_workers
        elif self.sweep:
            row = session.probe(kind, T, C, timing, timeout, cache, self._tick,
                                extra={"dataloader_workers": self.dataloader_workers})
            row["dataloader_workers"] = self.dataloader_workers
        else:
            row = session.probe(kind, T, C, timing, timeout, cache, self._tick)
        return row, kind, T, C

    def _cache_elements(self) -> int:
        """Elements an ingest probe's workers cache: ~64 MB per worker stream (out of the CPU
        caches, like fresh data), 16 to 128, from the element sizes measured so far."""
        ok = [r for r in self.out.rows if r.get("status") == "ok" and r.get("_elements_per_sec")
              and r.get("element_bytes_per_sec")]
        if not ok:
            return 16
        elem = max(r["element_bytes_per_sec"] / r["_elements_per_sec"] for r in ok)
        return int(min(max(64e6 / max(elem, 1.0), 16), 128))

    def _record(self, row: dict, kind: str, T: int, C: int) -> bool:
        """Keep the row and report it; False when probing stops: three failing probes in a
        row, or two with the same error before any succeeded. A timed-out session is
        stopped (the next probe starts a new one)."""
        self.out.rows.append(row)
        self.on_row(row)
        self.bar.note(_row_line(row))
        if row["status"] == "ok":
            self.elapsed_by_key[(kind, T, C)] = row["elapsed_s"]
            self.failures.clear()
            return True
        if row["status"] == dataloader_plan.INVALID:
            return True  # a point the DataLoader cannot be built at: skipped, not a failure
        failures = self.failures
        failures.append(row["error"])
        if row["status"] == "timeout" and self.session is not None:
            self.session.close(force=True)
            self.session = None
        if len(failures) >= 3 or (len(failures) >= 2 and failures[-1] == failures[-2]
                                  and not any(r["status"] == "ok" for r in self.out.rows)):
            self.out.stopped = "failing"
            self.out.notes.append(f"stopped after {len(failures)} failing probes in a row: {failures[-1]}")
            return False
        return True


def _row_line(row: dict) -> str:
    what = f"{row['kind']} {row['tasks']} task(s) × {row['cpus_per_task']} CPU(s)"
    if row.get("dataloader_workers") is not None:
        what += f", DataLoader num_workers {row['dataloader_workers']}"
    if row["status"] != "ok":
        return f"{what}: {row['status']}: {row['error']}"
    busy = (f"; disturbed: other processes kept {row.get('other_cores_busy', math.nan):.2f} cores busy"
            if is_contended(row.get("contended")) else "")
    return (f"{what}: {row['samples_per_sec']:.0f} samples/s, {row['cpu_cores_used']:.2f} cores busy "
            f"({row['cpu_util'] * 100:.0f} %){busy}")


class _Progress:
    """A tqdm bar over the time budget (seconds) on a terminal; one line per probe otherwise."""

    def __init__(self, total_s: float, enabled: bool):
        self.enabled = enabled
        self.tty = enabled and sys.stderr.isatty()
        self.bar = None
        self.last = 0.0
        if self.tty:
            from tqdm import tqdm  # only on a terminal: not at the CLI's start-up

            self.bar = tqdm(total=round(total_s), unit="s", desc="probing", leave=True,
                            bar_format="{desc}: {percentage:3.0f}%|{bar}| {n:.0f}/{total:.0f} s {postfix}")

    def update(self, t: float) -> None:
        if self.bar is not None:
            t = min(t, self.bar.total)
            if t - self.last >= 0.5:
                self.bar.update(t - self.last)
                self.last = t

    def describe(self, text: str) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(text, refresh=True)

    def note(self, line: str) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(f"  {line}", file=sys.stderr)
        else:
            print(f"cs_input_analyzer: {line}", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
