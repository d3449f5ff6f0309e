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
one streamer of rank 0 without a csrun environment.

The Model Zoo's own object: when ``modelzoo.common.pytorch`` is importable (a Model Zoo checkout
on the path), :func:`set_facts` also points the ``num_streamers``, ``get_streaming_rank`` and
``is_streamer`` attributes of the ``cb_model`` object that package exports at these functions
(:func:`bind_modelzoo`; in R1.6.1 ``cb_model`` is a name bound in the package's ``__init__.py``,
a ``SimpleNamespace`` of lambdas without the Cerebras packages, not a module), so processors that
call ``cm.num_streamers()`` through ``from modelzoo.common.pytorch import cb_model as cm`` shard
with csrun's facts, with no line in run.py. Pure Python: no torch, no TensorFlow (importing the
Model Zoo package imports torch, in a task that builds a DataLoader anyway).
"""
from __future__ import annotations

import importlib
import importlib.util
import logging
from dataclasses import dataclass
from typing import Any

__all__ = ["StreamerFacts", "set_facts", "facts", "num_streamers", "get_streaming_rank", "is_streamer",
           "bind_modelzoo", "MODELZOO_PACKAGE"]

log = logging.getLogger("csrun.runtime")

#: The Model Zoo package whose ``cb_model`` object :func:`bind_modelzoo` binds.
MODELZOO_PACKAGE = "modelzoo.common.pytorch"


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
_BOUND: Any = None  # the cb_model object bound last (a re-imported package binds again)
_TRIED = False  # the import failed once: not tried again (an absent Model Zoo is looked for each time)


def set_facts(f: StreamerFacts | None) -> None:
    """Set this process's facts (the runtime; ``None``: back to the environment's); with facts,
    also bind the Model Zoo's ``cb_model`` when the Model Zoo is importable (:func:`bind_modelzoo`)."""
    global _FACTS
    _FACTS = f
    if f is not None:
        bind_modelzoo()


def _modelzoo_importable() -> bool:
    """Whether ``modelzoo.common.pytorch`` can be imported, importing no ``modelzoo`` module when
    there is no top-level ``modelzoo`` package (``find_spec`` of the submodule imports its parents)."""
    if importlib.util.find_spec("modelzoo") is None:
        return False
    return importlib.util.find_spec(MODELZOO_PACKAGE) is not None


def bind_modelzoo() -> bool:
    """Point ``modelzoo.common.pytorch.cb_model``'s ``num_streamers``, ``get_streaming_rank`` and
    ``is_streamer`` at this module's functions (which answer the facts in force), when that
    package is importable; logs once per object bound. Returns whether ``cb_model`` is bound.

    Never raises: a Model Zoo that is absent is not imported; one that fails to import or has
    no ``cb_model`` is a warning (once) and the run goes on with csrun's own functions.
    """
    global _BOUND, _TRIED
    import sys

    pkg = sys.modules.get(MODELZOO_PACKAGE)
    if pkg is None:
        if _TRIED:
            return False
        try:
            if not _modelzoo_importable():
                return False
            _TRIED = True
            pkg = importlib.import_module(MODELZOO_PACKAGE)
        except Exception as e:  # noqa: BLE001 - a broken Model Zoo never fails the run
            log.warning("Model Zoo: %s is on the path but failed to import (%s: %s); its cb_model is not "
                        "bound to csrun's streamer facts", MODELZOO_PACKAGE, type(e).__name__, e)
            return False
    cm = getattr(pkg, "cb_model", None)
    if cm is None:
        if _BOUND is not False:
            log.warning("Model Zoo: %s has no cb_model; nothing bound", MODELZOO_PACKAGE)
            _BOUND = False
        return False
    if cm is _BOUND:
        return True
    try:
        cm.num_streamers, cm.get_streaming_rank, cm.is_streamer = num_streamers, get_streaming_rank, is_streamer
    except (AttributeError, TypeError) as e:
        log.warning("Model Zoo: cannot set the attributes of %s.cb_model (%s)", MODELZOO_PACKAGE, e)
        _BOUND = False
        return False
    _BOUND = cm
    log.info("Model Zoo: %s.cb_model's num_streamers, get_streaming_rank and is_streamer now answer csrun's "
             "streamer facts (%s)", MODELZOO_PACKAGE, getattr(pkg, "__file__", "?"))
    return True


def _from_env() -> StreamerFacts:
    from csrun_common.roles import RoleError, resolve_role

    try:
        role = resolve_role()
    except RoleError:
        return StreamerFacts()
    w = max(1, role.num_streamers)  # job-wide: with several trainer ranks, W of all ranks
    if role.shard_plan:
        w = 1
    if role.is_chief:
        if role.num_input_workers == 0 and role.world_size > 1 and not role.shard_plan:
            return StreamerFacts(role.world_size, role.rank, True)  # each rank reads its own share
        return StreamerFacts(w, 0, role.num_input_workers == 0)
    return StreamerFacts(w, 0 if role.shard_plan else int(role.streamer_index or 0), True)


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
