"""Issue 31's feed rows side by side in one run: how fast batches reach the training device
(CUDA when present, else CPU) through the PyTorch chief's real path, beside the ceilings.

Rows, per batch kind (images: 256x3x224x224 uint8 + int64 labels, 38.5 MB; small: 64x1024
float32 + int64 labels, 0.26 MB; ``--quick``: 8x3x32x32 images), GB/s (10^9 B/s) into the device
and the chief process's cores (psutil CPU times of this process over the window):

- ``data plane, device feed``: k processes running the input worker's real send path
  (``csrun_runtime.pytorch.worker.send_batches``) into the chief's real path
  (``RemoteSource`` + ``devicefeed.DeviceFeed``: pinned ring, copy stream, prefetch thread);
- ``data plane, receive only``: the same senders into ``RemoteSource.next()`` alone (the
  receive's ceiling, no copy);
- ``data plane, device feed, 1 copy thread``: the device feed with its pinned copy on one
  thread (shown when the default copies with several, :func:`staging.auto_copy_threads`);
- ``data plane, to_torch``: the same senders, ``RemoteSource.next()`` then ``to_torch`` (the
  path before issue 31: a fresh ``pin_memory()`` per batch on CUDA);
- ``DataLoader``: ``DataLoader(num_workers=k, pin_memory=True)`` in this process over the same
  batch, and ``DataLoader, fresh`` (a fresh tensor per batch);
- ``pinned H2D``, ``pageable H2D``, ``to_torch alone`` (no transport);
- ``one copy, ...`` (not csrun's path: the ceiling of issue 31's "frames land once in a ring of
  pinned host buffers" on this host): k processes sending the batch's bytes over plain TCP; the
  chief reads each connection on a thread of its own with ``socket.recv_into`` straight into
  pinned buffers (two per connection, reused), then (``to device``) copies each to the device
  on that thread's stream. Its ``chief_cores`` is what the kernel's TCP receive alone costs;
- with CUDA and torchvision: a ResNet-50 (bf16 autocast, channels_last) stepped by
  ``TorchStepBackend.train`` with the batch resident vs fed by the device feed (k senders);
  otherwise that row is reported as skipped.

Usage: ``python bench/bench_gpu_feed.py [--quick] [--ks 4,8] [--out FILE]`` (default
``bench/results/gpu_feed_<cpu|cuda>.json``; ``--kinds images``, ``--no-step``, ``--io-threads N``:
a part of the run, or the receiver's zmq I/O threads fixed; ``--copy-threads N``: a device feed
row with N copy threads beside the default's; ``--no-top-pad``: the chief's glibc
without the data plane's ``M_TOP_PAD``, for an A/B). The JSON names the device and the
host's cores.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [p for p in (str(ROOT), str(HERE)) if p not in sys.path]


def shapes(kind: str, quick: bool) -> list[tuple[tuple[int, ...], str]]:
    if kind == "images":
        n, side = (8, 32) if quick else (256, 224)
        return [((n, 3, side, side), "uint8"), ((n,), "int64")]
    return [((64, 1024), "float32"), ((64,), "int64")]


def make_batch(kind: str, quick: bool, seed: int = 0) -> tuple[Any, ...]:
    """One batch as CPU tensors (what the input worker's DataLoader yields)."""
    import numpy as np
    import torch

    rng = np.random.default_rng(seed)
    (xs, xdt), (ys, _) = shapes(kind, quick)
    x = rng.integers(0, 256, xs, dtype=np.uint8) if xdt == "uint8" else rng.random(xs, dtype=np.float32)
    return torch.from_numpy(x), torch.from_numpy(rng.integers(0, 1000, ys, dtype=np.int64))


def sender_main(spec_path: str) -> None:
    """A child: the PyTorch input worker's ``send_batches`` of one batch, endlessly."""
    from csrun_runtime.dataplane import ReceiverGone, Sender
    from csrun_runtime.pytorch.worker import send_batches

    spec = json.loads(Path(spec_path).read_text())
    if spec.get("cpus"):
        os.sched_setaffinity(0, spec["cpus"])
    batch = make_batch(spec["kind"], spec["quick"], seed=spec["index"])
    ppid = os.getppid()

    def check() -> None:
        if os.getppid() != ppid:
            raise SystemExit(0)

    s = Sender(spec["endpoint"], spec["index"])
    try:
        send_batches(s, itertools.repeat(batch), check=check)
    except (ReceiverGone, TimeoutError):
        pass
    finally:
        s.close(timeout=1.0)


#: ``--copy-threads N``: one more device feed row with N copy threads (None: none).
COPY_THREADS: int | None = None

#: ``--split-cores``: the cores the senders (and the DataLoader rows' workers) run on; the chief
#: runs on the others. None: every process may run on every core.
SENDER_CPUS: list[int] | None = None


def split_cores() -> list[int]:
    """Pin this process (the chief) to the lower half of its usable cores and return the upper
    half for the senders, as input workers on other nodes would leave the chief's cores alone."""
    cores = sorted(os.sched_getaffinity(0))
    half = max(1, len(cores) // 2)
    os.sched_setaffinity(0, cores[:half])
    return cores[half:] or cores


def pin_to_sender_cpus(_worker_id: int = 0) -> None:
    """A sender's or DataLoader worker's affinity under ``--split-cores`` (no-op otherwise)."""
    if SENDER_CPUS:
        os.sched_setaffinity(0, SENDER_CPUS)


def source_and_senders(kind: str, k: int, work: Path, quick: bool,
                       path: str = "data plane") -> tuple[Any, list[subprocess.Popen]]:
    """The chief's real ``RemoteSource`` (its own rendezvous directory under ``work``) and k
    sender processes (:func:`sender_main`) streaming ``kind`` batches into it, by ``path``:
    ``data plane`` (zmq, as from other nodes: no shared-memory ring though the senders run here),
    ``bulk channel`` (``runconfig.dataplane_bulk``) or ``shared memory`` (a ring per sender,
    ``runconfig.dataplane_shm_bytes``'s default: co-located input workers)."""
    from csrun_common.roles import Role
    from csrun_runtime.params import SHM_RING_BYTES
    from csrun_runtime.pytorch.remote import RemoteSource
    from csrun_runtime.rendezvous import Rendezvous

    rdv = Rendezvous(work / f"md-{kind}-{k}-{time.time_ns()}", "gpufeed.0")
    rdv.reset()
    role = Role(kind="chief", worker_index=None, num_input_workers=k, host="127.0.0.1")
    src = RemoteSource(rdv, role, {"input_timeout_secs": 60, "worker_start_timeout_secs": 120,
                                   "dataplane_bulk": path == "bulk channel",
                                   "dataplane_shm_bytes": SHM_RING_BYTES if path == "shared memory" else 0},
                       adopt=False)
    procs = []
    for i in range(k):
        spec = work / f"sender-{kind}-{k}-{i}-{time.time_ns()}.json"
        spec.write_text(json.dumps({"endpoint": src.endpoint, "index": i, "kind": kind, "quick": quick,
                                    "cpus": SENDER_CPUS}))
        procs.append(subprocess.Popen([sys.executable, __file__, "--sender", str(spec)], stdin=subprocess.DEVNULL,
                                      env=child_env()))
    return src, procs


def child_env() -> dict[str, str]:
    """A sender's environment: this repository and bench/ first on PYTHONPATH, the caller's
    PYTHONPATH kept (on the GPU machine pyzmq comes from a carried wheel's --target folder)."""
    keep = os.environ.get("PYTHONPATH", "")
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(HERE)] + ([keep] if keep else [])))


