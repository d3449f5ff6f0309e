"""The TensorFlow chief's prefetch to the device (issue 31, item 2: the principle of the PyTorch
chief's device feed, :mod:`csrun_runtime.pytorch.devicefeed`, on the TensorFlow side).

When TensorFlow sees a GPU (``tf.config.list_logical_devices("GPU")`` not empty), the
elements the training loop takes from its source (:class:`csrun_runtime.tensorflow.service.ChunkedSource`:
one received element, a bundle of batches, per chunk) are already on the GPU, and
``runconfig.device_prefetch`` of them (elements, not batches) are staged there ahead of the step:

- the in-process pipeline (:class:`~csrun_runtime.tensorflow.service.LocalSource`): TensorFlow's own
  ``tf.data.experimental.prefetch_to_device(gpu, device_prefetch)``, the dataset's last
  transformation before its iterator is made (:func:`prefetch_dataset`); a dataset it refuses
  (its legacy iterator cannot carry a ``None`` label) is iterated by a :class:`DevicePrefetch`
  thread instead (:func:`prefetch_in_process`);
- the input workers' streams (tf.data service's
  :class:`~csrun_runtime.tensorflow.service.ServiceSource`, the data plane's
  :class:`~csrun_runtime.tensorflow.remote.DataplaneSource`): their elements are merged on Python
  threads (service) or received from Python (numpy over zmq), so ``prefetch_to_device`` on each
  stream's dataset would put every stream's buffer and the merge queue on the GPU, not
  ``device_prefetch`` elements; instead one :class:`DevicePrefetch` thread takes the merged
  elements in order, copies each to the GPU (``tf.identity`` under ``tf.device(gpu)``) and keeps
  at most ``device_prefetch`` of them queued (one more being copied) for the step. Errors and the
  input's end pass through in order; the stall watchdog (``InputStalled`` after
  ``runconfig.input_timeout_secs``) stays on the training loop's thread.

No host sync per step: the step gets tensors already on its device, and its losses stay
tensors until the loop's log line (:mod:`csrun_runtime.tensorflow.steps`). Without a GPU the
whole thing is off (:func:`plan_prefetch`): the source and the dataset are the old ones,
untouched. It is off too with several trainer ranks (the strategy places each replica's batch
itself) and under ``--autoscale`` (the autoscaler drives the source from the loop's thread and
counts what it holds ahead). Only checked on CPU (the device forced to ``/CPU:0`` in
``tests/unit/csrun_runtime/tensorflow/test_deviceprefetch.py``): the project's GPU machine has no TensorFlow.

TensorFlow is imported inside the functions.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from ..handoff import put_unless_stopped
from ..params import DEVICE_PREFETCH  # runconfig.device_prefetch's default: elements staged ahead

__all__ = ["DEVICE_PREFETCH", "PrefetchPlan", "DevicePrefetch", "PrefetchStats", "gpu_device", "plan_prefetch",
           "prefetch_dataset", "prefetch_in_process", "to_device", "NO_ITEM"]

log = logging.getLogger("csrun.runtime")


#: Seconds between looks at the stop flag while the thread waits for an element or for room.
_POLL_SECS = 0.1

#: What a :class:`DevicePrefetch`'s ``pull`` raises when nothing came within its wait (tried again).
NO_ITEM: tuple[type[BaseException], ...] = (queue.Empty, TimeoutError)

_UNSET: Any = object()


@dataclass(frozen=True)
class PrefetchPlan:
    """Whether the chief prefetches its training elements to a device, and how.

    Attributes:
        on: prefetch or not (``False``: the source and the dataset are left as they are).
        device: the TensorFlow device name (``"/device:GPU:0"``), ``None`` when off for want of one.
        depth: ``runconfig.device_prefetch``: elements staged ahead (>= 1).
        how: ``"prefetch_to_device"`` (the in-process dataset), ``"thread"`` (a
            :class:`DevicePrefetch` on the merged streams, or on an in-process dataset
            ``prefetch_to_device`` refused) or ``"off"``.
        reason: one line saying why (logs, performance.json).
    """

    on: bool
    device: str | None
    depth: int
    how: str
    reason: str

    def describe(self) -> dict[str, Any]:
        """performance.json's ``device_prefetch``: ``on``, ``device``, ``depth`` (elements), ``how``, ``reason``."""
        return {"on": self.on, "device": self.device, "depth": self.depth, "how": self.how, "reason": self.reason}


