"""What a framework backend offers the core: the Protocols its entry modules implement, declared once.

A backend is a folder, :mod:`csrun_runtime.tensorflow` or :mod:`csrun_runtime.pytorch`, holding
the entry modules :data:`csrun_runtime.registry.ENTRY_MODULES` under the same names;
:func:`csrun_runtime.registry.entry` hands them out by framework name. :data:`MODULES` maps each
entry module to the Protocol it implements (``tests/unit/test_house.py`` checks every backend
against it: each member present, each function's or class's signature callable as the Protocol
declares it, each class's instances with the methods of the Protocol it returns). The core
drives what a backend makes through the small Protocols below: the training loop a
:class:`StepBackend` (declared in :mod:`csrun_runtime.loop`), the autoscaler and the elastic
watch a :class:`StreamSource`, the analyzer's pipeline probes an :class:`InputBackend`
(:mod:`csrun_runtime.input_backend`); a run.py calls ``run``. With several trainer ranks
(docs/MULTI-RANK.md) the backend's chief also makes a :class:`RankGroup` (declared in
:mod:`csrun_runtime.rankgroup`: ``rank``, ``world_size``, ``agree(code)`` a MAX over the
ranks, ``gather(obj)``, ``digest()`` of its weights; collectives time out with ``RankLost``)
and hands it to the loop wrapped in :class:`csrun_runtime.rankgroup.LoopRanks`
(``LoopSetup.ranks``): the core then agrees on every stop, lets rank 0 alone write, and
gathers the ranks' figures into performance.json and the verdict
(:class:`csrun_runtime.pytorch.ranks.TorchRanks` is PyTorch's).

A module Protocol's member in capitals (``STEP_BACKEND``, ``INPUT_BACKEND``, ``SOURCES``,
``VIOLATION``) names the backend's class for a role whose class names differ between
frameworks (``TFStepBackend``, ``TorchStepBackend``). Importing this module imports neither
framework.
"""
from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, Protocol

from csrun_common.roles import Role

from .coverage import Coverage
from .facts import BackendFacts
from .input_backend import InputBackend
from .loop import StepBackend
from .params import Resolved
from .probing import ChiefDrain, DrainBackend, ProbeBackend
from .rankgroup import RankGroup

__all__ = ["Task", "StreamSource", "Evaluates", "StepBackend", "InputBackend", "RankGroup", "RunnerModule",
           "ChiefModule",
           "RemoteModule", "FactsModule", "WorkerModule", "ContractModule", "CoverageModule", "EvaluationModule",
           "TrainingModule", "InputBackendModule", "MODULES", "INSTANCES"]


class Task(Protocol):
    """A task's whole life: the chief or an input worker."""

    def run(self) -> int:
        """Run until done; returns the task's exit code (0 done, 1 a runtime failure, 2 a
        contract violation or bad params, 75/130/143 stopped by a signal)."""
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
        """Open worker ``index``'s stream (``address``: where it serves; ``registration``: its
        ``workers/<index>.json``); ``index >= n`` grows the source."""
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


class Evaluates(Protocol):
    """A backend's evaluator (``evaluation.Evaluator``)."""

    def evaluate(self, model: Any, step: int) -> dict[str, float]:
        """Evaluate ``model`` at global step ``step``; returns the metrics by name."""
        ...


# --------------------------------------------------------------------------- the entry modules
class FactsModule(Protocol):
    """``facts``: what the backend declares about itself (:func:`csrun_runtime.registry.facts`)."""

    FACTS: BackendFacts


class RunnerModule(Protocol):
    """``runner``: what a run.py calls (its user functions first, as the framework's Model Zoo
    passes them)."""

    def run(self, *fns: Callable[..., Any], argv: Sequence[str] | None = None, exit: bool = True) -> int | None:
        """Run the task this process is (chief or input worker) and leave with its exit code
        (``exit=False``: return it); in capture mode record the functions and return."""
        ...

    def main(self, *fns: Callable[..., Any], argv: Sequence[str] | None = None,
             env: Mapping[str, str] | None = None) -> int:
        """Resolve the role (from ``env``) and params (from ``argv``), run the task; returns
        its exit code."""
        ...


