"""The probe driver: plans each probe (:mod:`analyzer.probe_plan`), runs it in a session
(:mod:`analyzer.probe_session`) within the time budget, and shows progress.

A session starts with one process per CPU and restarts with ``M`` (:func:`max_workers`) only
when an oversubscribed probe is worth its load time; a timed-out session is stopped and the
next probe starts a new one. For a PyTorch run.py (the workers' hellos name the framework) the
facts of :func:`csrun_runtime.probing.facts` decide: no ingest probe, the served probes
measure csrun's data plane, and DataLoader ``num_workers`` is swept
(:func:`analyzer.dataloader_plan.next_point`); a point whose DataLoader cannot be built is
``invalid`` (skipped, not a failure). Units: samples/s, seconds, bytes.
"""
from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import psutil

from csrun_runtime.probing import DEFAULT_FRAMEWORK

from . import dataloader_plan
from .probe_plan import INGEST_KIND, PROBE_KIND, SERVED_KIND, is_contended, next_probe
from .probe_session import ChiefApart, ProbeSession, Target, Timing


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
    """Probe the input_fn within ``budget_s`` seconds (run.py's load included), ``on_row(row)`` after
    each probe, ``fit_fn(rows, n)`` the current fit; raises :class:`analyzer.probe_session.ProbeLoadError`."""
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
