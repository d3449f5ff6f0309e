"""A run.py's modes (the Model Zoo's ``--mode``), declared once for both sides: the launcher's
one-batch check (``launcher/batchcheck.py``) and the task runtime (``csrun_runtime.params``,
``csrun_runtime.lifecycle``, the backends)."""
from __future__ import annotations

__all__ = ["MODES", "TRAIN_MODES"]

#: Values of ``--mode`` / ``runconfig.mode``.
MODES = ("train", "eval", "train_and_eval", "validate_only", "compile_only")
#: The modes that train: input workers stream the training input, and every trainer rank runs
#: them (the others run on trainer rank 0 alone).
TRAIN_MODES = ("train", "train_and_eval")
