"""The receiving end of the data plane (the chief): one ROUTER bound once, its senders' records
(:mod:`.workers`), what arrives turned into bundles (:mod:`.intake`) and, with ``bulk``, the bulk
channel's listener (:mod:`.bulk`); the protocol is :mod:`.protocol`'s (docs/DATAPLANE.md)."""
from __future__ import annotations

import os
import time
from collections import deque
from typing import Any

import zmq

from csrun_common.env import DATAPLANE_MAX_MESSAGE
from csrun_common.jobsecret import job_secret

from . import framing, protocol, shm
from .auth import Gate, Refusals
from .bulk import BulkListener
from .intake import BulkPosts, Bundle, Intake
from .protocol import MAX_MESSAGE_BYTES, WINDOW_BYTES, EndOfStream, deadline_in, ms_left
from .receive import auto_io_threads, keep_receive_memory
from .workers import Workers, last_bundles


def _router(ctx: zmq.Context, bind: str, max_bytes: int) -> zmq.Socket:
    """The receiver's ROUTER bound at ``bind`` (``:0``: a free port): a sender's routing id
    reconnecting takes over its pipe (its ids are not guessable), a send to a gone sender fails
    instead of being dropped, and a frame over ``max_bytes`` cuts its peer before it is
    allocated (zmq's MAXMSGSIZE)."""
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
    sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    sock.setsockopt(zmq.LINGER, 100)
    sock.setsockopt(zmq.MAXMSGSIZE, max_bytes)
    sock.bind(bind[:-2] + ":*" if bind.endswith(":0") else bind)
    return sock


