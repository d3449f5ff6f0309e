"""An input worker's DataLoader resumed at a position of its stream
(csrun_runtime/pytorch/resume.py): the same batches as the uninterrupted stream from there, for
the samplers csrun's users have, with and without DataLoader worker processes, and no sample
loaded to get there."""
from __future__ import annotations

import itertools

import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import (  # noqa: E402
    DataLoader,
    Dataset,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
)

from csrun_runtime.pytorch.contract import epochs  # noqa: E402
from csrun_runtime.pytorch.resume import FROM_START, SAMPLER, epochs_from  # noqa: E402

N, BATCH = 97, 4


class Ids(Dataset):
    """Sample i is i; every sample loaded is counted (in this process)."""

    loaded = 0

    def __len__(self):
        return N

    def __getitem__(self, i):
        Ids.loaded += 1
        return torch.tensor(i)


class Stream(IterableDataset):
    def __iter__(self):
        return iter(torch.arange(30))


def _loader(kind: str, workers: int = 0, persistent: bool = False) -> DataLoader:
    torch.manual_seed(5)  # what the input worker does before the data function (its torch seed)
    ds = Ids()
    extra = {"num_workers": workers, "persistent_workers": persistent} if workers else {}
    if kind == "distributed":
        return DataLoader(ds, batch_size=BATCH, drop_last=True, sampler=DistributedSampler(
            ds, num_replicas=3, rank=1, seed=11, drop_last=True), **extra)
    if kind == "random":  # draws its permutation's seed from torch's RNG each pass
        return DataLoader(ds, batch_size=BATCH, drop_last=True, sampler=RandomSampler(ds), **extra)
    return DataLoader(ds, batch_size=BATCH, drop_last=True, shuffle=False, **extra)


def _ids(batches, n):
    return [b.tolist() for b in itertools.islice(batches, n)]


@pytest.mark.parametrize("kind, workers, persistent", [
    ("distributed", 0, False), ("random", 0, False), ("sequential", 0, False),
    ("distributed", 2, True), ("random", 2, False),
])
def test_a_resumed_stream_is_the_uninterrupted_one_from_its_position(kind, workers, persistent):
    per_pass = len(_loader(kind))
    whole = _ids(epochs(_loader(kind, workers, persistent)), 5 * per_pass)
    for start in (0, 3, per_pass, per_pass + 5, 2 * per_pass + per_pass - 1):
        told = []
        got = _ids(epochs_from(_loader(kind, workers, persistent), start, told.append), per_pass + 2)
        assert got == whole[start:start + per_pass + 2], (kind, start)
        (info,) = told
        assert (info["batches"], info["pass"], info["batch_in_pass"]) == (start, *divmod(start, per_pass))
        assert info["how"] == (SAMPLER if start else FROM_START) and info["seconds"] >= 0


def test_the_fast_forward_loads_no_sample():
    loader = _loader("distributed")
    Ids.loaded = 0
    start = 3 * len(loader) + 2
    _ids(epochs_from(loader, start), 2)
    assert Ids.loaded == 2 * BATCH  # the two batches taken, nothing of the 3 passes and 2 batches skipped
    assert type(loader.batch_sampler.sampler) is DistributedSampler  # the loader's own again


def test_an_iterable_dataset_is_read_up_to_its_position_and_says_so():
    told = []
    got = _ids(epochs_from(DataLoader(Stream(), batch_size=4, drop_last=True), 9, told.append), 3)
    assert got == [[8, 9, 10, 11], [12, 13, 14, 15], [16, 17, 18, 19]]  # 7 batches a pass: pass 1, batch 2
    assert told[0]["how"].startswith("read and discarded 9 batch(es): an IterableDataset")


class Counting(IterableDataset):
    """Ids 0, 1, 2, ... for ever; its state is the next id."""

    def __init__(self):
        self.pos = 0

    def state_dict(self):
        return {"pos": self.pos}

    def load_state_dict(self, state):
        self.pos = state["pos"]

    def __iter__(self):
        while True:
            self.pos += 1
            yield torch.tensor(self.pos - 1)


def test_a_stateful_iterable_is_restored_and_only_the_batches_after_its_state_read():
    told = []
    loader = DataLoader(Counting(), batch_size=2, drop_last=True)
    got = _ids(epochs_from(loader, 10, told.append, {"at": 8, "state": {"pos": 16}}), 2)
    assert got == [[20, 21], [22, 23]]
    assert told[0]["how"] == "read and discarded 2 batch(es): restored its state_dict at batch 8"
    workers = DataLoader(Counting(), batch_size=2, drop_last=True, num_workers=1)  # its state is in that process
    told.clear()
    assert _ids(epochs_from(workers, 3, told.append, {"at": 2, "state": {"pos": 4}}), 1) == [[6, 7]]
    assert "its state lives in the DataLoader's worker processes" in told[0]["how"]


def test_each_bundle_carries_the_streams_state_before_its_first_batch():
    from csrun_runtime import position
    from csrun_runtime.pytorch.worker import send_batches

    class Sender:
        window_batches = None

        def __init__(self):
            self.sent = []

        def send_bundle(self, nest, n, timeout=None):
            self.sent.append(nest)

    ds, s = Counting(), Sender()
    send_batches(s, itertools.islice(epochs(DataLoader(ds, batch_size=2, drop_last=True)), 7), cap=3, first=40,
                 state_of=ds.state_dict)
    assert [(position.untag(n)[0], position.state_of(n)) for n in s.sent] == [
        (40, None), (43, {"pos": 6}), (46, {"pos": 12})]  # none before the first: maybe not restored yet
    assert [b.reshape(-1).tolist() for b in (position.untag(n)[1] for n in s.sent)][2] == [12, 13]
