"""The data plane's protocol between senders (input workers) and the receiver (the chief):
DEALER sockets connected to one ROUTER bound once, with credit-based flow control
(docs/DATAPLANE.md). :mod:`.sender` and :mod:`.receiver` speak it.

Messages (zmq multipart; the ROUTER sees the sender's routing id first,
``b"<index>.<attempt>.<16 random hex digits>"``: not guessable, so no peer can take over a
sender's connection):

=========  ===================  ===========================================================
from       frames               meaning
=========  ===================  ===========================================================
sender     ``H``, JSON          hello: ``{"v", "worker", "attempt", "pid", "host", "node", "nonce"}``
receiver   ``C``, JSON          challenge: ``{"nonce", "proof"}``: its nonce and its proof over the hello
sender     ``K``, JSON          answer: ``{"proof"}``: the sender's proof over the hello and that nonce
sender     ``D``, header, bufs  data: one bundle (:mod:`.framing`)
sender     ``M``, header, pos   data in the sender's shared-memory ring at position ``pos`` (uint64, :mod:`.shm`)
sender     ``U``, JSON          the ring the welcome offered: ``{"ok": bool, "error": str}`` (attached or not)
sender     ``E``, JSON          end of stream: ``{"bundles", "batches"}`` the sender sent
receiver   ``W``, JSON          welcome: ``{"window": bytes, "window_batches": n | null, "paused": bool}``,
                               and ``bulk_port`` / ``shm`` (a ring: ``{"path", "token", "bytes", "start"}``)
receiver   ``A``                one data message consumed (the sender may send more)
receiver   ``P`` / ``R``        pause / resume this sender
receiver   ``X``, reason        refused (an older attempt than the worker's current one, or a wrong proof)
receiver   ``?``                unknown sender (the receiver restarted): say hello again
receiver   ``F``                end of stream received
receiver   ``S``                the receiver is closing
=========  ===================  ===========================================================

The hello and the welcome are JSON objects: a reader takes the keys it knows and ignores others,
so either may carry more.

Authentication (:mod:`.auth`): the receiver answers a hello with a challenge, and records and
welcomes the worker only once the sender's answer proves it knows the job's secret; the sender
checks the receiver's proof before it answers, and sends no data before the welcome. A message of
a routing id that has not passed is dropped unread (``?`` tells a sender the receiver does not
know it: it says hello again).

Flow control: a sender keeps at most ``window`` bytes of data messages unacknowledged (one
message more when it holds none, so a bundle larger than the window still goes) and sends
no data before the receiver's welcome, which says whether it starts paused; the receiver
acknowledges a message when :meth:`Receiver.get_bundle` hands it out. So the chief buffers at
most about ``window`` bytes per worker (in zmq's pipes and the kernel's socket buffers), and
a consumer that stops reading stops every sender within one window.

With ``window_batches`` (:class:`Receiver`), credit is counted in batches too: a sender keeps at
most that many batches not taken by the chief, where a bundle counts as taken when the chief asks
for the next one (the receiver acknowledges a bundle at the next :meth:`Receiver.get_bundle`
call, when it is consumed, instead of when it is handed out); :meth:`Sender.room` tells an input
worker whether it may take one more batch from its input, so that what it read and the chief
has not taken stays within ``window_batches`` (docs/DATAPLANE.md "Read-ahead in batches").
"""
from __future__ import annotations

import json
import os
import socket
import time
from collections import deque
from typing import Any

#: Default bytes of one bundle when ``bundle="auto"``: batches are stacked until a bundle
#: holds at least this much (1 MiB: per-message costs < 1 % at loopback rates; bench_ingest).
BUNDLE_BYTES = 1 << 20
#: Default flow-control window per sender, bytes (4 bundles of :data:`BUNDLE_BYTES`).
WINDOW_BYTES = 4 << 20
PROTOCOL = 2
#: Default site bound on one data message's bytes (:data:`csrun_common.env.DATAPLANE_MAX_MESSAGE`):
#: a header declaring more is refused before anything is allocated.
MAX_MESSAGE_BYTES = 1 << 30

# message kinds (the first frame after the routing id)
HELLO, ANSWER, DATA, END, SHM_DATA, ATTACHED = b"H", b"K", b"D", b"E", b"M", b"U"
CHALLENGE, WELCOME, ACK, PAUSE, RESUME, REFUSED, UNKNOWN, ENDED, CLOSING = (
    b"C", b"W", b"A", b"P", b"R", b"X", b"?", b"F", b"S")