def gpu_device() -> str | None:
    """The name of TensorFlow's first logical GPU (``"/device:GPU:0"``), ``None`` when it sees none."""
    import tensorflow as tf

    gpus = tf.config.list_logical_devices("GPU")
    return gpus[0].name if gpus else None


def plan_prefetch(rc: Mapping[str, Any], *, streamed: bool, ranks: int = 1, autoscale: bool = False,
                  device: str | None = _UNSET) -> PrefetchPlan:
    """The chief's decision (see the module docstring).

    Args:
        rc: the resolved ``runconfig`` (``device_prefetch``, default :data:`DEVICE_PREFETCH`).
        streamed: the input workers' streams (``True``: a :class:`DevicePrefetch` thread) or the
            in-process pipeline (``prefetch_to_device`` on its dataset).
        ranks: trainer ranks of the job (off when more than one).
        autoscale: ``--autoscale`` is on (off for streamed sources).
        device: the device to prefetch to; default :func:`gpu_device` (``None``: no GPU, off).
            Tests force ``"/CPU:0"``.

    Returns:
        the :class:`PrefetchPlan` (``depth`` in elements). Raises ``ValueError`` / ``TypeError``
        for a ``device_prefetch`` that is not an integer (the params' validation refuses it first).
    """
    depth = max(1, int(rc.get("device_prefetch") or DEVICE_PREFETCH))
    if device is _UNSET:
        device = gpu_device()
    if device is None:
        return PrefetchPlan(False, None, depth, "off", "off: TensorFlow sees no GPU (nothing to prefetch to)")
    if ranks > 1:
        return PrefetchPlan(False, device, depth, "off", f"off: {ranks} trainer ranks (the distribution strategy "
                                                         "places each replica's batch)")
    if streamed and autoscale:
        return PrefetchPlan(False, device, depth, "off", "off: --autoscale drives the streams from the training "
                                                         "loop's thread")
    how = "thread" if streamed else "prefetch_to_device"
    what = ("a thread copies the merged streams' elements" if streamed
            else "tf.data.experimental.prefetch_to_device on the in-process dataset")
    return PrefetchPlan(True, device, depth, how, f"on: {depth} element(s) staged on {device} ahead of the step "
                                                  f"({what})")


def prefetch_dataset(ds: Any, plan: PrefetchPlan) -> Any:
    """``ds`` with ``tf.data.experimental.prefetch_to_device(plan.device, plan.depth)`` as its last
    transformation when ``plan.on``; ``ds`` itself (the same object) otherwise."""
    if not plan.on:
        return ds
    import tensorflow as tf

    return ds.apply(tf.data.experimental.prefetch_to_device(plan.device, buffer_size=plan.depth))


def prefetch_in_process(ds: Any, plan: PrefetchPlan) -> tuple[Any, PrefetchPlan]:
    """The in-process dataset's prefetch: ``(prefetch_dataset(ds, plan), plan)`` when TensorFlow's
    ``prefetch_to_device`` takes ``ds``; when it refuses it (its legacy iterator cannot carry
    every element structure: a ``None`` label raises ``TypeError``), ``(ds, plan)`` with
    ``plan.how == "thread"``: the caller then iterates ``ds`` on a :class:`DevicePrefetch`
    thread. Off: ``(ds, plan)``, ``ds`` the same object."""
    if not plan.on or plan.how != "prefetch_to_device":
        return ds, plan
    try:
        return prefetch_dataset(ds, plan), plan
    except Exception as e:  # noqa: BLE001 - TensorFlow's refusals have several types
        lines = str(e).strip().splitlines()
        why = f"{type(e).__name__}: {lines[-1][:160] if lines else ''}"
        return ds, replace(plan, how="thread", reason=f"{plan.reason}; prefetch_to_device refused the dataset "
                                                      f"({why}): a thread copies its elements instead")


def to_device(nest: Any, device: str) -> Any:
    """``nest`` (a nest of tensors or numpy arrays, ``None`` leaves kept; sparse and ragged tensors
    too) with every leaf a tensor copied onto ``device`` (``tf.identity`` under ``tf.device``; a
    string tensor stays in host memory, as TensorFlow keeps it). Raises what the copy raises
    (e.g. ``ResourceExhaustedError`` when the device is out of memory)."""
    import tensorflow as tf

    with tf.device(device):
        return tf.nest.map_structure(lambda t: None if t is None else tf.identity(t), nest)


def _nbytes(nest: Any) -> int:
    import tensorflow as tf

    n = 0
    for t in tf.nest.flatten(nest):
        if isinstance(t, tf.Tensor) and t.shape.is_fully_defined():
            n += int(t.shape.num_elements()) * int(tf.as_dtype(t.dtype).size)
    return n


