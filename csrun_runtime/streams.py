"""The chief's merge of its input workers' data-plane streams, once for every framework
(issue 22, "one house for two frameworks"; docs/DATAPLANE.md).

Every input worker sends its bundles (``n`` batches stacked, numpy arrays over the received
frames) to one :class:`csrun_runtime.dataplane.Receiver` of the chief (a zmq ROUTER:
:func:`start_receiver`). :class:`StreamMerge` reads them first come, first served and owns
everything around that receiver which the framework backends share:

- the workers' registrations by index (``registry``) and the elastic watch
  (:class:`csrun_runtime.elastic.WorkerWatch`: lost and replaced workers, adoption orders),
  polled every :data:`POLL_SECS` seconds (:meth:`StreamMerge.poll`);
- per-worker ``counts`` (batches handed to training), the seconds since each worker's last
  bundle, and the slots (:class:`StreamSlots`): slots ``0 .. streams-1`` read from the start, a
  slot not opened yet held and paused at the receiver, ``add_stream`` / ``pause`` /
  ``resume`` / ``reopen`` / ``streaming`` / ``stopped`` / ``buffered_batches`` (the interface
  :class:`csrun_runtime.autoscale.Autoscaler` and the watch drive; backpressure is the
  receiver's credit window per worker);
- stall detection naming the workers (heartbeats, batches, last bundle: :func:`stall_report`,
  :func:`raise_if_stalled`, :class:`InputStalled`), a worker whose heartbeat goes stale or
  whose stream ended counted as stopped, and a worker's pipeline error
  (``workers/<i>.stream_error.json``, :data:`STREAM_ERROR`) failing the chief naming it;
- ``describe()``'s common performance.json keys and ``close()``.

The framework adapters are thin: the TensorFlow chief's
:class:`csrun_runtime.tensorflow.remote.DataplaneSource` hands out the bundles as
:class:`csrun_runtime.tensorflow.service.Chunk` s (converted to tensors), the PyTorch chief's
:class:`csrun_runtime.pytorch.remote.RemoteSource` one batch at a time. The helpers at the top
(:func:`open_slot`, :func:`announce_stopped`, :func:`raise_if_stalled`, :func:`stall_report`)
also serve the tf.data service merge (:class:`csrun_runtime.tensorflow.service.ServiceSource`).

Imports neither TensorFlow nor torch (not even inside functions): numpy nests only.
"""
from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Collection, Mapping
from typing import Any

from csrun_common.atomic import read_json

from . import workernames
from .elastic import WorkerWatch
from .position import InputPositions, state_of, untag, untag_bundle
from .rendezvous import HEARTBEAT_SECS, STALE_SECS, Rendezvous

__all__ = ["StreamMerge", "StreamSlots", "InputStalled", "STREAM_ERROR", "POLL_SECS", "start_receiver",
           "dataplane_options", "plane_note", "open_slot", "announce_stopped", "raise_if_stalled", "stall_report"]

log = logging.getLogger("csrun.runtime")

#: Seconds between the merge's looks at the rendezvous (heartbeats, registrations, error files,
#: the elastic watch) while it waits for bundles.
POLL_SECS = HEARTBEAT_SECS
#: File (under the rendezvous' ``workers/``) where input worker ``<i>`` records the error that
#: ended its pipeline: ``<i>.stream_error.json`` ``{"error", "attempt", "node", "pid"}``.
STREAM_ERROR = "{index}.stream_error.json"


class InputStalled(RuntimeError):
    """No batch for too long, every input worker stopped, or a worker's pipeline failed (the
    message names the workers). One class for both chiefs: ``csrun_runtime.tensorflow.service`` and
    ``csrun_runtime.pytorch.remote`` re-export it."""


def dataplane_options(rc: Mapping[str, Any]) -> dict[str, Any]:
    """The receiver's keywords from ``runconfig`` ``rc``: ``bulk`` (``dataplane_bulk``) and ``shm_bytes``
    (``dataplane_shm_bytes``, default :data:`csrun_runtime.params.SHM_RING_BYTES`; 0: no ring)."""
    from .params import SHM_RING_BYTES

    shm_bytes = rc.get("dataplane_shm_bytes")
    return {"bulk": bool(rc.get("dataplane_bulk", False)),
            "shm_bytes": SHM_RING_BYTES if shm_bytes is None else int(shm_bytes)}


