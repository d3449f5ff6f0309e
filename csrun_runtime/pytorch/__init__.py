"""csrun's PyTorch runtime: the Model Zoo R1.6.1 run.py contract (docs/PYTORCH.md)::

    from csrun_runtime.pytorch import run, num_streamers, get_streaming_rank, is_streamer

    if __name__ == "__main__":
        run(model_fn, train_data_fn, eval_data_fn, default_params_fn)

``run`` (:mod:`.runner`) resolves the task's role from the ``CSRUN_*`` variables csrun_wse sets
(none: one local process) and runs the chief (:mod:`.chief`) or an input worker
(:mod:`.worker`, streaming its DataLoader over :mod:`csrun_runtime.dataplane`). The three
streamer functions (:mod:`.streamers`) have the Model Zoo's meanings. :mod:`.contract` holds the
checks, seeds and the optimizer rule; :mod:`.checkpoint` the checkpoints; :mod:`.events` the
TensorBoard files. Importing this package imports nothing else: the five names load their
module on first use (PEP 562), so that the core reads :mod:`.facts` alone; neither torch (imported
when a run needs it) nor, ever, TensorFlow.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .contract import worker_init_fn
    from .runner import run
    from .streamers import get_streaming_rank, is_streamer, num_streamers

__all__ = ["run", "num_streamers", "get_streaming_rank", "is_streamer", "worker_init_fn"]

#: where each public name lives
_HOMES = {"run": "runner", "num_streamers": "streamers", "get_streaming_rank": "streamers",
          "is_streamer": "streamers", "worker_init_fn": "contract"}


def __getattr__(name: str) -> Any:
    """``from csrun_runtime.pytorch import run`` (and the other four): the module imported now."""
    if name in _HOMES:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