class ChiefModule(Protocol):
    """``chief``: the chief task (its modes: train, eval, validate_only, compile_only)."""

    def Chief(self, role: Role, resolved: Resolved, /, *fns_and_start: Any) -> Task:  # noqa: N802 - a class
        """``Chief(role, resolved, <the run.py's three functions>, t_proc)``: ``t_proc`` the
        process's start (``time.time()`` seconds)."""
        ...


class RemoteModule(Protocol):
    """``remote``: the chief's sources of its input workers' batches, one class per transport,
    each a :class:`StreamSource`."""

    SOURCES: tuple[type, ...]


class WorkerModule(Protocol):
    """``worker``: the input-worker task."""

    def InputWorker(self, role: Role, resolved: Resolved, data_fn: Callable[..., Any], /) -> Task:  # noqa: N802
        """Input worker ``role.worker_index`` building its training input with ``data_fn``."""
        ...


class ContractModule(Protocol):
    """``contract``: the run.py contract's checks; ``VIOLATION`` is the exception they raise
    (the run refuses to start: exit 2, the violations named)."""

    VIOLATION: type[Exception]


class CoverageModule(Protocol):
    """``coverage``: contract rule 7 for this framework's training input."""

    def check_files(self, data_fn: Callable[..., Any], params: Mapping[str, Any], /) -> Coverage:
        """Build the training input as input workers 0 and 1 of 2 and judge the files they read
        (:class:`csrun_runtime.coverage.Coverage`). Raises what ``data_fn`` raises."""
        ...


class EvaluationModule(Protocol):
    """``evaluation``: the chief's evaluation on ``eval_input``."""

    def Evaluator(self, *args: Any) -> Evaluates:  # noqa: N802 - a class
        """The backend's evaluator (its constructor takes what the backend's chief holds)."""
        ...


class TrainingModule(Protocol):
    """``training``: the training loop's step backend, driven by
    :class:`csrun_runtime.loop.TrainingDriver`."""

    def STEP_BACKEND(self, *args: Any, **kwargs: Any) -> StepBackend:  # noqa: N802 - a class
        """The backend's :class:`csrun_runtime.loop.StepBackend` class."""
        ...


class InputBackendModule(Protocol):
    """``input_backend``: worker ``i`` of ``W``'s training input built for the analyzer's probes."""

    def INPUT_BACKEND(self, data_fn: Callable[..., Any], params: dict[str, Any], /) -> InputBackend:  # noqa: N802
        """The backend's :class:`csrun_runtime.input_backend.InputBackend` class, made from the
        captured run's training data function and params."""
        ...

    def describe_error(self, error: BaseException, what: str, /) -> str:
        """The lines an input worker shows for ``error``, raised by the user's input code while
        building or iterating the input: ``"{what} raised {Type}: {message} (in {function})"``
        then the last frames in the user's code, indented (``csrun_runtime.first_batch``)."""
        ...


#: entry module -> the Protocol it implements (``probe`` and ``drain``, the analyzer's node-side
#: probe and ``verify``'s drain: :mod:`csrun_runtime.probing`'s ``ProbeBackend`` and ``DrainBackend``).
MODULES: dict[str, type | None] = {
    "facts": FactsModule, "runner": RunnerModule, "chief": ChiefModule, "remote": RemoteModule, "worker": WorkerModule,
    "contract": ContractModule, "coverage": CoverageModule, "evaluation": EvaluationModule,
    "training": TrainingModule, "input_backend": InputBackendModule, "probe": ProbeBackend, "drain": DrainBackend,
}
#: what the classes a module Protocol names must implement: (module, member) -> instance Protocol.
INSTANCES: dict[tuple[str, str], type] = {
    ("remote", "SOURCES"): StreamSource, ("chief", "Chief"): Task, ("worker", "InputWorker"): Task,
    ("evaluation", "Evaluator"): Evaluates, ("training", "STEP_BACKEND"): StepBackend,
    ("input_backend", "INPUT_BACKEND"): InputBackend, ("drain", "ChiefDrain"): ChiefDrain,
}
