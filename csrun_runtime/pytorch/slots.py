"""Which input-worker slots the PyTorch chief reads (``csrun_wse --autoscale``, docs/AUTOSCALE.md):
the slot bookkeeping of :class:`csrun_runtime.pytorch.remote.RemoteSource` over its one
:class:`csrun_runtime.dataplane.Receiver`, as the TensorFlow chief's
:class:`csrun_runtime.dataplane_source.DataplaneSource` keeps it.

Slots ``0 .. streams-1`` are opened at the start; :meth:`StreamSlots.open` opens another
(autoscale's *add*). A bundle of a slot not opened yet is held (handed out first once the slot
is opened) and its worker paused at the receiver, so it sends at most one credit window
before it is wanted. :meth:`~StreamSlots.pause` / :meth:`~StreamSlots.resume` stop and restart a
worker's stream at the receiver (its sender blocks: backpressure); the receiver keeps a pause
of a worker not connected yet, and across a worker's reconnection and replacement: that attempt's
welcome says it starts paused, and it sends nothing until resumed. Imports neither TensorFlow nor torch.
"""
from __future__ import annotations

from collections import deque
from typing import Any

__all__ = ["StreamSlots"]


class StreamSlots:
    """The opened, paused and held slots of ``slots`` input workers sending to ``receiver``.

    Args:
        receiver: the chief's :class:`~csrun_runtime.dataplane.Receiver` (``pause(i)``,
            ``resume(i)``: also of a worker not connected yet; ``window_bytes``).
        slots: the job's input-worker slots ``W``.
        streams: slots opened at the start (``0 .. streams-1``, clamped to ``[1, W]``);
            default all ``W``.

    Call every method from the receiver's thread.
    """

    def __init__(self, receiver: Any, slots: int, streams: int | None = None):
        self.r = receiver
        #: One past the highest slot opened (the autoscaler opens slot ``n`` next).
        self.n = slots if streams is None else max(1, min(slots, int(streams)))
        self.opened: set[int] = set(range(self.n))
        self.paused: set[int] = set()  # paused by the autoscaler
        self._held: dict[int, deque[Any]] = {}  # bundles of slots not opened yet
        self._held_paused: set[int] = set()  # slots not opened yet, paused at the receiver
        self._bundle_n: dict[int, int] = {}  # batches in each worker's last bundle
        self._batch_bytes: dict[int, int] = {}  # bytes of one batch of each worker

    def open(self, index: int) -> None:
        """Read slot ``index`` from now on; its held bundles come first, and its worker, paused
        while it was not opened (or by :meth:`pause`), sends again."""
        self.n = max(self.n, index + 1)
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
        self._bundle_n[b.worker], self._batch_bytes[b.worker] = n, max(1, b.nbytes // n)

    def buffered_batches(self, streaming: set[int]) -> int:
        """At most how many batches the chief holds ahead of training from the ``streaming``
        workers: one credit window each (in batches of that worker's size) and one bundle."""
        window = int(getattr(self.r, "window_bytes", 0))
        total = 0
        for i in streaming:
            b, bundle = self._batch_bytes.get(i), max(1, self._bundle_n.get(i, 1))
            total += (window // b if b else bundle) + bundle
        return total
