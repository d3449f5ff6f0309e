"""Benchmark: where the data plane's gap to raw loopback TCP goes for elements of 256 KiB and
more (issue 23; ``bench/results/ingest_dataplane.json`` measured 0.44-0.69 of raw TCP there).

``k`` light sender processes (numpy + pyzmq, no TensorFlow) send the ceiling's batch
(:data:`ingest_lib.ROWS` rows, float32 features and int32 labels, 256 KiB or 4 MiB) to this
process on loopback, as fast as each path lets them. Side by side, in rotating order within each
repetition, each variant peeling one layer off csrun's data plane:

* ``raw TCP``: :func:`ingest_lib.measure_raw` (``k`` receiver threads ``recv_into`` one
  reused buffer; the sender ``sendall`` s one payload): the host's transport limit;
* ``zmq bare``: the data plane's socket pattern and messages without csrun: each sender a zmq
  DEALER sending the data plane's bundle message (``[b"D", header, x, y]``, the bundle stacked
  once beforehand) with ``copy=False``; the chief one ROUTER, ``recv_multipart(copy=False)``;
  no credits (``SNDHWM``/``RCVHWM`` 4 messages bound the buffers instead), no acknowledgement,
  no decoding. What is left to raw TCP here is zmq's own cost: its I/O thread on each end
  (a second thread per process, on this 2-core host competing with the senders), a fresh
  buffer per received message, pyzmq's zero-copy bookkeeping;
* ``data plane, pre-stacked``: :class:`csrun_runtime.dataplane.Sender` ``send_bundle`` of the
  same pre-stacked bundle into :class:`~csrun_runtime.dataplane.Receiver` ``get_bundle``:
  zmq bare + csrun's credits, acknowledgements and framing/decoding;
* ``data plane``: ``Sender.send`` per batch (``bundle="auto"``: a 256 KiB batch is stacked 4 to
  a bundle, a copy on the sender; a 4 MiB batch goes alone, without a copy), as
  ``bench_ingest.py --ceiling-only`` measures it;
* ``data plane, bundle 1``: ``Sender(bundle=1)``: each batch its own message, sent without a
  copy (no stacking);
* ``data plane, window 16 MiB``: the same with a 4× larger credit window (4 MiB, the
  default, is one 4 MiB bundle: each sender waits for each acknowledgement);
* ``data plane, senders' malloc keeps memory``: ``data plane`` with the senders' glibc told
  (:data:`MALLOC_ENV`) to serve large buffers from its heap and keep freed memory, instead of
  an ``mmap`` (fresh pages: a page fault per 4 KiB) and ``munmap`` per stacked bundle.

* ``data plane, before``: ``data plane`` as it was before issue 31 (one zmq I/O thread, glibc's
  malloc as is: ``Receiver(io_threads=1, keep_memory=False)``, ``Sender(keep_memory=False)``),
  beside the defaults (I/O threads by cores and senders, received frames and stacked bundles in
  memory kept mapped: :mod:`csrun_runtime.dataplane.receive`);
* ``data plane, 2 I/O threads``: the default receiver with 2 zmq I/O threads whatever the cores.
* ``shared memory``: the receiver offers each sender (all on its node here) a 256 MiB shared-memory
  ring (``Receiver(shm_bytes=...)``, issue 43 item 4): the sender writes each bundle into it, zmq
  carries its header and position, the chief's arrays are views of the ring. Beside ``data plane,
  copied out`` and ``bulk channel, lent`` it is what a CUDA chief's host does per byte: there the
  ring is registered with CUDA and the GPU's copy engine reads it, with no host copy.

Every data-plane variant's chief runs in a fresh process (``--chief``), so that one variant's
malloc settings (process-wide) do not carry into the next; each records the chief's page faults
per MB (``chief_faults_per_mb``: fresh pages written by the receive).

The default run is issue 31's table 1: raw TCP, ``data plane`` and ``data plane, before`` at
k = 1, 2, 4, 8 senders × 16 KiB / 256 KiB / 4 MiB (``--study``: every variant, as issue 23's
study; ``--ks 1,2,4`` narrows k).

and, in this process alone, ``framing only``: MB/s of the receiver's per-message Python
(the receiver's ``Intake.data``: cached header, ``np.frombuffer`` per leaf, the nest) on frames already
received, the bound the framing sets by itself.

Statistics: medians over the repetitions of MB/s (10^6 bytes/s) and CPU-s per MB (the chief's,
the senders' together), and medians of per-repetition ratios to raw TCP.

Run: ``python bench/bench_ingest_gap.py [--quick] [--out bench/results/ingest_recv.json]``
(the table, ~8 minutes on the 2-core host, ~5 on 16 cores); ``--variants "data plane;data plane, bundle 1"``,
``--sizes "256 KiB"`` (``;`` between names) and ``--repeats N`` narrow it (raw TCP is always measured).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import common  # bench/ is on sys.path: these modules run as scripts from it
import ingest_lib as bi
import ingest_roles

#: The variants measured through senders, in the order of the first repetition.
VARIANTS = ["raw TCP", "zmq bare", "data plane, pre-stacked", "data plane", "data plane, bundle 1",
            "data plane, window 16 MiB", "data plane, senders' malloc keeps memory", "data plane, before",
            "data plane, 2 I/O threads", "data plane, 8 I/O threads", "data plane, no top pad",
            "data plane, copied out", "data plane, copied out, no top pad", "bulk channel",
            "bulk channel, lent", "shared memory"]
#: Issue 31's table 1: the variants, senders and sizes of the default run.
TABLE = ["raw TCP", "data plane", "data plane, before"]
TABLE_KS = [1, 2, 4, 8]
TABLE_SIZES = ["16 KiB", "256 KiB", "4 MiB"]
#: The receiver's arguments of the variants that set them (the others: its defaults).
RECEIVER = {"data plane, before": {"io_threads": 1, "keep_memory": False},
            "data plane, 2 I/O threads": {"io_threads": 2},
            "data plane, 8 I/O threads": {"io_threads": 8},
            "bulk channel": {"bulk": True},
            "shared memory": {"shm_bytes": 256 << 20}}
#: glibc settings of the last variant's senders: no mmap/munmap (and page faults) per large
#: buffer; freed memory kept in the heap for the next bundle.
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(64 << 20), "MALLOC_TRIM_THRESHOLD_": str(256 << 20)}
SIZES = ["256 KiB", "4 MiB"]
#: Element sizes by name: bench_ingest's, and issue 31's image batch (256x3x224x224 uint8 +
#: labels: one element per bundle).
SIZE_BYTES = {**bi.SIZES, "38.5 MB": 38_535_168}
HWM = 4  # zmq bare: messages buffered per pipe at each end (the data plane's 4 MiB window is 4 bundles)


def _batch(nbytes: int, seed: int = 0) -> tuple[Any, Any]:
    """The ceiling's batch as numpy arrays (as :func:`ingest_roles.child_dp_sender` builds it)."""
    import numpy as np

    cols = max(1, (nbytes - 4 * bi.ROWS) // (4 * bi.ROWS))
    return (np.random.default_rng(seed).random((bi.ROWS, cols), dtype=np.float32), np.zeros(bi.ROWS, np.int32))


def _bundle(nbytes: int, seed: int = 0) -> tuple[tuple[Any, Any], int]:
    """The data plane's auto bundle of that batch, stacked once: ``(nest, n)``."""
    import numpy as np

    from csrun_runtime.dataplane import BUNDLE_BYTES

    x, y = _batch(nbytes, seed)
    n = max(1, BUNDLE_BYTES // (x.nbytes + y.nbytes))
    return (np.ascontiguousarray(np.stack([x] * n)), np.ascontiguousarray(np.stack([y] * n))), n


def child_sender(spec: dict) -> None:
    """One sender of ``spec["mode"]``: ``raw`` (:func:`ingest_roles.child_sender`), ``dp``
    (:func:`ingest_roles.child_dp_sender`; ``dp1``: with ``bundle=1``), ``dp-bundle`` (``send_bundle`` of a pre-stacked
    bundle) or ``zmq`` (a bare DEALER sending the data plane's message) until the chief goes."""
    mode = spec["mode"]
    if mode == "raw":
        return ingest_roles.child_sender(spec)
    if mode == "dp":
        return ingest_roles.child_dp_sender(spec)
    if mode == "dp1":
        return ingest_roles.child_dp_sender({**spec, "bundle": 1})
    import zmq

    from csrun_runtime.dataplane import ReceiverGone, Sender, framing

    nest, n = _bundle(spec["nbytes"], spec["index"])
    if mode == "dp-bundle":
        s = Sender(spec["endpoint"], spec["index"])
        try:
            while True:
                s.send_bundle(nest, n, timeout=60)
        except (ReceiverGone, TimeoutError):
            pass
        finally:
            s.close(timeout=1.0)
        return None
    tree, leaves = framing.flatten(nest)
    frames = [b"D", framing.encode_header(tree, leaves, n), *leaves]
    sock = zmq.Context(1).socket(zmq.DEALER)
    sock.setsockopt(zmq.SNDHWM, HWM)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDTIMEO, 5000)
    sock.connect(spec["endpoint"])
    try:
        while True:
            sock.send_multipart(frames, copy=False)
    except zmq.ZMQError:  # the chief closed (send timed out)
        pass
    return None


def _measure_zmq(k: int, nbytes: int, warmup_s: float, window_s: float, start: Any) -> dict[str, float]:
    """``k`` bare DEALER senders into one ROUTER of this process: batches/s and CPU."""
    import zmq

    _, n = _bundle(nbytes)
    ctx = zmq.Context(1)
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.RCVHWM, HWM)
    sock.setsockopt(zmq.RCVTIMEO, 60000)
    sock.setsockopt(zmq.LINGER, 0)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    senders = [start({"mode": "zmq", "endpoint": f"tcp://127.0.0.1:{port}", "index": i, "nbytes": nbytes})
               for i in range(k)]
    try:
        def step() -> int:
            sock.recv_multipart(copy=False)
            return n
        return bi.window(step, warmup_s, window_s, [p.pid for p in senders])
    finally:
        sock.close(linger=0)
        ctx.term()
        bi.reap(senders, 8.0)


