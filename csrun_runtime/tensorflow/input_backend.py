"""TensorFlow's :class:`csrun_runtime.input_backend.InputBackend`: the analyzer's probes and
``verify``'s drain build a TensorFlow ``input_fn`` as input worker i of W through it (the core
harness in :mod:`csrun_runtime.input_backend` holds the Protocol and :class:`BuiltInput`).
TensorFlow is imported inside the functions."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from ..input_backend import BuiltInput, InputBuildError, samples_in
from ..usererror import describe
from .facts import FACTS

__all__ = ["INPUT_BACKEND", "TFInputBackend", "describe_error", "tf_passes", "tf_samples_and_bytes"]


class TFInputBackend:
    """:class:`InputBackend` for a TensorFlow ``input_fn`` (see the module docstring).

    ``input_fn``: ``input_fn(params) -> tf.data.Dataset``; ``params``: the resolved params
    (:class:`csrun_runtime.capture.CapturedRun`'s, not per-worker: the worker's are derived).
    """

    framework = FACTS.name

    def __init__(self, input_fn: Callable[..., Any], params: dict[str, Any]):
        self.input_fn, self.params = input_fn, params

    def build(self, worker_index: int, num_input_workers: int, cpus: int, *,
              dataloader_workers: int | None = None, prefetch_factor: int | None = None) -> BuiltInput:
        """See :meth:`InputBackend.build`; the dataset of ``(features, labels)`` elements,
        ``private_threadpool_size = cpus``. Raises :class:`InputBuildError` with the
        contract's violations, or what ``input_fn`` raises."""
        ds = self.dataset(worker_index, num_input_workers, cpus)
        import tensorflow as tf

        restarts = [0]
        return BuiltInput(batches=tf_passes(ds, restarts), measure=lambda el: tf_samples_and_bytes(el, tf.nest.flatten),
                          info={"framework": self.framework, "cpus": int(cpus)}, restarts=restarts)

    def dataset(self, worker_index: int, num_input_workers: int, cpus: int) -> Any:
        """The ``tf.data.Dataset`` :meth:`build` iterates (the ingest probes serve it).
        Raises :class:`InputBuildError` with the contract's violations, or what ``input_fn``
        raises."""
        from . import bundling, contract, pipeline

        ds = pipeline.build_worker_input(self.input_fn, self.params, worker_index, num_input_workers).dataset
        rep = contract.check_dataset(ds, "train")
        if rep.violations:
            raise InputBuildError("; ".join(rep.violations))
        return bundling.limit_threads(ds, cpus)


def tf_passes(ds: Any, restarts: list[int]) -> Iterator[Any]:
    """``ds``'s elements pass after pass; RuntimeError when 1000 passes yield nothing."""
    got = 0
    while True:
        for el in ds:
            got += 1
            yield el
        restarts[0] += 1
        if got == 0 and restarts[0] > 1000:
            raise RuntimeError("input_fn's dataset yields no element")


def tf_samples_and_bytes(element: Any, flatten: Callable) -> tuple[int, int]:
    """``(samples, bytes)`` of one tf.data element (:func:`samples_in` and the summed size of
    its tensors); ``flatten`` is ``tf.nest.flatten``."""
    flat = flatten(element)
    if not flat:
        return 1, 0
    nbytes = 0
    for t in flat:
        ne = t.shape.num_elements()
        nbytes += (ne or 0) * (t.dtype.size or 1)
    return samples_in(flat), nbytes


def describe_error(error: BaseException, what: str) -> str:
    """The lines an input worker shows for ``error`` raised by ``input_fn`` or its pipeline (``usererror.describe``)."""
    return describe(error, what, generated=FACTS.generated_files)


#: This backend's :class:`csrun_runtime.input_backend.InputBackend` (:class:`csrun_runtime.backend.InputBackendModule`).
INPUT_BACKEND = TFInputBackend