def _sync(dev: Any) -> None:
    import torch

    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def window(step: Any, plan: dict[str, float], dev: Any, pids: list[int]) -> dict[str, Any]:
    """``step()`` (returns bytes delivered) for the warm-up, then the window; GB/s, the chief's
    cores (this process) and the others' (``pids``), the chief's minor page faults per MB."""
    import psutil
    from ingest_lib import cpu  # summed user+system CPU seconds of pids

    t_end = time.perf_counter() + plan["warmup_s"]
    while time.perf_counter() < t_end:
        step()
    _sync(dev)
    me = psutil.Process()
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    c0, w0, t0, got, n = sum(me.cpu_times()[:2]), cpu(pids), time.perf_counter(), 0, 0
    while time.perf_counter() - t0 < plan["window_s"]:
        got += step()
        n += 1
    _sync(dev)
    dt = time.perf_counter() - t0
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
    return {"gb_per_sec": round(got / dt / 1e9, 4), "batches": n, "window_s": round(dt, 3),
            "chief_cores": round((sum(me.cpu_times()[:2]) - c0) / dt, 2),
            "workers_cores": round((cpu(pids) - w0) / dt, 2),
            "chief_faults_per_mb": round(faults / (got / 1e6), 1) if got else None}


def dataplane_rows(kind: str, k: int, dev: Any, plan: dict[str, float], work: Path, quick: bool,
                   depth: int, path: str = "data plane") -> dict[str, Any]:
    """k sender processes into one RemoteSource: the device feed's rows (:func:`_feed_variants`),
    then to_torch's. ``path`` ``bulk channel``: the data on the bulk channel
    (``runconfig.dataplane_bulk``), rows named ``bulk channel, ...``: receive only, and the device
    feed, which on CUDA lends the receiver its pinned pool (one host copy, by the kernel), beside
    the same feed not lending (the ring's copy); no to_torch row. ``shared memory``: the senders
    as co-located input workers, each bundle in a shared-memory ring the feed registers with CUDA
    (no host copy by the chief): receive only and the device feed."""
    bulk = path == "bulk channel"
    from ingest_lib import reap

    from csrun_runtime.pytorch.contract import to_torch
    from csrun_runtime.pytorch.devicefeed import DeviceFeed
    from csrun_runtime.pytorch.staging import nest_bytes

    src, procs = source_and_senders(kind, k, work, quick, path)
    pids = [p.pid for p in procs]
    out: dict[str, Any] = {}
    try:
        src.r.wait_workers(k, 120.0)

        def old() -> int:
            nest, _ = src.next()
            to_torch(nest, dev)
            return nest_bytes(nest)

        def recv() -> int:
            nest, _ = src.next()
            return nest_bytes(nest)

        out[f"{path}, receive only"] = window(recv, plan, dev, pids)
        if path == "data plane":
            out["data plane, to_torch"] = window(old, plan, dev, pids)
        for name, feed_args in _feed_variants(path, dev, bulk):
            src.cancelled = False  # the previous feed's stop() cancelled the source's waits
            feed = DeviceFeed(src, dev, depth=depth, **feed_args)

            def new(feed: Any = feed) -> int:
                batch, _ = feed.next()
                return nest_bytes(batch)

            out[name] = window(new, plan, dev, pids)
            feed.stop()
            src.lend(None)  # a lending feed's pool let go: the next row receives into fresh arrays
            out[name]["feed"] = feed.feed_info()
    finally:
        src.close()
        reap(procs, 5.0)
    return out


