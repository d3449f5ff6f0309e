"""What bench_ingest's ceiling and the other ingest benchmarks (bench_ingest_gap, bench_gpu_feed,
bench_auth) measure with: the batch sizes, the measurement window (batches/s and the CPU of both
sides), raw TCP and data-plane ingest into this process from sender processes a caller starts
(:mod:`ingest_roles`' ``--sender`` and ``--dp-sender``), and reaping those senders.

Pure measurement: no TensorFlow; numpy and the data plane are imported where used.
"""
from __future__ import annotations

import os
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from csrun_common import atomic

#: Batch sizes of the ceiling (bytes of one batch: features + labels).
SIZES = {"16 KiB": 16 << 10, "256 KiB": 256 << 10, "4 MiB": 4 << 20}
#: Samples per batch of the synthetic batches.
ROWS = 64
#: Dataset variants each ceiling worker registers: name -> (input_bundle, compression, prefetch).
WORKER_VARIANTS: dict[str, tuple[str | int, str | None, bool]] = {
    "auto": ("auto", None, False), "unbundled": (1, None, False),
    "compressed": ("auto", "AUTO", False), "prefetch": ("auto", None, True),
}
#: Ceiling paths, and the hop variants (path name -> worker dataset variant, chief reader).
PATHS = {"service": ("auto", "threads"), "service, unbundled": ("unbundled", "threads")}
HOP_VARIANTS = {
    "max_outstanding_requests=8": ("auto", "mor8"),
    "2 consumers per worker (job_name)": ("auto", "two_consumers"),
    "compression AUTO": ("compressed", "threads"),
    "prefetch(2) after bundling": ("prefetch", "threads"),
    "merge in tf.data (interleave)": ("auto", "tfdata"),
}
#: A transport that is not tf.data service, measured beside it (hop study): each worker
#: iterates the same bundled dataset in Python and writes its tensors' bytes over TCP; the
#: chief reads them into numpy arrays wrapped as tensors. Not the runtime's path.
LEAN = "lean TCP transport (numpy, not tf.data service)"
#: The framework-neutral data plane (csrun_runtime.dataplane): ``k`` light sender processes
#: (numpy + pyzmq, no TensorFlow, like the raw TCP senders) each ``Sender.send`` the same batch
#: (stacked into ~1 MiB bundles), the chief ``Receiver.get_bundle`` on one endpoint.
DATAPLANE = "data plane (zmq)"
#: The same without the handshake's proofs (``authenticate=False`` at both ends): what
#: authentication costs (issue 45: at most 2 % of the ingest rate).
DATAPLANE_OPEN = "data plane (zmq), no authentication"


def write(path: str | Path, obj: Any) -> None:
    atomic.write_json(Path(path), obj, indent=None)


def cpu(pids: list[int]) -> float:
    """Summed user+system CPU seconds of ``pids`` (0 for a pid that is gone)."""

    total = 0.0
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def window(step: Callable[[], int], warmup_s: float, window_s: float, pids: list[int]
            ) -> dict[str, float]:
    """Call ``step`` (returns batches taken) for ``warmup_s`` then ``window_s`` seconds;
    returns batches/s and the CPU seconds per second of this process and of ``pids``."""
    import resource

    me = [os.getpid()]
    t_end = time.monotonic() + warmup_s
    while time.monotonic() < t_end:
        step()
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    c0, w0, t0, n = cpu(me), cpu(pids), time.monotonic(), 0
    while time.monotonic() - t0 < window_s:
        n += step()
    dt = time.monotonic() - t0
    return {"batches_per_sec": n / dt, "chief_cpu": (cpu(me) - c0) / dt,
            "workers_cpu": (cpu(pids) - w0) / dt, "window_s": dt,
            "chief_page_faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0}



# =========================================================================== raw TCP
def _recv_frames(conn: socket.socket, counts: list[int], i: int) -> None:
    head = bytearray(8)
    buf = bytearray(0)
    try:
        while True:
            got = 0
            while got < 8:
                r = conn.recv_into(memoryview(head)[got:])
                if not r:
                    return
                got += r
            n = struct.unpack("!Q", head)[0]
            if len(buf) != n:
                buf = bytearray(n)
            view, got = memoryview(buf), 0
            while got < n:
                r = conn.recv_into(view[got:])
                if not r:
                    return
                got += r
            counts[i] += 1
    except OSError:
        return


def measure_raw(k: int, nbytes: int, warmup_s: float, window_s: float, start: Callable[[dict], Any]
                ) -> dict[str, float]:
    """Batches/s of ``k`` raw TCP senders to ``k`` receiver threads of this process, and the
    CPU of both sides (see :func:`child_sender`)."""
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(k)
    port = ls.getsockname()[1]
    senders = [start({"port": port, "nbytes": nbytes}) for _ in range(k)]
    conns, counts = [], [0] * k
    try:
        ls.settimeout(60)
        for i in range(k):
            conn, _ = ls.accept()
            conns.append(conn)
            threading.Thread(target=_recv_frames, args=(conn, counts, i), daemon=True).start()
        pids = [p.pid for p in senders]

        def step() -> int:
            before = sum(counts)
            time.sleep(0.05)
            return sum(counts) - before

        return window(step, warmup_s, window_s, pids)
    finally:
        for c in conns:
            c.close()
        ls.close()
        for p in senders:
            p.kill()
            p.wait()



# =========================================================================== data plane
def measure_dataplane(k: int, nbytes: int, warmup_s: float, window_s: float, start: Callable[[dict], Any],
                      window_bytes: int | None = None, consume: Callable[[Any], None] | None = None,
                      lend: Callable[[int], Any] | None = None, **receiver: Any) -> dict[str, float]:
    """Batches/s of ``k`` data-plane senders into one :class:`~csrun_runtime.dataplane.Receiver`
    of this process (``get_bundle``: bundles handed out as arrays on the received frames), and
    the CPU of both sides. ``window_bytes``: the receiver's credit window (None: its default);
    ``consume(bundle)``: what the chief does with each bundle before the next (None: nothing);
    ``lend``: what the receiver reads bundles into (:meth:`Receiver.lend`, with ``bulk=True``);
    ``receiver``: its other arguments (``io_threads``, ``keep_memory``, ``bulk``, ``authenticate``:
    also given to the senders' specs)."""
    from csrun_runtime.dataplane import WINDOW_BYTES, Receiver

    rx = Receiver("tcp://127.0.0.1:0", window_bytes=window_bytes or WINDOW_BYTES, expected=k, **receiver)
    if lend is not None and not rx.lend(lend):
        raise ValueError("measure_dataplane: lend needs bulk=True")
    auth = {"authenticate": receiver["authenticate"]} if "authenticate" in receiver else {}
    senders = [start({"endpoint": rx.endpoint, "index": i, "nbytes": nbytes, **auth}) for i in range(k)]

    def step() -> int:
        b = rx.get_bundle(60)
        if consume is not None:
            consume(b)
        return b.n

    try:
        rx.wait_workers(k, 120)
        return window(step, warmup_s, window_s, [p.pid for p in senders])
    finally:
        rx.close()
        reap(senders, 5.0)


def reap(procs: list[subprocess.Popen], timeout: float) -> None:
    """Wait up to ``timeout`` s for each sender to leave by itself (its receiver closed), then
    kill it."""
    for p in procs:
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


