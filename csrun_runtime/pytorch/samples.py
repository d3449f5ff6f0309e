"""Sample-level sharding of a PyTorch training DataLoader: which dataset indices each streamer
draws in its first pass, and whether streamers 0 and 1 of 2 split the samples (contract rule 7,
the half of the check that :mod:`.coverage`'s file watch cannot judge).

A DataLoader over one file loaded in memory and split with ``DistributedSampler`` opens the
same file on every streamer: the files say nothing about what is split. Its sampler does: for a
map-style dataset with a length, the indices a streamer's DataLoader draws are listed from its
batch sampler (``set_epoch(0)`` first, as the input worker's first pass; torch's RNG restored
after each listing, so the pass that follows draws what it would have drawn). The indices of two
streamers refer to the same samples only when both built the same dataset: the check assumes
so when the dataset has the same length on streamers 0 and 1 of 2 and on one unsharded
streamer (a dataset built from the streamer's own files has a shorter length, and is judged by
its files).

Verdicts of :func:`judge` (pure): ``sharded`` (disjoint; what no streamer draws is at most the
sampler's ``drop_last`` remainder, fewer than one sample per streamer; what both draw at most
``DistributedSampler``'s padding, fewer than one per streamer), ``replicated`` (every streamer
draws every sample: each is trained once per streamer per pass, a problem), ``overlap``. The
DataLoader's own ``drop_last`` (each streamer's partial last batch) is counted apart as
dropped, not unread. torch is imported inside the functions.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..coverage import read_and_shared

__all__ = ["Drawn", "SampleJudgement", "drawn_indices", "judge", "MAX_INDICES"]

#: Longest dataset whose indices are listed (a longer one is not judged by sample).
MAX_INDICES = 20_000_000


@dataclass
class Drawn:
    """The indices one streamer's DataLoader draws in its first pass.

    Attributes:
        length: ``len(dataset)`` (samples).
        sampled: the sampler's indices, in order (before the DataLoader's ``drop_last``).
        drawn: the indices of the batches the DataLoader yields (after it).
        sampler: the sampler's class name.
    """

    length: int
    sampled: list[int]
    drawn: list[int]
    sampler: str


@dataclass
class SampleJudgement:
    """Outcome of :func:`judge`: ``verdict`` (``sharded``, ``replicated``, ``overlap``), ``line``
    (``sample-level: ...``, one clause), ``problems`` (messages; the caller appends the fix)."""

    verdict: str
    line: str
    problems: list[str] = field(default_factory=list)


def _listed(it: Any) -> list[int]:
    import torch

    with torch.random.fork_rng(devices=[]):  # the next pass draws what it would have drawn
        out: list[int] = []
        for x in it:
            if isinstance(x, (list, tuple)):
                out.extend(int(i) for i in x)
            else:
                out.append(int(x))
        return out


def drawn_indices(loader: Any) -> Drawn | str:
    """The indices ``loader`` (a ``torch.utils.data.DataLoader``) draws in its first pass, or
    why they cannot be listed (a one-clause reason: an ``IterableDataset``, no length, longer
    than :data:`MAX_INDICES`, a sampler that yields something other than indices)."""
    from torch.utils.data import BatchSampler, IterableDataset

    ds = loader.dataset
    if isinstance(ds, IterableDataset):
        return f"an IterableDataset ({type(ds).__name__}) has no indices to list"
    try:
        length = len(ds)
    except TypeError:
        return f"the dataset ({type(ds).__name__}) has no length"
    if length > MAX_INDICES:
        return f"{length} samples are more than the {MAX_INDICES} the check lists"
    bs = loader.batch_sampler
    sampler = bs.sampler if isinstance(bs, BatchSampler) else (loader.sampler if bs is None else bs)
    for s in {id(x): x for x in (loader.sampler, sampler)}.values():
        set_epoch = getattr(s, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(0)  # as contract.epochs() does before the first pass
    try:
        drawn = _listed(bs if bs is not None else loader.sampler)
        sampled = _listed(sampler) if isinstance(bs, BatchSampler) else drawn
    except (TypeError, ValueError) as e:
        return f"the sampler ({type(sampler).__name__}) does not yield indices ({type(e).__name__})"
    return Drawn(length, sampled, drawn, type(sampler).__name__)


def judge(drawn: Mapping[int, Drawn]) -> SampleJudgement:
    """Streamers' draws (by streamer index, all of one dataset's length) judged. Pure.

    The samples no streamer's sampler draws are unread unless fewer than the streamers (the
    sampler's ``drop_last`` remainder); samples two samplers draw are an overlap unless fewer
    than the streamers and the shares are the same size (``DistributedSampler``'s padding);
    samples a sampler draws but its DataLoader's ``drop_last`` leaves out are dropped (named,
    never a problem).
    """
    n = len(drawn)
    length = next(iter(drawn.values())).length
    sets = {k: set(d.sampled) for k, d in drawn.items()}
    whole = set(range(length))
    seen, shared = read_and_shared(sets)
    missing = whole - seen
    batch_dropped = sum(len(set(d.sampled) - set(d.drawn)) for d in drawn.values())
    shares = " and ".join(str(len(s)) for _, s in sorted(sets.items()))
    who = f"streamers {' and '.join(map(str, sorted(drawn)))} of {n}"
    base = f"{who} draw {shares} of the {length} samples"
    dropped = (f"; {batch_dropped} drawn but dropped by the DataLoader's drop_last (each streamer's partial "
               f"last batch)" if batch_dropped else "")
    if n > 1 and all(s == whole for s in sets.values()):
        return SampleJudgement("replicated", f"sample-level: replicated ({base}: every sample on every streamer)",
                               [f"every one of the {length} samples is drawn by each of the {n} input workers "
                                f"(the sampler does not split them by streamer: each sample is trained {n} "
                                f"times per pass)"])
    padding = len(shared) < n and len({len(d.sampled) for d in drawn.values()}) == 1
    remainder = len(missing) < n
    if (not shared or padding) and remainder:
        extra = (f"; {len(missing)} left out: the sampler's drop_last remainder" if missing else "")
        extra += (f"; {len(shared)} drawn twice: the sampler's padding to equal shares" if shared else "")
        return SampleJudgement("sharded", f"sample-level: disjoint ({base}{extra}{dropped})")
    if shared and not padding:
        msg = (f"{len(shared)} of the {length} samples are drawn by more than one of the {n} input workers"
               + (f" and {len(missing)} by none" if missing else ""))
    else:
        msg = f"{len(missing)} of the {length} samples are drawn by none of the {n} input workers"
    return SampleJudgement("overlap", f"sample-level: overlap ({base}{dropped})", [msg])
