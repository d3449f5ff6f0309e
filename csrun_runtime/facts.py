"""What a framework backend declares about itself, read without importing its framework: each
backend folder's ``facts.py`` holds one :class:`BackendFacts` as ``FACTS``
(:func:`csrun_runtime.registry.facts`). The core (params, capture, the first batch, the task's
lifecycle) and the analyzer read a backend's name, launcher word, runconfig keys and report
wording from it instead of naming the framework. Pure Python.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Key", "ProbeFacts", "BackendFacts", "int_min", "auto_or_int"]


@dataclass(frozen=True)
class Key:
    """One ``runconfig`` key: ``check(value)`` returns the value or raises ``ValueError`` (its
    message follows ``runconfig.<key>``), ``default`` fills it, ``doc`` is its help
    (csrun_runtime/README.md documents every key)."""

    check: Callable[[Any], Any]
    default: Any
    doc: str


def int_min(minimum: int) -> Callable[[Any], int]:
    """A :attr:`Key.check`: an integer >= ``minimum``."""
    def check(v):
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            raise ValueError(f"must be an integer >= {minimum}")
        return v
    check.__doc__ = f"integer >= {minimum}"
    return check


def auto_or_int(v):
    """auto or an integer >= 1"""
    if v == "auto" or (isinstance(v, int) and not isinstance(v, bool) and v >= 1):
        return v
    raise ValueError("must be auto or an integer >= 1")


@dataclass(frozen=True)
class ProbeFacts:
    """What the analyzer plans, predicts and writes differently for one framework.

    Attributes:
        title: the framework's name in report notes (``"PyTorch"``).
        ingest_probe: the chief's ingest has a hop of its own to probe on cached elements
            (kind ``"ingest"``: tf.data service) and a prior from the element size when none ran.
        dataloader_workers: the input is a DataLoader whose worker-process count the probes sweep
            (``dataloader_workers`` in each probe row), the report recommends and ``verify``
            sets (``--dataloader-workers``); a point of the sweep it cannot be built at is
            ``invalid`` (skipped), where another framework's build error is a contract violation.
        via: how the input workers' batches reach the chief (``"over csrun's data plane"``).
        input_note: appended to the report's "Input function:" line (``""`` for none).
        coverage_built: what the file-coverage check built (``"input_fn built as workers 0 and
            1 of 2"``).
    """

    title: str
    ingest_probe: bool
    dataloader_workers: bool
    via: str
    input_note: str
    coverage_built: str


@dataclass(frozen=True)
class BackendFacts:
    """One backend's facts.

    Attributes:
        name: its name in :data:`csrun_runtime.registry.FRAMEWORKS`, in capture records and reports.
        launcher: ``csrun_wse``'s launcher word that runs it (``python-ws``).
        input_what: how a user's input error names the training input (``"train_input: input_fn"``:
            ``"<input_what> raised ValueError: ..."``, :mod:`csrun_runtime.usererror`).
        runconfig: the ``runconfig`` keys only this backend acts on, with their help; the params
            accept every backend's (:data:`csrun_runtime.params.RUNCONFIG_KEYS`).
        probe: what the analyzer does differently for it (:class:`ProbeFacts`).
        generated_files: parts of file names the framework generates code in (AutoGraph's):
            frames there are not the user's (:func:`csrun_runtime.usererror.user_frames`).
    """

    name: str
    launcher: str
    input_what: str
    probe: ProbeFacts
    runconfig: Mapping[str, Key] = field(default_factory=dict)
    generated_files: tuple[str, ...] = ()
