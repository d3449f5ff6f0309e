"""Benchmark: fan-in of the data plane (csrun_runtime.dataplane) — 1, 16, 64 and 256 light sender
processes (numpy + pyzmq, no TensorFlow) on loopback into one chief endpoint.

Each measurement is one chief process (``--chief SPEC``: a :class:`~csrun_runtime.dataplane.Receiver`
bound once) and one launcher process (``--senders SPEC``) that imports numpy and pyzmq, then
``os.fork``s ``n`` senders; each sends a prebuilt bundle (``send_bundle``: 4 batches of 256 KiB,
float32 features + int32 labels) in a loop until the chief closes. Figures per ``n``:

* ``mb_per_sec``: aggregate bytes received by the chief per second (10^6 bytes), over a window
  after a warm-up;
* ``chief_cpu_s_per_mb``: the chief's CPU seconds (all its threads, zmq's I/O thread included)
  per MB;
* ``chief_rss_mb``: the chief's resident memory at the end of the window (its imports alone:
  ``chief_rss_idle_mb``);
* ``connect_s``: seconds from the launcher's first fork to the last sender's hello received.

Side by side (same run, rotating order): ``dataplane`` (ROUTER + DEALERs, credit flow control,
the runtime's transport) and ``zmq PUSH/PULL`` (one PULL bound once, PUSH senders, HWM of 4
messages: no per-worker credit, no pause, no identities) — what the protocol costs.
Per-sender window: ``min(4 MiB, 512 MiB / n)`` (at least 2 bundles), so the chief's buffering
stays bounded as ``n`` grows.
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

REPO = common.REPO
#: Batch of the senders: features float32 [ROWS, COLS] + labels int32 [ROWS] = 256 KiB.
ROWS = 64
COLS = (256 * 1024 - 4 * ROWS) // (4 * ROWS)
BUNDLE = 4
TRANSPORTS = ["dataplane", "zmq PUSH/PULL"]


def _bundle() -> Any:
    import numpy as np

    return (np.random.default_rng(0).random((BUNDLE, ROWS, COLS), dtype=np.float32),
            np.zeros((BUNDLE, ROWS), np.int32))


def window_bytes(n: int) -> int:
    """The per-sender flow-control window used at ``n`` senders (bytes)."""
    bundle = BUNDLE * (ROWS * COLS * 4 + ROWS * 4)
    return max(2 * bundle, min(4 << 20, (512 << 20) // n))


# =========================================================================== senders
def _dataplane_sender(spec: dict, i: int) -> None:
    from csrun_runtime.dataplane import ReceiverGone, Sender

    nest = _bundle()
    s = Sender(spec["endpoint"], i, 0)
    try:
        while time.time() < spec["stop_at"] and not os.path.exists(spec["stop_file"]):
            s.send_bundle(nest, BUNDLE, timeout=30)
    except (ReceiverGone, TimeoutError):
        pass
    finally:
        s.close(timeout=1.0)


def _pushpull_sender(spec: dict, i: int) -> None:
    import zmq

    x, y = _bundle()
    ctx = zmq.Context(1)
    sock = ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.SNDHWM, 4)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(spec["endpoint"])
    header = json.dumps({"worker": i, "shapes": [x.shape, y.shape]}).encode()
    try:
        while time.time() < spec["stop_at"] and not os.path.exists(spec["stop_file"]):
            if sock.poll(200, zmq.POLLOUT):
                sock.send_multipart([header, x, y], copy=False)
    except zmq.ZMQError:
        pass
    finally:
        sock.close()
        ctx.term()


def child_senders(spec: dict) -> None:
    """Fork ``spec["n"]`` senders (numpy and pyzmq imported once, before the forks; each child
    makes its own zmq context) and wait for them. Writes the wall time of the first fork."""
    import numpy  # noqa: F401 - imported before the forks, shared by the children
    import zmq  # noqa: F401

    import csrun_runtime.dataplane  # noqa: F401

    fn = _dataplane_sender if spec["transport"] == "dataplane" else _pushpull_sender
    t_fork = time.time()
    pids = []
    for i in range(spec["n"]):
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                fn(spec, i)
            except BaseException:  # noqa: BLE001
                code = 1
            os._exit(code)
        pids.append(pid)
    common.write_json(Path(spec["fork_out"]), {"t_fork": t_fork, "forked_s": time.time() - t_fork})
    for pid in pids:
        os.waitpid(pid, 0)


# =========================================================================== chief
def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def child_chief(spec: dict) -> None:
    """One measurement: bind, start the launcher, wait for every sender, then count bytes
    over a warm-up and a window; writes the figures to ``spec["out"]``."""
    import numpy as np
    import zmq

    from csrun_runtime.dataplane import Receiver

    n, transport = spec["n"], spec["transport"]
    rss_idle = _rss_mb()
    rx: Any
    if transport == "dataplane":
        rx = Receiver("tcp://127.0.0.1:0", window_bytes=window_bytes(n))
        endpoint = rx.endpoint
    else:
        ctx = zmq.Context(1)
        rx = ctx.socket(zmq.PULL)
        rx.setsockopt(zmq.RCVHWM, 4)
        port = rx.bind_to_random_port("tcp://127.0.0.1")
        endpoint = f"tcp://127.0.0.1:{port}"
    fork_out = Path(spec["out"]).with_suffix(".fork.json")
    stop_at = time.time() + spec["timeout_s"]
    launcher_spec = {"n": n, "transport": transport, "endpoint": endpoint, "stop_at": stop_at,
                     "fork_out": str(fork_out), "stop_file": str(Path(spec["out"]).with_suffix(".stop"))}
    sp = Path(spec["out"]).with_suffix(".senders.json")
    sp.write_text(json.dumps(launcher_spec))
    launcher = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--senders", str(sp)],
                                stdin=subprocess.DEVNULL, env=dict(os.environ, PYTHONPATH=str(REPO)))
    try:
        connect_s = None
        if transport == "dataplane":
            rx.wait_workers(n, timeout=120)
            connect_s = time.time() - json.loads(fork_out.read_text())["t_fork"]

            def take() -> int:
                return rx.get_bundle(timeout=30).nbytes
        else:
            def take() -> int:
                frames = rx.recv_multipart(copy=False)
                h = json.loads(frames[0].bytes)
                return sum(np.frombuffer(f.buffer, np.uint8).size for f in frames[1:]) + 0 * len(h)
        t_end = time.monotonic() + spec["warmup_s"]
        while time.monotonic() < t_end:
            take()
        c0, t0, got = time.process_time(), time.monotonic(), 0
        while time.monotonic() - t0 < spec["window_s"]:
            got += take()
        dt, cpu = time.monotonic() - t0, time.process_time() - c0
        mb = got / 1e6
        out = {"n": n, "transport": transport, "mb_per_sec": mb / dt, "chief_cpu": cpu / dt,
               "chief_cpu_s_per_mb": cpu / mb if mb else None, "chief_rss_mb": _rss_mb(),
               "chief_rss_idle_mb": rss_idle, "connect_s": connect_s,
               "forked_s": json.loads(fork_out.read_text())["forked_s"],
               "window_bytes": window_bytes(n) if transport == "dataplane" else None}
        if transport == "dataplane":
            c = rx.counts()
            out["senders_read"] = sum(1 for v in c.values() if v["bundles"])
            out["errors"] = sum(v["errors"] for v in c.values())
    finally:
        Path(launcher_spec["stop_file"]).touch()
        rx.close()
        try:
            launcher.wait(timeout=60)
        except subprocess.TimeoutExpired:
            launcher.kill()
    common.write_json(Path(spec["out"]), out)


# =========================================================================== harness
def measure(n: int, transport: str, work: Path, warmup_s: float, window_s: float) -> dict:
    """One chief process for ``n`` senders of ``transport``; its figures (or ``error``)."""
    out = work / f"{transport.split()[0]}-{n}-{time.time_ns()}.json"
    spec = {"n": n, "transport": transport, "warmup_s": warmup_s, "window_s": window_s,
            "timeout_s": 150 + warmup_s + window_s, "out": str(out)}
    sp = out.with_suffix(".spec.json")
    sp.write_text(json.dumps(spec))
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--chief", str(sp)],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))
    try:
        return json.loads(out.read_text())
    except (OSError, ValueError):
        return {"error": f"exit {proc.returncode}: {proc.stderr[-800:]}"}


def run(quick: bool = False) -> dict:
    """Every ``n`` × transport, ``repeats`` times in rotating order. Quick: n = 1, 16, one
    repetition of 1 s. Full: n = 1, 16, 64, 256, 3 repetitions of 2 s windows (~4 minutes on
    the 2-core host)."""
    ns, repeats, warmup, window = ([1, 16], 1, 0.5, 1.0) if quick else ([1, 16, 64, 256], 3, 1.0, 2.0)
    runs: dict[str, dict[str, list[dict]]] = {}
    cells = [(n, t) for n in ns for t in TRANSPORTS]
    with tempfile.TemporaryDirectory(prefix="bench_fanin_") as tmp:
        for r in range(repeats):
            order = cells[r % len(cells):] + cells[:r % len(cells)]
            for n, t in order:
                runs.setdefault(f"n={n}", {}).setdefault(t, []).append(measure(n, t, Path(tmp), warmup, window))
    out: dict[str, Any] = {"unit": "MB/s = 10^6 bytes/s; CPU-s per MB; RSS MB; seconds",
                           "batch_bytes": ROWS * COLS * 4 + ROWS * 4, "bundle_batches": BUNDLE, "ns": ns,
                           "repeats": repeats, "warmup_s": warmup, "window_s": window,
                           "where": "local processes on this host (chief, forked senders), loopback TCP",
                           "fanin": {}}
    for key, by_t in runs.items():
        cell: dict[str, Any] = {}
        for t, recs in by_t.items():
            ok = [x for x in recs if "error" not in x]
            if not ok:
                cell[t] = {"error": recs[0].get("error")}
                continue
            cell[t] = {f: round(common.median(x[f] for x in ok if x.get(f) is not None), 5)
                       for f in ("mb_per_sec", "chief_cpu", "chief_cpu_s_per_mb", "chief_rss_mb",
                                 "chief_rss_idle_mb", "connect_s", "forked_s")
                       if any(x.get(f) is not None for x in ok)}
            cell[t]["mb_per_sec_spread"] = common.spread([x["mb_per_sec"] for x in ok], 1)
            cell[t]["errors"] = [x["error"] for x in recs if "error" in x]
            if t == "dataplane":
                cell[t]["senders_read"] = [x.get("senders_read") for x in ok]
                cell[t]["window_bytes"] = ok[0].get("window_bytes")
        if all("mb_per_sec" in cell.get(t, {}) for t in TRANSPORTS):
            a, b = by_t["dataplane"], by_t["zmq PUSH/PULL"]
            cell["dataplane / PUSH-PULL"] = common.compare(
                [x.get("mb_per_sec", float("nan")) for x in a], [x.get("mb_per_sec", float("nan")) for x in b])
        out["fanin"][key] = cell
    dp = {k: v.get("dataplane", {}) for k, v in out["fanin"].items()}
    r16, rmax = dp.get("n=16", {}).get("mb_per_sec"), dp.get(f"n={ns[-1]}", {}).get("mb_per_sec")
    out["targets"] = {
        f"n={ns[-1]}_vs_16_ge_0.8": {"ratio": round(rmax / r16, 3) if r16 and rmax else None,
                                    "met": bool(r16 and rmax and rmax / r16 >= 0.8)},
        "all_connected_le_10s": {"connect_s": dp.get(f"n={ns[-1]}", {}).get("connect_s"),
                                 "met": (dp.get(f"n={ns[-1]}", {}).get("connect_s") or 1e9) <= 10},
    }
    return out


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] in ("--chief", "--senders"):
        spec_ = json.loads(Path(sys.argv[2]).read_text())
        (child_chief if sys.argv[1] == "--chief" else child_senders)(spec_)
        sys.exit(0)
    res = run(quick="--quick" in sys.argv)
    if "--out" in sys.argv:
        common.write_json(Path(sys.argv[sys.argv.index("--out") + 1]), res)
    print(json.dumps(res, indent=1))
