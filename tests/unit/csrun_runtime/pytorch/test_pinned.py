"""The pinned pool the device feed lends the data-plane receiver (``csrun_runtime.pytorch.pinned``)
and the feed's lent path: on CPU the pool unpinned (a lease's views keep its block, the block
back only when the last view is collected, reuse by size class, several threads, ``owns``, the
free-bytes bound) and the stager / feed with a lending source; on CUDA (skipped without it) the
feed copying batches received into lent pinned blocks straight to the device."""
from __future__ import annotations

import ctypes
import gc
import random
import threading
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from csrun_runtime.pytorch.devicefeed import DeviceFeed  # noqa: E402
from csrun_runtime.pytorch.pinned import MIN_BLOCK_BYTES, PinnedPool, size_class  # noqa: E402
from csrun_runtime.pytorch.staging import FeedStats, HostRing, Stager  # noqa: E402

X_SHAPE, Y_SHAPE = (4, 3, 8, 8), (4, 16)  # float32 and uint8 leaves of the CPU tests' bundles


def expected(i, x_shape=X_SHAPE, y_shape=Y_SHAPE):
    """Batch ``i``'s leaves: a float32 ``x`` and a uint8 ``y``, distinct for each ``i``."""
    rng = np.random.default_rng(i)
    return (rng.standard_normal(x_shape).astype(np.float32),
            rng.integers(0, 256, y_shape, dtype=np.uint8))


def received(allocate, i, x_shape=X_SHAPE, y_shape=Y_SHAPE):
    """What the receiver's bulk receive makes of bundle ``i``: one lease from ``allocate``, the
    bytes written into it, each leaf a view of it (``raw[off:off+nb].view(dtype).reshape(shape)``)."""
    x, y = expected(i, x_shape, y_shape)
    nbytes = x.nbytes + y.nbytes
    raw = np.frombuffer(allocate(nbytes), np.uint8, count=nbytes)
    raw[:x.nbytes] = x.reshape(-1).view(np.uint8)
    raw[x.nbytes:] = y.reshape(-1)
    return {"x": raw[:x.nbytes].view(np.float32).reshape(x_shape), "y": raw[x.nbytes:].reshape(y_shape)}


class LendingSource:
    """``next()`` over ``n`` batches, received into what the feed lent (``lend``), else into
    ordinary arrays; ``accept``: what ``lend`` returns."""

    def __init__(self, n, accept=True, x_shape=X_SHAPE, y_shape=Y_SHAPE):
        self.n, self.accept, self.shapes = n, accept, (x_shape, y_shape)
        self.allocate = None
        self.lend_calls = 0
        self.taken = 0

    def lend(self, allocate):
        self.lend_calls += 1
        if self.accept:
            self.allocate = allocate
        return self.accept

    def next(self):
        if self.taken >= self.n:
            return None, -1
        i, self.taken = self.taken, self.taken + 1
        if self.allocate is None:
            x, y = expected(i, *self.shapes)
            return {"x": x, "y": y}, 0
        return received(self.allocate, i, *self.shapes), 0

    def describe(self):
        return {"input": "lending"}


def check_each(feed, x_shape=X_SHAPE, y_shape=Y_SHAPE, busy=None):
    """Take every batch of ``feed``, each compared with :func:`expected` when it comes (a CPU
    ring's slot is written again ``slots`` batches later); ``busy()`` runs between taking a
    batch and reading it back. Returns the count."""
    n = 0
    while True:
        b, _ = feed.next()
        if b is None:
            return n
        assert b["x"].device.type == b["y"].device.type == feed.device.type
        if busy is not None:
            busy()
        x, y = expected(n, x_shape, y_shape)
        assert torch.equal(b["x"].cpu(), torch.from_numpy(x)), f"batch {n}: x differs"
        assert torch.equal(b["y"].cpu(), torch.from_numpy(y)), f"batch {n}: y differs"
        n += 1