def _measure_copied_out(k: int, nbytes: int, warmup_s: float, window_s: float, start: Any) -> dict[str, float]:
    """As :func:`ingest_lib.measure_dataplane`, but each bundle's leaves are copied into
    buffers allocated once (as the PyTorch device feed copies into its pinned ring), so the
    received frames live through a copy and several are alive at once, as in the chief."""
    import numpy as np

    bufs: dict[Any, Any] = {}

    def copy_out(b: Any) -> None:
        for j, a in enumerate(b.arrays):
            key = (j, a.shape, a.dtype.str)
            if key not in bufs:
                bufs[key] = np.empty_like(a)
            np.copyto(bufs[key], a)

    return bi.measure_dataplane(k, nbytes, warmup_s, window_s, start, consume=copy_out)


def _measure_lent(k: int, nbytes: int, warmup_s: float, window_s: float, start: Any) -> dict[str, float]:
    """The bulk channel with the receiver lent reused buffers (the pinned pool of a CUDA device
    feed, unpinned here: ``PinnedPool(pin=False)``), so that each received byte is copied once,
    by the kernel: what :func:`_measure_copied_out`'s two copies become on that path. The
    bundle's arrays are dropped at the next one (the lease returns its block to the pool)."""
    from csrun_runtime.pytorch.pinned import PinnedPool

    return bi.measure_dataplane(k, nbytes, warmup_s, window_s, start, bulk=True,
                                lend=PinnedPool(pin=False).allocate)


