"""The hand-off both frameworks' device feeds use between their background thread and the
training loop: a bounded ``queue.Queue`` whose producer gives up when the feed is stopped
(:class:`csrun_runtime.pytorch.devicefeed.DeviceFeed`,
:class:`csrun_runtime.tensorflow.deviceprefetch.DevicePrefetch`)."""
from __future__ import annotations

import queue
import threading
from typing import Any

#: Seconds between looks at the stop flag while the queue is full.
POLL_SECS = 0.1


def put_unless_stopped(q: queue.Queue[Any], item: Any, stop: threading.Event, poll_s: float = POLL_SECS) -> bool:
    """Put ``item`` into ``q``, looking at ``stop`` every ``poll_s`` seconds while ``q`` is
    full. Returns True once it is in, False when ``stop`` was set first (``item`` not put)."""
    while not stop.is_set():
        try:
            q.put(item, timeout=poll_s)
            return True
        except queue.Full:
            continue
    return False
