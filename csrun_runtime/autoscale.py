"""Autoscale (``csrun_wse --autoscale``): the chief grows and shrinks the set of input workers
it reads from, within the slots Slurm placed (docs/AUTOSCALE.md).

Every input-worker task of the allocation is a slot: it builds its dataset and registers it
with its own dispatcher as always (:mod:`csrun_runtime.tensorflow.worker`). A tf.data service worker
produces only for a consumer, so a slot whose stream the chief has not opened costs nothing
but its idle process. The chief opens the streams of slots ``0 .. initial-1``; every
``window`` seconds of training (input wait + compute, evaluations excluded) it measures

- the input wait fraction ``w`` (seconds waiting for input ÷ seconds of the window),
- the consumer rate: samples ÷ compute seconds (what training would take if input were free),
- the delivered rate (samples ÷ window seconds) and each streaming worker's rate,

and :func:`decide` adds or removes workers. After each action a pause passes unjudged (after
an add, from the new streams' first batch): the window, or 1.5 times the seconds of training
the chief's buffers hold if longer. Those buffers hold whole service elements (up to 63
bundled batches each: the merge queue and one element per reader thread), which would hide
a removed worker for seconds. *Add* opens the next slot's stream, or resumes one it paused;
*remove* pauses the stream of the last slot added: its worker stops when its buffers are full
(backpressure) and stays ready to be resumed. Every decision is logged with its reason and
recorded for ``performance.json`` (``autoscale``).

Rules (:func:`decide`), with ``HIGH_WAIT`` = 0.10 and ``LOW_WAIT`` = 0.02:

- ``w > HIGH_WAIT`` and fewer than ``max`` workers stream: add. Policy ``rate`` adds up to the
  estimate of TensorFlow's tf.data service AutoScaler (tensorflow/core/data/service/auto_scaler.h:
  "the optimal number of workers is ... the sum of the consumption rates divided by the
  average worker throughput"): ``ceil(consumer rate / (delivered rate / workers))``, at least
  one more; policy ``step`` adds one (Cachew, USENIX ATC'22: greedy ±1).
- ``w < LOW_WAIT`` and more than ``max(min, floor)`` stream: remove one, unless a worker's rate
  was measured (the delivered rate per worker of the last window that waited on input) and
  ``ceil(consumer rate × 1.1 / that rate)`` workers are still needed. ``floor`` is the count a
  removal was undone at (a removal that made training wait is not tried again).
- otherwise hold.

Pure Python except the source it drives (a :class:`csrun_runtime.tensorflow.service.ServiceSource`, or
on the data plane a :class:`csrun_runtime.tensorflow.remote.DataplaneSource`).
"""
from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from csrun_common.autoscale import AutoscaleSpec

from . import workernames

__all__ = ["Window", "Decision", "decide", "Autoscaler", "HIGH_WAIT", "LOW_WAIT"]

log = logging.getLogger("csrun.runtime")

#: Input wait fraction above which workers are added.
HIGH_WAIT = 0.10
#: Input wait fraction below which one worker is removed.
LOW_WAIT = 0.02
#: Windows kept for performance.json (the most recent; ``window_count`` counts them all).
MAX_WINDOWS = 2000
#: Headroom over the consumer rate a smaller set of workers must keep before one is removed.
MARGIN = 0.10
#: Seconds an added stream may take to deliver its first batch before the next window starts
#: anyway (the decision is recorded either way).
ADD_SETTLE_SECS = 30.0


@dataclass(frozen=True)
class Window:
    """What the training loop measured over one window.

    Attributes:
        wait_s: seconds the chief waited for input.
        compute_s: seconds it trained.
        samples: samples trained.
    """

    wait_s: float
    compute_s: float
    samples: int

    @property
    def seconds(self) -> float:
        """Wait plus compute, seconds."""
        return self.wait_s + self.compute_s

    @property
    def wait_fraction(self) -> float:
        """Input wait ÷ window seconds (0 for an empty window)."""
        return self.wait_s / self.seconds if self.seconds > 0 else 0.0

    @property
    def delivered(self) -> float:
        """Samples/s trained over the window."""
        return self.samples / self.seconds if self.seconds > 0 else 0.0

    @property
    def consumer_rate(self) -> float:
        """Samples/s training would take with no input wait (samples ÷ compute seconds)."""
        return self.samples / self.compute_s if self.compute_s > 0 else math.inf


@dataclass(frozen=True)
class Decision:
    """``action`` ``"add"``, ``"remove"`` or ``"hold"``; ``count`` workers; ``reason`` one line;
    ``estimate`` the AutoScaler formula's worker count (``None`` when not input-bound)."""

    action: str
    count: int
    reason: str
    estimate: int | None = None


def tf_autoscaler_estimate(window: Window, workers: int) -> int:
    """TensorFlow's AutoScaler estimate of the workers needed: ``ceil(consumer rate ÷ mean
    worker throughput)``, the throughput being the delivered rate ÷ ``workers`` (valid while
    the chief waits on input, i.e. the workers deliver all they can). At least 1."""
    per_worker = window.delivered / max(1, workers)
    if per_worker <= 0 or math.isinf(window.consumer_rate):
        return workers + 1
    return max(1, math.ceil(window.consumer_rate / per_worker - 1e-9))