def lease_of(a):
    """The lease under array ``a``: numpy collapses views down to the frombuffer array, whose
    base is the lease."""
    return a.base if isinstance(a.base, ctypes.Array) else a.base.base


def collected():
    gc.collect()


# ---------------------------------------------------------------------- the pool
def test_size_classes_are_powers_of_two_from_the_smallest_block():
    assert size_class(0) == size_class(1) == MIN_BLOCK_BYTES
    assert size_class(MIN_BLOCK_BYTES + 1) == 2 * MIN_BLOCK_BYTES
    assert size_class(37_000_000) == 64 << 20 and size_class(64 << 20) == 64 << 20
    for n in (1, 4095, 4097, 10_000, 1 << 20, (1 << 20) + 1, 37_000_000):
        c = size_class(n)
        assert c >= n and c & (c - 1) == 0 and (c == MIN_BLOCK_BYTES or c < 2 * n)


def test_a_lease_is_writable_memory_its_views_keep_until_the_last_one_is_collected():
    pool = PinnedPool(pin=False)
    lease = pool.allocate(10_000)
    assert isinstance(lease, ctypes.Array) and len(lease) == 10_000
    raw = np.frombuffer(lease, np.uint8, count=10_000)
    assert raw.base is lease and raw.flags.writeable
    a = raw[:4000].view(np.float32).reshape(10, 100)
    b = raw[4000:].reshape(60, 100)
    assert lease_of(a) is lease and lease_of(b) is lease and lease_of(b[1:].T) is lease
    a[:] = 1.5
    b[:] = 7
    assert pool.outstanding == 1 and pool.allocations == 1 and pool.bytes_pinned == size_class(10_000)
    del lease, raw
    collected()
    assert pool.outstanding == 1 and pool.free_bytes == 0  # the views hold the lease
    assert float(a.sum()) == 1.5 * 1000 and int(b.sum()) == 7 * 6000
    del a
    collected()
    assert pool.outstanding == 1 and pool.free_bytes == 0
    del b
    collected()
    assert pool.outstanding == 0 and pool.free_bytes == size_class(10_000)
    assert pool.bytes_pinned == size_class(10_000)


def test_a_lease_in_a_reference_cycle_comes_back_when_the_collector_frees_it():
    pool = PinnedPool(pin=False)

    class Holder:
        pass

    h = Holder()
    h.me, h.view = h, np.frombuffer(pool.allocate(5000), np.uint8)
    del h
    assert pool.outstanding == 1
    collected()
    assert pool.outstanding == 0 and pool.free_bytes == size_class(5000)


def test_a_lease_that_dies_while_the_pool_is_locked_comes_back_at_the_next_call():
    """The finalizer never waits for the lock (the collector can run inside a locked section
    of the same thread): the block waits and is taken back by the next call."""
    pool = PinnedPool(pin=False)
    v = np.frombuffer(pool.allocate(5000), np.uint8)
    with pool._lock:
        del v  # the finalizer runs here, on this thread, the lock held
    assert pool.outstanding == 0
    assert pool.free_bytes == size_class(5000)
    again = pool.allocate(4500)
    assert pool.reuses == 1 and pool.allocations == 1
    del again


def test_blocks_are_reused_by_size_class_and_only_once_free():
    pool = PinnedPool(pin=False)
    first = pool.allocate(100_000)
    addr = ctypes.addressof(first)
    second = pool.allocate(100_000)  # the first is outstanding: a new block
    assert ctypes.addressof(second) != addr and pool.allocations == 2 and pool.reuses == 0
    del first
    collected()
    third = pool.allocate(90_000)  # another size, the same class: the first's block
    assert ctypes.addressof(third) == addr and len(third) == 90_000
    assert pool.allocations == 2 and pool.reuses == 1
    other = pool.allocate(300_000)  # another class: a new block
    assert pool.allocations == 3 and pool.reuses == 1
    c = pool.counters()
    assert c == {"allocations": 3, "reuses": 1, "outstanding": 3,
                 "bytes_pinned": 2 * size_class(100_000) + size_class(300_000), "free_bytes": 0}
    del second, third, other


