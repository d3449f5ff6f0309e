"""An input dataset made ready to serve, the same on both transports, in the chief's in-process
pipeline and in the analyzer's probes: ``B`` consecutive batches stacked into one element
(:func:`plan_bundle`, :func:`bundle_dataset`) and the pipeline held to ``C`` cores
(:func:`limit_threads`).

Every element costs a fixed round trip (on tf.data service one outstanding ``GetElement``
request per worker stream), which dominates small batches: they travel ``B`` at a time
(``Dataset.batch(B)`` on the worker) and the chief unstacks them
(:class:`csrun_runtime.tensorflow.sources.ChunkedSource`).

TensorFlow is imported inside the functions: importing this module stays light.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..bundles import BUNDLE_TARGET_BYTES, MAX_BUNDLE

if TYPE_CHECKING:  # annotations only: TensorFlow is imported inside the functions
    import tensorflow as tf

__all__ = ["BundlePlan", "batch_nbytes", "plan_bundle", "bundle_dataset", "limit_threads"]


@dataclass(frozen=True)
class BundlePlan:
    """How many batches one service element carries (see :func:`plan_bundle`).

    Attributes:
        bundle: batches per element (``1``: each element is one batch, no bundling).
        batch_bytes: bytes of one batch (every tensor's static size), ``None`` when a shape
            or dtype has no static size.
        setting: the ``runconfig.input_bundle`` value that chose it (``"auto"`` or an int).
        reason: one line saying why (for the logs and performance.json).
    """

    bundle: int
    batch_bytes: int | None
    setting: str | int
    reason: str

    def describe(self) -> dict[str, Any]:
        """The plan as a JSON-ready dict."""
        return {"batches_per_element": self.bundle, "batch_bytes": self.batch_bytes,
                "element_bytes": None if self.batch_bytes is None else self.batch_bytes * self.bundle,
                "setting": self.setting, "reason": self.reason}


def batch_nbytes(element_spec: Any) -> int | None:
    """Bytes of one element of ``element_spec`` (a batch): the sum over its dense tensors of
    elements × dtype size. ``None`` when a shape is not fully static, a dtype has no fixed
    size (string, variant) or a component is not a dense tensor (sparse, ragged): such
    elements cannot be stacked by ``Dataset.batch``. ``None`` labels count 0 bytes."""
    import tensorflow as tf

    total = 0
    for spec in tf.nest.flatten(element_spec):
        if spec is None or type(spec).__name__ == "NoneTensorSpec":
            continue
        if not isinstance(spec, tf.TensorSpec) or not spec.shape.is_fully_defined():
            return None
        if spec.dtype in (tf.string, tf.variant, tf.resource):
            return None
        total += int(spec.shape.num_elements()) * int(spec.dtype.size)
    return total


def plan_bundle(element_spec: Any, setting: str | int = "auto", max_batches: int | None = None) -> BundlePlan:
    """How many batches an input worker stacks into one tf.data service element.

    Every service element costs a round trip on its worker's stream (the tf.data service
    client keeps one ``GetElement`` request outstanding per worker), so small batches are
    sent ``B`` at a time (``Dataset.batch(B)``) and unstacked by the chief.

    Args:
        element_spec: ``element_spec`` of the training dataset (one batch per element).
        setting: ``runconfig.input_bundle``: ``"auto"`` — ``B = min(MAX_BUNDLE,
            max(1, BUNDLE_TARGET_BYTES // batch_bytes))``; an int ``N >= 1`` — exactly ``N``
            (``1`` turns bundling off).
        max_batches: with ``"auto"``, at most this many batches per element (an input
            worker passes the run's steps ÷ (4 × input workers), so that a short run still
            takes batches from every worker: the merge is first come, first served by
            element). ``None``: no such cap.

    Returns:
        the :class:`BundlePlan`. Bundling needs every tensor's shape and size to be static
        (``Dataset.batch`` stacks equal shapes only): otherwise ``bundle == 1`` whatever the
        setting, and ``reason`` says so.
    """
    nbytes = batch_nbytes(element_spec)
    if nbytes is None:
        return BundlePlan(1, None, setting, "off: the batch has a tensor without a static shape "
                                            "and size, which Dataset.batch cannot stack")
    if setting != "auto":
        n = int(setting)
        why = "off (runconfig.input_bundle = 1)" if n == 1 else f"runconfig.input_bundle = {n}"
        return BundlePlan(n, nbytes, setting, why)
    n = max(1, min(MAX_BUNDLE, BUNDLE_TARGET_BYTES // max(1, nbytes)))
    capped = max_batches is not None and n > max(1, max_batches)
    n = max(1, min(n, max_batches)) if max_batches is not None else n
    if capped:
        why = (f"auto: {n} batches of {_mb(nbytes)} per element, capped by the run's length "
               f"(at most a quarter of each input worker's share of the steps)")
    elif n == 1:
        why = (f"off: a batch ({_mb(nbytes)}) is already at least half of the "
               f"{_mb(BUNDLE_TARGET_BYTES)} element size bundling aims at")
    else:
        why = (f"auto: {n} batches of {_mb(nbytes)} per element ({_mb(n * nbytes)}, aiming at "
               f"{_mb(BUNDLE_TARGET_BYTES)})")
    return BundlePlan(n, nbytes, setting, why)


def _mb(nbytes: int) -> str:
    if nbytes >= 1 << 20:
        return f"{nbytes / (1 << 20):.2f} MiB"
    return f"{nbytes / 1024:.1f} KiB"


def bundle_dataset(ds: Any, bundle: int) -> Any:
    """``ds`` with ``bundle`` consecutive batches stacked into each element (a new leading
    dimension of size ``bundle``; the dataset is infinite, so nothing is dropped); ``ds``
    itself when ``bundle == 1``."""
    if bundle <= 1:
        return ds
    return ds.batch(int(bundle), drop_remainder=True)


def limit_threads(ds: tf.data.Dataset, cpus_per_task: int | None) -> tf.data.Dataset:
    """Hold a dataset to ``cpus_per_task`` cores: a tf.data private threadpool of that size
    and ``max_intra_op_parallelism = 1`` (each op single-threaded; the threadpool gives the
    parallelism), each unless the input_fn set it itself. Unchanged when ``cpus_per_task``
    is None. The analyzer's probes build their datasets with this same function, so a
    probe measures the pipeline the input workers run."""
    if not cpus_per_task:
        return ds
    import tensorflow as tf

    cur = ds.options().threading
    opts = tf.data.Options()
    changed = False
    if cur.private_threadpool_size in (None, 0):
        opts.threading.private_threadpool_size = int(cpus_per_task)
        changed = True
    if cur.max_intra_op_parallelism is None:
        opts.threading.max_intra_op_parallelism = 1
        changed = True
    return ds.with_options(opts) if changed else ds
