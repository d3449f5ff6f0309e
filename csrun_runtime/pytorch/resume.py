"""An input worker's DataLoader from a position of its stream (docs/RESILIENCE.md "The input
position"): batch ``n`` of the stream, counted from the start of pass 0 (:mod:`csrun_runtime.position`).

- **Map-style** data (any sampler: ``DistributedSampler``, a Model Zoo ``ShardedSampler``,
  ``RandomSampler``; DataLoader worker processes or none): pass ``p = n // len(loader)``, batch
  ``k = n % len(loader)``. The passes before ``p`` are replayed at the sampler only
  (``set_epoch``, the sampler iterated, the DataLoader's seed drawn as each pass's iterator
  draws it: a sampler drawing from torch's RNG gets the same draws), and pass ``p`` starts with
  its first ``k`` batches of indices skipped inside the DataLoader's own iteration (the batch
  sampler wrapped for that pass), so no sample is loaded. torch's DataLoader has no
  ``state_dict`` (pytorch#166732); why not torchdata's ``StatefulDataLoader``: docs/DESIGN.md.
- **An IterableDataset with ``state_dict`` / ``load_state_dict``** iterated in the worker's
  process (DataLoader ``num_workers`` 0): the worker sends its state before each bundle, the
  chief commits the last one at or before the trained position, and a resume restores it and
  reads the few batches from there (fewer than a bundle).
- **Any other IterableDataset**: its batches are read and discarded (the cost is said).

torch is imported inside the functions.
"""
from __future__ import annotations

import collections
import itertools
import time
from collections.abc import Callable, Generator, Iterator, Mapping
from typing import Any

from .contract import ContractError

__all__ = ["epochs_from", "stateful", "SAMPLER", "BY_READING", "FROM_START"]

#: How a map-style stream is fast-forwarded (the chief's resume line says it).
SAMPLER = "skipped at the sampler, no sample read"
#: A stream at its beginning.
FROM_START = "from its beginning"
#: How any other stream is (with the reason).
BY_READING = "read and discarded {n} batch(es): {why}"


class _Skip:
    """A (batch) sampler whose next iteration starts ``k`` items in, and later ones at the start
    (a DataLoader iterator with persistent worker processes keeps the sampler it was made with);
    ``seconds`` records how long those ``k`` took. Lazy: the skip happens at the first item
    asked for, as the DataLoader's iterator asks (after it drew its seed), so the sampler's own
    draws come in the same order."""

    def __init__(self, sampler: Any, k: int):
        self.sampler, self.k, self.seconds = sampler, int(k), 0.0

    def __iter__(self) -> Iterator[Any]:
        k, self.k = self.k, 0
        t = time.monotonic()
        it = iter(self.sampler)
        collections.deque(itertools.islice(it, k), maxlen=0)  # consumed at C speed
        self.seconds += time.monotonic() - t
        yield from it

    def __len__(self) -> int:
        return max(0, len(self.sampler) - self.k)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sampler, name)


def _index_attr(loader: Any) -> str:
    """The DataLoader attribute its iterator draws indices from (torch's ``_index_sampler``)."""
    return "batch_sampler" if loader.batch_sampler is not None else "sampler"


def _skip_at(loader: Any, k: int) -> tuple[Any, str, int]:
    """Where to skip ``k`` batches of ``loader``'s next pass: ``(object, attribute, items)``. With
    torch's own ``BatchSampler``, ``k × batch_size`` indices of its sampler (skipped at C speed,
    no batch list made); else ``k`` items of the (batch) sampler the DataLoader iterates."""
    from torch.utils.data import BatchSampler

    bs = loader.batch_sampler
    if type(bs) is BatchSampler and getattr(bs, "sampler", None) is not None:
        return bs, "sampler", k * int(bs.batch_size)
    return loader, _index_attr(loader), k


def _set_epoch(loader: Any, epoch: int) -> None:
    for s in (getattr(loader, "sampler", None), getattr(getattr(loader, "batch_sampler", None), "sampler", None)):
        if s is not None and callable(getattr(s, "set_epoch", None)):
            s.set_epoch(epoch)


def _draws_seed(loader: Any, first: bool) -> bool:
    """Whether a pass's iteration of ``loader`` draws the DataLoader's base seed (persistent workers: first only)."""
    return first or not (loader.persistent_workers and loader.num_workers > 0)


