"""The shared-memory ring (csrun_runtime/dataplane/shm.py) on its own and through a Receiver and
Senders on this node: bytes freed in order whatever order the arrays die in, a ring that turns
many times with every batch intact, a sender killed while it streams replaced on a ring of its
own, the zmq path when the ring has no room or the sender is on another node, no file left in the
ring directory, and the pin callback's undo once the last array is gone. (The protocol's tests run
on rings too: the ``transport`` fixture's ``shm``.)"""
from __future__ import annotations

import gc
import multiprocessing
import os
import signal
import stat
import threading
import time

import numpy as np
import pytest

from csrun_runtime.dataplane import EndOfStream, FrameError, Receiver, Sender, shm
from csrun_runtime.dataplane.protocol import local_node
from csrun_runtime.dataplane.shm import RingWriter, SharedRing

MIB = 1 << 20


def _rings(d) -> list[str]:
    return [n for n in os.listdir(d) if n.startswith(shm.PREFIX)]


def test_bytes_are_freed_in_order_whatever_order_the_arrays_die_in(tmp_path):
    ring = SharedRing(MIB, str(tmp_path))
    writer = RingWriter(ring.offer())
    assert stat.S_IMODE(os.stat(ring.path).st_mode) == 0o600
    a = writer.reserve(300_000)
    writer.view(a, 300_000)[:] = 1
    writer.commit(a, 300_000)
    b = writer.reserve(300_000)
    writer.commit(b, 300_000)
    la, lb = ring.lease(a, 300_000), ring.lease(b, 300_000)
    arr = np.frombuffer(la, np.uint8)
    view = arr[10:20]  # a view of a view: still over the lease
    assert shm.leased(view) is ring and not shm.pinned(view) and (view == 1).all()
    del lb
    gc.collect()
    assert ring.tail == 0 and writer.tail() == 0  # b's bytes wait for a's
    del la, arr
    assert ring.tail == 0  # the view still holds a's lease
    del view
    gc.collect()
    assert ring.tail == 600_000 == writer.tail()
    # the next bundle would cross the ring's end: it starts the next turn, the bytes skipped are free
    c = writer.reserve(500_000)
    assert c == MIB
    lc = ring.lease(c, 500_000)
    assert ring.tail == MIB and ring.expect == MIB + 500_000
    del lc
    gc.collect()
    assert ring.tail == MIB + 500_000
    writer.close()
    ring.close()
    assert _rings(tmp_path) == []


def test_a_position_over_bytes_in_use_or_outside_the_ring_is_refused(tmp_path):
    ring = SharedRing(MIB, str(tmp_path))
    held = ring.lease(0, 600_000)
    with pytest.raises(FrameError, match="outside the ring"):
        ring.lease(600_000, 600_000)  # over the held bytes once it turns
    with pytest.raises(FrameError, match="outside the ring"):
        ring.lease(100, 10)  # before the end of the last bundle
    with pytest.raises(FrameError, match="outside the ring"):
        ring.lease(2 * MIB - 10, 100)  # across the ring's end
    assert held is not None
    ring.close()


def test_a_writer_finds_no_room_while_the_reader_holds_the_ring_and_refuses_another_file(tmp_path):
    ring = SharedRing(MIB, str(tmp_path))
    writer = RingWriter(ring.offer())
    pos = writer.reserve(MIB)
    writer.commit(pos, MIB)
    held = ring.lease(pos, MIB)
    t0 = time.monotonic()
    assert writer.reserve(10, wait=0.2) is None and time.monotonic() - t0 >= 0.2
    assert writer.reserve(MIB + 1) is None  # larger than the ring: never
    del held
    gc.collect()
    assert writer.reserve(10, wait=1.0) == MIB
    bad = dict(ring.offer(), token="00" * 16)
    with pytest.raises(ValueError, match="not the ring"):
        RingWriter(bad)
    writer.close()
    ring.close()


