"""A TensorFlow input worker's stream from a position (docs/RESILIENCE.md "The input position";
:mod:`csrun_runtime.position`), for the tf.data service transport.

A tf.data service dispatcher keeps the graph its first worker registered, and a replacement's
server runs that graph (csrun_runtime/tensorflow/worker.py), so the position cannot be a
constant of the graph: :func:`positioned` reads it when an iterator of the dataset is made, on the
worker that makes it (a ``tf.py_function``, which the service runs in that worker's process:
attempt 0 reads the chief's ``positions.json``, a replacement its ``resume.json``), skips that
many batches (``Dataset.skip``: read and discarded; a tf.data service iterator cannot be saved),
and tags each bundle with its batches' stream indices, which the chief's merge checks.

TensorFlow is imported inside the functions.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ..position import TAG, report_resumed, wait_position
from ..rendezvous import Rendezvous

__all__ = ["positioned", "stream_hooks", "resume_at", "SKIPPED"]

log = logging.getLogger("csrun.runtime")

#: How the stream got to its position (the chief's resume line).
SKIPPED = "read and discarded {n} batch(es) (Dataset.skip: a tf.data service iterator cannot be saved)"


def stream_hooks(rdv: Rendezvous, index: int, attempt: int, timeout: float
                 ) -> tuple[Callable[..., int], Callable[[dict[str, Any]], None]]:
    """Input worker ``index``'s (``attempt``) two hooks around its stream: ``position(check=...)``,
    where it starts (:func:`csrun_runtime.position.wait_position`, at most ``timeout`` s), and
    ``resumed(info)``, where it got to and how (told to the chief, which logs it, and logged)."""

    def position(check: Callable[[], None] = lambda: None) -> int:
        return wait_position(rdv, index, attempt, check, timeout)

    def resumed(info: dict[str, Any]) -> None:
        report_resumed(rdv, index, attempt, info["batches"], info["seconds"], info["how"])
        log.info("streaming from batch %d of this worker's stream: %s in %.3f s", info["batches"], info["how"],
                 info["seconds"])
    return position, resumed


def positioned(ds: Any, bundle: int, read_position: Callable[[], int],
               resumed: Callable[[dict[str, Any]], None] = lambda info: None) -> Any:
    """``ds`` (batches) from batch ``read_position()`` on, read when an iterator is made, in
    bundles of ``bundle`` (:func:`.service.bundle_dataset`), each element ``{TAG: int64[bundle],
    "batch": the bundle}``. ``resumed(info)`` is told where and in how long at the first bundle
    of each iterator (``info`` as :func:`csrun_runtime.position.report_resumed` takes it)."""
    import tensorflow as tf

    from .bundling import bundle_dataset

    started: list[float] = [0.0]

    def start() -> np.int64:
        n = int(read_position())
        started[0] = time.monotonic()
        return np.int64(n)

    def told(n: Any) -> np.int64:
        n = int(n)
        resumed({"batches": n, "pass": None, "batch_in_pass": None, "seconds": time.monotonic() - started[0],
                 "how": SKIPPED.format(n=f"{n:,}") if n else "from its beginning"})
        return np.int64(0)

    def tagged(n: Any, k: Any, el: Any) -> Any:
        first = n + k * bundle
        said = tf.cond(tf.equal(k, 0), lambda: tf.py_function(told, [n], tf.int64), lambda: tf.constant(0, tf.int64))
        with tf.control_dependencies([said]):
            idx = first + tf.range(bundle, dtype=tf.int64)
        return {TAG: idx, "batch": el}

    def from_position(n: Any) -> Any:
        n = tf.reshape(n, [])
        body = bundle_dataset(ds.skip(n), bundle).enumerate()
        return body.map(lambda k, el: tagged(n, k, el))

    begin = tf.data.Dataset.range(1).map(lambda _: tf.py_function(start, [], tf.int64))
    return begin.flat_map(from_position)


def resume_at(rdv: Rendezvous, index: int, attempt: int, timeout: float) -> Callable[[Any, int], Any]:
    """``make(ds, bundle)``: input worker ``index``'s (``attempt``) bundles of ``ds`` from its
    stream's position (:func:`positioned` with :func:`stream_hooks`), for the tf.data service."""
    position, resumed = stream_hooks(rdv, index, attempt, timeout)
    return lambda ds, bundle: positioned(ds, bundle, position, resumed)