def _replay(loader: Any, passes: int) -> None:
    """What ``passes`` whole passes of ``loader`` draw and advance, without a sample loaded:
    the base seed, ``set_epoch`` and the index sampler iterated to its end."""
    import torch

    for e in range(passes):
        _set_epoch(loader, e)
        if _draws_seed(loader, e == 0):
            torch.empty((), dtype=torch.int64).random_(generator=loader.generator)
        for _ in getattr(loader, _index_attr(loader)):
            pass


def stateful(loader: Any) -> bool:
    """Whether ``loader``'s stream has a state csrun can take and restore: an ``IterableDataset``
    with ``state_dict`` and ``load_state_dict``, iterated in this process (``num_workers`` 0)."""
    from torch.utils.data import IterableDataset

    ds = loader.dataset
    return (isinstance(ds, IterableDataset) and not loader.num_workers and callable(getattr(ds, "state_dict", None))
            and callable(getattr(ds, "load_state_dict", None)))


def epochs_from(loader: Any, start: int, on_resumed: Callable[[dict[str, Any]], None] = lambda info: None,
                state: Mapping[str, Any] | None = None) -> Generator[Any, None, None]:
    """``loader``'s batches pass after pass for ever (as :func:`.contract.epochs`) from batch
    ``start`` of that endless stream. ``state``: ``{"at": n, "state": ...}``, the dataset's
    ``state_dict()`` before batch ``n <= start`` of the stream (a :func:`stateful` loader's: it is
    restored, and only the batches from ``n`` read). Once the first batch is at hand,
    ``on_resumed(info)`` gets ``{"batches", "pass", "batch_in_pass", "seconds", "how"}``
    (``pass`` None without passes).

    Raises:
        ContractError: a pass yielded no batch.
    """
    from torch.utils.data import IterableDataset

    if isinstance(loader.dataset, IterableDataset):
        if state is not None and stateful(loader) and int(state["at"]) <= start:
            t0 = time.monotonic()
            loader.dataset.load_state_dict(state["state"])  # type: ignore[attr-defined]  # stateful()
            yield from _by_reading(loader, start, on_resumed, f"restored its state_dict at batch {int(state['at'])}",
                                   skip=start - int(state["at"]), t0=t0)
            return
        why = ("an IterableDataset without state_dict" if not callable(getattr(loader.dataset, "state_dict", None))
               else "its state lives in the DataLoader's worker processes" if loader.num_workers
               else "an IterableDataset with no state at or before this position")
        yield from _by_reading(loader, start, on_resumed, why)
        return
    t0 = time.monotonic()
    per_pass = len(loader)
    if per_pass <= 0:
        raise ContractError("train_input: the DataLoader yields no batch (a dataset smaller than one batch with "
                            "drop_last, or an empty shard)")
    p, k = divmod(int(start), per_pass)
    _replay(loader, p)
    replayed = time.monotonic() - t0
    epoch, told = p, False
    while True:
        _set_epoch(loader, epoch)
        owner, attr, items = _skip_at(loader, k)
        original, skip = getattr(owner, attr), None
        if epoch == p and k:
            skip = _Skip(original, items)
            object.__setattr__(owner, attr, skip)  # DataLoader refuses a new sampler once made
        try:
            for batch in loader:
                if not told:
                    told = True
                    on_resumed({"batches": int(start), "pass": p, "batch_in_pass": k,
                                "how": SAMPLER if start else FROM_START,
                                "seconds": replayed + (skip.seconds if skip is not None else 0.0)})
                yield batch
        finally:
            if skip is not None:
                object.__setattr__(owner, attr, original)
        epoch += 1


def _by_reading(loader: Any, start: int, on_resumed: Callable[[dict[str, Any]], None], why: str,
                skip: int | None = None, t0: float | None = None) -> Iterator[Any]:
    """:func:`.contract.epochs` with its first ``skip`` (default ``start``) batches read and
    discarded: batch ``start`` of the stream comes first."""
    from .contract import epochs

    t0 = time.monotonic() if t0 is None else t0
    skip = int(start) if skip is None else int(skip)
    it = epochs(loader)
    for _ in itertools.islice(it, skip):
        pass
    how = (BY_READING.format(n=f"{skip:,}", why=why) if skip or skip != start else FROM_START)
    on_resumed({"batches": int(start), "pass": None, "batch_in_pass": None, "seconds": time.monotonic() - t0,
                "how": how})
    yield from it