def framing_only(nbytes: int, seconds: float = 1.0) -> dict[str, float]:
    """MB/s of the receiver's intake of one data message (``Intake.data``) alone on one bundle's
    frames (already received), in this process: the receive path's Python per message, without
    zmq or the network."""
    import zmq

    from csrun_runtime.dataplane import Receiver, framing
    from csrun_runtime.dataplane.workers import WorkerRecord

    nest, n = _bundle(nbytes)
    tree, leaves = framing.flatten(nest)
    frames = [zmq.Frame(b"0.0"), zmq.Frame(b"D"), zmq.Frame(framing.encode_header(tree, leaves, n)),
              *(zmq.Frame(a.tobytes()) for a in leaves)]
    rx = Receiver("tcp://127.0.0.1:0")
    try:
        w = WorkerRecord(0, 0, b"0.0")
        calls, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            rx._intake.data(w, frames)
            calls += 1
        dt = time.perf_counter() - t0
    finally:
        rx.close()
    per = dt / calls
    return {"us_per_bundle": round(per * 1e6, 2), "mb_per_sec": round(w.bytes / dt / 1e6, 1),
            "batches_per_bundle": n}


def measure(variant: str, k: int, size: str, plan: dict, work: Path) -> dict[str, float]:
    """One measurement of ``variant`` with ``k`` senders at batch size ``size``: in this process
    for raw TCP and zmq bare, in a fresh chief process (:func:`child_chief`) for the data plane."""
    if variant in ("raw TCP", "zmq bare"):
        return measure_here(variant, k, size, plan, work)
    spec, out = work / f"chief{time.time_ns()}.json", work / f"chief{time.time_ns()}.out.json"
    spec.write_text(json.dumps({"variant": variant, "k": k, "size": size, "plan": plan, "work": str(work)}))
    env = dict(os.environ, PYTHONPATH=f"{common.REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--chief", str(spec), str(out)],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, env=env, timeout=300)
    if proc.returncode != 0 or not out.is_file():
        raise RuntimeError(f"chief exited {proc.returncode}: {proc.stderr.strip()[-300:]}")
    return json.loads(out.read_text())


