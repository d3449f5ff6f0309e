"""The PyTorch chief's training batches from its input workers over the data plane
(:mod:`csrun_runtime.dataplane`: one zmq ROUTER whose endpoint is published in the rendezvous
directory as ``endpoints.json``), and the watch over those workers (docs/RESILIENCE.md).

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

The merge itself (the receiver, the slots and what the autoscaler drives: ``add_stream``,
``pause`` / ``resume`` at the receiver, per-worker ``counts``, ``streaming()``,
``buffered_batches()``; the watch; stall detection; a worker's pipeline error file) is the
framework-neutral core's :class:`csrun_runtime.streams.StreamMerge`, which the TensorFlow
chief's :class:`csrun_runtime.tensorflow.remote.DataplaneSource` shares: :class:`RemoteSource` is
its PyTorch adapter (single batches, the start timeout, the registrations' ``status: failed``,
``endpoints.json``). A paused worker's replacement starts paused (the receiver keeps the
pause); one of a slot never opened is left unread (:meth:`RemoteSource.reopen` returns
``"not streaming"``).

No TensorFlow; no torch either (batches stay numpy nests until the loop moves them).
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from csrun_common.autoscale import AutoscaleSpec
from csrun_common.autoscale import parse_env as parse_autoscale
from csrun_common.roles import Role

from .. import preemption, workernames
from ..params import ParamsError
from ..position import InputPositions
from ..rendezvous import Rendezvous
from ..streams import POLL_SECS, InputStalled, StreamMerge, dataplane_options, plane_note, start_receiver

__all__ = ["RemoteSource", "InputStalled", "WorkerFailed", "POLL_SECS",
           "READ_AHEAD_BATCHES", "autoscale_spec"]

log = logging.getLogger("csrun.runtime")

#: Default of ``runconfig.input_read_ahead_batches``: batches an input worker reads at most ahead
#: of what the chief took from it (the receiver's ``window_batches``; docs/DATAPLANE.md).
READ_AHEAD_BATCHES = 32


class WorkerFailed(RuntimeError):
    """An input worker registered ``status: failed`` (contract violations, listed)."""

    def __init__(self, index: int, violations: list[str]):
        super().__init__(f"{workernames.name(index)} failed: " + "; ".join(violations))
        self.index, self.violations = index, violations


def autoscale_spec(environ: Mapping[str, str], num_input_workers: int) -> AutoscaleSpec | None:
    """``csrun_wse --autoscale``'s spec from ``CSRUN_AUTOSCALE`` in ``environ`` for a job of
    ``num_input_workers`` input-worker slots (docs/AUTOSCALE.md; logged), or None when unset.
    Raises :class:`csrun_runtime.params.ParamsError` naming the variable and its value when it
    does not parse or does not fit the slots (the chief exits 2)."""
    try:
        spec = parse_autoscale(environ, num_input_workers)
    except ValueError as e:
        raise ParamsError(str(e)) from None
    if spec is not None:
        log.info("autoscale (%s policy, %g s windows): reading input workers 0..%d of %d slot(s), "
                 "between %d and %d at a time", spec.policy, spec.window_s, spec.initial - 1, num_input_workers,
                 spec.min_workers, spec.max_workers)
    return spec


class RemoteSource(StreamMerge):
    """Batches from ``W`` input workers through one :class:`csrun_runtime.dataplane.Receiver`:
    the PyTorch adapter over :class:`csrun_runtime.streams.StreamMerge`.

    Args:
        rdv: the job step's rendezvous (the endpoint is published there at once).
        role: the chief's role (``num_input_workers``; ``host``: the address workers reach it by).
        rc: ``runconfig`` (``input_timeout_secs``, ``worker_start_timeout_secs``: seconds;
            ``input_read_ahead_batches``: the receiver's batch window, default
            :data:`READ_AHEAD_BATCHES`, 0: bytes only).
        adopt: order adoptions of workers lost with their node; default ``CSRUN_WORKER_JOB=1``
            in the environment (``csrun_wse --survive-node-loss``).
        streams: slots read from the start (``0 .. streams-1``, clamped to ``[1, W]``), default
            all ``W``; the others are opened by :meth:`add_stream` (``--autoscale``).
        start: the global step the model was restored at: every stream resumes at the position
            committed with that checkpoint (:meth:`csrun_runtime.position.InputPositions.restore`).

    Every slot ``0 .. W-1`` is watched from the start: its registration (``status: failed``
    raises :class:`WorkerFailed`) and heartbeat are read at each :meth:`poll`. Raises
    ``zmq.ZMQError`` when the receiver cannot bind. Call every method from one thread.
    """

    def __init__(self, rdv: Rendezvous, role: Role, rc: dict[str, Any], adopt: bool | None = None,
                 streams: int | None = None, start: int = 0):
        w = role.num_input_workers
        # runconfig.input_read_ahead_batches: what a worker reads ahead of what this chief took
        ahead = int(rc.get("input_read_ahead_batches", READ_AHEAD_BATCHES) or 0)
        receiver, endpoint = start_receiver(role.host, window_batches=ahead or None, **dataplane_options(rc))
        rdv.publish_endpoints([endpoint] * w, {"num_workers": w})
        log.info("data plane: receiving from %d input worker(s) at %s%s", w, endpoint, plane_note(receiver))
        # the workers register after the endpoint is published: their registrations are read in poll()
        positions = InputPositions.restore(rc.get("model_dir") or ".", start, rc, slots=w, rank=role.rank,
                                           world_size=role.world_size)
        super().__init__(rdv, receiver, {}, w if streams is None else max(1, min(w, int(streams))), slots=w,
                         adopt=adopt, addresses=[endpoint] * w, positions=positions)  # one receiver for every slot
        self.role, self.rc, self.endpoint = role, rc, endpoint
        self.r = receiver
        self.nodes: dict[int, str | None] = {}  # Slurm node of each worker (its registration)
        self._batches: Iterator[Any] | None = None  # the rest of the bundle being handed out
        self._worker = -1
        self.t_first: float | None = None
        self.t0 = time.monotonic()
        self.cancelled = False  # cancel(): next() returns (None, -1) within POLL_SECS

    def cancel(self) -> None:
        """Make :meth:`next` return ``(None, -1)`` within :data:`POLL_SECS` s; the one method another thread calls."""
        self.cancelled = True

    def lend(self, allocate: Callable[[int], Any] | None) -> bool:
        """Receive into ``allocate(nbytes)``'s buffers (called on reader threads; None: fresh); False: no bulk."""
        return bool(self.r.lend(allocate))

    def on_shared_memory(self, register: Callable[[int, int], Any] | None) -> bool:
        """Pin the shared-memory rings with ``register`` (:meth:`csrun_runtime.dataplane.Receiver.on_shared_memory`)."""
        return bool(self.r.on_shared_memory(register))

    # ------------------------------------------------------------------ the merge's hooks
    def _look(self, i: int) -> None:
        """Worker ``i``'s registration: ``status: failed`` raises :class:`WorkerFailed`; else
        it is kept (``registry``, its first node in ``nodes``) and told to the watch."""
        reg = self.rdv.worker(i)
        if reg:
            if reg.get("status") == "failed":
                raise WorkerFailed(i, list(reg.get("violations") or ["(no reason given)"]))
            self.nodes.setdefault(i, reg.get("node"))
            self.registry[i] = reg
            self.watch.known(i, reg)

    def _announce(self, i: int, why: str) -> None:
        self.announced.add(i)
        log.info("%s on %s: %s", workernames.name(i), self.nodes.get(i), why)

    def reopen(self, index: int, registration: Mapping[str, Any]) -> str:
        """Worker ``index``'s replacement registered (:meth:`csrun_runtime.streams.StreamMerge.reopen`, node kept):
        returns ``"reconnected"``, or ``"not streaming"`` for a slot autoscale has not opened."""
        self.nodes[index] = registration.get("node")
        return super().reopen(index, registration)

    # ------------------------------------------------------------------ batches
    def _take(self, timeout: float) -> tuple[int, Any]:
        """One batch ``(worker, nest)``: the rest of the current bundle, else of the next one
        (:meth:`~csrun_runtime.streams.StreamMerge.next_bundle`). Raises TimeoutError after
        ``timeout`` s."""
        if self._batches is not None:
            nest = next(self._batches, None)
            if nest is not None:
                return self._worker, nest
            self._batches = None
        b = self.next_bundle(timeout)
        if b.n == 0:  # an unstacked message: one batch
            return b.worker, b.nest
        self._batches, self._worker = b.batches(), b.worker
        return self._worker, next(self._batches)

    def next(self) -> tuple[Any, int]:
        """The next batch and its worker; ``(None, -1)`` once a stop signal was recorded.
        Raises :class:`~csrun_runtime.streams.InputStalled` after
        ``runconfig.worker_start_timeout_secs`` seconds without a first batch, or
        ``runconfig.input_timeout_secs`` without a later one, or naming a worker whose pipeline
        failed, and :class:`WorkerFailed` (from :meth:`poll`)."""
        limit = float(self.rc["input_timeout_secs"] if self.t_first is not None
                      else self.rc["worker_start_timeout_secs"])
        t0 = time.monotonic()
        while True:
            if preemption.stop_requested() or self.cancelled:  # a stop signal, or cancel(): no more batches
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
                log.info("first batch from %s after %.2f s", workernames.name(worker), self.t_first - self.t0)
            self.counts[worker] = self.counts.get(worker, 0) + 1
            return nest, worker

    # ------------------------------------------------------------------ the record
    def _worker_nodes(self) -> dict[str, Any]:
        return {str(i): self.nodes.get(i) or c.get("host") for i, c in self.r.counts().items()}

    def _describe_plane(self) -> dict[str, Any]:
        counts = self.r.counts()
        bulk = self.r.bulk_port is not None
        return {"input": f"input workers over the data plane (zmq{', bulk channel' if bulk else ''})",
                "data_plane": {"endpoint": self.endpoint,
                               "bytes_per_worker": {str(i): c["bytes"] for i, c in counts.items()},
                               "bundles_per_worker": {str(i): c["bundles"] for i, c in counts.items()},
                               "errors": self.r.errors(), "stale_messages": sum(c["stale"] for c in counts.values()),
                               "bulk": bulk}}