def start_receiver(host: str, window_bytes: int | None = None,
                   window_batches: int | None = None, bulk: bool = False, shm_bytes: int = 0) -> tuple[Any, str]:
    """Bind the chief's receiver on every interface, on a free port, with a credit window of ``window_bytes``
    bytes per worker (default :data:`csrun_runtime.dataplane.WINDOW_BYTES`) and, when given, of ``window_batches``
    batches not taken by the chief; ``bulk``: with the bulk channel (``runconfig.dataplane_bulk``);
    ``shm_bytes``: a shared-memory ring of that many bytes per input worker on the chief's node
    (``runconfig.dataplane_shm_bytes``; 0: none). Returns ``(receiver, "tcp://<host>:<port>")``, ``host`` the
    chief's address for the input workers. Raises ``zmq.ZMQError`` when nothing can be bound."""
    from .dataplane import WINDOW_BYTES, Receiver

    r = Receiver("tcp://*:0", window_bytes=window_bytes or WINDOW_BYTES, window_batches=window_batches or None,
                 bulk=bulk, shm_bytes=shm_bytes)
    port = r.endpoint.rsplit(":", 1)[1]
    return r, f"tcp://{host}:{port}"


def plane_note(receiver: Any) -> str:
    """The receiver's log line's note of its bulk channel and rings, or ""."""
    port, ring = receiver.bulk_port, getattr(receiver, "shm_bytes", 0)
    return ((f", bulk channel on port {port} (runconfig.dataplane_bulk)" if port is not None else "")
            + (f", a shared-memory ring of {ring >> 20} MiB for each input worker on this node "
               "(runconfig.dataplane_shm_bytes)" if ring else ""))


# --------------------------------------------------------------------------- shared helpers
def open_slot(source: Any, index: int, registration: Mapping | None) -> None:
    """What ``add_stream`` of every merge shares (:class:`StreamMerge`,
    :class:`csrun_runtime.tensorflow.service.ServiceSource`): record worker ``index``'s ``registration``
    (if given), grow ``source.n`` to ``index + 1`` (slots in between, never opened, count as
    stopped) and forget ``index``'s failure and stop."""
    if registration is not None:
        source.registry[index] = dict(registration)
    for j in range(source.n, index + 1):
        source.counts.setdefault(j, 0)
        source.last.setdefault(j, None)
        if j != index:
            source.announced.add(j)
    source.n = max(source.n, index + 1)
    source.failed.pop(index, None)
    source.announced.discard(index)


def announce_stopped(source: Any, i: int, why: str) -> None:
    """Count input worker ``i`` of ``source`` (as :func:`stall_report`'s) as stopped
    (``source.announced``) and log it once, as ``<who> stopped<why>; training continues with
    the other k worker(s)`` (or ``no input worker left``); ``why`` starts with its separator
    (``": no heartbeat for 9 s"``, ``" streaming (UnavailableError: ...)"``)."""
    source.announced.add(i)
    left = source.n - len(source.announced | set(source.failed))
    log.warning("%s stopped%s; %s", source._who(i), why,
                f"training continues with the other {left} worker(s)" if left else "no input worker left")


def raise_if_stalled(source: Any, start: float, timeout: float, what: str) -> None:
    """The watchdog's verdict when no batch came (``source`` as :func:`stall_report`'s, with
    ``stopped()`` and ``watch``): raises :class:`InputStalled` with the stall report when
    every worker stopped (none awaiting a replacement) and more than 1 s passed since
    ``start`` (monotonic s), or when more than ``timeout`` s passed (``what`` names the
    setting); returns otherwise."""
    now = time.monotonic()
    if len(source.stopped() - source.watch.awaiting()) >= source.n and now - start > 1.0:
        raise InputStalled(f"every input worker stopped and no batch is left: {source.status_text()}")
    if now - start > timeout:
        raise InputStalled(f"no batch from any input worker for {now - start:.0f} s "
                           f"({what} = {timeout:g}): {source.status_text()}")


