"""The receiver's intake: what arrives (zmq messages, the bulk channel's posts) turned into
:class:`Bundle` s, counted on the senders' records (:mod:`.workers`), with the protocol's replies
(:mod:`.protocol`). :class:`~csrun_runtime.dataplane.Receiver` owns one :class:`Intake`."""
from __future__ import annotations

import json
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import framing, protocol
from .auth import Gate
from .bulk import BulkListener, offsets
from .framing import FrameError
from .workers import WorkerRecord, Workers


@dataclass
class Bundle:
    """One received message: ``n`` batches from input worker ``worker`` (attempt ``attempt``).

    ``nest``: the structure the sender sent, each leaf an array over the received frame (no
    copy) with leading axis ``n`` (the batches stacked); ``nbytes``: the leaves' bytes.

    Lifetime: each array keeps its zmq frame alive (numpy's base chain holds the frame's
    buffer), so the arrays, and views of them, stay valid as long as they are referenced, also
    after the receiver closed; the frame's memory is freed with the last of them. Through the
    bulk channel the arrays are views of one buffer per bundle, which the consumer lent
    (:meth:`Receiver.lend`) or a fresh numpy array; the same rule holds. A consumer
    that copies into its own buffers (a pinned ring for a device) takes :attr:`arrays`, copies
    each once, drops the bundle and rebuilds the nest around its copies (:meth:`rebuild`)."""

    worker: int
    attempt: int
    n: int
    nbytes: int
    nest: Any
    _tree: Any = field(repr=False, default=None)
    _leaves: list = field(repr=False, default_factory=list)
    _identity: bytes = field(repr=False, default=b"")

    @property
    def arrays(self) -> list[np.ndarray]:
        """The leaves in :func:`.framing.flatten` order: C-contiguous, shape ``(n, *batch_shape)`` (n == 0: as sent)."""
        return list(self._leaves)

    def rebuild(self, arrays: list[Any]) -> Any:
        """The nest with ``arrays`` (one a leaf, in order, any type) for the received; FrameError: a count differs."""
        return framing.unflatten(self._tree, arrays)

    def batches(self) -> Iterator[Any]:
        """Each batch of the bundle in order: the nest with every leaf's ``[j]`` (views)."""
        for j in range(self.n):
            yield framing.unflatten(self._tree, [a[j, ...] for a in self._leaves])


class BulkPosts:
    """What the bulk channel's reader threads posted (:class:`.bulk.BulkListener`), taken on the
    receiver's thread: ends of connections are applied to the workers' records, bundles of an
    older attempt counted as stale, and each bundle of a current sender returned."""

    def __init__(self, listener: BulkListener, workers: Workers):
        self.listener, self.workers = listener, workers
        self._posts: deque[tuple[str, bytes, Any, Any]] = deque()

    def __bool__(self) -> bool:
        return bool(self._posts)

    def next_data(self) -> tuple[WorkerRecord, framing.Layout, list[np.ndarray]] | None:
        """The next bundle of a current sender ``(record, layout, leaves)``, or None when no post is left."""
        if not self._posts:
            self._posts.extend(self.listener.take())
        while self._posts:
            # ("data", identity, layout, leaves) or ("end", identity, reason | None, bad stream)
            kind, identity, first, second = self._posts.popleft()
            w = self.workers.of(identity)
            if w is None or w.identity != identity:
                if w is not None:
                    w.stale += kind == "data"  # an older attempt's bundle still in its connection
                elif kind == "data":
                    self.workers.error(identity, "bulk data from a sender that has not said hello")
                continue
            if kind == "end":
                self.workers.bulk_end(w, first, bool(second))
                continue
            return w, first, second
        return None



