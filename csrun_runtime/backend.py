"""What a framework backend offers the core: the Protocols the core calls, declared once.

A backend is a folder, :mod:`csrun_runtime.tensorflow` or :mod:`csrun_runtime.pytorch`, holding
the entry modules :data:`csrun_runtime.registry.ENTRY_MODULES` under the same names. The core
reaches a backend two ways, and only the Protocols it calls are declared here:

- through :func:`csrun_runtime.registry.entry`: the modules in :data:`MODULES` (``facts``,
  ``runner``, ``input_backend``, the analyzer's ``probe`` and ``verify``'s ``drain``);
  ``tests/unit/test_house.py`` checks every backend's against them by signature, and the
  classes they hand out against :data:`INSTANCES`;
- through what a backend hands it: the task's lifecycle (:mod:`csrun_runtime.lifecycle`) calls a
  runner's :class:`Hooks` (the shape of Ray Train's ``Backend``) and the :class:`ChiefTask` and
  input-worker :class:`Task` they make; the training loop a :class:`StepBackend` (declared in
  :mod:`csrun_runtime.loop`); the autoscaler and the elastic watch a :class:`StreamSource`; with
  several trainer ranks the loop a :class:`RankGroup` (declared in :mod:`csrun_runtime.rankgroup`).

Importing this module imports neither framework.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from csrun_common.roles import Role

from .facts import BackendFacts
from .input_backend import InputBackend
from .loop import StepBackend
from .params import Resolved
from .probing import ChiefDrain, DrainBackend, ProbeBackend
from .rankgroup import RankGroup
from .rendezvous import Rendezvous

__all__ = ["Task", "Failure", "ChiefTask", "Hooks", "StreamSource", "StepBackend", "InputBackend", "RankGroup",
           "FactsModule", "RunnerModule", "InputBackendModule", "MODULES", "INSTANCES"]


class Task(Protocol):
    """A task's whole life (an input worker's)."""

    def run(self) -> int:
        """Run until done; returns the exit code (0 done, 1 a runtime failure, 2 a contract violation or bad params)."""
        ...


@dataclass(frozen=True)
class Failure:
    """What a chief's exception means (:meth:`Hooks.failure`, :func:`csrun_runtime.lifecycle.failure`):
    the exit ``code`` and the ``lines`` logged (each one line, at ``level``; ``traceback``: with
    the exception's); ``reason`` is ``done.json``'s (default: the lines, joined)."""

    code: int
    lines: tuple[str, ...]
    level: int = logging.ERROR
    traceback: bool = False
    reason: str = ""


class ChiefTask(Protocol):
    """What a backend's chief offers the lifecycle (:meth:`Hooks.chief` makes it)."""

    @property
    def ranks(self) -> RankGroup | None:
        """Its :class:`RankGroup` once several trainer ranks joined (``None`` before, and with one rank)."""
        ...

    def run_mode(self) -> int:
        """Run ``runconfig.mode``; returns 0 or a stop's 75/130/143; raises what the lifecycle maps to exit codes."""
        ...

    def close(self) -> None:
        """After ``done.json`` (also when :meth:`run_mode` raised): release the source, own input worker, temp files."""
        ...

    def missing_reports(self) -> int:
        """Input workers that will write no report: the chief's own, asked for and never started."""
        ...


class Hooks(Protocol):
    """What a backend supplies to the task's life (:mod:`csrun_runtime.lifecycle`); a runner's
    ``Hooks(<the run.py's functions>)`` holds the functions a run.py passed to ``run()``."""

    facts: BackendFacts

    def functions(self) -> tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any] | None]:
        """``(training input function, model_fn, eval input function)`` for a capture record."""
        ...

    def resolve(self, argv: Sequence[str], run_py: str | None, /) -> Resolved:
        """The run's params from its command line. Raises :class:`csrun_runtime.params.ParamsError`."""
        ...

    def warnings(self, env: Mapping[str, str], /) -> list[str]:
        """Warnings the chief logs after the params' own (csrun_wse features this backend ignores)."""
        ...

    def worker(self, role: Role, resolved: Resolved, /) -> Task:
        """The input-worker task ``role`` (its input built with the run.py's data function)."""
        ...

    def chief(self, role: Role, resolved: Resolved, rdv: Rendezvous | None, t_proc: float, /) -> ChiefTask:
        """The chief ``role``; ``rdv``: the rendezvous (with input workers); ``t_proc``: its start, epoch seconds."""
        ...

    def failure(self, error: BaseException, ranks: RankGroup | None, /) -> Failure | None:
        """Exit code and lines of this backend's ``error`` (a contract violation: 2); ``None``: the ladder decides."""
        ...


