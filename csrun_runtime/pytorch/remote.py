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

No TensorFlow; no torch either (batches stay numpy nests until the loop moves them).
"""
from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from csrun_common.atomic import write_json
from csrun_common.roles import Role

from .. import preemption
from ..elastic import WorkerWatch
from ..rendezvous import STALE_SECS, Rendezvous

__all__ = ["RemoteSource", "InputStalled", "WorkerFailed", "DATAPLANE_FILE", "POLL_SECS"]

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


class RemoteSource:
    """Batches from ``W`` input workers through one :class:`csrun_runtime.dataplane.Receiver`.

    Args:
        rdv: the job step's rendezvous (``dataplane.json`` is written there at once).
        role: the chief's role (``num_workers``; ``host``: the address workers reach it by).
        rc: ``runconfig`` (``input_timeout_secs``, ``worker_start_timeout_secs``: seconds).
        adopt: order adoptions of workers lost with their node; default ``CSRUN_WORKER_JOB=1``
            in the environment (``csrun_wse --survive-node-loss``).

    Raises ``zmq.ZMQError`` when the receiver cannot bind. Call every method from one thread.
    """

    def __init__(self, rdv: Rendezvous, role: Role, rc: dict[str, Any], adopt: bool | None = None):
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
        with its higher attempt (the receiver drops what the older one had in flight); only
        its stopped state is cleared here. Returns ``"reconnected"``."""
        self.announced.discard(index)
        self.nodes[index] = registration.get("node")
        return "reconnected"

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
                self.watch.known(i, reg)
            age = self.rdv.age(f"workers/{i}")
            if age is not None and age > STALE_SECS and i not in self.announced:
                self.announced.add(i)
                log.info("input worker %d on %s: no heartbeat for %.0f s", i, self.nodes.get(i), age)
        self.watch.poll(self)

    # ------------------------------------------------------------------ batches
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
                worker, nest = self.r.get(timeout=min(POLL_SECS, max(0.01, limit - (time.monotonic() - t0))))
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
                "input": "input workers over the data plane (zmq)",
                "data_plane": {"endpoint": self.endpoint,
                               "bytes_per_worker": {str(i): c["bytes"] for i, c in counts.items()},
                               "bundles_per_worker": {str(i): c["bundles"] for i, c in counts.items()},
                               "errors": self.r.errors(), "stale_messages": sum(c["stale"] for c in counts.values())},
                **self.watch.describe()}

    def close(self) -> None:
        """Close the receiver: the workers' next send fails and they wait for ``done.json``."""
        self.r.close()
