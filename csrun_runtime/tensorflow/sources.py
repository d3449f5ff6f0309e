"""The chief's sources of training batches, their common part: the training loop takes *chunks*
(:class:`Chunk`: up to all the batches of one element, in its worker's order) and trains several
steps per call on them; :meth:`ChunkedSource.get` still hands out single batches.
:class:`ChunkedSource` unstacks the elements of the input workers' streams (tf.data service's
:class:`csrun_runtime.tensorflow.service.ServiceSource`, the data plane's
:class:`csrun_runtime.tensorflow.remote.DataplaneSource`); without input workers the chief
iterates the pipeline itself (:class:`LocalSource`), bundled the same way
(:mod:`csrun_runtime.tensorflow.bundling`).

TensorFlow is imported inside the functions: importing this module stays light.
"""
from __future__ import annotations

import queue
from dataclasses import dataclass
from typing import Any, Protocol

from .bundling import BundlePlan, bundle_dataset
from .deviceprefetch import DevicePrefetch, PrefetchPlan, prefetch_in_process, to_device

__all__ = ["BatchSource", "Chunk", "ChunkedSource", "LocalSource", "Pending", "map_structure", "steps_in"]


@dataclass(frozen=True)
class Chunk:
    """Consecutive training batches of one input worker, for one training call: batches
    ``offset .. offset + steps - 1`` of ``batches``.

    Attributes:
        worker: the input worker's index (0 for the in-process pipeline).
        batches: the service element they come from: the structure of one batch
            (``(features, labels)``, ``labels`` may be ``None``) whose every tensor has a
            leading dimension of the element's batches (1 for an unbundled element). Passed
            whole, never sliced: a training call reads its batches in place, and its
            compiled loop sees one shape per element size.
        offset: index of the chunk's first batch in ``batches``.
        steps: how many batches (training steps) the chunk holds, ``>= 1``.
    """

    worker: int
    batches: Any
    offset: int
    steps: int


class BatchSource(Protocol):
    """Where the chief's training batches come from (:class:`~csrun_runtime.tensorflow.service.ServiceSource`,
    :class:`LocalSource`).

    ``get_chunk(max_steps, timeout, what)`` returns a :class:`Chunk` of ``1..max_steps``
    batches of one worker, in that worker's order; ``get(timeout, what)`` returns one batch as
    ``(worker_index, (features, labels))``. Both raise :class:`~csrun_runtime.streams.InputStalled` after ``timeout``
    seconds without a batch (``what`` names the setting in the message). ``describe()`` gives
    the per-worker batch counts for performance.json (batches handed out, in batches).
    """

    def get_chunk(self, max_steps: int, timeout: float, what: str = ...) -> Chunk: ...

    def get(self, timeout: float, what: str = ...) -> tuple[int, Any]: ...

    def describe(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


def steps_in(element: Any) -> int:
    """Batches in a bundled element: its first tensor's leading dimension. Raises ValueError
    for an element without tensors."""
    import tensorflow as tf

    for t in tf.nest.flatten(element):
        if t is not None:
            return int(t.shape[0])
    raise ValueError("an element without tensors")


def map_structure(fn: Any, element: Any) -> Any:
    """``fn`` on every tensor of ``element`` (a nest of tensors; ``None`` leaves stay ``None``),
    with ``tf.nest.map_structure``: e.g. batch ``a`` of a bundle is ``map_structure(lambda t: t[a], el)``."""
    import tensorflow as tf

    return tf.nest.map_structure(lambda t: None if t is None else fn(t), element)


@dataclass
class Pending:
    """The element the chief is handing out, and how much of it is left."""

    worker: int
    element: Any
    bundled: bool
    size: int
    offset: int = 0


class ChunkedSource:
    """Hands out the elements of input streams as chunks or single batches (the bundling's
    other end). Subclasses give ``_next_element(timeout, what) -> (worker, element)`` and
    ``_bundles`` (batches per element, by worker). Counts are batches handed out.

    A streamed subclass also gives ``_pull(wait) -> item`` (its next raw item within ``wait``
    seconds, raising ``queue.Empty`` or ``TimeoutError`` when none came) and ``_stage(item,
    device) -> item`` (the item's tensors on ``device``), and reads its items through
    :meth:`_next_item`: :meth:`start_prefetch` then puts a
    :class:`~csrun_runtime.tensorflow.deviceprefetch.DevicePrefetch` thread between the two
    (on a GPU; without one nothing changes)."""

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}
        self._bundles: dict[int, int] = {}
        self._pending: Pending | None = None
        #: the device prefetch thread (:meth:`start_prefetch`), None when off
        self.prefetch: DevicePrefetch | None = None

    def _next_element(self, timeout: float, what: str) -> tuple[Any, ...]:
        raise NotImplementedError

    def _pull(self, wait: float) -> Any:
        raise NotImplementedError

    def _stage(self, item: Any, device: str) -> Any:
        raise NotImplementedError

    def _next_item(self, wait: float) -> Any:
        """The next raw item (:meth:`_pull`'s; on device when prefetching); queue.Empty/TimeoutError after wait s."""
        return self._pull(wait) if self.prefetch is None else self.prefetch.get(wait)

    def start_prefetch(self, plan: PrefetchPlan) -> None:
        """With ``plan.on``: from now on a thread pulls this source's items (its only reader), copies them to
        ``plan.device`` and keeps ``plan.depth`` of them ahead
        (:class:`~csrun_runtime.tensorflow.deviceprefetch.DevicePrefetch`). Off: nothing changes."""
        if plan.on and self.prefetch is None:
            device = str(plan.device)
            self.prefetch = DevicePrefetch(self._pull, lambda item: self._stage(item, device), plan.depth)

    def stop_prefetch(self) -> dict[str, Any]:
        """Stop the prefetch thread (staged items dropped); returns ``{"device_prefetch_stats":
        {...}}`` for :meth:`describe` (elements, bytes, the loop's waits, the copies' seconds),
        ``{}`` when there was none."""
        if self.prefetch is None:
            return {}
        self.prefetch.stop()
        return {"device_prefetch_stats": self.prefetch.stats.describe()}

    def _fill(self, timeout: float, what: str) -> Pending:
        if self._pending is None:
            i, el = self._next_element(timeout, what)
            bundled = self._bundles.get(i, 1) > 1
            self._pending = Pending(i, el, bundled, steps_in(el) if bundled else 1)
        return self._pending

    def _took(self, p: Pending, m: int) -> None:
        p.offset += m
        if p.offset >= p.size:
            self._pending = None
        self.counts[p.worker] = self.counts.get(p.worker, 0) + m

    def available(self, timeout: float, what: str = "runconfig.input_timeout_secs") -> int:
        """Batches the next :meth:`get_chunk` hands out at once (the current element's rest, else the next one's,
        waited for; what ranks agree on). Raises :class:`~csrun_runtime.streams.InputStalled` (see the subclass)."""
        p = self._fill(timeout, what)
        return p.size - p.offset

    def get_chunk(self, max_steps: int, timeout: float,
                  what: str = "runconfig.input_timeout_secs") -> Chunk:
        """Up to ``max_steps`` consecutive batches of one worker (see :class:`Chunk`): the rest
        of the element being handed out, else of the next element to arrive. Raises
        :class:`~csrun_runtime.streams.InputStalled` (see the subclass)."""
        import tensorflow as tf

        p = self._fill(timeout, what)
        m = min(max(1, int(max_steps)), p.size - p.offset)
        batches = p.element if p.bundled else map_structure(lambda t: tf.expand_dims(t, 0), p.element)
        chunk = Chunk(p.worker, batches, p.offset, m)
        self._took(p, m)
        return chunk

    def get(self, timeout: float, what: str = "runconfig.input_timeout_secs") -> tuple[int, Any]:
        """One batch: ``(worker_index, (features, labels))``. Raises :class:`~csrun_runtime.streams.InputStalled`."""
        p = self._fill(timeout, what)
        if p.bundled:
            a = p.offset
            batch = map_structure(lambda t: t[a], p.element)
        else:
            batch = p.element
        self._took(p, 1)
        return p.worker, batch