def child_chief(spec: dict, out: Path) -> None:
    """The chief of one data-plane measurement (:func:`measure_here`), its record written to ``out``."""
    out.write_text(json.dumps(measure_here(spec["variant"], spec["k"], spec["size"], spec["plan"],
                                           Path(spec["work"]))))


def measure_here(variant: str, k: int, size: str, plan: dict, work: Path) -> dict[str, float]:
    """One measurement of ``variant`` with ``k`` senders at batch size ``size``, this process the chief."""
    nbytes, w, m = SIZE_BYTES[size], plan["warmup_s"], plan["window_s"]

    def start(mode: str, extra_env: dict[str, str] | None = None, **extra: Any) -> Any:
        def go(spec: dict) -> subprocess.Popen:
            path = work / f"sender{time.time_ns()}.json"
            path.write_text(json.dumps({**spec, **extra, "mode": mode}))
            env = dict(os.environ, PYTHONPATH=f"{common.REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
                       **(extra_env or {}))
            return subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--sender", str(path)],
                                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                    env=env)
        return go

    if variant == "raw TCP":
        rec = bi.measure_raw(k, nbytes, w, m, start("raw"))
    elif variant == "zmq bare":
        rec = _measure_zmq(k, nbytes, w, m, start("zmq"))
    elif variant == "data plane, pre-stacked":
        rec = bi.measure_dataplane(k, nbytes, w, m, start("dp-bundle"))
    elif variant == "data plane":
        rec = bi.measure_dataplane(k, nbytes, w, m, start("dp"))
    elif variant == "data plane, bundle 1":
        rec = bi.measure_dataplane(k, nbytes, w, m, start("dp1"))
    elif variant == "data plane, window 16 MiB":
        rec = bi.measure_dataplane(k, nbytes, w, m, start("dp"), window_bytes=16 << 20)
    elif variant == "data plane, before":  # the senders' malloc as is too
        rec = bi.measure_dataplane(k, nbytes, w, m, start("dp", keep_memory=False), **RECEIVER[variant])
    elif variant.startswith("data plane") and variant.endswith("no top pad"):  # glibc as before M_TOP_PAD
        from csrun_runtime.dataplane.receive import keep_receive_memory
        keep_receive_memory(top_pad=0)  # first in this fresh chief process: the Receiver's call keeps it
        rec = (_measure_copied_out if "copied out" in variant else bi.measure_dataplane)(
            k, nbytes, w, m, start("dp"))
    elif variant == "data plane, copied out":
        rec = _measure_copied_out(k, nbytes, w, m, start("dp"))
    elif variant == "bulk channel, lent":
        rec = _measure_lent(k, nbytes, w, m, start("dp"))
    elif variant in RECEIVER:
        rec = bi.measure_dataplane(k, nbytes, w, m, start("dp"), **RECEIVER[variant])
    else:
        rec = bi.measure_dataplane(k, nbytes, w, m, start("dp", MALLOC_ENV))
    mb = rec["batches_per_sec"] * nbytes / 1e6
    total_mb = mb * rec["window_s"]
    return {**rec, "mb_per_sec": mb, "chief_cpu_s_per_mb": rec["chief_cpu"] / mb if mb else None,
            "senders_cpu_s_per_mb": rec["workers_cpu"] / mb if mb else None,
            "chief_faults_per_mb": rec["chief_page_faults"] / total_mb if total_mb else None}


