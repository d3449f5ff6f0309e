"""One numbering of the input workers in every message and record (docs/MULTI-RANK.md "The input,
split across ranks").

With several trainer ranks, input worker ``g`` (job-wide, ``0 <= g < W``) feeds rank
``g % world_size`` as that rank's slot ``g // world_size`` (:func:`csrun_common.ranks.worker_rank`);
a rank's rendezvous directory, its streams and its lost-worker watch count slots. What a person
reads names the job-wide index, with the slot beside it: ``input worker 5 (rank 1's slot 1)``;
with one rank slot and index are the same and the text is ``input worker 5``. The task sets its
rank once (:func:`set_rank`, from :func:`csrun_runtime.task.begin`); the chief's and the input
worker's code then call :func:`name` and :func:`job_index` with the slots they hold.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["set_rank", "job_worker", "job_index", "name", "renumber", "WORKER_LISTS", "SLOT_LISTS", "SLOT_MAPS"]

_state = {"rank": 0, "world_size": 1}

#: performance.json's lists of workers, each entry's ``index`` a slot until :func:`renumber`.
WORKER_LISTS = ("workers_lost", "workers_replaced", "workers_given_up")
#: Its lists of slots, and its mappings keyed by slot (``data_plane``'s inside that key).
SLOT_LISTS = ("workers_paused", "workers_stopped")
SLOT_MAPS = ("batches_per_worker", "worker_nodes", "batches_per_element", "bytes_per_worker", "bundles_per_worker")


def set_rank(rank: int, world_size: int) -> None:
    """This task's trainer rank (a chief's own, an input worker's the rank it feeds) and the world size."""
    _state["rank"], _state["world_size"] = int(rank), max(1, int(world_size))


def job_worker(slot: Any, rank: int, world_size: int) -> Any:
    """The job-wide index ``slot × world_size + rank`` of rank ``rank``'s input worker ``slot``
    (:func:`csrun_common.ranks.worker_rank`'s inverse), a string when ``slot`` was one; another key
    (``"in-process"``) unchanged."""
    text = str(slot)
    if not text.isdigit():
        return slot
    g = int(text) * world_size + rank
    return str(g) if isinstance(slot, str) else g


def job_index(slot: int) -> int:
    """The job-wide index of this rank's input worker ``slot``: ``slot × world_size + rank``."""
    return int(slot) * _state["world_size"] + _state["rank"]


def name(slot: int) -> str:
    """``input worker <g>``, and ``(rank <r>'s slot <slot>)`` beside it with several ranks."""
    if _state["world_size"] <= 1:
        return f"input worker {int(slot)}"
    return f"input worker {job_index(slot)} (rank {_state['rank']}'s slot {int(slot)})"


def _key(k: Any) -> Any:
    text = str(k)
    return str(job_index(int(text))) if text.isdigit() else k


def renumber(desc: Mapping[str, Any]) -> dict[str, Any]:
    """A source's ``describe()`` by job-wide index (unchanged with one rank): the keys of
    :data:`SLOT_MAPS` (a slot as a string; ``"in-process"`` kept; ``data_plane``'s too), the
    slots of :data:`SLOT_LISTS`, and each entry of :data:`WORKER_LISTS` (``index`` job-wide,
    ``rank`` and ``slot`` added)."""
    out = dict(desc)
    if _state["world_size"] <= 1:
        return out
    for key, value in desc.items():
        if key in WORKER_LISTS and isinstance(value, list):
            out[key] = [{**e, "index": job_index(e["index"]), "rank": _state["rank"], "slot": e["index"]}
                        if isinstance(e, Mapping) and isinstance(e.get("index"), int) else e for e in value]
        elif key in SLOT_LISTS and isinstance(value, list):
            out[key] = [job_index(i) if isinstance(i, int) else i for i in value]
        elif key in SLOT_MAPS and isinstance(value, Mapping):
            out[key] = {_key(k): v for k, v in value.items()}
        elif key == "data_plane" and isinstance(value, Mapping):
            out[key] = renumber(value)
    return out
