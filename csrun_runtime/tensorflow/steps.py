"""Several training steps in one call: the chief's answer to per-step overhead.

Keras' ``train_on_batch`` costs the chief a Python round trip per step (argument checks, a
generator, a ``tf.function`` call, converting the logs to Python floats): about 0.9 ms here,
several times a whole step of a small model. As Keras' own ``steps_per_execution`` does,
:class:`TrainSteps` runs ``n`` steps inside one ``tf.function`` call — a ``tf.while_loop``
over batches ``offset .. offset + n - 1`` of a received element
(:class:`csrun_runtime.tensorflow.service.Chunk`), each iteration running the model's own
``train_step`` — so the Python cost is paid once per chunk.

With ``model.jit_compile`` the whole loop is one XLA computation (measured on the digits
model: 58 µs per step in chunks of 64, against 180 µs when only each step is compiled and
the loop runs in the TensorFlow executor, and 980 µs with ``train_on_batch``). The offset
and the step count are tensors, so the loop compiles once per element size, not once per
chunk length.

Each step resets the model's metrics first, so the logs returned are those of the chunk's
last step alone — what ``train_on_batch`` returns for one step — and the weights after ``n``
steps equal those after ``n`` ``train_on_batch`` calls on the same batches. The loss of every
step comes back too (a vector the size of the element), and the global step is advanced inside
the call: logging needs no chunk boundary, and the call needs no eager op of its own.

TensorFlow is imported inside the functions (see :mod:`csrun_runtime.tensorflow.worker`).
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

__all__ = ["TrainSteps", "StepLoss"]

log = logging.getLogger("csrun.runtime")


class _HostLosses:
    """A call's losses tensor, read to the host (``.numpy()``) once, at the first :class:`StepLoss` read."""

    def __init__(self, tensor: Any):
        self.tensor: Any = tensor
        self.values: Any = None

    def get(self, i: int) -> float:
        if self.values is None:
            self.values = self.tensor.numpy()
        return float(self.values[i])


class StepLoss:
    """One step's loss of a :class:`TrainSteps` call: ``float()`` reads it (the call's losses
    come to the host once, at the first read: the loop's logging cadence, not every call)."""

    __slots__ = ("host", "i")

    def __init__(self, host: _HostLosses, i: int):
        self.host, self.i = host, i

    def __float__(self) -> float:
        return self.host.get(self.i)


