"""The PyTorch chief's device feed (csrun_runtime/pytorch/devicefeed.py, issue 31) on CPU: the
reused ring, order, prefetch depth, the measured wait, reallocation on a shape change, errors
and the end. The CUDA path (pinned ring, copy stream, events) runs in bench/bench_gpu_feed.py on
a GPU."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from csrun_runtime.pytorch.devicefeed import DeviceFeed, feed_rate  # noqa: E402
from csrun_runtime.pytorch.staging import HostRing, nest_bytes  # noqa: E402


class ListSource:
    """``next()`` over a list of batches; records how many were taken and on which thread."""

    def __init__(self, batches, delay=0.0, fail_at=None):
        self.batches, self.delay, self.fail_at = list(batches), delay, fail_at
        self.taken = 0
        self.threads: set[str] = set()
        self.closed = False

    def next(self):
        self.threads.add(threading.current_thread().name)
        if self.fail_at is not None and self.taken == self.fail_at:
            raise RuntimeError("input worker 3's pipeline failed")
        if self.taken >= len(self.batches):
            return None, -1
        time.sleep(self.delay)
        self.taken += 1
        return self.batches[self.taken - 1], self.taken % 2

    def describe(self):
        return {"input": "list"}

    def close(self):
        self.closed = True


def batch(i, n=4):
    return {"x": np.full((n, 3), i, dtype=np.float32), "y": np.arange(n, dtype=np.int64) + i}


def drain(feed):
    out = []
    while True:
        b, who = feed.next()
        if b is None:
            return out
        out.append((b, who))


@pytest.mark.parametrize("threaded", [True, False])
def test_batches_come_in_order_as_tensors_and_the_input_ends(threaded):
    feed = DeviceFeed(ListSource([batch(i) for i in range(7)]), "cpu", depth=2, threaded=threaded)
    got = drain(feed)
    feed.close()
    assert [int(b["x"][0, 0]) for b, _ in got] == list(range(7))
    assert all(isinstance(b["y"], torch.Tensor) and b["y"].device.type == "cpu" for b, _ in got)
    assert [w for _, w in got] == [(i + 1) % 2 for i in range(7)]
    assert feed.next() == (None, -1)
    assert feed.source.closed and feed.stats.batches == 7 and feed.stats.bytes == 7 * nest_bytes(batch(0))


def test_the_cpu_default_passes_received_arrays_through_without_a_copy():
    b = batch(5)
    feed = DeviceFeed(ListSource([b]), "cpu")
    out, _ = feed.next()
    feed.close()
    assert feed.ring is None and out["x"].data_ptr() == b["x"].ctypes.data  # a view, no copy
    assert feed._thread is None  # no thread without CUDA by default: on this thread, in order


def test_the_ring_reuses_the_same_buffers_across_batches():
    feed = DeviceFeed(ListSource([batch(i) for i in range(9)]), "cpu", depth=2, threaded=False, copy=True)
    ptrs = []
    for i in range(9):
        b, _ = feed.next()
        assert int(b["x"][0, 0]) == i and int(b["y"][0]) == i  # the slot holds this batch's copy
        ptrs.append(b["x"].data_ptr())
    feed.close()
    assert feed.ring is not None and feed.ring.allocations == 1
    slots = feed.ring.slots
    assert len(set(ptrs)) == slots == 4  # depth 2 + one being filled + one with the step
    assert ptrs[:slots] == ptrs[slots:2 * slots]  # the same buffers, in turn


def test_a_shape_change_reallocates_the_ring_once():
    ring = HostRing(3, pin=False)
    a = [np.ones((4, 3), np.float32), None]
    _, first = ring.fill(a)
    ring.fill(a)
    assert ring.allocations == 1 and first[1] is None
    _, bufs = ring.fill([np.ones((2, 3), np.float32), None])
    assert ring.allocations == 2 and tuple(bufs[0].shape) == (2, 3) and ring.next_slot == 1
    ring.fill([np.ones((2, 3), np.float64), None])  # a dtype change too
    assert ring.allocations == 3
    feed = DeviceFeed(ListSource([batch(0), batch(1), batch(2, n=8), batch(3, n=8)]), "cpu",
                      threaded=False, copy=True)
    shapes = [tuple(b["x"].shape) for b, _ in drain(feed)]
    assert shapes == [(4, 3), (4, 3), (8, 3), (8, 3)] and feed.ring.allocations == 2


def test_the_feed_threads_stay_at_most_depth_plus_three_batches_ahead_and_receive_on_their_own():
    src = ListSource([batch(i) for i in range(20)])
    feed = DeviceFeed(src, "cpu", depth=3, threaded=True)
    b, _ = feed.next()
    deadline = time.monotonic() + 5
    while src.taken < 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)  # it would take more now if it were not bounded
    # one handed out, `depth` queued, one staged and waiting for room in that queue, one
    # received and waiting to be staged, one received and waiting for room in the staging queue
    assert src.taken == 1 + 3 + 1 + 1 + 1
    assert src.threads == {"csrun-device-feed-receive"}
    feed.close()


def test_the_wait_for_the_next_batch_is_measured():
    feed = DeviceFeed(ListSource([batch(i) for i in range(3)], delay=0.15), "cpu", depth=2, threaded=True)
    feed.next()
    assert feed.last_wait >= 0.1  # the receive took 0.15 s: the step loop waited for it
    time.sleep(0.4)  # the thread receives the rest meanwhile
    feed.next()
    assert feed.last_wait < 0.05
    info = feed.feed_info()
    feed.close()
    assert info["batches"] == 2 and info["wait_s"] >= 0.1 and info["device_prefetch"] == 2
    assert feed.describe()["device_feed"]["threaded"] is True and feed.describe()["input"] == "list"


def test_the_source_error_is_raised_on_the_step_loop_thread():
    feed = DeviceFeed(ListSource([batch(0), batch(1)], fail_at=1), "cpu", threaded=True)
    feed.next()
    with pytest.raises(RuntimeError, match="input worker 3's pipeline failed"):
        feed.next()
    assert feed.next() == (None, -1)
    feed.close()


def test_close_cancels_a_source_waiting_for_its_next_batch():
    class Waiting(ListSource):
        def __init__(self):
            super().__init__([])
            self.cancelled = False

        def next(self):
            while not self.cancelled:
                time.sleep(0.01)
            return None, -1

        def cancel(self):
            self.cancelled = True

    feed = DeviceFeed(Waiting(), "cpu", threaded=True)
    t0 = time.monotonic()
    feed.close()
    assert time.monotonic() - t0 < 2 and feed.source.closed and not feed._thread.is_alive()


def test_feed_rate_counts_the_bytes_moved():
    rate = feed_rate([batch(i, n=256) for i in range(10)], "cpu")
    assert rate > 0
    with pytest.raises(ValueError, match="no batch"):
        feed_rate([], "cpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (runs in bench/gpu/run.sh on a GPU machine)")
@pytest.mark.parametrize("copy_threads", [1, 4, "pageable"])
def test_cuda_feed_hands_every_batch_exactly_while_the_gpu_is_busy(copy_threads):
    """On CUDA: pinned ring reused (4 slots for 40 batches), copy stream, copy events, the
    compute stream kept busy by a matmul per batch, so that a slot written again before its copy
    ended, or a batch used before its copy event, shows as a wrong byte; ``pageable``: no ring,
    each leaf copied from the received arrays (the driver stages them)."""
    rng = np.random.default_rng(0)
    src = [{"x": rng.integers(0, 256, (8, 3, 512, 512), dtype=np.uint8), "y": np.arange(8, dtype=np.int64) + i}
           for i in range(40)]
    pageable = copy_threads == "pageable"
    feed = DeviceFeed(ListSource(src), "cuda", depth=2, copy=not pageable,
                      copy_threads=None if pageable else copy_threads)
    assert feed.threaded and (feed.ring is None if pageable else feed.ring.pin)
    m = torch.randn(2048, 2048, device="cuda")
    got = 0
    while True:
        b, _ = feed.next()
        if b is None:
            break
        assert b["x"].device.type == "cuda"
        for _ in range(3):
            m = torch.tanh(m @ m)
        assert torch.equal(b["x"].cpu(), torch.from_numpy(src[got]["x"])), f"batch {got} differs"
        assert torch.equal(b["y"].cpu(), torch.from_numpy(src[got]["y"]))
        got += 1
    assert got == 40
    if not pageable:
        assert feed.feed_info()["ring"]["allocations"] == 1
        assert feed.feed_info()["ring"]["copy_threads"] == copy_threads
    feed.close()


class ReceiverSource:
    """``next()`` over a data-plane Receiver's batches (as RemoteSource hands them out), and its
    ``on_shared_memory``."""

    def __init__(self, receiver):
        self.r, self.registered = receiver, []

    def next(self):
        from csrun_runtime.dataplane import EndOfStream

        try:
            return self.r.get(timeout=30)[::-1]
        except EndOfStream:
            return None, -1

    def on_shared_memory(self, register):
        self.registered.append(register)
        return self.r.on_shared_memory(register)

    def describe(self):
        return {}


def _stream_images(endpoint, n, shape=(8, 3, 512, 512)):
    from csrun_runtime.dataplane import Sender

    with Sender(endpoint, 0, bundle=1) as s:
        for i in range(n):
            s.send({"x": np.full(shape, i % 251, np.uint8), "y": np.arange(shape[0], dtype=np.int64) + i})


def test_a_cpu_feed_leaves_the_shared_memory_rings_unpinned():
    from csrun_runtime.dataplane import Receiver

    with Receiver("tcp://127.0.0.1:0", expected=1, shm_bytes=4 << 20) as r:
        src = ReceiverSource(r)
        t = threading.Thread(target=_stream_images, args=(r.endpoint, 5, (2, 3, 8, 8)))
        t.start()
        feed = DeviceFeed(src, "cpu")
        got = [int(b["y"][0]) for b, _ in drain(feed)]
        t.join()
        assert got == list(range(5)) and src.registered == [] and not feed.feed_info()["rings_pinned"]
        assert r.counts()[0]["shm_bundles"] == 5


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (runs in bench/gpu/run.sh on a GPU machine)")
def test_cuda_feed_copies_a_co_located_workers_batches_from_its_pinned_ring():
    """An input worker on this node streams 40 image batches (6.3 MB) through a 64 MiB ring, which
    the feed has registered with CUDA: each batch is copied to the GPU from the ring itself
    (``direct_batches``), exactly, while the GPU is busy, and the ring's bytes are reused only
    after their copy."""
    from csrun_runtime.dataplane import Receiver

    with Receiver("tcp://127.0.0.1:0", expected=1, shm_bytes=64 << 20) as r:
        src = ReceiverSource(r)
        feed = DeviceFeed(src, "cuda", depth=2)
        assert feed.rings_pinned
        t = threading.Thread(target=_stream_images, args=(r.endpoint, 40))
        t.start()
        m = torch.randn(2048, 2048, device="cuda")
        got = 0
        while True:
            b, _ = feed.next()
            if b is None:
                break
            for _ in range(3):
                m = torch.tanh(m @ m)
            assert b["x"].device.type == "cuda" and int(b["y"][0]) == got
            assert bool((b["x"] == got % 251).all()), f"batch {got} differs"
            got += 1
        t.join()
        info = feed.feed_info()
        feed.close()
        assert got == 40 and info["rings_pinned"] and info["direct_batches"] == 40
        assert r.counts()[0]["shm_bundles"] == 40
