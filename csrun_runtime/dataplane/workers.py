"""The receiver's record of its senders (the input workers): who said hello at which attempt,
the welcome, pause and resume, per-worker counts and the bad messages dropped. One
:class:`Workers` per :class:`~csrun_runtime.dataplane.Receiver`, called on its thread."""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import zmq

from . import framing, protocol
from .framing import FrameError

log = logging.getLogger(__name__)

@dataclass
class WorkerRecord:
    """One input worker as the receiver knows it: its current attempt's routing id and the
    counts of every attempt of its index."""

    index: int
    attempt: int
    identity: bytes
    pid: int | None = None
    host: str | None = None
    bundles: int = 0
    batches: int = 0
    bytes: int = 0
    errors: int = 0
    stale: int = 0
    done: bool = False
    paused: bool = False
    last: float | None = None
    connected_at: float = 0.0
    attempt_bundles: int = 0  # bundles of this attempt received (the bulk channel's end check)
    end_bundles: int | None = None  # bundles its end of stream says it sent (bulk: not yet done)
    bulk_ended: bool = False  # its bulk connection ended (everything it wrote was read)
    ring: Any = None  # this attempt's shared-memory ring (:class:`.shm.SharedRing`), when offered
    shm: bool = False  # the sender attached to its ring
    shm_bundles: int = 0  # bundles received through a ring (all attempts)

    def carry_counts(self, cur: WorkerRecord) -> None:
        """Go on with ``cur``'s counts and pause (a replacement attempt of the same index, or
        the same attempt reconnecting)."""
        self.bundles, self.batches, self.bytes, self.errors, self.stale, self.paused, self.shm_bundles = (
            cur.bundles, cur.batches, cur.bytes, cur.errors, cur.stale, cur.paused, cur.shm_bundles)

    def count(self, now: float) -> dict[str, Any]:
        """Receiver.counts' record at ``now`` (monotonic s): ``bundles``, ``batches``, ``bytes`` (all attempts),
        ``attempt`` (current), ``pid``, ``host``, ``errors`` (bad messages dropped), ``stale`` (older attempts'
        dropped), ``done`` (ended its stream), ``paused``, ``last_age_s`` (s since its last bundle; None: none yet),
        ``shm`` (the current attempt sends through a shared-memory ring), ``shm_bundles`` (all attempts)."""
        return {"bundles": self.bundles, "batches": self.batches, "bytes": self.bytes, "attempt": self.attempt,
                "pid": self.pid, "host": self.host, "errors": self.errors, "stale": self.stale, "done": self.done,
                "paused": self.paused, "last_age_s": None if self.last is None else now - self.last,
                "shm": self.shm, "shm_bundles": self.shm_bundles}

    def received(self, layout: framing.Layout) -> int:
        """Count one bundle of ``layout`` received from this attempt; returns its bytes."""
        nbytes = sum(layout.nbytes)
        self.bundles += 1
        self.attempt_bundles += 1
        self.batches += max(layout.n, 1)
        self.bytes += nbytes
        self.last = time.monotonic()
        return nbytes

    def end_check(self) -> None:
        """Through the bulk channel a sender's end (on zmq) can overtake its last bundles: it
        is done once they are all read, or its connection ended (nothing more can come)."""
        if self.end_bundles is not None and (self.attempt_bundles >= self.end_bundles or self.bulk_ended):
            self.done = True


def last_bundles(workers: dict[int, WorkerRecord]) -> str:
    """For a timeout's message: each worker's seconds since its last bundle, paused, ended."""
    now = time.monotonic()
    return ", ".join(f"{i}: {'never' if w.last is None else f'{now - w.last:.1f} s ago'}"
                     f"{' (paused)' if w.paused else ''}{' (ended)' if w.done else ''}"
                     for i, w in sorted(workers.items())) or "none connected"


