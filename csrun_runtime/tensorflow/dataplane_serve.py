"""An input worker serving its ``input_fn`` over csrun's data plane (``runconfig.transport:
dataplane``; docs/DATAPLANE.md "The TensorFlow path").

The input worker (:class:`csrun_runtime.tensorflow.worker.InputWorker`) gets here once the chief's
``endpoints.json`` says ``transport: dataplane`` (its ``endpoints[i]``: the chief's
receiver, ``tcp://host:port``). :func:`serve` builds, checks and plans the dataset's
bundling with the service path's own method (:meth:`InputWorker.build_and_plan`: the
contract, :func:`csrun_runtime.tensorflow.service.plan_bundle`; then
:func:`csrun_runtime.tensorflow.service.limit_threads`), stacks ``B`` batches per element with
``Dataset.batch(B)`` (the bundle; :data:`PREFETCH` bundles prepared ahead), and sends each
element from ``as_numpy_iterator()`` to the chief with
:meth:`csrun_runtime.dataplane.Sender.send_bundle`: one message per bundle, the arrays handed to
zmq without a copy, no Python per batch. A pump thread sends; the main thread
keeps the worker's life as on the service path (``done.json``, a lost chief, a later attempt
that supersedes this one) and writes the same report.

A replacement (``attempt > 0``, :mod:`csrun_runtime.supervise`) connects with its attempt: the
chief's receiver drops what the old attempt still had in flight and reads the new one. An error
of the pipeline is recorded in ``workers/<i>.stream_error.json``
(:data:`csrun_runtime.streams.STREAM_ERROR`), which fails the chief naming this worker.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from csrun_common.roles import Role

from ..bundles import map_nest
from ..position import tag
from ..rendezvous import SUPERSEDED, Heartbeat, Rendezvous
from ..streams import STREAM_ERROR
from .bundling import BundlePlan, limit_threads
from .pipeline import WorkerInput
from .resume import stream_hooks

__all__ = ["serve", "Pump", "ServedWorker"]

log = logging.getLogger("csrun.runtime")

#: Bundles the served dataset prepares ahead of the one being sent (``Dataset.prefetch``).
PREFETCH = 2
#: Seconds one send waits for credit before the pump looks at its stop flag again.
SEND_POLL_SECS = 0.5


class _Halted(Exception):
    """The pump was stopped while it waited for its starting position."""


class Pump(threading.Thread):
    """Send ``ds``'s batches in bundles of ``bundle`` (``bundle == 1``: plain batches, given a
    leading axis of 1) to ``endpoint`` as input worker ``index``/``attempt`` until the dataset
    ends, :meth:`stop` is called or the receiver refuses this attempt. ``counter[0]`` counts the
    bundles sent; ``error`` holds a pipeline error (``None``: none), also given to ``on_error``.

    With ``position`` (``position(check) -> n``: the stream index to start at, waited for while
    ``check()`` raises when stopped) the stream starts at batch ``n`` of ``ds`` (read and
    discarded: ``Dataset.skip``), ``resumed(info)`` says where and in how long, and each bundle
    carries its batches' stream indices (:func:`csrun_runtime.position.tag`)."""

    def __init__(self, ds: Any, bundle: int, endpoint: str, index: int, attempt: int, counter: list[int],
                 on_error: Callable[[str], None] | None = None, position: Callable[[Callable[[], None]], int] | None
                 = None, resumed: Callable[[dict[str, Any]], None] = lambda info: None):
        super().__init__(daemon=True, name=f"dataplane-send-{index}.{attempt}")
        self.ds, self.bundle, self.endpoint, self.index, self.attempt = ds, bundle, endpoint, index, attempt
        self.counter, self.on_error = counter, on_error
        self.position, self.resumed = position, resumed
        self.error: str | None = None
        self.ended = False  # the dataset ended (a finite input_fn)
        self._halt = threading.Event()

    def stop(self) -> None:
        """Ask the pump to leave after the send it is waiting in (within SEND_POLL_SECS)."""
        self._halt.set()

    def _check_halt(self) -> None:
        if self._halt.is_set():
            raise _Halted()

    def _served(self, start: int) -> Any:
        """The bundles from batch ``start`` of ``ds`` (the ones before read and discarded), the
        next bundle prepared on tf.data's threads while this one is sent."""
        from .bundling import bundle_dataset

        return bundle_dataset(self.ds.skip(start) if start else self.ds, self.bundle).prefetch(PREFETCH)

    def _told(self, start: int, seconds: float) -> None:
        how = (f"read and discarded {start:,} batch(es) (Dataset.skip: its iterator is not checkpointed)"
               if start else "from its beginning")
        self.resumed({"batches": start, "pass": None, "batch_in_pass": None, "seconds": seconds, "how": how})

    def run(self) -> None:
        from ..dataplane import NotAuthenticated, ReceiverGone, Sender

        sender = Sender(self.endpoint, self.index, self.attempt, bundle=1)
        try:
            start = 0 if self.position is None else self.position(self._check_halt)
            t0 = time.monotonic()
            for k, el in enumerate(self._served(start).as_numpy_iterator()):
                if self.bundle <= 1:
                    el = map_nest(lambda a: a[None], el)
                if self.position is not None:
                    if not k:
                        self._told(start, time.monotonic() - t0)
                    el = tag(el, start + k * self.bundle, self.bundle)
                while not self._halt.is_set():
                    try:
                        sender.send_bundle(el, self.bundle, timeout=SEND_POLL_SECS)
                        break
                    except TimeoutError:  # no credit (the chief is busy, or paused us)
                        continue
                if self._halt.is_set():
                    return
                self.counter[0] += 1
            self.ended = True
        except _Halted:
            return
        except NotAuthenticated as e:  # a foreign listener: one line, and nothing sent there
            log.error("%s", e)
        except ReceiverGone as e:
            log.info("the chief's receiver stopped reading this worker: %s", e)
        except Exception as e:  # noqa: BLE001 - any error of the user's pipeline is reported
            self.error = f"{type(e).__name__}: {str(e).strip()[:1000]}"
            log.error("the input pipeline failed: %s", self.error)
            if self.on_error is not None:
                self.on_error(self.error)
        finally:
            sender.close(timeout=2.0 if self.ended else 0.2)


