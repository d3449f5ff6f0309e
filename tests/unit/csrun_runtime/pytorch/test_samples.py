"""csrun_runtime/pytorch/samples.py with real torch DataLoaders: the dataset indices each streamer
draws in its first pass (before and after the DataLoader's ``drop_last``), why they cannot be
listed for an IterableDataset, and the judgement of streamers 0 and 1 of 2: split by
``DistributedSampler``, every sample on every streamer, or the same half twice."""
from __future__ import annotations

import pytest

from csrun_runtime.pytorch.samples import Drawn, drawn_indices, judge

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset  # noqa: E402

DATA = list(range(10))


def loader(rank: int | None, drop_last: bool = False) -> DataLoader:
    sampler = None if rank is None else DistributedSampler(DATA, num_replicas=2, rank=rank, shuffle=True, seed=3)
    return DataLoader(DATA, batch_size=2, sampler=sampler, drop_last=drop_last)


def test_a_distributed_sampler_splits_the_samples():
    draws = {r: drawn_indices(loader(r)) for r in (0, 1)}
    assert all(isinstance(d, Drawn) and d.length == 10 and d.sampler == "DistributedSampler" for d in draws.values())
    assert set(draws[0].drawn).isdisjoint(draws[1].drawn) and len(draws[0].drawn) == 5
    verdict = judge(draws)
    assert verdict.verdict == "sharded" and not verdict.problems
    assert verdict.line.startswith("sample-level: disjoint (streamers 0 and 1 of 2 draw 5 and 5 of the 10 samples")


def test_the_drop_last_of_the_dataloader_is_dropped_not_unread():
    d = drawn_indices(loader(0, drop_last=True))
    assert len(d.sampled) == 5 and len(d.drawn) == 4  # its partial last batch
    verdict = judge({0: d, 1: drawn_indices(loader(1, drop_last=True))})
    assert verdict.verdict == "sharded" and "2 drawn but dropped by the DataLoader's drop_last" in verdict.line


def test_every_sample_on_every_streamer_is_replicated_and_the_same_half_an_overlap():
    same = {r: drawn_indices(loader(None)) for r in (0, 1)}
    replicated = judge(same)
    assert replicated.verdict == "replicated" and replicated.problems
    half = {r: drawn_indices(loader(0)) for r in (0, 1)}
    overlap = judge(half)
    assert overlap.verdict == "overlap" and overlap.problems[0].startswith("5 of the 10 samples are drawn by more than")


def test_an_iterable_dataset_has_no_indices_to_list():
    class Stream(IterableDataset):
        def __iter__(self):
            return iter(DATA)

    assert drawn_indices(DataLoader(Stream(), batch_size=2)) == "an IterableDataset (Stream) has no indices to list"