def _feed_variants(path: str, dev: Any, bulk: bool) -> list[tuple[str, dict[str, Any]]]:
    """The device feed rows of :func:`dataplane_rows` for ``path`` (its rows' prefix): each row's
    name and :class:`DeviceFeed`'s arguments. zmq: the default copy threads, 1, ``--copy-threads``
    and pageable (the last two on CUDA); the bulk channel: lending (the default), and on CUDA not;
    shared memory: the default (on CUDA the rings registered, each batch copied from its ring)."""
    from csrun_runtime.pytorch.staging import auto_copy_threads

    cuda = dev.type == "cuda"
    if path == "shared memory":
        return [(f"{path}, device feed", {})]
    if bulk:
        return [(f"{path}, device feed", {"lend": None})] + (
            [(f"{path}, device feed, not lent", {"lend": False})] if cuda else [])
    auto = auto_copy_threads() if cuda else 1
    variants: list[tuple[str, dict[str, Any]]] = [(f"{path}, device feed", {"copy_threads": auto})]
    variants += [(f"{path}, device feed, 1 copy thread", {"copy_threads": 1})] if auto > 1 else []
    if cuda and COPY_THREADS and COPY_THREADS != auto:  # --copy-threads: an A/B of the default
        variants += [(f"{path}, device feed, {COPY_THREADS} copy threads", {"copy_threads": COPY_THREADS})]
    variants += [(f"{path}, device feed, pageable", {"copy": False, "copy_threads": None})] if cuda else []
    return variants


def raw_sender_main(spec_path: str) -> None:
    """A child of the one-copy rows: the batch's leaves' bytes sent over plain TCP, endlessly."""
    import socket

    spec = json.loads(Path(spec_path).read_text())
    if spec.get("cpus"):
        os.sched_setaffinity(0, spec["cpus"])
    bufs = [memoryview(t.numpy()).cast("B") for t in make_batch(spec["kind"], spec["quick"], seed=spec["index"])]
    ppid = os.getppid()
    try:
        with socket.create_connection(("127.0.0.1", spec["port"]), timeout=60) as sock:
            while os.getppid() == ppid:
                for b in bufs:
                    sock.sendall(b)
    except OSError:  # the chief closed
        pass