def test_free_blocks_are_kept_up_to_max_free_bytes_and_the_rest_dropped():
    pool = PinnedPool(pin=False, max_free_bytes=2 * 8192)
    leases = [pool.allocate(8000) for _ in range(3)]
    assert pool.bytes_pinned == 3 * 8192
    del leases
    collected()
    assert pool.free_bytes == 2 * 8192 and pool.bytes_pinned == 2 * 8192 and pool.outstanding == 0
    again = [pool.allocate(8192) for _ in range(3)]
    assert pool.reuses == 2 and pool.allocations == 4
    del again
    zero = PinnedPool(pin=False, max_free_bytes=0)
    v = zero.allocate(100)
    del v
    assert zero.free_bytes == 0 and zero.bytes_pinned == 0


def test_owns_only_views_of_its_live_leases():
    pool, other = PinnedPool(pin=False), PinnedPool(pin=False)
    raw = np.frombuffer(pool.allocate(4096), np.uint8)
    leaf = raw[16:32].view(np.float32)
    assert pool.owns(raw) and pool.owns(leaf) and pool.owns(leaf.reshape(2, 2)[::-1].T)
    assert not pool.owns(leaf.copy()) and not pool.owns(np.zeros(4)) and not pool.owns(torch.zeros(4))
    assert not pool.owns(None) and not pool.owns(3)
    assert not other.owns(leaf)
    assert not pool.owns(np.frombuffer((ctypes.c_char * 8)(), np.uint8))  # a ctypes array not lent
    assert other.owns(np.frombuffer(other.allocate(10), np.uint8))


def test_a_negative_size_is_refused_and_an_empty_lease_works():
    pool = PinnedPool(pin=False)
    with pytest.raises(ValueError, match="nbytes"):
        pool.allocate(-1)
    empty = pool.allocate(0)
    assert len(empty) == 0 and np.frombuffer(empty, np.uint8, count=0).shape == (0,)