def test_the_pin_callback_is_undone_once_the_ring_is_closed_and_its_last_array_gone(tmp_path):
    calls = []

    def register(address, nbytes):
        calls.append(("pin", address, nbytes))
        return lambda: calls.append(("unpin", address))

    ring = SharedRing(MIB, str(tmp_path), register)
    assert ring.registered and calls == [("pin", ring.address, shm.HEADER_BYTES + MIB)]
    leaf = np.frombuffer(ring.lease(0, 64), np.float32)
    assert shm.pinned(leaf)
    ring.close()
    assert _rings(tmp_path) == [] and len(calls) == 1  # closed, but an array is still over it
    leaf[:] = 3.0  # still mapped
    del leaf
    gc.collect()
    assert calls[-1] == ("unpin", ring.address)


def test_a_failing_pin_leaves_the_ring_unpinned(tmp_path, caplog):
    def register(address, nbytes):
        raise RuntimeError("cudaErrorHostMemoryAlreadyRegistered")

    ring = SharedRing(MIB, str(tmp_path), register)
    assert not ring.registered and "could not pin" in caplog.text
    ring.close()


def test_sweep_removes_only_the_rings_of_gone_receivers(tmp_path):
    mine = SharedRing(MIB, str(tmp_path))
    gone = tmp_path / f"{shm.PREFIX}999999999-0123456789abcdef"
    gone.write_bytes(b"x")
    other = tmp_path / "csrun-something-else"
    other.write_bytes(b"x")
    assert shm.sweep(str(tmp_path)) == 1
    assert not gone.exists() and other.exists() and os.path.exists(mine.path)
    mine.close()


