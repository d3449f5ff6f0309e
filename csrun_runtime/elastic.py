"""The chief's side of lost and replaced input workers (docs/RESILIENCE.md "Lost input workers").

An input worker's task keeps a replacement running after the worker's process dies
(:mod:`csrun_runtime.supervise`: same command, same environment, so the same worker index,
files and seed). :class:`WorkerWatch` is polled by the chief's
:class:`csrun_runtime.tensorflow.service.ServiceSource` every :data:`csrun_runtime.rendezvous.HEARTBEAT_SECS`
seconds and

- notices a loss from the supervisor's record ``workers/<i>.lost.json`` (written the moment the
  process died), from the stream's error, or from a heartbeat older than
  :data:`csrun_runtime.rendezvous.STALE_SECS`, and logs it naming the worker and its node;
- notices the replacement's registration (``workers/<i>.json`` with a higher ``attempt``) and
  has the source read worker ``i``'s stream again (:meth:`ServiceSource.reopen`);
- records both for ``performance.json``: ``workers_lost`` and ``workers_replaced`` (index,
  node, time), and ``workers_given_up`` (a worker that died
  :data:`MAX_DEATHS` times);
- with ``adopt`` (``csrun_wse --survive-node-loss``: the input workers run as their own Slurm
  job, which outlives a lost node): orders a new home for a worker whose heartbeat is older
  than :data:`csrun_runtime.rendezvous.STALE_SECS` while no supervisor recorded its death (its
  node, and its supervisor with it, is gone): ``workers/<i>.orphan.json`` with the next
  ``attempt``; a supervisor on a surviving node of that job claims it and starts worker ``i``
  there (:mod:`csrun_runtime.supervise`). After :data:`MAX_DEATHS` orders the worker is
  given up.

Pure Python; no TensorFlow.
"""
from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from typing import Any, Protocol

from csrun_common import env as codec
from csrun_common.atomic import write_json
from csrun_common.roles import WORKER_JOB_ENV

from . import workernames
from .rendezvous import STALE_SECS, Rendezvous

__all__ = ["WorkerWatch", "Reopenable", "MAX_DEATHS", "ATTEMPT_ENV", "STATE_ENV", "tell_supervisor"]

#: An input worker that dies this many times is given up (issue 12: "A worker that keeps
#: dying (3 times) is given up with a warning, not retried forever").
MAX_DEATHS = 3
#: Seconds an adoption order may go unanswered (no replacement registered) before the chief
#: orders again (the adopting process may have died while starting).
ADOPT_TIMEOUT_SECS = 60.0
#: Environment variable of an input worker's process under :mod:`csrun_runtime.supervise`: how
#: many times this worker died before (0, then 1, 2 for its replacements).
ATTEMPT_ENV = codec.WORKER_ATTEMPT
#: Environment variable of that process: a file where the worker writes its rendezvous
#: directory and index (:func:`tell_supervisor`), so that the supervisor records a death there.
STATE_ENV = codec.SUPERVISOR_STATE


def tell_supervisor(rendezvous_dir: str, index: int, env: Mapping[str, str] | None = None) -> None:
    """Input worker, once it knows its rendezvous: tell the supervising process where to
    record a death (a no-op outside :mod:`csrun_runtime.supervise`)."""
    path = (os.environ if env is None else env).get(STATE_ENV)
    if path:
        write_json(path, {"rendezvous": str(rendezvous_dir), "index": int(index)})

log = logging.getLogger("csrun.runtime")


class Reopenable(Protocol):
    """What :class:`WorkerWatch` needs of the chief's batch source."""

    def reopen(self, index: int, registration: Mapping[str, Any]) -> str: ...

    def stopped(self) -> set[int]: ...

    @property
    def counts(self) -> dict[int, int]: ...