@dataclass
class PrefetchStats:
    """What a :class:`DevicePrefetch` measured: elements and bytes staged, the consumer's waits
    for the queue (``wait_s``, seconds) and the thread's copying (``stage_s``, seconds)."""

    elements: int = 0
    bytes: int = 0
    wait_s: float = 0.0
    stage_s: float = 0.0

    def describe(self) -> dict[str, Any]:
        """The figures as a JSON-ready dict (seconds rounded to 0.1 ms)."""
        return {"elements": self.elements, "bytes": self.bytes, "wait_s": round(self.wait_s, 4),
                "stage_s": round(self.stage_s, 4)}


class DevicePrefetch:
    """Items of a source staged on a device by a background thread, in order, ``depth`` ahead.

    Args:
        pull: ``pull(wait) -> item``: the source's next item within ``wait`` seconds; raises one
            of :data:`NO_ITEM` when none came (called again), ``StopIteration`` at the input's
            end, anything else as the source's error. Called on this object's thread only, from
            construction until :meth:`stop`: the caller reads the source through :meth:`get` alone.
        stage: ``stage(item) -> item``: the item with its tensors on the device (e.g.
            :func:`to_device`); an item that carries an error stays as it is (the caller's stage
            decides).
        depth: items queued ahead of :meth:`get` (>= 1); the thread holds at most one more while
            it waits for room, so at most ``depth + 1`` items are pulled and not yet taken.
        name: the thread's name.

    :meth:`get` returns the items in the order ``pull`` gave them; after the last one it raises
    ``StopIteration`` (the end) or the error ``pull`` or ``stage`` raised, again at every later
    call. ``stats`` (:class:`PrefetchStats`) measures the waits and the copying.
    """

    def __init__(self, pull: Callable[[float], Any], stage: Callable[[Any], Any], depth: int = DEVICE_PREFETCH,
                 name: str = "csrun-device-prefetch"):
        self.pull, self.stage, self.depth = pull, stage, max(1, int(depth))
        self.stats = PrefetchStats()
        self._q: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=self.depth)
        self._stop = threading.Event()
        self._ended: tuple[str, Any] | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ the thread
    def _produce(self) -> tuple[str, Any] | None:
        """One pull, staged: ``("item", staged)``, ``("end", None)``, ``("error", exc)``, or None (nothing yet)."""
        try:
            item = self.pull(_POLL_SECS)
        except NO_ITEM:
            return None
        except StopIteration:
            return "end", None
        except BaseException as e:  # noqa: BLE001 - raised again on the consumer's thread
            return "error", e
        t0 = time.perf_counter()
        try:
            staged = self.stage(item)
            self.stats.bytes += _nbytes(staged)
        except BaseException as e:  # noqa: BLE001 - raised again on the consumer's thread
            return "error", e
        self.stats.stage_s += time.perf_counter() - t0
        self.stats.elements += 1
        return "item", staged

    def _run(self) -> None:
        while not self._stop.is_set():
            got = self._produce()
            if got is None:
                continue
            if not put_unless_stopped(self._q, got, self._stop, _POLL_SECS) or got[0] != "item":
                return

    # ------------------------------------------------------------------ the consumer
    def get(self, wait: float) -> Any:
        """The next staged item. Raises ``queue.Empty`` when none came within ``wait`` seconds,
        ``StopIteration`` after the input's end, the source's (or the copy's) error after its
        last item, and ``RuntimeError`` once :meth:`stop` ended the thread with nothing queued."""
        if self._ended is not None:
            raise self._ended[1] if self._ended[0] == "error" else StopIteration
        t0 = time.perf_counter()
        try:
            kind, value = self._q.get(timeout=wait)
        except queue.Empty:
            if self._stop.is_set() and not self._thread.is_alive() and self._q.empty():
                raise RuntimeError("the device prefetch was stopped") from None
            raise
        finally:
            self.stats.wait_s += time.perf_counter() - t0
        if kind != "item":
            self._ended = kind, value
            raise value if kind == "error" else StopIteration
        return value

    def alive(self) -> bool:
        """Whether the thread still runs (it ends at the input's end, an error, or :meth:`stop`)."""
        return self._thread.is_alive()

    def stop(self, timeout: float = 5.0) -> None:
        """End the thread (within ``pull``'s wait, :data:`_POLL_SECS`); items staged are dropped.
        Logs a warning when it did not end within ``timeout`` seconds."""
        self._stop.set()
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("the device prefetch's thread %s did not end within %.0f s", self._thread.name, timeout)