def stall_report(source: Any, stopped: Collection[int], failed_prefix: str = "") -> str:
    """What :class:`InputStalled` says of each input worker of ``source`` (a
    :class:`StreamMerge` or :class:`csrun_runtime.tensorflow.service.ServiceSource`: its ``rdv``, ``n``,
    ``counts``, ``last``, ``failed``, ``paused`` and ``_who``), one clause per worker
    ``0 .. n-1`` joined by ``"; "``: who it is (node, pid), ``(stopped)`` when in ``stopped``
    or its heartbeat is missing or older than STALE_SECS, ``(paused)``, its heartbeat's age in
    s, the batches handed out, the seconds since its last batch, and ``failed_prefix`` + why
    its stream failed, if it did."""
    now = time.monotonic()
    parts = []
    for i in range(source.n):
        age = source.rdv.age(f"workers/{i}")
        hb = "no heartbeat file" if age is None else f"heartbeat {age:.0f} s ago"
        dead = " (stopped)" if i in stopped or age is None or age > STALE_SECS else ""
        last = source.last.get(i)
        lb = "no batch yet" if last is None else f"last batch {now - last:.0f} s ago"
        parts.append(f"{source._who(i)}{dead}{' (paused)' if i in source.paused else ''}: {hb}, "
                     f"{source.counts.get(i, 0)} batches, {lb}"
                     + (f", {failed_prefix}{source.failed[i]}" if i in source.failed else ""))
    return "; ".join(parts)