class Intake:
    """Received messages into bundles: zmq messages (:meth:`message`) and, with the bulk channel
    (``posts``), its posts (:meth:`post`); hellos and answers through ``gate`` (a sender is
    recorded once it is let in), messages of a routing id not let in dropped unread, bad ones
    recorded on the workers' records, data acknowledged when asked (``ack``) or dropped. A
    header declaring more than ``max_bytes`` is a bad message."""

    def __init__(self, workers: Workers, posts: BulkPosts | None, gate: Gate, max_bytes: int | None = None):
        self.workers, self.posts, self.gate, self.max_bytes = workers, posts, gate, max_bytes
        self._layouts: dict[bytes, framing.Layout] = {}

    def message(self, frames: list, ack: bool = True) -> Bundle | None:
        """One zmq message (``frames``: routing id, kind, ...): a bundle, or None (control, or dropped)."""
        identity = frames[0].bytes
        kind = frames[1].bytes if len(frames) > 1 else b""
        if kind in (protocol.HELLO, protocol.ANSWER):
            hello = (self.gate.hello if kind == protocol.HELLO else self.gate.answer)(identity, frames)
            if hello is not None:
                self.workers.hello(identity, *hello)
            return None
        w = self.workers.of(identity)
        if w is None:  # dropped unread: its peer is refused; a sender the receiver forgot says hello again
            self.gate.stranger(frames)
            self.workers.tell(identity, protocol.UNKNOWN)
            return None
        if w.identity != identity:  # an older attempt's message still in flight
            w.stale += 1
            return None
        if kind in (protocol.DATA, protocol.SHM_DATA):
            b = self.data(w, frames) if kind == protocol.DATA else self.shm_data(w, frames)
            if ack or b is None:  # handed out now (or dropped): the sender may send again
                self.workers.tell(identity, protocol.ACK)
            return b
        if kind == protocol.ATTACHED:
            try:
                said = json.loads(frames[2].bytes)
                self.workers.attached(w, bool(said.get("ok")), str(said.get("error", "")))
            except (IndexError, ValueError, AttributeError):
                self.workers.attached(w, False, "a malformed answer to the ring's offer")
            return None
        if kind == protocol.END:
            self.end(w, frames)
            return None
        self.workers.error(identity, f"unknown message kind {kind[:8]!r} ({len(frames) - 1} frames)")
        return None

    def end(self, w: WorkerRecord, frames: list) -> None:
        """Worker ``w``'s end of stream: done now, or through the bulk channel once its last
        bundles (as many as its end says it sent) are read."""
        if self.posts is None:
            w.done = True
        else:  # its last bundles may still be in its bulk connection
            try:
                w.end_bundles = int(json.loads(frames[2].bytes)["bundles"])
            except (IndexError, ValueError, KeyError, TypeError):
                w.end_bundles = 0
            w.end_check()
        self.workers.tell(w.identity, protocol.ENDED)

    def data(self, w: WorkerRecord, frames: list) -> Bundle | None:
        """Worker ``w``'s data message: its bundle, or None when it is bad (recorded)."""
        try:
            if len(frames) < 3:
                raise FrameError("data message without a header (truncated?)")
            layout = framing.parse_header_cached(self._layouts, frames[2].bytes, self.max_bytes)
            leaves = framing.decode_leaves(layout, [f.buffer for f in frames[3:]])
            nest = framing.unflatten(layout.tree, leaves)
        except FrameError as e:
            self.workers.error(w.identity, str(e))
            return None
        return self.accept(w, layout, leaves, nest)

    def shm_data(self, w: WorkerRecord, frames: list) -> Bundle | None:
        """Worker ``w``'s bundle in its shared-memory ring (``M``, header, position): leaves that are views of the
        ring, or None when it is bad (recorded)."""
        try:
            if w.ring is None or not w.shm:
                raise FrameError("shared-memory data from a sender without an attached ring")
            if len(frames) != 4 or len(frames[3].bytes) != 8:
                raise FrameError("shared-memory data message without a header and a position (truncated?)")
            layout = framing.parse_header_cached(self._layouts, frames[2].bytes, self.max_bytes)
            starts, total = offsets(layout)
            lease = w.ring.lease(int.from_bytes(frames[3].bytes, "little"), total)
        except FrameError as e:
            self.workers.error(w.identity, str(e))
            return None
        buf = np.frombuffer(lease, np.uint8, count=max(total, 1))
        leaves = [buf[start:start + nb].view(dt).reshape(shape) if nb else np.empty(shape, dt)
                  for start, nb, dt, shape in zip(starts, layout.nbytes, layout.dtypes, layout.shapes, strict=True)]
        w.shm_bundles += 1
        return self.accept(w, layout, leaves)

    def accept(self, w: WorkerRecord, layout: framing.Layout, leaves: list[np.ndarray], nest: Any = None) -> Bundle:
        """Count one received bundle of worker ``w`` and make it (``nest``: the leaves rebuilt,
        when the caller has it)."""
        nbytes = w.received(layout)
        if nest is None:
            nest = framing.unflatten(layout.tree, leaves)  # (checked against the layout when it was parsed)
        return Bundle(w.index, w.attempt, layout.n, nbytes, nest, layout.tree, leaves, w.identity)

    def post(self, ack: bool) -> Bundle | None:
        """The bulk channel's next bundle (acknowledged with ``ack``), or None when none is there."""
        assert self.posts is not None
        got = self.posts.next_data()
        if got is None:
            return None
        w, layout, leaves = got
        b = self.accept(w, layout, leaves)
        w.end_check()
        if ack:
            self.workers.tell(w.identity, protocol.ACK)
        return b