def one_copy_rows(kind: str, k: int, dev: Any, plan: dict[str, float], work: Path, quick: bool) -> dict[str, Any]:
    """The one-copy ceiling (module docstring): ``one copy, receive only`` (``recv_into`` pinned
    buffers) and ``one copy, to device`` (then a non_blocking copy on a stream per connection)."""
    import queue
    import socket
    import threading

    import torch
    from ingest_lib import reap

    cuda = dev.type == "cuda"
    nbytes = sum(t.nbytes for t in make_batch(kind, quick))
    out: dict[str, Any] = {}
    for name, h2d in (("one copy, receive only", False), ("one copy, to device", True)):
        lsock = socket.create_server(("127.0.0.1", 0))
        lsock.settimeout(120)
        procs = []
        for i in range(k):
            spec = work / f"raw-{kind}-{k}-{i}-{time.time_ns()}.json"
            spec.write_text(json.dumps({"port": lsock.getsockname()[1], "index": i, "kind": kind, "quick": quick,
                                        "cpus": SENDER_CPUS}))
            procs.append(subprocess.Popen([sys.executable, __file__, "--raw-sender", str(spec)],
                                          stdin=subprocess.DEVNULL, env=child_env()))
        conns: list[Any] = []
        threads: list[threading.Thread] = []
        q: queue.Queue[Any] = queue.Queue(maxsize=2 * k)
        stop = threading.Event()

        def reader(conn: Any, h2d: bool = h2d, stop: Any = stop, q: Any = q) -> None:
            bufs = [torch.empty(nbytes, dtype=torch.uint8, pin_memory=cuda) for _ in range(2)]
            dsts = [torch.empty(nbytes, dtype=torch.uint8, device=dev) for _ in range(2)] if h2d else []
            stream = torch.cuda.Stream(device=dev) if cuda else None
            events: list[Any] = [None, None]
            for i in itertools.count():
                s = i % 2
                if events[s] is not None:
                    events[s].synchronize()
                mv, got = memoryview(bufs[s].numpy()), 0
                while got < nbytes:
                    try:
                        r = conn.recv_into(mv[got:])
                    except OSError:  # closed by the window's end
                        return
                    if not r or stop.is_set():
                        return
                    got += r
                if h2d and stream is not None:
                    with torch.cuda.stream(stream):
                        dsts[s].copy_(bufs[s], non_blocking=True)
                        events[s] = torch.cuda.Event()
                        events[s].record(stream)
                elif h2d:
                    dsts[s].copy_(bufs[s])  # the CPU row: a copy, as a device copy would move the bytes
                while not stop.is_set():
                    try:
                        q.put(events[s], timeout=0.1)
                        break
                    except queue.Full:
                        pass

        def step(q: Any = q) -> int:
            ev = q.get(timeout=60)
            if ev is not None:
                ev.synchronize()
            return nbytes

        try:  # a sender that never connects: accept times out, and the senders are still reaped
            conns.extend(lsock.accept()[0] for _ in range(k))
            threads.extend(threading.Thread(target=reader, args=(c,), daemon=True) for c in conns)
            for t in threads:
                t.start()
            out[name] = window(step, plan, dev, [p.pid for p in procs])
        finally:
            stop.set()
            for c in conns:  # shutdown wakes a reader blocked in recv_into
                try:
                    c.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                c.close()
            lsock.close()
            for t in threads:
                t.join(5.0)
            reap(procs, 5.0)
    return out


class SameBatch:
    """A map-style dataset whose every item is the same batch (``fresh``: a copy of it)."""

    def __init__(self, batch: tuple[Any, ...], fresh: bool):
        self.batch, self.fresh = batch, fresh

    def __len__(self) -> int:
        return 10 ** 9

    def __getitem__(self, i: int) -> Any:
        return tuple(t.clone() for t in self.batch) if self.fresh else self.batch


