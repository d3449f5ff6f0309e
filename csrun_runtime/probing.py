"""The framework-neutral parts of the analyzer's node-side tasks: its probes
(``python -m analyzer.probe_worker``) and ``verify``'s drain (``python -m analyzer.verify_task``).

Each backend folder holds one ``probe`` and one ``drain`` module (reached through
:func:`csrun_runtime.registry.entry`); the harnesses in :mod:`analyzer.probe_worker` and
:mod:`analyzer.verify_task` drive them and never import a framework. The two module interfaces
(:class:`ProbeBackend`, :class:`DrainBackend`) are declared here, with what both sides share:
the counters a probe process iterates (:class:`Counter`, :class:`IdleCounter`, the
:class:`Stepper` protocol), the probe's two errors (:class:`ContractViolation`,
:class:`InvalidPoint`), CPU accounting (:func:`host_busy_seconds`, :func:`process_tree`) and the
facts the analyzer's login side reads about a framework without importing it
(:class:`csrun_runtime.facts.ProbeFacts`, :func:`facts`).

No TensorFlow or torch import here, at any level.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Protocol

import psutil

from . import registry
from .facts import ProbeFacts
from .input_backend import BuiltInput, InputBackend

__all__ = ["ProbeFacts", "facts", "framework_of_report", "DEFAULT_FRAMEWORK", "Stepper", "Counter",
           "IdleCounter", "ContractViolation", "InvalidPoint", "host_busy_seconds", "process_tree",
           "ProbeBackend", "DrainSource", "ChiefDrain", "DrainBackend"]

#: the framework of a record that names none (the reports and probe hellos of earlier releases).
DEFAULT_FRAMEWORK: str = registry.DEFAULT_FRAMEWORK


def facts(framework: str | None) -> ProbeFacts:
    """``framework``'s :class:`.facts.ProbeFacts` (``None``/``""``: the default); raises ``UnknownFramework``."""
    return registry.facts(framework or DEFAULT_FRAMEWORK).probe


def framework_of_report(framework: str | None, dataloader_rows: bool) -> str:
    """The framework of a probe table: ``framework`` when it is recorded, else the first
    framework whose probes sweep DataLoader workers exactly when the rows have
    ``dataloader_workers`` (``dataloader_rows``)."""
    if framework:
        return framework
    for fw in registry.FRAMEWORKS:
        if facts(fw).dataloader_workers == dataloader_rows:
            return fw
    return DEFAULT_FRAMEWORK


class ContractViolation(RuntimeError):
    """The input function broke the runtime's contract (the message is the backend's contract's)."""


class InvalidPoint(RuntimeError):
    """The input cannot be built at the probe's point (e.g. DataLoader ``num_workers: 0`` with
    a ``prefetch_factor``): the probe is recorded ``invalid`` and the planner skips it."""


class Stepper(Protocol):
    """What a probe process iterates: :class:`Counter`, :class:`IdleCounter` or a backend's
    own (a tf.data service source's, a data-plane receiver's or sender's)."""

    samples: int
    batches: int
    bytes: int

    @property
    def restarts(self) -> int: ...

    def step(self) -> None: ...


class Counter:
    """Iterates a built input (:class:`csrun_runtime.input_backend.BuiltInput`: endless, pass
    after pass), counting samples, batches and bytes."""

    def __init__(self, built: BuiltInput):
        self.built = built
        self.samples = self.batches = self.bytes = 0

    @property
    def restarts(self) -> int:
        """Passes begun after the first."""
        return self.built.restarts[0]

    def step(self) -> None:
        """Take one batch and count it."""
        self.count(next(self.built.batches))

    def count(self, el: Any) -> None:
        """Add one element's samples and bytes (the backend's ``measure``)."""
        s, b = self.built.measure(el)
        self.samples += s
        self.batches += 1
        self.bytes += b


