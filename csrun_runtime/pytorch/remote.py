"""The PyTorch chief's training batches from its input workers over the data plane
(:mod:`csrun_runtime.dataplane`: one zmq ROUTER whose endpoint is published in the rendezvous
directory as ``dataplane.json``), and the watch over those workers (docs/RESILIENCE.md).

:class:`RemoteSource` hands the training loop one batch at a time, first come, first served,
and once every :data:`POLL_SECS` seconds looks at the rendezvous:

- a registration ``status: failed`` ends the run (:class:`WorkerFailed`: the chief exits 2);
- a worker whose heartbeat is older than :data:`csrun_runtime.rendezvous.STALE_SECS` counts as
  stopped (:meth:`RemoteSource.stopped`);
- :class:`csrun_runtime.elastic.WorkerWatch` (the TensorFlow chief's, reused) records deaths
  its task's supervisor wrote and stopped workers as ``workers_lost``, a later attempt's
  registration as ``workers_replaced`` (:meth:`RemoteSource.reopen`: the replacement connects
  to the receiver by itself with its higher attempt), and with ``csrun_wse
  --survive-node-loss`` (``CSRUN_WORKER_JOB=1``) orders a new home for a worker lost with its
  node (``workers/<i>.orphan.json``), which a supervisor of the input workers' job carries
  out (:class:`csrun_runtime.supervise.Adopter`).

It also offers what the autoscaler (:class:`csrun_runtime.autoscale.Autoscaler`, ``csrun_wse
--autoscale``, docs/AUTOSCALE.md) drives, as the TensorFlow chief's
:class:`csrun_runtime.dataplane_source.DataplaneSource` does over the same receiver: slots
``0 .. streams-1`` read from the start, :meth:`RemoteSource.add_stream` (open the next slot),
:meth:`~RemoteSource.pause` / :meth:`~RemoteSource.resume` (the receiver tells the worker to
stop or go on sending: backpressure, its DataLoader stops), per-worker ``counts`` (batches
handed to training), ``paused``, ``n``, :meth:`~RemoteSource.streaming` and
:meth:`~RemoteSource.buffered_batches`; the slots' bookkeeping is :class:`.slots.StreamSlots`
(a slot not opened has its first bundles held and is paused at the receiver). A paused
worker's replacement starts paused (the receiver keeps the pause); one of a slot never opened
is left unread (:meth:`RemoteSource.reopen` returns ``"not streaming"``).

No TensorFlow; no torch either (batches stay numpy nests until the loop moves them).
"""
from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping
from typing import Any

from csrun_common.atomic import write_json
from csrun_common.autoscale import AutoscaleSpec
from csrun_common.autoscale import parse_env as parse_autoscale
from csrun_common.roles import Role

from .. import preemption
from ..elastic import WorkerWatch
from ..params import ParamsError
from ..rendezvous import STALE_SECS, Rendezvous
from .slots import StreamSlots

__all__ = ["RemoteSource", "InputStalled", "WorkerFailed", "DATAPLANE_FILE", "POLL_SECS", "autoscale_spec"]

log = logging.getLogger("csrun.runtime")

#: The chief's data-plane endpoint in the rendezvous directory (``{"endpoint", "num_workers"}``).
DATAPLANE_FILE = "dataplane.json"
#: Seconds between the chief's looks at the rendezvous while it waits for batches.
POLL_SECS = 1.0


class InputStalled(RuntimeError):
    """No training batch within the watchdog's time (names the workers and their last batch)."""


class WorkerFailed(RuntimeError):
    """An input worker registered ``status: failed`` (contract violations, listed)."""

    def __init__(self, index: int, violations: list[str]):
        super().__init__(f"input worker {index} failed: " + "; ".join(violations))
        self.index, self.violations = index, violations


def autoscale_spec(environ: Mapping[str, str], num_workers: int) -> AutoscaleSpec | None:
    """``csrun_wse --autoscale``'s spec from ``CSRUN_AUTOSCALE`` in ``environ`` for a job of
    ``num_workers`` input-worker slots (docs/AUTOSCALE.md; logged), or None when unset.
    Raises :class:`csrun_runtime.params.ParamsError` naming the variable and its value when it
    does not parse or does not fit the slots (the chief exits 2)."""
    try:
        spec = parse_autoscale(environ, num_workers)
    except ValueError as e:
        raise ParamsError(str(e)) from None
    if spec is not None:
        log.info("autoscale (%s policy, %g s windows): reading input workers 0..%d of %d slot(s), "
                 "between %d and %d at a time", spec.policy, spec.window_s, spec.initial - 1, num_workers,
                 spec.min_workers, spec.max_workers)
    return spec