class Workers:
    """The receiver's per-worker control and record: hello and welcome, pause, resume, counts
    and the bad messages.

    Args:
        sock: the receiver's ROUTER, which :meth:`tell` sends on (it holds no reference to the
            receiver: a receiver dropped without :meth:`Receiver.close` is freed at once, its
            socket closed before its context).
        welcome: the welcome's fixed keys (``window``, ``window_batches``, ``bulk_port``).
        strict: :meth:`error` raises :class:`FrameError` after recording.
        rings: ``rings(hello) -> SharedRing | None``: the shared-memory ring offered to a sender
            let in with that hello (its welcome's ``shm``), or None: no ring.
    """

    def __init__(self, sock: zmq.Socket, welcome: dict[str, Any], strict: bool = False,
                 rings: Callable[[dict[str, Any]], Any] | None = None):
        self._sock, self._welcome, self.strict, self._rings = sock, dict(welcome), strict, rings
        self.by_index: dict[int, WorkerRecord] = {}
        self.ids: dict[bytes, tuple[int, int]] = {}  # routing id -> (index, attempt)
        self.paused: set[int] = set()  # indices paused (connected or not yet)
        self._errors: list[str] = []

    def tell(self, identity: bytes, *frames: bytes) -> None:
        """Send a control message to the sender ``identity``; dropped when it is gone or not reading."""
        try:
            self._sock.send_multipart([identity, *frames], zmq.NOBLOCK)
        except zmq.ZMQError:  # the sender is gone (ROUTER_MANDATORY) or not reading
            pass

    def __len__(self) -> int:
        return len(self.by_index)

    def of(self, identity: bytes) -> WorkerRecord | None:
        """The record of the index routing id ``identity`` said hello as (its current attempt's,
        which may be another routing id), or None for a sender that has not said hello."""
        who = self.ids.get(identity)
        return self.by_index.get(who[0]) if who else None

    def error(self, identity: bytes, err: str) -> None:
        """Record a bad message from ``identity`` (logged, counted on its worker). Raises
        :class:`FrameError` under ``strict``."""
        w = self.ids.get(identity)
        msg = f"{f'input worker {w[0]} (attempt {w[1]})' if w else f'unknown sender {identity[:40]!r}'}: {err}"
        log.warning("data plane: %s; message dropped", msg)
        self._errors.append(msg)
        del self._errors[:-100]
        if w and w[0] in self.by_index:
            self.by_index[w[0]].errors += 1
        if self.strict:
            raise FrameError(msg, w[0] if w else None)

    def hello(self, identity: bytes, index: int, attempt: int, h: dict[str, Any]) -> None:
        """Worker ``index`` at ``attempt`` said hello as ``identity`` (``h``: its hello) and was
        let in: a newer or the same attempt of its index replaces the record (counts go on) and
        is welcomed; an older one is refused (``X``)."""
        cur = self.by_index.get(index)
        if cur is not None and attempt < cur.attempt:
            self.tell(identity, protocol.REFUSED, f"worker {index} is read at attempt {cur.attempt} now".encode())
            return
        self.ids[identity] = (index, attempt)
        w = WorkerRecord(index, attempt, identity, h.get("pid"), h.get("host"), connected_at=time.monotonic())
        if cur is not None:  # a replacement (or the same attempt reconnecting): counts go on
            w.carry_counts(cur)
            self.drop_ring(cur)
        w.paused = index in self.paused  # also when paused before it ever connected
        self.by_index[index] = w
        welcome = {**self._welcome, "paused": w.paused}
        w.ring = self._rings(h) if self._rings is not None else None
        if w.ring is not None:
            welcome["shm"] = w.ring.offer()
        self.tell(identity, protocol.WELCOME, protocol.encode(welcome))

    def attached(self, w: WorkerRecord, ok: bool, error: str) -> None:
        """Worker ``w`` mapped its ring (``ok``) or could not (``error``): the ring's name goes (without ``ok``,
        the ring too)."""
        if w.ring is None:
            return
        w.ring.unlink()
        w.shm = bool(ok)
        if not ok:
            log.info("data plane: input worker %d (attempt %d) on this node sends over TCP: %s",
                     w.index, w.attempt, error or "its shared-memory ring was not attached")
            self.drop_ring(w)

    @staticmethod
    def drop_ring(w: WorkerRecord) -> None:
        """No more bundles through ``w``'s ring: it goes once no array is over it."""
        if w.ring is not None:
            w.ring.close()
            w.ring, w.shm = None, False

    def pause(self, i: int, paused: bool) -> None:
        """Pause (or resume) worker ``i``, also one not connected yet."""
        (self.paused.add if paused else self.paused.discard)(i)
        if (w := self.by_index.get(i)) is not None:
            w.paused = paused
            self.tell(w.identity, protocol.PAUSE if paused else protocol.RESUME)

    def ended(self, expected: int | None) -> bool:
        """Whether every one of ``expected`` workers (indices ``0..expected-1``) ended its stream."""
        return expected is not None and all(
            (w := self.by_index.get(i)) is not None and w.done for i in range(expected))

    def bulk_end(self, w: WorkerRecord, why: str | None, bad: bool) -> None:
        """Worker ``w``'s bulk connection ended: between messages (``why`` None), inside one (that
        bundle is lost: a warning), or closed for a stream that cannot be parsed (``bad``: a bad
        message, :meth:`error`: recorded, raised under ``strict``)."""
        w.bulk_ended = True
        w.end_check()
        if bad:
            self.error(w.identity, str(why))
        elif why:
            log.warning("data plane: input worker %d (attempt %d): bulk connection ended inside a bundle "
                        "(%s); that bundle is dropped", w.index, w.attempt, why)

    def counts(self) -> dict[int, dict[str, Any]]:
        """Per worker index: :meth:`WorkerRecord.count`."""
        now = time.monotonic()
        return {i: w.count(now) for i, w in sorted(self.by_index.items())}

    def errors(self) -> list[str]:
        """The last (up to 100) bad messages dropped, each naming its sender and the fault."""
        return list(self._errors)