class LocalSource(ChunkedSource):
    """Batches from a dataset iterated in-process (single-process mode, zero workers).

    Args:
        ds: the training dataset (one batch per element).
        plan: bundling of the in-process pipeline (``Dataset.batch(plan.bundle)``), so that the
            training loop gets chunks of several steps as from input workers; ``None``: none.
        prefetch: the chief's device prefetch: when on, ``prefetch_to_device`` ends the dataset,
            or, for a dataset TensorFlow's ``prefetch_to_device`` refuses, a
            :class:`~csrun_runtime.tensorflow.deviceprefetch.DevicePrefetch` thread iterates it
            (:func:`csrun_runtime.tensorflow.deviceprefetch.prefetch_in_process`); ``None`` or off:
            none. ``prefetch_plan`` is the plan as applied.

    ``get_chunk`` / ``get`` return worker index 0; they block without a timeout (the pipeline
    runs in this process, so there is nothing remote to wait for).
    """

    def __init__(self, ds: Any, plan: BundlePlan | None = None, prefetch: PrefetchPlan | None = None):
        super().__init__()
        self.plan = plan
        bundle = plan.bundle if plan is not None else 1
        self._bundles = {0: bundle}
        ds = bundle_dataset(ds, bundle)
        self.prefetch_plan = prefetch
        if prefetch is not None:
            ds, self.prefetch_plan = prefetch_in_process(ds, prefetch)
        self._it = iter(ds)
        self.counts = {0: 0}
        if self.prefetch_plan is not None and self.prefetch_plan.how == "thread":
            self.start_prefetch(self.prefetch_plan)

    def _next_element(self, timeout: float, what: str) -> tuple[int, Any]:
        if self.prefetch is None:
            return 0, next(self._it)
        while True:  # no timeout, as without the thread; the input's end comes as StopIteration
            try:
                return 0, self.prefetch.get(0.5)
            except queue.Empty:
                continue

    def _pull(self, wait: float) -> Any:
        return next(self._it)  # the in-process pipeline: no wait of its own

    def _stage(self, item: Any, device: str) -> Any:
        return to_device(item, device)

    def describe(self) -> dict[str, Any]:
        """Batches handed out and batches per element (performance.json); with a device prefetch
        thread its figures (the thread stopped)."""
        return {"num_workers": 0, "batches_per_worker": {"in-process": self.counts[0]},
                "batches_per_element": {"in-process": self._bundles[0]}, **self.stop_prefetch()}

    def close(self) -> None:
        """Stop the device prefetch thread, if any."""
        self.stop_prefetch()