class ServedWorker(Protocol):
    """What :func:`serve` uses of an input worker
    (:class:`csrun_runtime.tensorflow.worker.InputWorker` implements it): its identity, rendezvous
    and counters, and the steps it shares with the tf.data service path."""

    role: Role
    rdv: Rendezvous
    heartbeat: Heartbeat
    index: int
    attempt: int
    me: dict[str, Any]  # what every registration and report says of the worker
    counter: list[int]  # ``counter[0]``: elements (bundles) sent
    bundling: BundlePlan
    files: list[str] | None  # the files its pipeline lists

    def build_and_plan(self) -> tuple[int | None, WorkerInput] | None:
        """``(batch_size, built input)`` checked, ``bundling`` planned; ``None`` after registering the violations."""
        ...

    def left_unserved(self, chief_status: str | None, status: str = "left") -> None:
        """The report of a worker that leaves without having served."""
        ...

    def serve_until_done(self) -> tuple[int, str | None]:
        """Wait while serving; ``(exit code, the chief's status or SUPERSEDED)``."""
        ...

    def write_report(self, built: WorkerInput, batch_size: int | None, status: str | None) -> None:
        """The report of what the worker produced."""
        ...


def serve(worker: ServedWorker, endpoint: str) -> int:
    """Build, check, register and serve ``worker``'s dataset to the chief's receiver at
    ``endpoint`` until the chief is done; returns the exit code (as
    :meth:`csrun_runtime.tensorflow.worker.InputWorker.run`: 0 done or superseded, 1 chief lost, 2 the
    input_fn violates the contract, registered as ``status: failed``)."""
    got = worker.build_and_plan()
    if got is None:
        worker.left_unserved(None, "failed")
        return 2
    batch_size, built = got
    ti = built.params["train_input"]
    rdv, index, attempt = worker.rdv, worker.index, worker.attempt

    def record(error: str) -> None:
        rdv.write("workers/" + STREAM_ERROR.format(index=index), {"error": error, "attempt": attempt,
                                                                 "node": worker.role.node, "pid": os.getpid(),
                                                                 "time": time.time()})

    # its stream resumes where the chief says (csrun_runtime/position.py): published before the
    # chief reads, or for a replacement answered when the chief sees the registration below
    position, resumed = stream_hooks(rdv, index, attempt, float(built.params["runconfig"]["worker_start_timeout_secs"]))
    pump = Pump(limit_threads(built.dataset, worker.role.cpus_per_task), worker.bundling.bundle, endpoint, index,
                attempt, worker.counter, record, position=position, resumed=resumed)
    worker.rdv.register_worker(worker.index, {
        **worker.me, "status": "ok", "transport": "dataplane", "dispatcher": endpoint,
        "batch_size": batch_size, "shuffle_seed": ti.get("shuffle_seed"), "data_files": ti.get("data_files"),
        "pipeline_files": worker.files, **built.describe(), "registered": time.time(),
        "bundle": worker.bundling.bundle, "bundling": worker.bundling.describe()})
    log.info("serving input_fn to the chief over the data plane (%s, attempt %d, batch_size %s, shuffle_seed %s, "
             "%s; bundling %s)", endpoint, worker.attempt, batch_size, ti.get("shuffle_seed"),
             f"{len(worker.files)} file(s) listed by its pipeline" if worker.files is not None else "files not seen",
             worker.bundling.reason)
    pump.start()
    code, status = worker.serve_until_done()
    pump.stop()
    pump.join(timeout=3.0)
    worker.heartbeat.stop()
    if status != SUPERSEDED:
        worker.write_report(built, batch_size, status)
    return code

