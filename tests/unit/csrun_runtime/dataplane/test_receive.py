"""The receive path of issue 31: bundles expose their arrays as views on zmq's frames that stay
valid after the bundle and the receiver are gone (a device feed copies each once into its own
buffers), several zmq I/O threads serve several senders, and the chief's glibc keeps received
memory mapped — over real zmq sockets on loopback."""
from __future__ import annotations

import gc
import platform
import threading

import numpy as np
import pytest

from csrun_runtime.dataplane import FrameError, Receiver, Sender, framing
from csrun_runtime.dataplane import receive as rcv


def _bundle_of(rx, nest, n):
    """Send ``nest`` (leading axis ``n``) as one bundle from a sender (in a thread: its handshake
    goes back and forth while the receiver reads) and receive it."""
    s = Sender(rx.endpoint, 0)
    t = threading.Thread(target=s.send_bundle, args=(nest, n), kwargs={"timeout": 10}, daemon=True)
    t.start()
    try:
        return rx.get_bundle(timeout=10)
    finally:
        t.join(10)
        s.close(timeout=0.2)


def test_bundle_arrays_are_views_that_outlive_the_receiver_and_can_be_copied_once():
    x = np.arange(4 * 64 * 256, dtype=np.float32).reshape(4, 64, 256)  # frames of 256 KiB and 32 KiB:
    y = np.arange(4 * 1024, dtype=np.int64).reshape(4, 1024)          # not copied by zmq nor realigned
    rx = Receiver("tcp://127.0.0.1:0")
    b = _bundle_of(rx, {"x": x, "y": y}, 4)
    arrays = b.arrays
    assert [a.shape for a in arrays] == [(4, 64, 256), (4, 1024)]  # flatten order: the dict's keys
    assert all(a.base is not None and not a.flags.owndata and a.flags.c_contiguous for a in arrays)
    assert arrays[0].ctypes.data == b.nest["x"].ctypes.data  # the nest's leaves are the same memory
    rx.close()
    del b
    gc.collect()
    np.testing.assert_array_equal(arrays[0], x)  # still valid: each array holds its frame
    # a consumer's one copy into buffers it allocated beforehand, and the nest around them
    ring = [np.empty_like(a) for a in arrays]
    for dst, src in zip(ring, arrays, strict=True):
        np.copyto(dst, src)
    rebuilt = framing.unflatten(framing.flatten({"x": x, "y": y})[0], ring)
    np.testing.assert_array_equal(rebuilt["y"], y)


def test_rebuild_puts_a_consumers_copies_in_the_received_structure():
    rx = Receiver("tcp://127.0.0.1:0")
    try:
        b = _bundle_of(rx, (np.ones((2, 5), np.uint8), [np.zeros((2,), np.int32)]), 2)
        out = b.rebuild(["a", "b"])
        assert out == ("a", ["b"])
        with pytest.raises(FrameError):
            b.rebuild(["only one"])
    finally:
        rx.close()


@pytest.mark.parametrize("cores, want", [(1, 2), (2, 2), (8, 2), (12, 3), (16, 4), (64, 4)])
def test_auto_io_threads_scales_with_cores(monkeypatch, cores, want):
    monkeypatch.setattr(rcv, "usable_cores", lambda: cores)
    assert rcv.auto_io_threads() == want


def test_several_io_threads_serve_several_senders_in_order():
    rx = Receiver("tcp://127.0.0.1:0", io_threads=2, expected=3)
    senders = [Sender(rx.endpoint, i, bundle=1) for i in range(3)]
    try:
        # each sender's handshake in a thread of its own (it goes back and forth) while the receiver reads
        handshakes = [threading.Thread(target=s.room, kwargs={"timeout": 10}, daemon=True) for s in senders]
        for t in handshakes:
            t.start()
        rx.wait_workers(3, 10)
        for t in handshakes:
            t.join(10)
        for i, s in enumerate(senders):
            for j in range(3):
                s.send(np.full((1024,), 10 * i + j, np.int32), timeout=10)
        got: dict[int, list[int]] = {}
        for _ in range(9):
            b = rx.get_bundle(timeout=10)
            got.setdefault(b.worker, []).append(int(b.arrays[0][0, 0]))
        assert got == {i: [10 * i, 10 * i + 1, 10 * i + 2] for i in range(3)}
    finally:
        for s in senders:
            s.close(timeout=0.2)
        rx.close()


def test_keep_receive_memory_applies_once_on_glibc(monkeypatch):
    monkeypatch.delenv("CSRUN_DATAPLANE_KEEP_MEMORY", raising=False)
    monkeypatch.setattr(rcv, "_kept", None)
    first = rcv.keep_receive_memory()
    assert first is (platform.libc_ver()[0] == "glibc")
    assert rcv.keep_receive_memory() is first


def test_keep_receive_memory_can_be_turned_off_by_the_environment(monkeypatch):
    monkeypatch.setenv("CSRUN_DATAPLANE_KEEP_MEMORY", "0")
    monkeypatch.setattr(rcv, "_kept", None)
    assert rcv.keep_receive_memory() is False
