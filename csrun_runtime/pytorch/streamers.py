"""The streamer facts of a PyTorch task: the Model Zoo's ``num_streamers()``,
``get_streaming_rank()`` and ``is_streamer()`` (Model Zoo R1.6.1 ``cb_model``), answered by csrun.

Meanings (docs/PYTORCH.md):

- ``num_streamers()``: ``W``, how many processes build the training DataLoader and stream it
  (the job's input workers; 1 when the chief reads in-process: ``python run.py``, or a job
  without input workers; 1 as well under a shard plan, whose per-worker ``data_dir`` view
  already holds only this worker's files, as ``TF_CONFIG`` says one worker then);
- ``get_streaming_rank()``: this process's index in ``[0, W)`` (0 on the chief);
- ``is_streamer()``: True in a process whose DataLoader feeds training: an input worker, or the
  chief when it reads in-process; False on a chief that receives from input workers.

The runtime sets them (:func:`set_facts`) before it calls a data function; a data processor
imported outside ``run()`` gets the answer of the environment (:mod:`csrun_common.roles`), or
one streamer of rank 0 without a csrun environment. Pure Python: no torch, no TensorFlow.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["StreamerFacts", "set_facts", "facts", "num_streamers", "get_streaming_rank", "is_streamer"]


@dataclass(frozen=True)
class StreamerFacts:
    """``num_streamers`` (>= 1), ``rank`` (``0 <= rank < num_streamers``), ``streamer``.

    Raises:
        ValueError: a rank outside ``[0, num_streamers)`` or ``num_streamers < 1``.
    """

    num_streamers: int = 1
    rank: int = 0
    streamer: bool = True

    def __post_init__(self) -> None:
        if self.num_streamers < 1 or not 0 <= self.rank < self.num_streamers:
            raise ValueError(f"streaming rank {self.rank} outside [0, {self.num_streamers})")


_FACTS: StreamerFacts | None = None


def set_facts(f: StreamerFacts | None) -> None:
    """Set this process's facts (the runtime; ``None``: back to the environment's)."""
    global _FACTS
    _FACTS = f


def _from_env() -> StreamerFacts:
    from csrun_common.roles import RoleError, resolve_role

    try:
        role = resolve_role()
    except RoleError:
        return StreamerFacts()
    w = max(1, role.num_input_workers)
    if role.shard_plan:
        w = 1
    if role.is_chief:
        return StreamerFacts(w, 0, role.num_input_workers == 0)
    return StreamerFacts(w, 0 if role.shard_plan else int(role.worker_index or 0), True)


def facts() -> StreamerFacts:
    """The facts in force: those the runtime set, else the environment's."""
    return _FACTS if _FACTS is not None else _from_env()


def num_streamers() -> int:
    """Number of processes streaming training input (``W >= 1``; see the module docstring)."""
    return facts().num_streamers


def get_streaming_rank() -> int:
    """This process's streaming rank in ``[0, num_streamers())`` (0 on the chief)."""
    return facts().rank


def is_streamer() -> bool:
    """True in a process whose training DataLoader feeds training (see the module docstring)."""
    return facts().streamer
