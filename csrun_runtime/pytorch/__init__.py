"""csrun's PyTorch runtime: the Model Zoo R1.6.1 run.py contract (docs/PYTORCH.md)::

    from csrun_runtime.pytorch import run, num_streamers, get_streaming_rank, is_streamer

    if __name__ == "__main__":
        run(model_fn, train_data_fn, eval_data_fn, default_params_fn)

``run`` (:mod:`.runner`) resolves the task's role from the ``CSRUN_*`` variables csrun_wse sets
(none: one local process) and runs the chief (:mod:`.chief`) or an input worker
(:mod:`.worker`, streaming its DataLoader over :mod:`csrun_runtime.dataplane`). The three
streamer functions (:mod:`.streamers`) have the Model Zoo's meanings. :mod:`.contract` holds the
checks, seeds and the optimizer rule; :mod:`.checkpoint` the checkpoints; :mod:`.events` the
TensorBoard files. Importing this package imports neither torch nor TensorFlow (torch is
imported when a run needs it), and nothing here ever imports TensorFlow.
"""
from .contract import worker_init_fn
from .runner import run
from .streamers import get_streaming_rank, is_streamer, num_streamers

__all__ = ["run", "num_streamers", "get_streaming_rank", "is_streamer", "worker_init_fn"]
