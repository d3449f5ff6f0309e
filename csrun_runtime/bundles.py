"""How many batches an input worker stacks into one element it sends (both frameworks: a tf.data
service element, or a data-plane bundle). Framework-neutral constants, read by
:mod:`csrun_runtime.tensorflow.service` / :mod:`csrun_runtime.tensorflow.worker` and
:mod:`csrun_runtime.pytorch.worker`.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["BUNDLE_TARGET_BYTES", "MAX_BUNDLE", "AUTOSCALE_MAX_BUNDLE", "map_nest"]

#: ``input_bundle: auto`` stacks batches into service elements of about this many bytes.
#: Measured on the 2-core test host (BENCHMARKS.md, ``ingest``): bytes/s through one
#: worker stream rise with the element size up to 1-2 MiB elements and fall beyond.
BUNDLE_TARGET_BYTES = 1 << 20
#: ``input_bundle: auto`` never stacks more batches than this into one element.
MAX_BUNDLE = 256
#: Under ``csrun_wse --autoscale``, ``input_bundle: auto`` stacks at most this many batches per
#: element (docs/AUTOSCALE.md): the autoscaler's windows count batches, and a smaller bundle
#: keeps what a paused stream still delivers small.
AUTOSCALE_MAX_BUNDLE = 16


def map_nest(fn: Callable[[Any], Any], nest: Any) -> Any:
    """``fn`` on every leaf of a nest of tuples, lists and dicts (``None`` stays ``None``): e.g. a
    batch given a bundle's leading axis of 1 is ``map_nest(lambda a: a[None], batch)``. Pure
    Python, for numpy arrays and tensors alike."""
    if isinstance(nest, tuple):
        return tuple(map_nest(fn, x) for x in nest)
    if isinstance(nest, list):
        return [map_nest(fn, x) for x in nest]
    if isinstance(nest, dict):
        return {k: map_nest(fn, v) for k, v in nest.items()}
    return None if nest is None else fn(nest)