def summarize(runs: dict[str, list[dict]]) -> dict[str, Any]:
    """Per variant: medians of MB/s and CPU-s per MB; the paired ratio to raw TCP."""
    out: dict[str, Any] = {}
    for v, recs in runs.items():
        ok = [r for r in recs if r.get("mb_per_sec")]
        if not ok:
            out[v] = {"runs": 0, "errors": [r.get("error") for r in recs][:3]}
            continue
        out[v] = {"mb_per_sec": round(common.median(r["mb_per_sec"] for r in ok), 1),
                  "chief_cpu_s_per_mb": round(common.median(r["chief_cpu_s_per_mb"] for r in ok), 5),
                  "senders_cpu_s_per_mb": round(common.median(r["senders_cpu_s_per_mb"] for r in ok), 5),
                  "chief_faults_per_mb": round(common.median(r.get("chief_faults_per_mb") or 0 for r in ok), 1),
                  "runs": len(ok)}
        pairs = [(r["mb_per_sec"], b["mb_per_sec"]) for r, b in zip(recs, runs["raw TCP"], strict=False)
                 if r.get("mb_per_sec") and b.get("mb_per_sec")]  # repetitions where both measured
        if v != "raw TCP" and pairs:
            out[v]["vs_raw_tcp"] = common.compare([a for a, _ in pairs], [b for _, b in pairs], 3)["median_ratio"]
        if len(ok) < len(recs):
            out[v]["errors"] = [r["error"] for r in recs if "error" in r][:3]
    return out


def run(quick: bool = False, variants: list[str] | None = None, sizes: list[str] | None = None,
        repeats: int | None = None, ks: list[int] | None = None) -> dict[str, Any]:
    """Each variant × k × size (default: issue 31's table 1, :data:`TABLE` × :data:`TABLE_KS`
    × :data:`TABLE_SIZES`; ``variants``, ``sizes``, ``ks``: others; raw TCP is always measured),
    ``repeats`` times (default 3) in rotating order; ``quick``: k = 1, 256 KiB, one repetition
    of short windows."""
    reps, plan = (1, {"warmup_s": 0.2, "window_s": 0.5}) if quick else (3, {"warmup_s": 0.3, "window_s": 1.0})
    ks = ks or ([1] if quick else TABLE_KS)
    repeats = repeats or reps
    order0 = ["raw TCP", *[v for v in (variants or TABLE) if v != "raw TCP"]]
    sizes = sizes or (["256 KiB"] if quick else TABLE_SIZES)
    raw: dict[str, dict[str, dict[str, list[dict]]]] = {}
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench_gap_") as tmp:
        for r in range(repeats):
            order = order0[r % len(order0):] + order0[:r % len(order0)]
            for k in ks:
                for size in sizes:
                    for v in order:
                        try:
                            rec = measure(v, k, size, plan, Path(tmp))
                        except Exception as exc:  # noqa: BLE001 - recorded, the others go on
                            rec = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
                            print(f"bench_ingest_gap: {v}, k={k}, {size}: {rec['error']}", file=sys.stderr)
                        raw.setdefault(f"k={k}", {}).setdefault(size, {}).setdefault(v, []).append(rec)
    out: dict[str, Any] = {
        "what": "MB/s (10^6 bytes/s) through one chief process on loopback, k light sender processes; "
                "medians of repetitions in rotating order; vs_raw_tcp: median of per-repetition ratios",
        "ks": ks, "sizes": sizes, "variants": order0, "repeats": repeats, **plan, "hwm_zmq_bare": HWM,
        "results": {k: {s: summarize(v) for s, v in sizes.items()} for k, sizes in raw.items()},
        "framing_only": {s: framing_only(SIZE_BYTES[s]) for s in sizes},
        "errors": [r["error"] for sizes in raw.values() for vs in sizes.values() for recs in vs.values()
                   for r in recs if "error" in r][:10],
        "seconds": round(time.monotonic() - t0, 1),
    }
    return out


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--sender":
        try:
            child_sender(json.loads(Path(sys.argv[2]).read_text()))
        finally:
            os._exit(0)
    if len(sys.argv) == 4 and sys.argv[1] == "--chief":
        child_chief(json.loads(Path(sys.argv[2]).read_text()), Path(sys.argv[3]))
        sys.exit(0)
    def _arg(name: str) -> str | None:
        return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else None

    result = run(quick="--quick" in sys.argv, variants=VARIANTS if "--study" in sys.argv else
                 (_arg("--variants") or "").split(";") if _arg("--variants") else None,
                 sizes=_arg("--sizes").split(";") if _arg("--sizes") else None,  # type: ignore[union-attr]
                 repeats=int(_arg("--repeats") or 0) or None,
                 ks=[int(x) for x in _arg("--ks").split(",")] if _arg("--ks") else None)  # type: ignore[union-attr]
    result["meta"] = common.metadata("--quick" in sys.argv)
    if "--out" in sys.argv:
        common.write_json(Path(sys.argv[sys.argv.index("--out") + 1]), result)
    print(json.dumps(result, indent=1))