def dataloader_row(kind: str, k: int, dev: Any, plan: dict[str, float], fresh: bool, quick: bool) -> dict[str, Any]:
    from torch.utils.data import DataLoader

    batch = make_batch(kind, quick)
    nbytes = sum(t.nbytes for t in batch)
    loader = DataLoader(SameBatch(batch, fresh), batch_size=None, num_workers=k, pin_memory=dev.type == "cuda",
                        worker_init_fn=pin_to_sender_cpus,
                        timeout=60)
    it = iter(loader)
    try:
        def step() -> int:
            for t in next(it):
                t.to(dev, non_blocking=True)
            return nbytes

        step()
        return window(step, plan, dev, [w.pid for w in getattr(it, "_workers", [])])
    finally:
        shut = getattr(it, "_shutdown_workers", None)
        if shut:
            shut()


def h2d_row(kind: str, mode: str, dev: Any, plan: dict[str, float], quick: bool) -> dict[str, Any]:
    """``pinned H2D`` (CUDA only), ``pageable H2D``, ``to_torch alone``."""
    import collections

    import torch

    from csrun_runtime.pytorch.contract import to_torch

    batch = make_batch(kind, quick)
    nbytes = sum(t.nbytes for t in batch)
    inflight: collections.deque[Any] = collections.deque()
    src = [t.pin_memory() for t in batch] if mode == "pinned H2D" else list(batch)
    arrays = tuple(t.numpy() for t in batch)

    def step() -> int:
        if mode == "to_torch alone":
            to_torch(arrays, dev)
        else:
            moved = [t.to(dev, non_blocking=mode == "pinned H2D") for t in src]
            if dev.type == "cpu":  # a copy, so that the CPU row moves bytes as a device copy would
                moved = [t.clone() for t in moved]
        if dev.type == "cuda":  # at most 4 batches queued
            ev = torch.cuda.Event()
            ev.record()
            inflight.append(ev)
            if len(inflight) > 4:
                inflight.popleft().synchronize()
        return nbytes

    return window(step, plan, dev, [])


def step_rows(dev: Any, k: int, work: Path, depth: int) -> dict[str, Any]:
    """ResNet-50 (torchvision), bf16 autocast, channels_last, SGD momentum, stepped by
    ``TorchStepBackend.train``: the batch resident on the GPU vs fed by k senders through the
    device feed; the loss read once per block (the logging cadence), not per step."""
    import torch
    import torch.nn.functional as F
    import torchvision
    from ingest_lib import reap

    from csrun_runtime.pytorch.devicefeed import DeviceFeed
    from csrun_runtime.pytorch.training import OneBatch, TorchStepBackend

    torch.backends.cudnn.benchmark = True
    mean = torch.tensor([0.485, 0.456, 0.406], device=dev).view(1, 3, 1, 1) * 255
    std = torch.tensor([0.229, 0.224, 0.225], device=dev).view(1, 3, 1, 1) * 255
    net = torchvision.models.resnet50().to(dev, memory_format=torch.channels_last)

    def forward_loss(m: Any, batch: Any) -> Any:
        x, y = batch
        x = ((x.float() - mean) / std).contiguous(memory_format=torch.channels_last)
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            return F.cross_entropy(m(x).float(), y)

    opt = torch.optim.SGD(net.parameters(), lr=1e-3, momentum=0.9)
    kw = {"model": net, "opt": opt, "rc": {"keep_checkpoint_max": 1}, "model_dir": work / "md-step",
          "evaluate": lambda m, s: None, "forward_loss": forward_loss, "device": dev}
    batch = make_batch("images", False)
    resident = tuple(t.to(dev) for t in batch)
    be = TorchStepBackend(source=None, **kw)

    def block(next_batch: Any, n: int) -> tuple[float, float]:
        _sync(dev)
        t0, waited, loss = time.perf_counter(), 0.0, None
        for _ in range(n):
            a = time.perf_counter()
            b = next_batch()
            waited += time.perf_counter() - a
            loss, _ = be.train(OneBatch(b, 0))
        float(loss)  # the log line's read
        _sync(dev)
        return (time.perf_counter() - t0) / n, waited / n

    block(lambda: resident, 5)
    r1, _ = block(lambda: resident, 20)
    src, procs = source_and_senders("images", k, work, False)
    try:
        src.r.wait_workers(k, 120.0)
        by_depth = {}
        for d in sorted({depth, 1, 4}):  # runconfig.device_prefetch's default chosen by these
            src.cancelled = False
            feed = DeviceFeed(src, dev, depth=d)
            block(lambda feed=feed: feed.next()[0], 5)
            f_d, w_d = block(lambda feed=feed: feed.next()[0], 20)
            feed.stop()
            by_depth[d] = {"step_ms_fed": round(f_d * 1e3, 2), "wait_ms_per_step": round(w_d * 1e3, 2)}
        fed, wait = by_depth[depth]["step_ms_fed"] / 1e3, by_depth[depth]["wait_ms_per_step"] / 1e3
    finally:
        src.close()
        reap(procs, 5.0)
    r2, _ = block(lambda: resident, 20)
    res = min(r1, r2)
    return {"model": "torchvision ResNet-50, bf16 autocast, channels_last, SGD momentum", "senders": k,
            "step_ms_resident": [round(r1 * 1e3, 2), round(r2 * 1e3, 2)], "step_ms_fed": round(fed * 1e3, 2),
            "wait_ms_per_step": round(wait * 1e3, 2), "input_share_of_fed_step": round(1 - res / fed, 4),
            "device_prefetch": depth,
            "by_device_prefetch": {d: {**v, "input_share": round(1 - res / (v["step_ms_fed"] / 1e3), 4)}
                                   for d, v in by_depth.items()},
            "target": "within 3 % of resident"}