def decide(spec: AutoscaleSpec, window: Window, workers: int, floor: int = 0,
           capacity: float | None = None) -> Decision:
    """The decision for one window (module docstring's rules) with ``workers`` streaming;
    ``capacity`` is a worker's rate (samples/s) last measured while training waited on input
    (``None`` until then)."""
    w = window.wait_fraction
    if w > HIGH_WAIT and workers < spec.max_workers:
        est = tf_autoscaler_estimate(window, workers)
        if spec.policy == "rate":
            n = min(spec.max_workers - workers, max(1, est - workers))
            why = (f"input wait {w:.0%} > {HIGH_WAIT:.0%}: the AutoScaler estimate is {est} worker(s) "
                   f"(consumer {window.consumer_rate:.0f} samples/s ÷ {window.delivered / max(1, workers):.0f} "
                   f"per worker)")
        else:
            n = 1
            why = f"input wait {w:.0%} > {HIGH_WAIT:.0%}: one more worker"
        return Decision("add", n, why, est)
    if w < LOW_WAIT and workers > max(spec.min_workers, floor):
        if capacity and not math.isinf(window.consumer_rate):
            need = max(1, math.ceil(window.consumer_rate * (1 + MARGIN) / capacity))
            if need >= workers:
                return Decision("hold", 0, f"input wait {w:.1%}: {need} worker(s) of {capacity:.0f} samples/s "
                                           f"needed for {window.consumer_rate:.0f} samples/s", need)
            return Decision("remove", 1, f"input wait {w:.1%} < {LOW_WAIT:.0%}: {need} worker(s) of {capacity:.0f} "
                                         f"samples/s feed {window.consumer_rate:.0f} samples/s", need)
        return Decision("remove", 1, f"input wait {w:.1%} < {LOW_WAIT:.0%}: the input is ahead of training "
                                     f"(a worker's rate not measured yet)")
    if w > HIGH_WAIT:
        return Decision("hold", 0, f"input wait {w:.0%} but already at --max-workers {spec.max_workers}")
    return Decision("hold", 0, f"input wait {w:.1%}")