class Receiver:
    """The chief's end: one ROUTER socket bound once, read by the calling thread.

    Args:
        bind: where to bind, e.g. ``tcp://*:5555`` or ``tcp://127.0.0.1:0`` (port 0: any free
            port; :attr:`endpoint` says which). Senders connect to it.
        window_bytes: bytes each sender may have unacknowledged (flow control); the chief
            buffers at most about this per sender (plus one bundle).
        window_batches: batches each sender may have sent and the chief not taken (None: bytes
            only). With it a bundle is acknowledged when the next one is asked for (consumed),
            not when it is handed out, so that an input worker that checks :meth:`Sender.room`
            reads at most this many batches ahead of the chief.
        expected: how many workers (indices ``0..expected-1``) end the stream: once all have
            sent their end, :meth:`get_bundle` raises :class:`EndOfStream`. None: never.
        strict: raise :class:`FrameError` from :meth:`get_bundle` for a bad message (after
            dropping it; the next call reads on) instead of only recording it.
        io_threads: zmq I/O threads (None: :func:`.receive.auto_io_threads`, by cores).
        keep_memory: apply :func:`.receive.keep_receive_memory` to this process.
        bulk: also listen for the bulk channel (:mod:`.bulk`; ``runconfig.dataplane_bulk``) on the bind
            address' interface: senders send their data there, read straight into buffers lent (:meth:`lend`).
        secret: the job's secret (default :func:`csrun_common.jobsecret.job_secret`: ``CSRUN_JOB_SECRET``,
            else this process' own, which the processes it starts inherit).
        authenticate: False: let in every sender without the handshake's proofs (benchmarks
            and tests only).
        max_message_bytes: the most bytes one data message may declare (default: the site's
            ``CSRUN_DATAPLANE_MAX_MESSAGE_BYTES``, else :data:`.protocol.MAX_MESSAGE_BYTES`);
            zmq refuses a larger frame before allocating it, a larger header is a bad message.
        shm_bytes, shm_dir: a shared-memory ring of that many bytes in that directory for each
            sender on this node (:class:`.shm.Rings`; ``runconfig.dataplane_shm_bytes``); 0: none.

    A sender is recorded and welcomed only once it has proved it knows the secret, after the
    receiver proved it (:mod:`.auth`): a peer that cannot is refused, counted (:meth:`refused`)
    and logged once per address, and never displaces a worker nor reaches :meth:`get_bundle`.

    Received arrays are views on zmq's frames, each holding its frame (:class:`Bundle`). A
    truncated or corrupt message is dropped, recorded (:meth:`errors`, ``counts()[i]
    ["errors"]``, a logged warning naming the worker) and acknowledged; reading goes on with
    the other messages. A sender with a higher attempt than its index's current one replaces
    it: what the older attempt still had in flight is dropped (``stale``). Not thread-safe:
    call every method from one thread. Raises ``zmq.ZMQError`` when ``bind`` cannot be bound.
    """

    def __init__(self, bind: str = "tcp://127.0.0.1:0", window_bytes: int = WINDOW_BYTES,
                 expected: int | None = None, strict: bool = False, io_threads: int | None = None,
                 window_batches: int | None = None, keep_memory: bool = True, bulk: bool = False,
                 secret: bytes | None = None, authenticate: bool = True, max_message_bytes: int | None = None,
                 shm_bytes: int = 0, shm_dir: str = shm.SHM_DIR):
        if window_batches is not None and window_batches < 1:
            raise ValueError(f"window_batches {window_batches}: None or an integer >= 1")
        self.max_message_bytes = max_message_bytes or DATAPLANE_MAX_MESSAGE.integer(
            os.environ, MAX_MESSAGE_BYTES, minimum=1)
        key = (secret if secret is not None else job_secret()) if authenticate else None
        self.window_bytes, self.expected = window_bytes, expected
        self.window_batches = window_batches
        self._taken: bytes | None = None  # window_batches: the bundle handed out last, acknowledged at the next call
        if keep_memory:
            keep_receive_memory()
        self._ctx = zmq.Context(io_threads or auto_io_threads())
        self._sock = _router(self._ctx, bind, self.max_message_bytes)
        #: The bound address (``tcp://host:port``; ``0.0.0.0`` when bound to every interface).
        self.endpoint: str = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._bulk: BulkListener | None = None
        self._poller: zmq.Poller | None = None
        self._refusals = Refusals()
        if bulk:
            host = bind.split("://", 1)[-1].rsplit(":", 1)[0].strip("[]")
            self._bulk = BulkListener("" if host in ("*", "0.0.0.0") else host, key, self._refusals,
                                      self.max_message_bytes, window_bytes)
            self._poller = zmq.Poller()
            self._poller.register(self._sock, zmq.POLLIN)
            self._poller.register(self._bulk.wakeup, zmq.POLLIN)
        welcome = {"window": self.window_bytes, "window_batches": self.window_batches}
        if self._bulk is not None:
            welcome["bulk_port"] = self._bulk.port
        self.shm_bytes = int(shm_bytes)
        self.rings = shm.Rings(self.shm_bytes, shm_dir) if self.shm_bytes else None
        self._workers = Workers(self._sock, welcome, strict, self.rings.offer if self.rings else None)
        self._posts = BulkPosts(self._bulk, self._workers) if self._bulk is not None else None
        self._intake = Intake(self._workers, self._posts, Gate(key, self._refusals, self._workers.tell),
                              self.max_message_bytes)
        self._ready: deque[tuple[Bundle, bytes]] = deque()  # wait_workers' reads: acked when handed out
        self._current: Bundle | None = None
        self._next_batch = 0
        self.t0 = time.monotonic()

    @property
    def strict(self) -> bool:
        """Whether a bad message raises :class:`FrameError` from :meth:`get_bundle` (settable)."""
        return self._workers.strict

    @strict.setter
    def strict(self, value: bool) -> None:
        self._workers.strict = value

    # ----------------------------------------------------------------- control
    def _tell(self, identity: bytes, *frames: bytes) -> None:
        self._workers.tell(identity, *frames)

    def _wait(self, deadline: float | None) -> bool:
        """Wait until a message or a bulk post is there to read, or ``deadline`` passes (False)."""
        if self._poller is None:
            return bool(self._sock.poll(ms_left(deadline)))
        return bool(self._posts) or bool(self._poller.poll(ms_left(deadline)))

    def _read_ready(self, ack: bool) -> Bundle | None:
        """Handle what is there to read now until it is a bundle (returned), else None."""
        while True:
            try:
                frames = self._sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            b = self._intake.message(frames, ack=ack)
            if b is not None:
                return b
        return self._intake.post(ack) if self._posts is not None else None

    def _read(self, deadline: float | None) -> Bundle | None:
        """Handle messages until a bundle arrives (returned) or ``deadline`` passes (None)."""
        while True:
            b = self._read_ready(ack=self.window_batches is None)
            if b is not None:
                return b
            if deadline is not None and time.monotonic() >= deadline:
                return None
            if not self._wait(deadline):
                return None

    # ----------------------------------------------------------------- public
    def get_bundle(self, timeout: float | None = None) -> Bundle:
        """The next bundle from any sender (first come, first served; each sender's in its
        order).

        Raises:
            TimeoutError: none arrived within ``timeout`` seconds (None: wait forever); the
                message names the workers and the seconds since each one's last bundle.
            EndOfStream: every expected sender has ended (see ``expected``).
            FrameError: only with ``strict``: a bad message, naming its worker.
        """
        if self._taken is not None:  # window_batches: the last bundle is consumed now
            self._tell(self._taken, protocol.ACK)
            self._taken = None
        if self._ready:
            b, _ = self._ready.popleft()
            return self._hand(b)
        deadline = deadline_in(timeout)
        while True:
            if self._workers.ended(self.expected):
                raise EndOfStream(f"all {self.expected} input workers ended their streams")
            # with ``expected``, look at the ends at least every 0.5 s
            step = None if self.expected is None else time.monotonic() + 0.5
            got = self._read(step if deadline is None else deadline if step is None else min(step, deadline))
            if got is not None:
                return got if self.window_batches is None else self._hand(got)
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"no batch from any input worker for {timeout} s "
                                   f"(last bundle per worker: {last_bundles(self._workers.by_index)})")

    def _hand(self, b: Bundle) -> Bundle:
        """Hand ``b`` out: acknowledged now, or with ``window_batches`` at the next call."""
        if self.window_batches is None:
            self._tell(b._identity, protocol.ACK)  # handed out: the sender may send again
        else:
            self._taken = b._identity
        return b

    def get(self, timeout: float | None = None) -> tuple[int, Any]:
        """The next single batch: ``(worker_index, nest)``, a batch of the current bundle (views
        into the received frames), or the bundle's nest as sent when it is not stacked
        (``n == 0``). Errors as :meth:`get_bundle`."""
        if self._current is None or self._next_batch >= self._current.n:
            self._current, self._next_batch = self.get_bundle(timeout), 0
            if self._current.n == 0:
                b, self._current = self._current, None
                return b.worker, b.nest
        b = self._current
        j = self._next_batch
        self._next_batch += 1
        return b.worker, framing.unflatten(b._tree, [a[j, ...] for a in b._leaves])

    def wait_workers(self, n: int, timeout: float) -> float:
        """Read until ``n`` distinct worker indices have said hello (data read meanwhile is kept
        for :meth:`get_bundle`); returns the seconds it took. Raises :class:`TimeoutError`
        naming how many connected."""
        t0 = time.monotonic()
        deadline = t0 + timeout
        while len(self._workers) < n:
            b = self._read_ready(ack=False)
            if b is not None:
                self._ready.append((b, b._identity))
            elif len(self._workers) < n and not self._wait(deadline):
                raise TimeoutError(f"{len(self._workers)} of {n} input workers connected within {timeout} s")
        return time.monotonic() - t0

    def pause(self, i: int) -> None:
        """Stop ``i``'s stream till :meth:`resume` (its in-flight window still comes); new attempts start paused."""
        self._workers.pause(i, True)

    def resume(self, i: int) -> None:
        """Let paused worker ``i`` send again."""
        self._workers.pause(i, False)

    def counts(self) -> dict[int, dict[str, Any]]:
        """Per worker index, its :meth:`.workers.WorkerRecord.count` (bundles, batches, bytes, ..., last_age_s)."""
        return self._workers.counts()

    def errors(self) -> list[str]:
        """The last (up to 100) bad messages dropped, each naming its sender and the fault."""
        return self._workers.errors()

    def refused(self) -> dict[str, Any]:
        """The peers refused on zmq and the bulk channel (:meth:`.auth.Refusals.describe`)."""
        return self._refusals.describe()

    @property
    def bulk_port(self) -> int | None:
        """The bulk channel's TCP port (on the bind address' interface); None without ``bulk``."""
        return None if self._bulk is None else self._bulk.port

    def lend(self, allocate: Any) -> bool:
        """Receive later bundles of the bulk channel into ``allocate(nbytes)``, a writable buffer of >= nbytes bytes
        (e.g. a device feed's pinned memory: each byte is copied once, by the kernel), called on the channel's reader
        threads: thread-safe; None: fresh numpy arrays again. Each leaf is then a view of one uint8 array over it (its
        ``.base``, whose ``.base`` is what ``allocate`` returned). Returns False (nothing lent) without ``bulk``."""
        if self._bulk is None:
            return False
        self._bulk.lend(allocate)
        return True

    def on_shared_memory(self, register: shm.Register | None) -> bool:
        """Pin each ring, now and later, with ``register(address, nbytes) -> undo`` (:meth:`.shm.Rings.pin`)."""
        return self.rings is not None and self.rings.pin(register)

    def close(self) -> None:
        """Tell every sender the receiver is closing (their next send raises :class:`ReceiverGone`) and close
        the socket. Arrays handed out stay valid (a ring stays mapped till the last array over it goes)."""
        if self._sock.closed:
            return
        for w in self._workers.by_index.values():
            self._tell(w.identity, protocol.CLOSING, b"the receiver closed")
            self._workers.drop_ring(w)
        if self._bulk is not None:
            self._bulk.close()
        self._sock.close(linger=100)
        self._ctx.term()

    def __enter__(self) -> Receiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