def env() -> dict[str, Any]:
    import numpy as np
    import torch
    import zmq

    cuda = torch.cuda.is_available()
    return {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "host": platform.node(), "cores": os.cpu_count(),
            "usable_cores": len(os.sched_getaffinity(0)), "python": platform.python_version(),
            "torch": torch.__version__, "numpy": np.__version__, "pyzmq": zmq.__version__,
            "device": torch.cuda.get_device_name(0) if cuda else f"CPU ({platform.processor() or 'cpu'})",
            "cuda": torch.version.cuda if cuda else None}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="CPU-sized: small images, k=1,2, short windows")
    ap.add_argument("--ks", default=None, help="sender counts (default 4,8; --quick 1,2)")
    ap.add_argument("--depth", type=int, default=2, help="runconfig.device_prefetch of the device feed rows")
    ap.add_argument("--out", default=None, help="results JSON (default bench/results/gpu_feed_<cpu|cuda>.json)")
    ap.add_argument("--kinds", default="images,small", help="batch kinds (images, small)")
    ap.add_argument("--no-step", action="store_true", help="skip the ResNet-50 step rows")
    ap.add_argument("--io-threads", type=int, default=None,
                    help="the chief receiver's zmq I/O threads (default: the runtime's, by cores)")
    ap.add_argument("--split-cores", action="store_true",
                    help="the chief on the lower half of the cores, the senders and DataLoader workers on the "
                         "upper half (input workers on other nodes leave the chief's cores alone)")
    ap.add_argument("--copy-threads", type=int, default=None,
                    help="on CUDA, one more device feed row with this many copy threads (the default: "
                         "staging.auto_copy_threads(), by the chief's usable cores)")
    ap.add_argument("--no-top-pad", action="store_true",
                    help="this chief's glibc without the data plane's M_TOP_PAD (as before it; A/B)")
    ap.add_argument("--sender", help=argparse.SUPPRESS)
    ap.add_argument("--raw-sender", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.sender:
        sender_main(a.sender)
        return 0
    if a.raw_sender:
        raw_sender_main(a.raw_sender)
        return 0
    global COPY_THREADS
    COPY_THREADS = a.copy_threads
    if a.no_top_pad:
        from csrun_runtime.dataplane.receive import keep_receive_memory

        keep_receive_memory(top_pad=0)  # first in this process: the receivers' later calls keep it
    if a.io_threads:
        from csrun_runtime.dataplane import receiver

        receiver.auto_io_threads = lambda: a.io_threads
    res = run(a.quick, a.ks, a.depth, kinds=a.kinds.split(","), step=not a.no_step, split=a.split_cores)
    res["meta"]["io_threads"] = a.io_threads or "auto"
    res["meta"]["top_pad"] = not a.no_top_pad
    out = Path(a.out) if a.out else HERE / "results" / f"gpu_feed_{res['meta']['device_type']}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


def run(quick: bool = False, ks_text: str | None = None, depth: int = 2,
        kinds: list[str] | None = None, step: bool = True, split: bool = False) -> dict[str, Any]:
    """The rows (bench/run.py's entry): into CUDA when there is one, else the CPU; ``ks_text``
    the sender counts (default 4,8; quick 1,2); ``depth`` the device feed's
    ``runconfig.device_prefetch``. Returns ``{"meta", "kinds", "step"}``."""
    import torch

    dev = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    ks = [int(x) for x in (ks_text or ("1,2" if quick else "4,8")).split(",")]
    plan = {"warmup_s": 0.1, "window_s": 0.3} if quick else {"warmup_s": 0.5, "window_s": 2.0}
    a = argparse.Namespace(quick=quick, depth=depth)
    t0 = time.perf_counter()
    global SENDER_CPUS
    all_cores = sorted(os.sched_getaffinity(0))
    SENDER_CPUS = split_cores() if split else None
    res: dict[str, Any] = {"meta": {**env(), "quick": a.quick, "ks": ks, "device_prefetch": a.depth, **plan,
                                    "split_cores": None if not split else
                                    {"chief": sorted(os.sched_getaffinity(0)), "senders": SENDER_CPUS}},
                           "kinds": {}}
    try:
        _rows(res, dev, ks, plan, a, kinds, step)
    finally:
        SENDER_CPUS = None
        os.sched_setaffinity(0, all_cores)
    res["meta"]["elapsed_s"] = round(time.perf_counter() - t0, 1)
    res["meta"]["device_type"] = dev.type
    return res


def _rows(res: dict[str, Any], dev: Any, ks: list[int], plan: dict[str, float], a: argparse.Namespace,
          kinds: list[str] | None, step: bool) -> None:
    """:func:`run`'s measuring, into ``res``."""
    with tempfile.TemporaryDirectory(prefix="gpu-feed-") as tmp:
        for kind in kinds or ["images", "small"]:
            nbytes = sum(t.nbytes for t in make_batch(kind, a.quick))
            rows: dict[str, Any] = {"batch": f"{'x'.join(map(str, shapes(kind, a.quick)[0][0]))} "
                                             f"{shapes(kind, a.quick)[0][1]} + labels", "batch_bytes": nbytes}
            for mode in (["pinned H2D"] if dev.type == "cuda" else []) + ["pageable H2D", "to_torch alone"]:
                rows[mode] = h2d_row(kind, mode, dev, plan, a.quick)
            for k in ks:
                rows[f"k={k}"] = {**dataplane_rows(kind, k, dev, plan, Path(tmp), a.quick, a.depth),
                                  **dataplane_rows(kind, k, dev, plan, Path(tmp), a.quick, a.depth, "bulk channel"),
                                  **dataplane_rows(kind, k, dev, plan, Path(tmp), a.quick, a.depth, "shared memory"),
                                  **one_copy_rows(kind, k, dev, plan, Path(tmp), a.quick),
                                  "DataLoader": dataloader_row(kind, k, dev, plan, False, a.quick),
                                  "DataLoader, fresh": dataloader_row(kind, k, dev, plan, True, a.quick)}
            res["kinds"][kind] = rows
            print(render_kind(kind, rows, ks), flush=True)
        try:
            import torchvision  # noqa: F401
            have_tv = True
        except ImportError:
            have_tv = False
        if not step:
            res["step"] = {"skipped": "--no-step"}
        elif dev.type == "cuda" and have_tv and not a.quick:
            res["step"] = step_rows(dev, max(ks), Path(tmp), a.depth)
        else:
            res["step"] = {"skipped": "needs CUDA and torchvision, full size" if not a.quick else "--quick"}
        print("step:", json.dumps(res["step"]), flush=True)


def render_kind(kind: str, rows: dict[str, Any], ks: list[int]) -> str:
    """One batch kind's rows as text: GB/s and the chief's cores."""
    lines = [f"{kind} {rows['batch']} ({rows['batch_bytes'] / 1e6:.2f} MB): GB/s (chief cores)"]
    for m in ("pinned H2D", "pageable H2D", "to_torch alone"):
        if m in rows:
            lines.append(f"  {m:42s} {rows[m]['gb_per_sec']:8.3f} ({rows[m]['chief_cores']})")
    for k in ks:
        for m, r in rows[f"k={k}"].items():
            lines.append(f"  k={k} {m:38s} {r['gb_per_sec']:8.3f} ({r['chief_cores']})")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