# --------------------------------------------------------------------------- the slots
class StreamSlots:
    """The opened, paused and held slots of the input workers sending to ``receiver``.

    Args:
        receiver: the chief's :class:`~csrun_runtime.dataplane.Receiver` (``pause(i)``,
            ``resume(i)``: also of a worker not connected yet; ``window_bytes``: bytes).
        opened: slots read from the start (``0 .. opened-1``).

    A bundle of a slot not opened yet is held (handed out first once the slot is opened) and
    its worker paused at the receiver, so it sends at most one credit window before it is
    wanted. The receiver keeps a pause of a worker not connected yet, and across a worker's
    reconnection and replacement. Call every method from the receiver's thread.
    """

    def __init__(self, receiver: Any, opened: int):
        self.r = receiver
        self.opened: set[int] = set(range(opened))
        self.paused: set[int] = set()  # paused by the autoscaler
        self._held: dict[int, deque[Any]] = {}  # bundles of slots not opened yet
        self._held_paused: set[int] = set()  # slots not opened yet, paused at the receiver
        #: Batches in each worker's last bundle handed out, by worker index.
        self.bundle_n: dict[int, int] = {}
        self._batch_bytes: dict[int, int] = {}  # bytes of one batch of each worker

    def open(self, index: int) -> None:
        """Read slot ``index`` from now on; its held bundles come first, and its worker, paused
        while it was not opened (or by :meth:`pause`), sends again."""
        self.opened.add(index)
        if index in self.paused or index in self._held_paused:
            self._held_paused.discard(index)
            self.resume(index)

    def pause(self, i: int) -> None:
        """Tell worker ``i`` to send nothing more (what it has in flight, at most one credit
        window, is still handed out); a worker not connected yet starts paused."""
        self.paused.add(i)
        self.r.pause(i)

    def resume(self, i: int) -> None:
        """Let paused worker ``i`` send again."""
        self.paused.discard(i)
        self.r.resume(i)

    def held(self) -> Any | None:
        """A held bundle of an opened slot (lowest slot first), or None."""
        for i in sorted(self.opened & set(self._held)):
            if self._held[i]:
                b = self._held[i].popleft()
                self._seen(b)
                return b
        return None

    def admit(self, b: Any) -> bool:
        """A bundle ``b`` just received (``b.worker``, ``b.n`` batches, ``b.nbytes``): True when
        it is to be handed out; False when its slot is not opened (held, its worker paused at
        the receiver)."""
        if b.worker not in self.opened:
            self._held.setdefault(b.worker, deque()).append(b)
            if b.worker not in self._held_paused:
                self._held_paused.add(b.worker)
                self.r.pause(b.worker)
            return False
        self._seen(b)
        return True

    def _seen(self, b: Any) -> None:
        n = max(1, b.n)
        self.bundle_n[b.worker], self._batch_bytes[b.worker] = n, max(1, b.nbytes // n)

    def buffered_batches(self, streaming: set[int]) -> int:
        """At most how many batches the chief holds ahead of training from the ``streaming``
        workers: one credit window each (in batches of that worker's size, at most the
        receiver's ``window_batches``) and one bundle."""
        window = int(getattr(self.r, "window_bytes", 0))
        wb = getattr(self.r, "window_batches", None)
        total = 0
        for i in streaming:
            b, bundle = self._batch_bytes.get(i), max(1, self.bundle_n.get(i, 1))
            credit = window // b if b else bundle
            total += (min(credit, int(wb)) if wb else credit) + bundle
        return total


# --------------------------------------------------------------------------- the merge
class StreamMerge:
    """The bundles of every input worker sending to the chief's receiver, first come, first
    served, with the workers watched (framework-neutral; the adapters hand them out).

    Args:
        rdv: the job step's rendezvous (heartbeats, registrations, stream error files).
        receiver: the bound :class:`csrun_runtime.dataplane.Receiver` the workers send to.
        registry: the workers' registrations by index known now (node, host, pid, attempt).
        streams: how many slots are read from the start (``0 .. streams-1``; ``add_stream``
            opens the others). A slot not opened yet is paused at the receiver on its first
            bundle; what it sent until then (at most one credit window) is kept for when it is
            opened.
        slots: the job's input-worker slots ``W``, every one watched from the start (its
            heartbeat; :meth:`_look` reads its registration) and described; ``None``: the slots
            ``0 .. n-1`` read so far.
        adopt: the watch orders adoptions of workers lost with their node (``--survive-node-loss``);
            default ``CSRUN_WORKER_JOB=1`` in the environment.
        addresses: every slot's address for the autoscaler (the one receiver's endpoint).
        positions: every slot's stream position (:class:`csrun_runtime.position.InputPositions`,
            published at once): bundles are handed out in stream order, duplicates dropped, and a
            replacement told where to start; ``None``: bundles as they come.

    Subclasses may override the hooks :meth:`_look` (a worker's registration at each poll),
    :meth:`_announce` (how a stopped worker is logged), :meth:`_worker_nodes` and
    :meth:`_describe_plane` (performance.json). Call every method from one thread (the
    receiver is not thread-safe).
    """

    def __init__(self, rdv: Rendezvous, receiver: Any, registry: Mapping[int, Mapping], streams: int, *,
                 slots: int | None = None, adopt: bool | None = None, addresses: Collection[str] = (),
                 positions: InputPositions | None = None):
        self.rdv, self.receiver, self.w = rdv, receiver, slots
        self.positions = positions
        if positions is not None:
            positions.publish(rdv)
        #: Every slot's latest registration (``workers/<i>.json``), by index (the autoscaler's).
        self.registry: dict[int, dict[str, Any]] = {i: dict(r) for i, r in registry.items()}
        self.n = int(streams)  # one past the highest slot opened
        #: Batches handed to training, by worker index.
        self.counts: dict[int, int] = {i: 0 for i in range(self.n)}
        self.last: dict[int, float | None] = {i: None for i in range(self.n)}  # monotonic s of the last bundle
        self.failed: dict[int, str] = {}  # workers whose stream ended, and why
        self.announced: set[int] = set()  # workers counted as stopped (stale heartbeat, ended), not replaced since
        self.addresses = list(addresses)
        self.slots = StreamSlots(receiver, self.n)
        # a PyTorch chief watches before its workers register: their first registrations reach
        # the watch in poll() (WorkerWatch.known)
        self.watch = WorkerWatch(rdv, {**{i: {} for i in range(slots or 0)}, **self.registry}, adopt=adopt)
        self._fatal: str | None = None
        self._last_poll = 0.0  # monotonic s of the last poll (0: the first call polls)

    # ------------------------------------------------------------------ streams
    @property
    def paused(self) -> set[int]:
        """Workers the autoscaler paused."""
        return self.slots.paused

    @property
    def opened(self) -> set[int]:
        """Slots read (opened at the start or by :meth:`add_stream`)."""
        return self.slots.opened

    def indices(self) -> range:
        """The slots watched and described: ``0 .. W-1`` with ``slots``, else ``0 .. n-1``."""
        return range(self.n if self.w is None else self.w)

    def add_stream(self, index: int, address: str = "", registration: Mapping | None = None) -> None:
        """Read slot ``index`` from now on (autoscale's *add*; a new index grows the merge, those between count
        as stopped): its held bundles first, its worker unpaused. ``address`` is unused (one receiver for all)."""
        open_slot(self, index, registration)
        self.slots.open(index)

    def pause(self, i: int) -> None:
        """Autoscale's *remove*: worker ``i`` sends nothing more (once connected); what is in flight is handed out."""
        self.slots.pause(i)

    def resume(self, i: int) -> None:
        """Let paused worker ``i`` send again."""
        self.slots.resume(i)

    def reopen(self, i: int, registration: Mapping) -> str:
        """Worker ``i``'s replacement registered (:mod:`csrun_runtime.elastic`): it connects to
        the receiver by itself with its higher attempt, which drops what the old attempt still
        had in flight (a paused worker's replacement starts paused); only its stopped state is
        cleared here. Returns ``"reconnected"`` (``"not streaming"`` for a slot not opened)."""
        self.registry[i] = dict(registration)
        self.announced.discard(i)
        if self.positions is not None:
            self.positions.answer(self.rdv, i, int(registration.get("attempt") or 0))
        if i not in self.opened:
            return "not streaming"
        self.failed.pop(i, None)
        return "reconnected"

    def streaming(self) -> set[int]:
        """Indices of the workers read now: opened, not paused, not stopped."""
        return self.opened - self.paused - self.stopped()

    def stopped(self) -> set[int]:
        """Indices of the workers whose stream ended or whose heartbeat went stale (not replaced since)."""
        return set(self.announced) | set(self.failed)

    def buffered_batches(self) -> int:
        """Most batches the chief holds ahead of training: a credit window per streaming worker, plus one bundle."""
        return self.slots.buffered_batches(self.streaming())

    # ------------------------------------------------------------------ the watch
    def _who(self, i: int) -> str:
        reg = self.registry.get(i) or {}
        return f"{workernames.name(i)} on {reg.get('node', '?')} (pid {reg.get('pid', '?')})"

    def status_text(self) -> str:
        """One clause per worker: node, heartbeat age, batches handed out, last bundle age (:func:`stall_report`)."""
        return stall_report(self, self.stopped())

    def poll(self) -> None:
        """At most once every :data:`POLL_SECS` seconds: look at every watched worker
        (registration, stream error file, ended stream, heartbeat), then the
        :class:`~csrun_runtime.elastic.WorkerWatch` (losses, replacements, adoption orders;
        logged). Raises :class:`InputStalled` naming a worker whose pipeline failed, and what
        :meth:`_look` raises."""
        now = time.monotonic()
        if now - self._last_poll < POLL_SECS:
            return
        self._last_poll = now
        self._check_workers()
        self.watch.poll(self)
        if self.positions is not None:
            self.positions.poll_resumed(self.rdv, self.indices())
        if self._fatal:
            raise InputStalled(self._fatal)

    def _check_workers(self) -> None:
        """Registrations, pipeline errors the workers recorded, ended streams, stale heartbeats."""
        counts = self.receiver.counts()
        for i in self.indices():
            self._look(i)
            if i in self.announced:
                continue
            reg = self.registry.get(i) or {}
            err = read_json(self.rdv.workers_dir / STREAM_ERROR.format(index=i))
            if err and int(err.get("attempt") or 0) >= int(reg.get("attempt") or 0):
                self._fatal = f"{self._who(i)}: its input pipeline failed: {str(err.get('error'))[:500]}"
                return
            c = counts.get(i) or {}
            if c.get("done") and int(c.get("attempt") or 0) >= int(reg.get("attempt") or 0):
                self.failed[i] = "the stream ended (the input_fn's dataset is finite)"
            age = self.rdv.age(f"workers/{i}")
            why = (f"no heartbeat for {age:.0f} s" if age is not None and age > STALE_SECS
                   else self.failed.get(i))
            if why:
                self._announce(i, why)

    def _look(self, i: int) -> None:
        # hook; by default the registrations given are kept
        pass

    def _announce(self, i: int, why: str) -> None:
        """Hook: count worker ``i`` stopped (``why``: ``"no heartbeat for 9 s"``); default: :func:`announce_stopped`."""
        announce_stopped(self, i, f": {why}")

    # ------------------------------------------------------------------ bundles
    def next_bundle(self, wait: float) -> Any:
        """The next bundle of an opened slot (held ones first, then first come, first served):
        a :class:`csrun_runtime.dataplane.Bundle` without its stream tag; with ``positions`` the
        next batches of its stream only (:meth:`csrun_runtime.position.InputPositions.accept`:
        a duplicate is dropped). One of a slot not opened yet is held. Polls the workers when
        due (:meth:`poll`, whose errors it raises). Raises ``TimeoutError`` (the receiver's
        message, naming each worker's last bundle) after ``wait`` seconds."""
        deadline = time.monotonic() + wait
        while True:
            b = self._admitted(deadline)
            if self.positions is not None:
                first = untag(b.nest)[0]
                self.positions.snapshot(b.worker, first, state_of(b.nest))  # a stateful dataset's
                drop = self.positions.accept(b.worker, first, max(1, b.n))
                if drop >= max(1, b.n):
                    continue
                b = untag_bundle(b, drop)
            else:
                b = untag_bundle(b)
            break
        self.last[b.worker] = time.monotonic()
        self.counts.setdefault(b.worker, 0)
        return b

    def _admitted(self, deadline: float) -> Any:
        """A held bundle of an opened slot, else the next received one of an opened slot."""
        b = self.slots.held()
        if b is not None:
            return b
        if self._fatal:
            raise InputStalled(self._fatal)
        self.poll()
        while True:
            b = self.receiver.get_bundle(timeout=max(0.0, deadline - time.monotonic()))
            if self.slots.admit(b):
                return b

    # ------------------------------------------------------------------ the record
    def describe(self) -> dict[str, Any]:
        """For performance.json: ``batches_per_worker`` (handed to training), ``worker_nodes``,
        ``workers_paused``, ``dataplane_refused`` (the peers the receiver refused: ones that did
        not prove they know the job's secret, :meth:`csrun_runtime.dataplane.Receiver.refused`),
        ``dataplane_shm`` (``ring_bytes``, and per worker on the chief's node the bundles received
        through its shared-memory ring), the adapter's data-plane keys (:meth:`_describe_plane`) and
        the watch's ``workers_lost``, ``workers_replaced`` and ``workers_given_up`` (times: Unix seconds)."""
        refused = getattr(self.receiver, "refused", None)
        shared = {str(i): c["shm_bundles"] for i, c in self.receiver.counts().items() if c.get("shm_bundles")}
        return {"batches_per_worker": {str(i): self.counts.get(i, 0) for i in self.indices()},
                "worker_nodes": self._worker_nodes(),
                "workers_paused": sorted(self.paused),
                **({"dataplane_refused": refused()} if refused is not None else {}),
                "dataplane_shm": {"ring_bytes": getattr(self.receiver, "shm_bytes", 0), "bundles_per_worker": shared},
                **self._describe_plane(),
                **self.watch.describe()}

    def _worker_nodes(self) -> dict[str, Any]:
        """Hook: each described slot's node (default: its registration's)."""
        return {str(i): (self.registry.get(i) or {}).get("node") for i in self.indices()}

    def _describe_plane(self) -> dict[str, Any]:
        """Hook: the adapter's data-plane keys of :meth:`describe` (default: none)."""
        return {}

    def close(self) -> None:
        """Close the receiver (the workers' next send raises ReceiverGone); arrays handed out stay valid."""
        self.receiver.close()