def _stream(endpoint, index, attempt, batches, nbytes, started=None, shm=True):
    """An input worker: ``batches`` batches whose bytes all hold their batch number."""
    with Sender(endpoint, index, attempt=attempt, bundle=1, shm=shm) as s:
        for k in range(batches):
            s.send({"x": np.full(nbytes // 8, k, np.int64), "k": np.array([k])})
            if started is not None and k == 5:
                started.set()


def _check(b, seen):
    for batch in b.batches():
        k = int(batch["k"][0])
        assert (batch["x"] == k).all(), f"batch {k} of worker {b.worker} is not intact"
        seen.setdefault(b.worker, []).append(k)


def test_many_turns_of_the_ring_with_bundles_held_out_of_order_keep_every_batch_intact(tmp_path):
    """200 bundles of 0.25 MiB through a 1 MiB ring, the consumer holding three at a time and
    dropping them out of order: every batch arrives, intact, in order."""
    with Receiver("tcp://127.0.0.1:0", expected=1, shm_bytes=MIB, shm_dir=str(tmp_path)) as r:
        t = threading.Thread(target=_stream, args=(r.endpoint, 0, 0, 200, MIB // 4 - 128))
        t.start()
        seen, held = {}, []
        try:
            while True:
                b = r.get_bundle(timeout=30)
                _check(b, seen)
                held.append(b)
                if len(held) == 3:
                    held.pop(1)  # out of order
                    held.pop(0)
                    for old in held:
                        _check(old, {})  # what is still held was not written over
        except EndOfStream:
            pass
        t.join()
        c = r.counts()[0]
        assert seen == {0: list(range(200))} and c["shm"] and c["shm_bundles"] == c["bundles"] == 200
        assert _rings(tmp_path) == []


def test_a_consumer_holding_the_ring_gets_the_rest_on_zmq(monkeypatch):
    """A consumer that keeps every bundle: the ring fills, then bundles go on zmq, none lost."""
    monkeypatch.setattr(shm, "ROOM_WAIT_S", 0.05)
    with Receiver("tcp://127.0.0.1:0", expected=1, shm_bytes=MIB) as r:
        t = threading.Thread(target=_stream, args=(r.endpoint, 0, 0, 12, MIB // 4 - 128))
        t.start()
        kept, seen = [], {}
        try:
            while True:
                kept.append(r.get_bundle(timeout=30))
                _check(kept[-1], seen)
        except EndOfStream:
            pass
        t.join()
        c = r.counts()[0]
        assert seen == {0: list(range(12))} and 3 <= c["shm_bundles"] <= 4 and c["bundles"] == 12


def _drain(r, seen):
    try:
        while True:
            _check(r.get_bundle(timeout=30), seen)
    except EndOfStream:
        pass


def test_a_sender_on_another_node_or_declining_sends_over_tcp(tmp_path):
    with Receiver("tcp://127.0.0.1:0", expected=2, shm_bytes=MIB, shm_dir=str(tmp_path)) as r:
        r.rings.node = "some-other-node"
        t0 = threading.Thread(target=_stream, args=(r.endpoint, 0, 0, 3, 4096))
        t0.start()
        r.wait_workers(1, 10)
        r.rings.node = local_node()
        t1 = threading.Thread(target=_stream, args=(r.endpoint, 1, 0, 3, 4096), kwargs={"shm": False})
        t1.start()
        seen = {}
        _drain(r, seen)
        t0.join()
        t1.join()
        c = r.counts()
        assert sorted(seen.items()) == [(0, [0, 1, 2]), (1, [0, 1, 2])]
        assert not c[0]["shm"] and not c[1]["shm"] and c[0]["shm_bundles"] == c[1]["shm_bundles"] == 0
        assert _rings(tmp_path) == []


def test_no_ring_directory_is_a_warning_and_tcp(caplog):
    with Receiver("tcp://127.0.0.1:0", expected=1, shm_bytes=MIB, shm_dir="/nonexistent/shm") as r:
        t = threading.Thread(target=_stream, args=(r.endpoint, 0, 0, 3, 4096))
        t.start()
        seen = {}
        _drain(r, seen)
        t.join()
        assert seen == {0: [0, 1, 2]} and r.counts()[0]["shm_bundles"] == 0
    assert "no shared-memory ring" in caplog.text and "send over TCP" in caplog.text


def test_a_killed_sender_is_replaced_on_a_ring_of_its_own_and_no_file_is_left(tmp_path):
    """A sender process SIGKILLed while streaming (maybe inside a write) and its replacement
    (attempt 1): what the chief got is intact, the replacement streams through a new ring, and the
    killed one's ring goes with its last array."""
    ctx = multiprocessing.get_context("fork")
    with Receiver("tcp://127.0.0.1:0", expected=1, shm_bytes=4 * MIB, shm_dir=str(tmp_path)) as r:
        started = ctx.Event()
        p = ctx.Process(target=_stream, args=(r.endpoint, 0, 0, 100_000, MIB // 2, started))
        p.start()
        seen, first = {}, []
        while not started.is_set():
            first.append(r.get_bundle(timeout=30))
        os.kill(p.pid, signal.SIGKILL)
        p.join()
        for b in first:
            _check(b, seen)
        old_ring = r._workers.by_index[0].ring
        q = ctx.Process(target=_stream, args=(r.endpoint, 0, 1, 20, MIB // 2))
        q.start()
        again = {}
        try:
            while True:
                b = r.get_bundle(timeout=30)
                if b.attempt == 1:
                    _check(b, again)
        except EndOfStream:
            pass
        q.join()
        assert q.exitcode == 0 and again == {0: list(range(20))}
        assert r._workers.by_index[0].ring is not old_ring and r.counts()[0]["attempt"] == 1
        del first, b
        gc.collect()
        assert old_ring._mm.closed  # the killed sender's ring is unmapped with its last array
    assert _rings(tmp_path) == []


def test_a_pin_callback_given_late_pins_the_rings_made_before_and_after_it(tmp_path):
    calls = []

    def register(address, nbytes):
        calls.append(address)
        return lambda: calls.append(-address)

    with Receiver("tcp://127.0.0.1:0", expected=2, shm_bytes=MIB, shm_dir=str(tmp_path)) as r:
        t0 = threading.Thread(target=_stream, args=(r.endpoint, 0, 0, 3, 4096))
        t0.start()
        r.wait_workers(1, 10)
        first = r._workers.by_index[0].ring
        assert r.on_shared_memory(register) and calls == [first.address] and first.registered
        t1 = threading.Thread(target=_stream, args=(r.endpoint, 1, 0, 3, 4096))
        t1.start()
        _drain(r, {})
        t0.join()
        t1.join()
        second = r._workers.by_index[1].ring
        assert second.registered and calls[:2] == [first.address, second.address]
    gc.collect()
    assert sorted(calls[2:]) == sorted([-first.address, -second.address])  # undone as each ring went
    with Receiver("tcp://127.0.0.1:0") as plain:
        assert not plain.on_shared_memory(register)  # no rings: nothing to pin