class TrainSteps:
    """Train a compiled Keras model several steps per call.

    Args:
        model: the compiled ``keras.Model`` (built, its optimizer built); ``model.jit_compile``
            decides whether the loop is compiled with XLA.
        on_xla_failure: called with the exception when the first call fails while
            ``model.jit_compile`` is set and ``allow_fallback``; the loop is then rebuilt
            without XLA and the call retried (``runconfig.jit_compile: auto``).
        allow_fallback: whether an XLA failure on the first call falls back (else it raises).
        counter: an integer ``tf.Variable`` (the global step) advanced by ``n`` inside the call,
            or ``None``.
        strategy: a ``tf.distribute`` strategy (several trainer ranks,
            :mod:`csrun_runtime.tensorflow.ranks`) or ``None``. With one, each step is its own
            ``strategy.run`` on this rank's local batch inside the call's loop (Keras' pattern:
            the optimizer's gradient all-reduce is a synchronization point, which may not sit in
            a nested ``tf.function`` or in control flow inside ``strategy.run``), without XLA.

    ``steps(batches, offset, n)`` trains on batches ``offset .. offset + n - 1`` of
    ``batches`` — ``(features, labels)`` whose every tensor has a leading dimension of at
    least ``offset + n`` — in order, and returns ``(logs, losses)``: the logs of the last step
    (``{"loss": ..., "accuracy": ...}``, each read with ``float()``) and the loss of each of the
    ``n`` steps as a :class:`StepLoss` (the first log value when the model has no ``loss``), so
    that a loop can log a step inside the chunk; nothing comes to the host until a value is read
    (the loop reads at its logging cadence). Raises what the model's train step raises.
    """

    def __init__(self, model: Any, on_xla_failure: Callable[[BaseException], None] | None = None,
                 allow_fallback: bool = True, counter: Any = None, strategy: Any = None):
        self.model = model
        self.counter = counter
        self.strategy = strategy
        self.on_xla_failure = on_xla_failure
        self.allow_fallback = allow_fallback
        self.calls = 0
        self._fn: Any = self._build()

    def _build(self) -> Any:
        import tensorflow as tf

        if self.strategy is not None:
            return _distributed_loop(self.model, self.counter, self.strategy)
        model, counter = self.model, self.counter
        jit = bool(model.jit_compile)

        def one_step(data: Any) -> Any:
            for m in model.metrics:
                m.reset_state()
            return model.train_step(data)

        # With XLA the whole loop is compiled (the step is inlined); without, each step is a
        # tf.function of its own, called by the loop (cheaper than inlining it, measured).
        step = one_step if jit else tf.function(one_step, reduce_retracing=True)

        # Under XLA an index must be a gather: a strided slice makes its begin a compile-time
        # constant, which recompiled the loop for every new offset (measured: 0.85 s each).
        def take(t: Any, i: Any) -> Any:
            return tf.gather(t, i) if jit else t[i]

        def pick(batches: Any, i: Any) -> Any:
            x, y = batches
            xi = tf.nest.map_structure(lambda t: take(t, i), x)
            return (xi,) if y is None else (xi, tf.nest.map_structure(lambda t: take(t, i), y))

        def loop(batches: Any, offset: Any, n: Any) -> Any:
            size = tf.shape(tf.nest.flatten(batches[0])[0])[0]
            logs = step(pick(batches, offset))
            key = "loss" if "loss" in logs else next(iter(logs))

            def note(losses: Any, i: Any, logs: Any) -> Any:
                return tf.tensor_scatter_nd_update(losses, [[i]], [tf.cast(logs[key], tf.float32)])

            losses = note(tf.zeros([size], tf.float32), offset, logs)

            def body(i: Any, _: Any, losses: Any) -> Any:
                logs = step(pick(batches, i))
                return i + 1, logs, note(losses, i, logs)

            _, logs, losses = tf.while_loop(lambda i, *_: i < offset + n, body, (offset + 1, logs, losses),
                                            parallel_iterations=1)
            if counter is not None:
                counter.assign_add(tf.cast(n, counter.dtype))
            return logs, losses

        return tf.function(loop, jit_compile=jit, reduce_retracing=True)

    def __call__(self, batches: Any, offset: int = 0, n: int = 1) -> tuple[dict[str, Any], list[StepLoss]]:
        import tensorflow as tf

        args = (batches, tf.constant(int(offset), tf.int32), tf.constant(int(n), tf.int32))
        try:
            logs, losses = self._fn(*args)
        except Exception as e:  # noqa: BLE001 - XLA compile failures have many types
            if self.calls or not (self.model.jit_compile and self.allow_fallback):
                raise
            if self.on_xla_failure is not None:
                self.on_xla_failure(e)
            self.model.jit_compile = False
            self._fn = self._build()
            logs, losses = self._fn(*args)
        self.calls += 1
        # no host read here (issue 31): the losses stay tensors until the loop's log line reads one
        host = _HostLosses(losses)
        return dict(logs), [StepLoss(host, i) for i in range(offset, offset + n)]


def _distributed_loop(model: Any, counter: Any, strategy: Any) -> Any:
    """:class:`TrainSteps`' call with a ``strategy``: ``(batches, offset, n) -> (logs, losses)``
    as without, each of the ``n`` steps one ``strategy.run`` of the model's ``train_step`` on
    this rank's batch ``i`` (one local replica per rank: the batch is that replica's), in a
    ``tf.range`` loop of one ``tf.function`` (no XLA); the logs and losses are this rank's."""
    import tensorflow as tf

    def one_step(data: Any) -> Any:
        for m in model.metrics:
            m.reset_state()
        return model.train_step(data)

    def pick(batches: Any, i: Any) -> Any:
        x, y = batches
        xi = tf.nest.map_structure(lambda t: t[i], x)
        return (xi,) if y is None else (xi, tf.nest.map_structure(lambda t: t[i], y))

    def local(value: Any) -> Any:
        return tf.nest.map_structure(lambda v: strategy.experimental_local_results(v)[0], value)

    def loop(batches: Any, offset: Any, n: Any) -> Any:
        size = tf.shape(tf.nest.flatten(batches[0])[0])[0]
        logs = local(strategy.run(one_step, args=(pick(batches, offset),)))
        key = "loss" if "loss" in logs else next(iter(logs))
        losses = tf.tensor_scatter_nd_update(tf.zeros([size], tf.float32), [[offset]],
                                             [tf.cast(logs[key], tf.float32)])
        for i in tf.range(offset + 1, offset + n):
            logs = local(strategy.run(one_step, args=(pick(batches, i),)))
            losses = tf.tensor_scatter_nd_update(losses, [[i]], [tf.cast(logs[key], tf.float32)])
        if counter is not None:
            counter.assign_add(tf.cast(n, counter.dtype))
        return logs, losses

    return tf.function(loop, reduce_retracing=True)
