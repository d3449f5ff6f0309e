"""The one module that names both framework backends of the task runtime.

A backend is a subpackage, :mod:`csrun_runtime.tensorflow` or :mod:`csrun_runtime.pytorch`,
with the same entry modules (:data:`ENTRY_MODULES`); everything else (the launcher, the
analyzer, the core of :mod:`csrun_runtime`) reaches a framework's code through
:func:`entry` with the framework's name, so that nothing outside a backend's folder imports
TensorFlow or torch, and a third framework is one more folder and one more name here.
Backends are imported lazily, on the first :func:`entry` call for them: importing this module
imports neither framework.
"""
from __future__ import annotations

import importlib
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .facts import BackendFacts

__all__ = ["FRAMEWORKS", "DEFAULT_FRAMEWORK", "ENTRY_MODULES", "UnknownFramework", "entry", "facts", "launchers",
           "framework_of_launcher"]

#: the backends, by the name a run.py's capture record and the analyzer's reports use.
FRAMEWORKS: tuple[str, ...] = ("tensorflow", "pytorch")
#: the backend of ``from csrun_runtime import run``, and of a record that names none (the reports
#: and probe hellos of earlier releases).
DEFAULT_FRAMEWORK: str = FRAMEWORKS[0]
#: the modules every backend folder holds under the same names (checked by tests/unit/test_house.py):
#: its facts (``facts``: name, launcher word, runconfig keys, read without the framework), the task's
#: entry (``runner``: the lifecycle's hooks), the chief, the chief's source of the input workers'
#: batches (``remote``), the input worker, the input contract and its file-coverage check,
#: evaluation, the training loop's step backend (``training``), the analyzer's probe and
#: ``verify``'s drain.
ENTRY_MODULES: tuple[str, ...] = ("facts", "runner", "chief", "remote", "worker", "contract", "coverage",
                                  "evaluation", "training", "input_backend", "probe", "drain")


class UnknownFramework(ValueError):
    """A framework name that is not one of :data:`FRAMEWORKS`."""


def facts(framework: str) -> BackendFacts:
    """The backend ``framework``'s :class:`csrun_runtime.facts.BackendFacts` (its ``facts``
    module: the framework itself is not imported). Raises :class:`UnknownFramework`."""
    got: BackendFacts = entry(framework, "facts").FACTS
    return got


def launchers() -> dict[str, str]:
    """``csrun_wse``'s launcher word of each framework (``python-ws`` runs TensorFlow), by framework."""
    return {fw: facts(fw).launcher for fw in FRAMEWORKS}


def framework_of_launcher(launcher: str) -> str:
    """The framework a ``csrun_wse`` launcher word runs (``python-ws`` -> ``tensorflow``).
    Raises :class:`UnknownFramework` for another word."""
    for fw, word in launchers().items():
        if word == launcher:
            return fw
    raise UnknownFramework(f"launcher {launcher!r}: expected one of {', '.join(launchers().values())}")


def entry(framework: str, module: str) -> ModuleType:
    """The backend ``framework``'s entry module ``module`` (``csrun_runtime.<framework>.<module>``), imported on
    first use. Raises :class:`UnknownFramework` (not in :data:`FRAMEWORKS`) or ``ModuleNotFoundError`` (no
    such module, or its framework not installed: the package named)."""
    if framework not in FRAMEWORKS:
        raise UnknownFramework(f"framework {framework!r}: expected one of {', '.join(FRAMEWORKS)}")
    return importlib.import_module(f"csrun_runtime.{framework}.{module}")
