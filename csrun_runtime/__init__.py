"""The task runtime: what runs inside every task that ``csrun_wse`` / ``csrun_cpu`` launch.

``from csrun_runtime import run`` is all a TensorFlow run.py needs (docs/CONTRACT.md); importing
this package does not import TensorFlow; ``run`` (the TensorFlow backend's runner, loaded on
first use through :mod:`.registry`) does in a launched task (``CSRUN_ROLE`` set), at once and
without its two start-up lines (:mod:`csrun_runtime.tensorflow.quiet`). A PyTorch run.py imports
:mod:`csrun_runtime.pytorch` instead, which never imports TensorFlow.

The top level is the framework-neutral core (docs/ARCHITECTURE.md): :mod:`.backend` (the
Protocols a backend implements), :mod:`.registry` (the one module naming both backends),
:mod:`.loop` (the training loop), :mod:`.streams` (the chief's merge of the workers' streams),
:mod:`.dataplane` (numpy batches over zmq), :mod:`.rendezvous`, :mod:`.params`,
:mod:`.capture` (``load_entry``: run.py without training), :mod:`.artifacts`, and the rest. The
backends are :mod:`csrun_runtime.tensorflow` and :mod:`csrun_runtime.pytorch`, with the same
entry modules (``runner``, ``chief``, ``remote``, ``worker``, ...). The role of a task comes
from :mod:`csrun_common.roles`.
"""
from __future__ import annotations

from typing import Any

__all__ = ["run", "load_entry", "CapturedRun"]


def __getattr__(name: str) -> Any:
    """``run``, ``load_entry`` and ``CapturedRun`` imported on first use (PEP 562), not with the
    package: importing :mod:`.runner` in a launched task imports TensorFlow (:mod:`.quiet`),
    which ``csrun_runtime.pytorch`` (a subpackage, so this file runs first) must not do.
    ``from csrun_runtime import run`` imports it at once, as before."""
    if name == "run":
        from .registry import DEFAULT_FRAMEWORK, entry

        return entry(DEFAULT_FRAMEWORK, "runner").run
    if name in ("load_entry", "CapturedRun"):
        from . import capture

        return getattr(capture, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