class EndOfStream(Exception):
    """Every expected sender has ended its stream (:meth:`Sender.close`) and every message
    before its end has been handed out."""


class ReceiverGone(ConnectionError):
    """The receiver refused this sender (an older attempt than the one it reads now) or closed."""


class NotAuthenticated(ReceiverGone):
    """The endpoint did not prove it knows the job's secret: nothing was sent to it (its message
    names the endpoint)."""


def ms_left(deadline: float | None) -> int | None:
    """Milliseconds until ``deadline`` (monotonic s; at least 0), None for None (no deadline)."""
    return None if deadline is None else max(0, int((deadline - time.monotonic()) * 1000))


def deadline_in(timeout: float | None) -> float | None:
    """The monotonic time ``timeout`` seconds from now (None: no deadline)."""
    return None if timeout is None else time.monotonic() + timeout


def local_node() -> str:
    """This process' node: Slurm's ``SLURMD_NODENAME`` (in every task), else the host name."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def hello(worker: int, attempt: int, nonce: bytes = b"") -> dict[str, Any]:
    """A sender's hello: protocol, worker index, attempt, this process' pid, host and node
    (:func:`local_node`), and its nonce (hex; empty without authentication)."""
    return {"v": PROTOCOL, "worker": worker, "attempt": attempt, "pid": os.getpid(), "host": socket.gethostname(),
            "node": local_node(), "nonce": nonce.hex()}


def parse_hello(raw: bytes) -> tuple[int, int, dict[str, Any]]:
    """``(worker, attempt, hello)`` of a hello's JSON. Raises ValueError, KeyError, TypeError
    for a malformed one, another protocol or a negative index or attempt."""
    h = json.loads(raw)
    index, attempt = int(h["worker"]), int(h["attempt"])
    if h.get("v") != PROTOCOL or index < 0 or attempt < 0:
        raise ValueError(f"protocol {h.get('v')}, worker {index}, attempt {attempt}")
    return index, attempt, h


def encode(message: dict[str, Any]) -> bytes:
    """A hello, welcome or end of stream as its JSON frame."""
    return json.dumps(message).encode()


class Credits:
    """A sender's side of the flow control: the window its welcome gave, whether it is paused,
    and the (bytes, batches) of each data message not acknowledged yet."""

    def __init__(self) -> None:
        self.window: int | None = None  # None until welcomed
        self.window_batches: int | None = None  # the welcome's batch window (None: bytes only)
        self.paused = False
        self.inflight: deque[tuple[int, int]] = deque()
        self.bytes = self.batches = 0

    def reset(self) -> None:
        """Forget the window and what is in flight (a new hello)."""
        self.window, self.window_batches, self.paused = None, None, False
        self.inflight.clear()
        self.bytes = self.batches = 0

    def welcome(self, info: dict[str, Any]) -> None:
        """Take the window and pause state of a welcome."""
        self.window, self.paused = int(info["window"]), bool(info["paused"])
        self.window_batches = int(info.get("window_batches") or 0) or None

    def ack(self) -> None:
        """The oldest message in flight was acknowledged."""
        if self.inflight:
            nbytes, n = self.inflight.popleft()
            self.bytes -= nbytes
            self.batches -= n

    def sent(self, nbytes: int, n: int) -> None:
        """A data message of ``nbytes`` bytes and ``n`` batches went out."""
        self.inflight.append((nbytes, n))
        self.bytes += nbytes
        self.batches += n

    def full(self, n: int) -> bool:
        """Whether a message of ``n`` batches must wait for credit (one always goes when none is in flight)."""
        if not self.inflight:
            return False
        assert self.window is not None
        wb = self.window_batches
        return self.bytes >= self.window or (wb is not None and self.batches + n > wb)

    def blocked(self, n: int) -> bool:
        """Whether a message of ``n`` batches may not go now: not welcomed, paused, or no credit."""
        return self.window is None or self.paused or self.full(n)

    def room(self, pending: int) -> bool:
        """Welcomed, and under a batch window fewer than ``window_batches`` batches in flight
        with ``pending`` more."""
        wb = self.window_batches
        return self.window is not None and (wb is None or self.batches + pending < wb)

    def state(self) -> str:
        """Why a send waits, for a timeout's message."""
        return ("not welcomed (receiver unreachable?)" if self.window is None else
                "paused by the receiver" if self.paused else
                f"{self.bytes} bytes / {self.batches} batches unacknowledged "
                f"(window {self.window} bytes / {self.window_batches} batches)")