class IdleCounter:
    """The :class:`Counter` interface for a process that only serves (an input worker of an
    ingest or served probe): ``step`` waits 10 ms; nothing is consumed here.
    ``local_cpu_seconds_per_sample``: the pipeline's own cost measured just before serving."""

    def __init__(self, local_cpu_seconds_per_sample: float | None = None) -> None:
        self.samples = self.bytes = self.restarts = 0
        self.batches = 0
        self.local_cpu_seconds_per_sample = local_cpu_seconds_per_sample

    def step(self) -> None:
        """Wait 10 ms."""
        time.sleep(0.01)
        self.batches += 1


def host_busy_seconds() -> float:
    """CPU-seconds the whole machine has been busy (all processes, all CPUs) so far."""
    t = psutil.cpu_times()
    return float(sum(t) - t.idle - getattr(t, "iowait", 0.0))


def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants' pids (psutil, recursive); ``[pid]`` when it cannot be read."""
    try:
        return [pid] + [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return [pid]


class ProbeBackend(Protocol):
    """The interface of a backend's ``probe`` module (``registry.entry(fw, "probe")``), which
    :mod:`analyzer.probe_worker` drives.

    ``prepare()`` imports the framework (the probe process's
    load time counts it). ``backend(captured)`` is the captured run.py's
    :class:`csrun_runtime.input_backend.InputBackend`, raising :class:`ContractViolation`.
    ``role(entry, cmd, index, workdir)`` is process ``index``'s part in an ``ingest`` or
    ``served`` probe command: ``(stepper, objects to keep referenced or close, the batches the
    warm-up must at least take)``; ``entry`` has ``backend``, ``captured``, ``params``; raises
    ``ValueError`` for a kind the framework has not, :class:`InvalidPoint`, ``TimeoutError``.
    ``file_coverage(captured)`` is the file-coverage check's result (``Coverage.to_dict()``).
    """

    def prepare(self) -> None: ...

    def backend(self, captured: Any) -> InputBackend: ...

    def role(self, entry: Any, cmd: dict[str, Any], index: int, workdir: Path) -> tuple[Stepper, Any, int]: ...

    def file_coverage(self, captured: Any) -> dict[str, Any]: ...


class DrainSource(Protocol):
    """What ``verify``'s drain reads: ``get(timeout) -> (worker, batch)``; a source of several
    input workers also has ``counts`` (batches per worker so far)."""

    def get(self, timeout: float) -> tuple[int, Any]: ...


class ChiefDrain(Protocol):
    """A backend's chief side of the drain (``drain.ChiefDrain(role, resolved, captured,
    t_proc)``; constructing it starts nothing that needs stopping). ``open()`` sets up what
    the framework's chief sets up for training and returns ``(source, pids of input-worker
    processes on this host)``; ``samples_of(batch)`` is a batch's samples; ``describe()`` adds
    the backend's own keys to the result; ``close(ok)`` marks the job done (the input workers
    leave) and stops what ``open`` started, also after ``open`` failed."""

    def open(self) -> tuple[DrainSource, list[int]]: ...

    def samples_of(self, batch: Any) -> int: ...

    def describe(self) -> dict[str, Any]: ...

    def close(self, ok: bool) -> None: ...


class DrainBackend(Protocol):
    """The interface of a backend's ``drain`` module (``registry.entry(fw, "drain")``), which
    :mod:`analyzer.verify_task` drives: ``prepare()`` before run.py loads (quiet start-up, stop
    signals); ``adjust(resolved, captured, dataloader_workers)`` the resolved params before
    the task runs (``dataloader_workers``: ``--dataloader-workers`` or ``None``);
    ``worker(role, resolved, captured) -> exit code`` the input worker's whole task;
    ``ChiefDrain`` the chief's side (:class:`ChiefDrain`)."""

    def prepare(self) -> None: ...

    def adjust(self, resolved: Any, captured: Any, dataloader_workers: int | None) -> None: ...

    def worker(self, role: Any, resolved: Any, captured: Any) -> int: ...