class RemoteSource:
    """Batches from ``W`` input workers through one :class:`csrun_runtime.dataplane.Receiver`.

    Args:
        rdv: the job step's rendezvous (``dataplane.json`` is written there at once).
        role: the chief's role (``num_workers``; ``host``: the address workers reach it by).
        rc: ``runconfig`` (``input_timeout_secs``, ``worker_start_timeout_secs``: seconds).
        adopt: order adoptions of workers lost with their node; default ``CSRUN_WORKER_JOB=1``
            in the environment (``csrun_wse --survive-node-loss``).
        streams: slots read from the start (``0 .. streams-1``), default all ``W``; the others
            are opened by :meth:`add_stream` (``--autoscale``).

    Raises ``zmq.ZMQError`` when the receiver cannot bind. Call every method from one thread.
    """

    def __init__(self, rdv: Rendezvous, role: Role, rc: dict[str, Any], adopt: bool | None = None,
                 streams: int | None = None):
        from ..dataplane import Receiver

        self.rdv, self.role, self.rc = rdv, role, rc
        self.w = role.num_workers
        self.r = Receiver("tcp://0.0.0.0:0")
        port = self.r.endpoint.rsplit(":", 1)[1]
        self.endpoint = f"tcp://{role.host}:{port}"
        write_json(rdv.dir / DATAPLANE_FILE, {"endpoint": self.endpoint, "num_workers": self.w,
                                              "created": time.time()})
        log.info("data plane: receiving from %d input worker(s) at %s", self.w, self.endpoint)
        self.handed: dict[int, int] = {}
        self.nodes: dict[int, str | None] = {}  # Slurm node of each worker (its registration)
        #: Every slot's latest registration (``workers/<i>.json``), by index (the autoscaler's).
        self.registry: dict[int, dict[str, Any]] = {}
        self.addresses = [self.endpoint] * self.w  # one receiver for every slot
        self.slots = StreamSlots(self.r, self.w, streams)
        self._batches: Iterator[Any] | None = None  # the rest of the bundle being handed out
        self._worker = -1
        self.announced: set[int] = set()  # workers whose heartbeat went stale, not replaced since
        # the workers register after the endpoint is published: their first registrations
        # reach the watch in poll() (WorkerWatch.known)
        self.watch = WorkerWatch(rdv, {i: {} for i in range(self.w)}, adopt=adopt)
        self.t_first: float | None = None
        self.t0 = time.monotonic()
        self._last_poll = 0.0

    # ------------------------------------------------------------------ what WorkerWatch reads
    @property
    def counts(self) -> dict[int, int]:
        """Batches handed to training, by worker index."""
        return dict(self.handed)

    def stopped(self) -> set[int]:
        """Workers whose heartbeat went stale (older than :data:`~csrun_runtime.rendezvous.STALE_SECS`)
        and that no replacement registered for since."""
        return set(self.announced)

    def reopen(self, index: int, registration: Mapping[str, Any]) -> str:
        """Worker ``index``'s replacement registered: it connects to the receiver by itself
        with its higher attempt (the receiver drops what the older one had in flight; a paused
        worker's replacement starts paused); only its stopped state is cleared here. Returns
        ``"reconnected"``, or ``"not streaming"`` for a slot autoscale has not opened."""
        self.announced.discard(index)
        self.nodes[index] = registration.get("node")
        self.registry[index] = dict(registration)
        return "reconnected" if index in self.slots.opened else "not streaming"

    # ------------------------------------------------------------------ autoscale's interface
    @property
    def n(self) -> int:
        """One past the highest slot opened (the autoscaler's next slot to open)."""
        return self.slots.n

    @property
    def paused(self) -> set[int]:
        """Workers the autoscaler paused."""
        return self.slots.paused

    def add_stream(self, index: int, address: str = "", registration: Mapping[str, Any] | None = None) -> None:
        """Read slot ``index`` from now on (autoscale's *add*); its held bundles come first.
        ``address`` (the receiver's endpoint) is not needed: every slot sends to one receiver."""
        if registration is not None:
            self.registry[index] = dict(registration)
        self.slots.open(index)

    def pause(self, i: int) -> None:
        """Stop worker ``i``'s stream (autoscale's *remove*): :meth:`.slots.StreamSlots.pause`."""
        self.slots.pause(i)

    def resume(self, i: int) -> None:
        """Let paused worker ``i`` send again."""
        self.slots.resume(i)

    def streaming(self) -> set[int]:
        """Indices of the workers read now: opened, not paused, not stopped."""
        return self.slots.opened - self.slots.paused - self.stopped()

    def buffered_batches(self) -> int:
        """At most how many batches the chief holds ahead of training (a credit window and one
        bundle per streaming worker)."""
        return self.slots.buffered_batches(self.streaming())

    # ------------------------------------------------------------------ the watch
    def poll(self) -> None:
        """At most once every :data:`POLL_SECS`: failed registrations (raise
        :class:`WorkerFailed`), stale heartbeats, then the :class:`~csrun_runtime.elastic.WorkerWatch`
        (losses, replacements, adoption orders; logged)."""
        now = time.monotonic()
        if now - self._last_poll < POLL_SECS:
            return
        self._last_poll = now
        for i in range(self.w):
            reg = self.rdv.worker(i)
            if reg:
                if reg.get("status") == "failed":
                    raise WorkerFailed(i, list(reg.get("violations") or ["(no reason given)"]))
                self.nodes.setdefault(i, reg.get("node"))
                self.registry[i] = reg
                self.watch.known(i, reg)
            age = self.rdv.age(f"workers/{i}")
            if age is not None and age > STALE_SECS and i not in self.announced:
                self.announced.add(i)
                log.info("input worker %d on %s: no heartbeat for %.0f s", i, self.nodes.get(i), age)
        self.watch.poll(self)

    # ------------------------------------------------------------------ batches
    def _bundle(self, timeout: float) -> Any:
        """The next bundle of an opened slot (held ones first); one of a slot not opened yet
        is held (:meth:`.slots.StreamSlots.admit`). Raises TimeoutError after ``timeout`` s."""
        b = self.slots.held()
        if b is not None:
            return b
        deadline = time.monotonic() + timeout
        while True:
            b = self.r.get_bundle(timeout=max(0.0, deadline - time.monotonic()))
            if self.slots.admit(b):
                return b

    def _take(self, timeout: float) -> tuple[int, Any]:
        """One batch ``(worker, nest)``: the rest of the current bundle, else of the next one."""
        if self._batches is not None:
            nest = next(self._batches, None)
            if nest is not None:
                return self._worker, nest
            self._batches = None
        b = self._bundle(timeout)
        if b.n == 0:  # an unstacked message: one batch
            return b.worker, b.nest
        self._batches, self._worker = b.batches(), b.worker
        return self._worker, next(self._batches)

    def next(self) -> tuple[Any, int]:
        """The next batch and its worker; ``(None, -1)`` once a stop signal was recorded.
        Raises :class:`InputStalled` after ``runconfig.worker_start_timeout_secs`` seconds
        without a first batch, or ``runconfig.input_timeout_secs`` without a later one, and
        :class:`WorkerFailed` (from :meth:`poll`)."""
        limit = float(self.rc["input_timeout_secs"] if self.t_first is not None
                      else self.rc["worker_start_timeout_secs"])
        t0 = time.monotonic()
        while True:
            if preemption.stop_requested():  # a stop signal while waiting: the loop stops at this step
                return None, -1
            self.poll()
            try:
                worker, nest = self._take(timeout=min(POLL_SECS, max(0.01, limit - (time.monotonic() - t0))))
            except TimeoutError as e:
                if time.monotonic() - t0 >= limit:
                    key = "input_timeout_secs" if self.t_first else "worker_start_timeout_secs"
                    raise InputStalled(f"{e} (runconfig.{key} {limit:g})") from None
                continue
            if self.t_first is None:
                self.t_first = time.monotonic()
                log.info("first batch from input worker %d after %.2f s", worker, self.t_first - self.t0)
            self.handed[worker] = self.handed.get(worker, 0) + 1
            return nest, worker

    def describe(self) -> dict[str, Any]:
        """For performance.json: batches and nodes per worker, the data plane's counts
        (bytes, bundles, errors, stale messages) and the watch's ``workers_lost``,
        ``workers_replaced`` and ``workers_given_up`` (times: Unix seconds)."""
        counts = self.r.counts()
        return {"batches_per_worker": {str(i): self.handed.get(i, 0) for i in range(self.w)},
                "worker_nodes": {str(i): self.nodes.get(i) or c.get("host") for i, c in counts.items()},
                "workers_paused": sorted(self.paused),
                "input": "input workers over the data plane (zmq)",
                "data_plane": {"endpoint": self.endpoint,
                               "bytes_per_worker": {str(i): c["bytes"] for i, c in counts.items()},
                               "bundles_per_worker": {str(i): c["bundles"] for i, c in counts.items()},
                               "errors": self.r.errors(), "stale_messages": sum(c["stale"] for c in counts.values())},
                **self.watch.describe()}

    def close(self) -> None:
        """Close the receiver: the workers' next send fails and they wait for ``done.json``."""
        self.r.close()