def test_threads_allocating_and_releasing_never_share_an_outstanding_block():
    """Reader threads allocate leases of varying sizes, write their own pattern, hold it a
    moment and check it is intact; no address is handed out twice while outstanding."""
    pool = PinnedPool(pin=False)
    live: set[int] = set()
    guard = threading.Lock()
    errors: list[str] = []

    def reader(t):
        rnd = random.Random(t)
        for k in range(300):
            n = rnd.choice((3000, 5000, 9000, 20_000))
            lease = pool.allocate(n)
            addr = ctypes.addressof(lease)
            with guard:
                if addr in live:
                    errors.append(f"thread {t}: block {addr:#x} handed out twice")
                live.add(addr)
            raw = np.frombuffer(lease, np.uint8, count=n)
            raw[:] = (t * 31 + k) % 251
            view = raw[n // 2:]  # the view outlives the lease's own name
            del lease, raw
            time.sleep(rnd.random() * 1e-4)
            if not np.all(view == (t * 31 + k) % 251):
                errors.append(f"thread {t}: bundle {k} overwritten")
            with guard:
                live.discard(addr)  # before the block can be handed out again
            del view

    threads = [threading.Thread(target=reader, args=(t,)) for t in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    c = pool.counters()
    assert c["outstanding"] == 0 and c["allocations"] + c["reuses"] == 6 * 300
    assert c["allocations"] <= 6 * 4 and c["reuses"] >= 6 * 300 - 6 * 4  # reused, not regrown
    assert c["free_bytes"] == c["bytes_pinned"]


# ---------------------------------------------------------------------- the stager and the feed (CPU)
def test_the_stager_skips_the_ring_for_lent_leaves_and_passes_them_through():
    pool = PinnedPool(pin=False)
    ring = HostRing(3, pin=False)
    stager = Stager(torch.device("cpu"), False, ring, FeedStats(), pool)
    nest = received(pool.allocate, 0)
    base = ctypes.addressof(lease_of(nest["x"]))
    out, event = stager.stage(nest)
    assert event is None and ring.allocations == 0 and stager.direct_batches == 1
    assert out["x"].data_ptr() == base  # a view of the lease: no copy
    del nest
    collected()
    assert pool.outstanding == 1  # the tensors over it keep it
    x, y = expected(0)
    assert torch.equal(out["x"], torch.from_numpy(x)) and torch.equal(out["y"], torch.from_numpy(y))
    del out
    collected()
    assert pool.outstanding == 0
    # a leaf not lent goes through the ring; the lent one beside it does not
    mixed = {"x": received(pool.allocate, 1)["x"], "z": np.arange(6, dtype=np.int64)}
    out, _ = stager.stage(mixed)
    assert ring.allocations == 1 and ring.buffers[0][0] is None and ring.buffers[0][1] is not None
    assert out["x"].data_ptr() == ctypes.addressof(lease_of(mixed["x"]))
    assert out["z"].data_ptr() != mixed["z"].ctypes.data and stager.direct_batches == 2
    plain, _ = stager.stage({"x": np.ones(3, np.float32)})  # nothing lent: the ring as before
    assert stager.direct_batches == 2 and ring.allocations == 2 and torch.equal(plain["x"], torch.ones(3))


class FakeEvent:
    def __init__(self):
        self.done, self.synced = False, False

    def query(self):
        return self.done

    def synchronize(self):
        self.synced = self.done = True


def test_the_stager_lets_lent_leaves_go_only_once_their_copy_event_completed():
    """The references the CUDA path keeps (``held``): dropped at a stage when the event has
    completed; ``close`` waits for the rest first."""
    pool = PinnedPool(pin=False)
    stager = Stager(torch.device("cpu"), False, None, FeedStats(), pool)
    done, pending = FakeEvent(), FakeEvent()
    stager.held = [(done, list(received(pool.allocate, 0).values())),
                   (pending, list(received(pool.allocate, 1).values()))]
    collected()
    assert pool.outstanding == 2
    stager._release_held()
    assert pool.outstanding == 2  # neither event completed
    done.done = True
    stager._release_held()
    collected()
    assert pool.outstanding == 1 and [e for e, _ in stager.held] == [pending]
    stager.close()
    collected()
    assert pending.synced and stager.held == [] and pool.outstanding == 0


@pytest.mark.parametrize("lend", [None, False])
def test_the_cpu_feed_lends_nothing_by_default_or_when_told_not_to(lend):
    src = LendingSource(5)
    feed = DeviceFeed(src, "cpu", copy=True, lend=lend)
    assert check_each(feed) == 5
    assert src.lend_calls == 0 and feed.pool is None and feed.feed_info()["lent"] is None
    assert feed.feed_info()["ring"]["allocations"] == 1 and feed.stager.direct_batches == 0
    feed.close()


@pytest.mark.parametrize("threaded", [True, False])
def test_a_feed_told_to_lend_receives_into_the_pool_and_skips_the_ring(threaded):
    src = LendingSource(12)
    feed = DeviceFeed(src, "cpu", copy=True, lend=True, threaded=threaded)
    assert src.lend_calls == 1 and feed.pool is not None and not feed.pool.pin
    assert check_each(feed) == 12  # each batch let go before the next: its block reused
    info = feed.feed_info()
    assert info["lent"]["direct_batches"] == 12 and info["ring"]["allocations"] == 0
    assert info["lent"]["allocations"] + info["lent"]["reuses"] == 12 and info["lent"]["reuses"] > 0
    assert info["lent"]["bytes_pinned"] == info["lent"]["allocations"] * size_class(
        np.prod(X_SHAPE) * 4 + np.prod(Y_SHAPE))
    feed.close()


def test_a_source_that_declines_the_loan_is_fed_as_before():
    src = LendingSource(3, accept=False)
    feed = DeviceFeed(src, "cpu", copy=True, lend=True)
    assert src.lend_calls == 1 and feed.pool is None and feed.feed_info()["lent"] is None
    assert check_each(feed) == 3 and feed.feed_info()["ring"]["allocations"] == 1
    feed.close()


# ---------------------------------------------------------------------- CUDA
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (runs on a GPU machine)")


@CUDA
def test_cuda_pool_blocks_are_pinned():
    pool = PinnedPool(pin=True)
    v = np.frombuffer(pool.allocate(1 << 20), np.uint8)
    assert torch.from_numpy(v).is_pinned() and torch.from_numpy(v[4096:]).is_pinned()


@CUDA
@pytest.mark.parametrize("lend", [None, False])
def test_cuda_feed_copies_lent_batches_exactly_while_the_gpu_is_busy(lend):
    """On CUDA the feed lends its pool (by default): 40 bundles received into lent pinned
    blocks, copied to the device straight from there while the compute stream is kept busy by
    matmuls, so that a block reused before its copy ended, or a batch used before its copy
    event, shows as a wrong value; the blocks are reused, the ring never filled. ``lend=False``:
    nothing lent, the ring as before."""
    n, xs, ys = 40, (8, 3, 256, 256), (8, 4096)
    src = LendingSource(n, x_shape=xs, y_shape=ys)
    feed = DeviceFeed(src, "cuda", depth=2, copy=True, lend=lend)
    assert feed.threaded and feed.ring is not None and feed.ring.pin
    assert src.lend_calls == (0 if lend is False else 1)
    m = torch.randn(2048, 2048, device="cuda")

    def busy():
        nonlocal m
        for _ in range(3):
            m = torch.tanh(m @ m)

    assert check_each(feed, xs, ys, busy) == n
    info = feed.feed_info()
    if lend is False:
        assert info["lent"] is None and info["ring"]["allocations"] == 1
    else:
        lent = info["lent"]
        assert lent["direct_batches"] == n and info["ring"]["allocations"] == 0
        assert lent["allocations"] <= 10 and lent["reuses"] == n - lent["allocations"] and lent["reuses"] > 0
        assert lent["bytes_pinned"] == lent["allocations"] * size_class(np.prod(xs) * 4 + np.prod(ys))
    feed.close()
    if feed.pool is not None:
        collected()
        assert feed.stager.held == [] and feed.pool.outstanding == 0


# ---------------------------------------------------------------------- through the real receiver
class ReceiverSource:
    """A chief's source over a real data-plane receiver on its bulk channel (what
    ``RemoteSource`` does, without the rendezvous): one batch per bundle, ``lend`` forwarded."""

    def __init__(self, receiver):
        self.r = receiver

    def lend(self, allocate):
        return self.r.lend(allocate)

    def next(self):
        from csrun_runtime.dataplane import EndOfStream

        try:
            b = self.r.get_bundle(timeout=30)
        except EndOfStream:
            return None, -1
        (nest,) = list(b.batches())  # bundle=1: each bundle one batch, views of its lent buffer
        return nest, b.worker

    def describe(self):
        return {"input": "receiver"}


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=CUDA)])
def test_batches_sent_over_the_bulk_channel_reach_the_device_from_the_lent_pool(device):
    """Sender -> the bulk channel -> recv_into a lent block -> the device feed: every batch
    intact and in order, each staged from lent memory, the blocks reused."""
    from csrun_runtime.dataplane import Receiver, Sender

    n, xs, ys = 30, (8, 3, 64, 64), (8, 256)
    with Receiver("tcp://127.0.0.1:0", bulk=True, expected=1) as r:
        feed = DeviceFeed(ReceiverSource(r), device, depth=2, copy=True, lend=True)

        def send():
            with Sender(r.endpoint, 0, bundle=1) as s:
                for i in range(n):
                    x, y = expected(i, xs, ys)
                    s.send({"x": x, "y": y})

        t = threading.Thread(target=send, daemon=True)
        t.start()
        assert check_each(feed, xs, ys) == n
        t.join(10)
        lent = feed.feed_info()["lent"]
        assert lent["direct_batches"] == n and lent["reuses"] > 0, lent
        feed.close()
