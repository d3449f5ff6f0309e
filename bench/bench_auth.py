"""Benchmark: what the data plane's authentication costs (issue 45; docs/SECURITY.md,
docs/DATAPLANE.md "Authentication"), and why it is not ZeroMQ's CURVE.

Three parts, in this process and light sender processes (``ingest_roles.py --dp-sender``: numpy
and pyzmq, no TensorFlow):

1. **Ingest** (``ingest``): ``k`` = 1, 2 sender processes into one receiver of this process
   (:func:`ingest_lib.measure_dataplane`), batches of 16 KiB, 256 KiB and 4 MiB, the data on zmq
   and on the bulk channel, each with authentication (the default) and without it
   (``authenticate=False`` at both ends), side by side in rotating order; MB/s medians of the
   repetitions and ``authenticated / open``, the median of per-repetition ratios (target: >= 0.98).
2. **Connection setup** (``setup``): milliseconds from ``Sender(...)`` to its welcome (the zmq
   handshake and, with the bulk channel, the bulk connection's), senders one after another in
   this process while a thread reads the receiver, with and without authentication (target:
   <= 10 ms per sender).
3. **Per message** (``per_message``): microseconds the receiver's intake spends on one data
   message already received (a bundle of each size, from a sender that passed its handshake),
   in this process, with and without authentication, alternating: the steady stream's only path
   (:meth:`Intake.message`), without the scheduling noise of the ingest rows.
4. **Why not CURVE** (``curve``): a bare zmq DEALER into a ROUTER in this process, messages of
   16 KiB, 256 KiB and 4 MiB, plain and under ZeroMQ's CURVE mechanism (every frame encrypted
   and authenticated): MB/s and the ratio.

Run: ``python bench/bench_auth.py [--quick] [--repeats N] [--out bench/results/auth.json]`` (~5
minutes on the 2-core host; quick: k = 1, 256 KiB, one repetition).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import common  # bench/ is on sys.path: these modules run as scripts from it
import ingest_lib

ROLES = Path(__file__).resolve().with_name("ingest_roles.py")
#: The ingest variants: name -> the receiver's (and its senders') arguments.
VARIANTS = {"zmq, authenticated": {"authenticate": True}, "zmq, open": {"authenticate": False},
            "bulk channel, authenticated": {"authenticate": True, "bulk": True},
            "bulk channel, open": {"authenticate": False, "bulk": True}}


def _starter(work: Path) -> Any:
    """``start(spec)`` for :func:`ingest_lib.measure_dataplane`: an ``ingest_roles.py --dp-sender``."""
    def start(spec: dict) -> subprocess.Popen:
        path = work / f"sender{time.time_ns()}.json"
        path.write_text(json.dumps(spec))
        env = dict(os.environ, PYTHONPATH=f"{common.REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
        return subprocess.Popen([sys.executable, str(ROLES), "--dp-sender", str(path)], env=env,
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return start


def ingest(ks: list[int], sizes: list[str], repeats: int, warmup_s: float, window_s: float) -> dict[str, Any]:
    """Part 1: ``{"k=K": {size: {variant: MB/s spread, "zmq: authenticated / open": ratio, ...}}}``."""
    names = list(VARIANTS)
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench_auth_") as tmp:
        start = _starter(Path(tmp))
        for k in ks:
            for size in sizes:
                nbytes = ingest_lib.SIZES[size]
                got: dict[str, list[float]] = {v: [] for v in names}
                for r in range(repeats):
                    for v in names[r % len(names):] + names[:r % len(names)]:
                        rec = ingest_lib.measure_dataplane(k, nbytes, warmup_s, window_s, start, **VARIANTS[v])
                        got[v].append(rec["batches_per_sec"] * nbytes / 1e6)
                cell: dict[str, Any] = {v: common.spread(got[v], 1) for v in names}
                for channel in ("zmq", "bulk channel"):
                    cell[f"{channel}: authenticated / open"] = common.compare(got[f"{channel}, authenticated"],
                                                                              got[f"{channel}, open"])
                out.setdefault(f"k={k}", {})[size] = cell
    return out


def setup(n: int) -> dict[str, Any]:
    """Part 2: per variant the milliseconds from ``Sender()`` to its welcome, ``n`` senders."""
    from csrun_runtime.dataplane import Receiver, Sender

    out: dict[str, Any] = {}
    for name, kw in VARIANTS.items():
        rx = Receiver("tcp://127.0.0.1:0", **kw)
        stop = threading.Event()

        def read(rx: Any = rx, stop: threading.Event = stop) -> None:
            while not stop.is_set():
                try:
                    rx.get_bundle(timeout=0.01)
                except TimeoutError:
                    pass

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        ms = []
        try:
            for i in range(n):
                t0 = time.perf_counter()
                s = Sender(rx.endpoint, i, authenticate=kw["authenticate"])
                if not s.room(timeout=10):
                    raise TimeoutError(f"{name}: sender {i} not welcomed within 10 s")
                ms.append((time.perf_counter() - t0) * 1e3)
                s.close(timeout=2)
        finally:
            stop.set()
            reader.join(5)
            rx.close()
        out[name] = common.spread(ms, 2)
    return out


def per_message(sizes: list[str], repeats: int, seconds: float) -> dict[str, Any]:
    """Part 3: per size, µs per data message through the receiver's intake, authenticated and open."""
    import numpy as np
    import zmq

    from csrun_runtime.dataplane import Receiver, Sender, framing

    out: dict[str, Any] = {}
    for size in sizes:
        nbytes = ingest_lib.SIZES[size]
        n = max(1, (1 << 20) // nbytes)
        leaves = [np.zeros((n, nbytes // 4), np.float32)]
        got: dict[str, list[float]] = {"authenticated": [], "open": []}
        for _ in range(repeats):
            for name in got:
                rx = Receiver("tcp://127.0.0.1:0", authenticate=name == "authenticated")
                s = Sender(rx.endpoint, 0, authenticate=name == "authenticated")
                t = threading.Thread(target=s.room, kwargs={"timeout": 10}, daemon=True)
                t.start()
                rx.wait_workers(1, 10)
                t.join(10)
                frames = [zmq.Frame(s._identity), zmq.Frame(b"D"),
                          zmq.Frame(framing.encode_header(0, leaves, n)), *[zmq.Frame(a.tobytes()) for a in leaves]]
                calls, t0 = 0, time.perf_counter()
                while time.perf_counter() - t0 < seconds:
                    rx._intake.message(frames, ack=False)
                    calls += 1
                got[name].append((time.perf_counter() - t0) / calls * 1e6)
                s.close(timeout=0.5)
                rx.close()
        out[size] = {"us_per_message": {k: common.spread(v, 2) for k, v in got.items()},
                     "authenticated / open": common.compare(got["authenticated"], got["open"])}
    return out


def _curve_rate(curve: bool, nbytes: int, seconds: float) -> float:
    """MB/s of one DEALER sending ``nbytes`` messages to a ROUTER in this process (a thread each)."""
    import zmq

    ctx = zmq.Context(2)
    srv, cli = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    if curve:
        spub, ssec = zmq.curve_keypair()
        cpub, csec = zmq.curve_keypair()
        srv.curve_server, srv.curve_secretkey, srv.curve_publickey = True, ssec, spub
        cli.curve_serverkey, cli.curve_publickey, cli.curve_secretkey = spub, cpub, csec
    cli.setsockopt(zmq.SNDHWM, 4)
    port = srv.bind_to_random_port("tcp://127.0.0.1")
    cli.connect(f"tcp://127.0.0.1:{port}")
    payload, stop = os.urandom(nbytes), threading.Event()

    def send() -> None:
        while not stop.is_set():
            if cli.poll(50, zmq.POLLOUT):
                cli.send(payload, copy=False)

    t = threading.Thread(target=send, daemon=True)
    t.start()
    srv.recv_multipart()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        srv.recv_multipart(copy=False)
        n += 1
    dt = time.perf_counter() - t0
    stop.set()
    t.join(5)
    cli.close(0)
    srv.close(0)
    ctx.term()
    return n * nbytes / dt / 1e6


def curve(sizes: list[str], repeats: int, seconds: float) -> dict[str, Any]:
    """Part 3: per size the MB/s plain and under CURVE, and CURVE / plain."""
    out: dict[str, Any] = {}
    for size in sizes:
        plain, cur = [], []
        for _ in range(repeats):
            plain.append(_curve_rate(False, ingest_lib.SIZES[size], seconds))
            cur.append(_curve_rate(True, ingest_lib.SIZES[size], seconds))
        out[size] = {"plain": common.spread(plain, 1), "curve": common.spread(cur, 1),
                     "curve / plain": common.compare(cur, plain)}
    return out


def run(quick: bool = False, repeats: int = 4) -> dict[str, Any]:
    """Every part (module docstring); ``repeats`` of the ingest, 4 by default (each of the four
    variants once in each position of the rotating order); quick: k = 1, 256 KiB, one
    repetition, 5 senders."""
    ks, sizes = ([1], ["256 KiB"]) if quick else ([1, 2], list(ingest_lib.SIZES))
    repeats = 1 if quick else repeats
    res: dict[str, Any] = {
        "what": "the data plane's authentication: ingest MB/s (10^6 bytes/s) authenticated vs open, "
                "connection setup ms per sender, and zmq's CURVE beside plain zmq",
        "repeats": repeats, "warmup_s": 0.3, "window_s": 1.0, "order": "rotating per repetition",
        "ingest": ingest(ks, sizes, repeats, 0.3, 1.0),
        "setup": setup(5 if quick else 20),
        "per_message": per_message(sizes, 1 if quick else 5, 0.3 if quick else 1.0),
        "curve": curve(sizes, repeats, 1.0),
    }
    ratios = {f"{k}, {size}, {ch}": cell[f"{ch}: authenticated / open"]["median_ratio"]
              for k, by_size in res["ingest"].items() for size, cell in by_size.items()
              for ch in ("zmq", "bulk channel")}
    setup_ms = {v: rec["median"] for v, rec in res["setup"].items() if "authenticated" in v}
    per_msg = {size: rec["authenticated / open"]["median_ratio"] for size, rec in res["per_message"].items()}
    res["targets"] = {
        "ingest_authenticated_vs_open_ge_0.98": {"ratios": ratios, "met": all(r >= 0.98 for r in ratios.values()),
                                                 "worst": min(ratios.values())},
        "setup_le_10ms_per_sender": {"median_ms": setup_ms, "met": all(m <= 10 for m in setup_ms.values())},
        "per_message_authenticated_vs_open_le_1.02": {"ratios": per_msg,
                                                      "met": all(r <= 1.02 for r in per_msg.values())},
    }
    res["meta"] = common.metadata(quick)
    return res


if __name__ == "__main__":
    result = run(quick="--quick" in sys.argv,
                 repeats=int(sys.argv[sys.argv.index("--repeats") + 1]) if "--repeats" in sys.argv else 4)
    if "--out" in sys.argv:
        common.write_json(Path(sys.argv[sys.argv.index("--out") + 1]), result)
    print(json.dumps({k: result[k] for k in ("targets", "setup")}, indent=1))
