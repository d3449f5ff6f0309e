"""The task runtime: what runs inside every task that ``csrun_wse`` / ``csrun_cpu`` launch.

``from csrun_runtime import run`` is all a run.py needs (docs/CONTRACT.md); importing this
package does not import TensorFlow, except in a launched task (``CSRUN_ROLE`` set), where it
imports TensorFlow at once without its two start-up lines (:mod:`.quiet`).

Modules: :mod:`.runner` (``run``: role and params, then chief or input worker), :mod:`.chief`
(the chief's modes), :mod:`.training` (the training loop), :mod:`.worker` (the input-worker
task), :mod:`.service` (tf.data service dispatchers and the chief's batch sources),
:mod:`.rendezvous` (files on the shared file system: dispatchers, registrations,
heartbeats, done), :mod:`.params` (command line, params YAML, per-worker params, shard
plan; no TF), :mod:`.contract` (the input_fn contract), :mod:`.artifacts`
(performance.json, params YAML), :mod:`.capture` (``load_entry``: run.py without training).
The role of a task comes from :mod:`csrun_common.roles`.
"""
from .capture import CapturedRun, load_entry
from .runner import run

__all__ = ["run", "load_entry", "CapturedRun"]