class StreamSource(Protocol):
    """The chief's merge of its input workers' streams, as the core drives it: the training loop
    (``describe``, ``close``), :class:`csrun_runtime.autoscale.Autoscaler` (``streaming``,
    ``pause``, ``resume``, ``add_stream``, ``buffered_batches``, ``counts``, ``paused``, ``n``)
    and :class:`csrun_runtime.elastic.WorkerWatch`'s replacements (``reopen``, ``stopped``).

    Attributes (instance data, set by the constructor): ``counts`` (batches handed to training,
    by worker index), ``paused`` (indices paused by the autoscaler), ``n`` (one past the highest
    slot opened)."""

    counts: dict[int, int]
    paused: set[int]
    n: int

    def streaming(self) -> set[int]:
        """The worker indices being read now (opened, not paused, not stopped)."""
        ...

    def stopped(self) -> Collection[int]:
        """The worker indices whose streams ended (lost or failed)."""
        ...

    def pause(self, i: int, /) -> None:
        """Stop reading worker ``i``'s stream until :meth:`resume` (what it sent is kept)."""
        ...

    def resume(self, i: int, /) -> None:
        """Read worker ``i``'s paused stream again."""
        ...

    def add_stream(self, index: int, address: str, registration: Mapping | None = None, /) -> None:
        """Open worker ``index``'s stream (at ``address``; its ``workers/<index>.json``); ``index >= n`` grows it."""
        ...

    def reopen(self, i: int, registration: Mapping, /) -> str:
        """Worker ``i``'s replacement registered: read its stream; returns what was done."""
        ...

    def buffered_batches(self) -> int:
        """Batches received and not yet handed to training."""
        ...

    def describe(self) -> dict[str, Any]:
        """performance.json's record of the input: per-worker counts, nodes, the transport's view."""
        ...

    def close(self) -> None:
        """Stop reading; release the transport."""
        ...


# --------------------------------------------------------------------------- what registry.entry reaches
class FactsModule(Protocol):
    """``facts``: what the backend declares about itself (:func:`csrun_runtime.registry.facts`)."""

    FACTS: BackendFacts


class RunnerModule(Protocol):
    """``runner``: what a run.py calls (its user functions first, as the framework's Model Zoo
    passes them; ``from csrun_runtime import run`` is the default backend's), and the lifecycle's
    hooks over those functions."""

    def run(self, *fns: Callable[..., Any], argv: Sequence[str] | None = None, exit: bool = True) -> int | None:
        """Run this task, exit with its code (``exit=False``: return it); capture mode: record the functions."""
        ...

    def Hooks(self, *fns: Callable[..., Any]) -> Hooks:  # noqa: N802 - a class
        """The backend's :class:`Hooks` over the run.py's functions."""
        ...


class InputBackendModule(Protocol):
    """``input_backend``: worker ``i`` of ``W``'s training input built for the analyzer's probes
    and the launcher's one-batch check (:mod:`csrun_runtime.first_batch`)."""

    def INPUT_BACKEND(self, data_fn: Callable[..., Any], params: dict[str, Any], /) -> InputBackend:  # noqa: N802
        """The backend's :class:`InputBackend` over the captured run's training data function and params."""
        ...

    def describe_error(self, error: BaseException, what: str, /) -> str:
        """An input worker's lines for ``error`` from user input code (``usererror.describe``, or a contract's)."""
        ...


#: entry module -> the Protocol it implements, for the modules the core and the analyzer reach
#: through :func:`csrun_runtime.registry.entry` (``probe`` and ``drain``: :mod:`csrun_runtime.probing`'s).
MODULES: dict[str, type] = {
    "facts": FactsModule, "runner": RunnerModule, "input_backend": InputBackendModule, "probe": ProbeBackend,
    "drain": DrainBackend,
}
#: what the classes a module Protocol names must implement: (module, member) -> instance Protocol.
INSTANCES: dict[tuple[str, str], type] = {
    ("runner", "Hooks"): Hooks, ("input_backend", "INPUT_BACKEND"): InputBackend, ("drain", "ChiefDrain"): ChiefDrain,
}