class Autoscaler:
    """The chief's autoscaler over a :class:`csrun_runtime.tensorflow.service.ServiceSource` or a
    :class:`csrun_runtime.tensorflow.remote.DataplaneSource` (the same stream API).

    Args:
        spec: the ``--autoscale`` bounds and policy.
        source: the service source, opened on slots ``0 .. spec.initial-1``; it must have
            ``add_stream``, ``pause``, ``resume``, ``streaming()`` and ``counts``.
        addresses: every slot's dispatcher address (``host:port``), by slot index.
        registry: every slot's registration (``workers/<i>.json``), by slot index.
        batch_size: samples per batch.

    :meth:`after_chunk` is called by the training loop after each chunk; :meth:`describe`
    gives ``performance.json``'s ``autoscale``.
    """

    def __init__(self, spec: AutoscaleSpec, source: Any, addresses: Sequence[str],
                 registry: dict[int, dict[str, Any]], batch_size: int):
        self.spec, self.source, self.batch_size = spec, source, batch_size
        self.addresses, self.registry = list(addresses), registry
        self.events: list[dict[str, Any]] = []
        self.windows: deque[dict[str, Any]] = deque(maxlen=MAX_WINDOWS)
        self.window_count = 0
        self.floor = 0
        self._last_removed: int | None = None  # workers streaming after the last removal
        now = time.monotonic()
        self._t_start = now
        self._active_since: dict[int, float] = {i: now for i in source.streaming()}
        self._worker_seconds = 0.0
        self._settling: dict[int, tuple[float, int]] = {}  # slot -> (time added, its count then)
        self._skip: float | None = None  # time of the last action: its effect is not judged at once
        self._skip_s = spec.window_s
        self.capacity: float | None = None  # samples/s of one worker, measured while input-bound
        self._reset_window(now)

    # ------------------------------------------------------------------ measuring
    def _reset_window(self, now: float) -> None:
        self._wait = self._compute = 0.0
        self._samples = 0
        self._t_window = now
        self._counts0 = dict(self.source.counts)

    def after_chunk(self, wait_s: float, compute_s: float, steps: int) -> Decision | None:
        """Account one chunk (``wait_s`` and ``compute_s`` seconds, ``steps`` batches); at the
        end of a window decide and act. Returns the decision taken, else ``None``."""
        now = time.monotonic()
        if self._settling:
            self._settle(now)
            return None
        if self._skip is not None and now - self._skip < self._skip_s:
            return None  # the window after an action: the merge queue's buffer drains or fills
        if self._skip is not None:
            self._skip = None
            self._reset_window(now)
            return None
        self._wait += wait_s
        self._compute += compute_s
        self._samples += steps * self.batch_size
        if self._wait + self._compute < self.spec.window_s:
            return None
        win = Window(self._wait, self._compute, self._samples)
        streaming = sorted(self.source.streaming())
        workers = len(streaming)
        rates = {str(i): round((self.source.counts.get(i, 0) - self._counts0.get(i, 0)) * self.batch_size
                               / max(1e-9, now - self._t_window), 1) for i in streaming}
        self.window_count += 1
        self.windows.append({"time": round(time.time(), 3), "workers": workers,
                             "input_wait_fraction": round(win.wait_fraction, 4),
                             "samples_per_sec": round(win.delivered, 1),
                             "consumer_samples_per_sec": round(min(win.consumer_rate, 1e12), 1),
                             "worker_samples_per_sec": rates,
                             "tf_autoscaler_estimate": tf_autoscaler_estimate(win, workers)})
        if self._last_removed is not None and win.wait_fraction > HIGH_WAIT and workers == self._last_removed:
            self.floor = workers + 1  # the last removal made training wait: do not go below again
        if win.wait_fraction > HIGH_WAIT and workers:
            self.capacity = win.delivered / workers  # every worker delivers all it can
        decision = decide(self.spec, win, workers, self.floor, self.capacity)
        self._act(decision, win, now)
        self._reset_window(time.monotonic())
        return decision

    def _settle(self, now: float) -> None:
        """Wait until every added stream delivered a batch (or ADD_SETTLE_SECS), then start
        a new window: a new worker's warm-up is not the policy's to judge."""
        for i, (t, c0) in list(self._settling.items()):
            if self.source.counts.get(i, 0) > c0 or now - t > ADD_SETTLE_SECS:
                del self._settling[i]
        if not self._settling:
            self._skip = now

    # ------------------------------------------------------------------ acting
    def _act(self, d: Decision, win: Window, now: float) -> None:
        if d.action == "hold":
            return
        for _ in range(d.count):
            slot = self._add_one(now) if d.action == "add" else self._remove_one(now)
            if slot is None:
                break
            workers = len(self.source.streaming())
            self.events.append({"time": round(time.time(), 3), "action": d.action, "worker": slot,
                                "reason": d.reason, "input_wait_fraction": round(win.wait_fraction, 4),
                                "samples_per_sec": round(win.delivered, 1), "workers": workers,
                                "tf_autoscaler_estimate": d.estimate})
            log.info("autoscale: %s %s on %s (now %d streaming): %s", d.action, workernames.name(slot),
                     (self.registry.get(slot) or {}).get("node", "?"), workers, d.reason)
        self._last_removed = len(self.source.streaming()) if d.action == "remove" else None
        # what the merge buffers hold (whole service elements) must drain before the next judgement
        buffered = self.source.buffered_batches() * self.batch_size
        self._skip_s = max(self.spec.window_s, 1.5 * buffered / max(1.0, min(win.consumer_rate, 1e12)))
        if d.action == "remove":
            self._skip = now

    def _add_one(self, now: float) -> int | None:
        paused = sorted(self.source.paused)
        if paused:
            slot = paused[0]
            self.source.resume(slot)
        elif self.source.n < len(self.addresses):
            slot = self.source.n
            self.source.add_stream(slot, self.addresses[slot], self.registry.get(slot))
        else:
            return None
        self._settling[slot] = (now, self.source.counts.get(slot, 0))
        self._active_since[slot] = now
        return slot

    def _remove_one(self, now: float) -> int | None:
        streaming = sorted(self.source.streaming(), key=lambda i: (-self._active_since.get(i, 0.0), -i))
        if len(streaming) <= 1:
            return None
        slot = streaming[0]  # the last one added
        self.source.pause(slot)
        self._worker_seconds += now - self._active_since.pop(slot, now)
        return slot

    # ------------------------------------------------------------------ the record
    def describe(self) -> dict[str, Any]:
        """``performance.json``'s ``autoscale``: the setting, ``events`` (time: Unix seconds;
        action; worker: slot index; reason; input_wait_fraction; samples_per_sec: delivered
        over the window; workers streaming after it), ``windows`` (the last :data:`MAX_WINDOWS`
        windows measured; ``window_count`` all of them),
        ``final_workers`` and ``worker_seconds`` (seconds each slot streamed, summed)."""
        now = time.monotonic()
        streaming = self.source.streaming()
        live = sum(now - t for i, t in self._active_since.items() if i in streaming)
        return {"policy": self.spec.policy, "window_s": self.spec.window_s,
                "initial_workers": self.spec.initial, "min_workers": self.spec.min_workers,
                "max_workers": self.spec.max_workers, "high_wait": HIGH_WAIT, "low_wait": LOW_WAIT,
                "events": list(self.events), "windows": list(self.windows), "window_count": self.window_count,
                "final_workers": len(streaming),
                "worker_samples_per_sec_measured": None if self.capacity is None else round(self.capacity, 1),
                "worker_seconds": round(self._worker_seconds + live, 3),
                "seconds": round(now - self._t_start, 3)}
