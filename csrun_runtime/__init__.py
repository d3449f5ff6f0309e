"""The task runtime: what runs inside every task that ``csrun_wse`` / ``csrun_cpu`` launch.

``from csrun_runtime import run`` is all a run.py needs (docs/CONTRACT.md); importing this
package does not import TensorFlow; ``run`` (:mod:`.runner`, loaded on first use) does in a
launched task (``CSRUN_ROLE`` set), at once and without its two start-up lines (:mod:`.quiet`).
A PyTorch run.py imports :mod:`csrun_runtime.pytorch` instead, which never imports TensorFlow.

Modules: :mod:`.runner` (``run``: role and params, then chief or input worker), :mod:`.chief`
(the chief's modes), :mod:`.training` (the training loop), :mod:`.worker` (the input-worker
task), :mod:`.service` (tf.data service dispatchers and the chief's batch sources),
:mod:`.rendezvous` (files on the shared file system: dispatchers, registrations,
heartbeats, done), :mod:`.params` (command line, params YAML, per-worker params, shard
plan; no TF), :mod:`.contract` (the input_fn contract), :mod:`.artifacts`
(performance.json, params YAML), :mod:`.capture` (``load_entry``: run.py without training).
The role of a task comes from :mod:`csrun_common.roles`.
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
        from .tensorflow.runner import run

        return run
    if name in ("load_entry", "CapturedRun"):
        from . import capture

        return getattr(capture, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