class WorkerWatch:
    """Losses and replacements of the job's input workers, seen from the chief.

    Args:
        rdv: the job step's rendezvous.
        registry: the first registrations by worker index (``attempt`` 0).
        adopt: order adoptions of workers lost with their node (``--survive-node-loss``);
            default: ``CSRUN_WORKER_JOB=1`` in the environment.

    ``poll(source)`` is cheap (a few small file reads per worker); ``describe()`` gives the
    keys ``workers_lost``, ``workers_replaced`` and ``workers_given_up`` of performance.json,
    with times as Unix seconds and ``seconds_after_loss`` in seconds.
    """

    def __init__(self, rdv: Rendezvous, registry: Mapping[int, Mapping[str, Any]],
                 adopt: bool | None = None):
        self.rdv = rdv
        self.adopt = os.environ.get(WORKER_JOB_ENV) == "1" if adopt is None else adopt
        self._orders: dict[int, int] = {}  # worker index -> adoption orders written
        self._attempt_ordered: dict[int, int] = {}  # worker index -> attempt of its last order
        self._order_time: dict[int, float] = {}  # worker index -> time of its last order
        self.attempt = {i: int(r.get("attempt") or 0) for i, r in registry.items()}
        self.nodes = {i: r.get("node") for i, r in registry.items()}
        self.pids = {i: r.get("pid") for i, r in registry.items()}
        self.deaths_seen = {i: 0 for i in registry}
        self.lost: list[dict[str, Any]] = []
        self.replaced: list[dict[str, Any]] = []
        self.given_up: list[dict[str, Any]] = []
        self._pending: dict[int, float] = {}  # worker index -> time of its loss, not yet replaced
        self._restarting: set[int] = set()  # pending workers whose supervisor starts a replacement

    def known(self, index: int, registration: Mapping[str, Any]) -> None:
        """Take worker ``index``'s node and pid from its current attempt's ``registration``; a later attempt's is
        :meth:`poll`'s (a replacement); an unknown index is ignored."""
        if index in self.attempt and int(registration.get("attempt") or 0) == self.attempt[index]:
            self.nodes[index], self.pids[index] = registration.get("node"), registration.get("pid")

    def poll(self, source: Reopenable) -> None:
        """Record new losses (supervisor's record first, then the source's stopped streams) and
        reopen the stream of every worker whose replacement registered."""
        for i in self.attempt:
            self._deaths(i)
        for i in sorted(source.stopped()):
            if i not in self._pending and not any(g["index"] == i for g in self.given_up):
                self._lose(i, time.time(), "its stream stopped (stream error or stale heartbeat)")
        for rec in self.replaced:
            if "streaming_again" not in rec and source.counts.get(rec["index"], 0) > rec["batches_before"]:
                now = time.time()
                rec["streaming_again"] = round(now, 3)
                rec["seconds_loss_to_stream"] = round(now - rec["lost_at"], 3)
                log.info("%s streams again, %.1f s after its loss", workernames.name(rec["index"]),
                         now - rec["lost_at"])
        if self.adopt:
            self._order_adoptions()
        for i in list(self._pending):
            reg = self.rdv.worker(i)
            if reg and reg.get("status") == "ok" and int(reg.get("attempt") or 0) > self.attempt[i]:
                self._replaced(i, reg, source)

    def _deaths(self, i: int) -> None:
        deaths = self.rdv.lost(i)
        for d in deaths[self.deaths_seen[i]:]:
            if i not in self._pending:
                self._lose(i, float(d.get("time") or time.time()),
                           f"its process (pid {d.get('pid')}) died of {d.get('signal')}")
            self._restarting.add(i)
            if d.get("given_up"):
                self._restarting.discard(i)
                self.given_up.append({"index": i, "node": d.get("node"), "time": d.get("time"),
                                      "deaths": d.get("deaths")})
                self._pending.pop(i, None)
                log.warning("%s on %s died %s times: given up; training continues "
                            "without it", workernames.name(i), d.get("node"), d.get("deaths"))
        self.deaths_seen[i] = len(deaths)

    def _order_adoptions(self) -> None:
        """Order a new home for each lost worker no supervisor is replacing, once its heartbeat
        is stale; again when an order got no registration within :data:`ADOPT_TIMEOUT_SECS`;
        give the worker up after :data:`MAX_DEATHS` orders."""
        now = time.time()
        for i in sorted(set(self._pending) - self._restarting):
            age = self.rdv.age(f"workers/{i}")
            if age is None or age <= STALE_SECS:
                continue
            last = self._order_time.get(i)
            if last is not None and now - last < ADOPT_TIMEOUT_SECS:
                continue  # an order is out and may still be answered
            if self._orders.get(i, 0) >= MAX_DEATHS:
                self._pending.pop(i, None)
                self._attempt_ordered.pop(i, None)
                self.given_up.append({"index": i, "node": self.nodes.get(i), "time": round(now, 3),
                                      "deaths": self._orders[i]})
                log.warning("%s lost %d times: given up; training continues without it",
                            workernames.name(i), self._orders[i])
                continue
            self._orders[i] = self._orders.get(i, 0) + 1
            attempt = max(self.attempt[i], self._attempt_ordered.get(i, 0)) + 1
            self._attempt_ordered[i], self._order_time[i] = attempt, now
            self.rdv.order_adoption(i, {"index": i, "attempt": attempt, "lost_node": self.nodes.get(i),
                                        "time": round(now, 3)})
            log.warning("%s on %s: no heartbeat for %.0f s and no supervisor replacing it "
                        "(its node is lost): the input workers' job is asked to start it on a "
                        "surviving node (replacement %d)", workernames.name(i), self.nodes.get(i), age, attempt)

    def _lose(self, i: int, when: float, why: str) -> None:
        self._pending[i] = when
        self.lost.append({"index": i, "node": self.nodes.get(i), "pid": self.pids.get(i),
                          "time": round(when, 3), "noticed": round(time.time(), 3), "reason": why})
        log.warning("%s on %s (pid %s) lost %.1f s ago: %s; waiting for its "
                    "replacement", workernames.name(i), self.nodes.get(i), self.pids.get(i), time.time() - when, why)

    def _replaced(self, i: int, reg: Mapping[str, Any], source: Reopenable) -> None:
        lost_at = self._pending.pop(i)
        self._restarting.discard(i)
        self._order_time.pop(i, None)
        how = source.reopen(i, reg)
        self.attempt[i] = int(reg.get("attempt") or 0)
        self.nodes[i], self.pids[i] = reg.get("node"), reg.get("pid")
        now = time.time()
        self.replaced.append({"index": i, "node": reg.get("node"), "pid": reg.get("pid"),
                              "attempt": self.attempt[i], "time": round(now, 3),
                              "seconds_after_loss": round(now - lost_at, 3), "stream": how,
                              "lost_at": round(lost_at, 3), "batches_before": source.counts.get(i, 0)})
        log.warning("%s replaced on %s (pid %s, replacement %d) %.1f s after its "
                    "loss; its stream %s", workernames.name(i), reg.get("node"), reg.get("pid"), self.attempt[i],
                    now - lost_at, how)

    def awaiting(self) -> set[int]:
        """Workers lost whose task's supervisor recorded the death and is starting a
        replacement, or whose adoption was ordered (not given up)."""
        ordered = {i for i, a in self._attempt_ordered.items() if a > self.attempt[i]}
        return set(self._pending) & (self._restarting | ordered)

    def describe(self) -> dict[str, Any]:
        """``workers_lost``, ``workers_replaced`` and ``workers_given_up`` for performance.json."""
        return {"workers_lost": list(self.lost), "workers_replaced": list(self.replaced),
                "workers_given_up": list(self.given_up)}
