"""csrun_runtime/handoff.py: the device feeds' hand-off puts an item while there is room, and gives
up without putting it once the feed is stopped while the queue stays full."""
from __future__ import annotations

import queue
import threading
import time

from csrun_runtime.handoff import put_unless_stopped


def test_an_item_goes_in_while_there_is_room():
    q: queue.Queue[int] = queue.Queue(maxsize=1)
    assert put_unless_stopped(q, 1, threading.Event()) and q.get_nowait() == 1


def test_a_stop_while_the_queue_is_full_gives_up_without_the_item():
    q: queue.Queue[int] = queue.Queue(maxsize=1)
    q.put(0)
    stop = threading.Event()
    threading.Timer(0.05, stop.set).start()
    t = time.monotonic()
    assert not put_unless_stopped(q, 1, stop, poll_s=0.01)
    assert time.monotonic() - t < 2.0 and q.get_nowait() == 0 and q.empty()


def test_room_made_before_the_stop_takes_the_item():
    q: queue.Queue[int] = queue.Queue(maxsize=1)
    q.put(0)
    threading.Timer(0.05, q.get).start()
    assert put_unless_stopped(q, 1, threading.Event(), poll_s=0.01) and q.get(timeout=1) == 1
