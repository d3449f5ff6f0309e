"""The probe planner and the probe-table rows it reads (pure: no I/O).

A row (:func:`summarize`) is one probe: ``T`` tasks × ``C`` CPUs per task of a ``kind``
(:data:`PROBE_KIND` the pipeline, :data:`INGEST_KIND` the chief's tf.data service ingest,
:data:`SERVED_KIND` an input worker serving a chief). :func:`next_probe` chooses the next
probe from the rows so far:

1. bracket the space: ``1 × n`` (one task, all CPUs), ``n × 1`` (all tasks, one CPU each),
   ``1 × 1``;
2. measure the chief's ingest once (it caps every multi-node layout), then one ``served``
   probe (1 CPU); the served probe is repeated once after step 4 and once before stopping;
2b. measure once more a layout, or the ingest probe, whose only measurement was
   *contended* (:data:`CONTENDED_CORES`), the brackets first;
3. repeat the best layout once;
4. if ``n × 1`` left the CPUs idle, oversubscribe (``M × 1`` with ``M > n``);
5. then alternate: the unmeasured layout the current fit rates highest, and repeats of the
   best layouts until each has three;
6. stop when every layout is measured and the best ones are repeated with under 5 % spread
   (the driver also stops at the time budget).

Why these steps: docs/DESIGN.md "The analyzer's probes". Units: samples/s, seconds, bytes.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

PROBE_KIND, INGEST_KIND, SERVED_KIND = "pipeline", "ingest", "served"
#: A probe is *contended* when other processes kept more than this share of the node's CPUs
#: busy during its window (a shared host); the planner measures it again.
CONTENDED_CORES = 0.2


def candidates(n: int, max_tasks: int) -> list[tuple[int, int]]:
    """Probe layouts ``(T, C)`` for a node with ``n`` CPUs and at most ``max_tasks``
    processes: powers of two and the extremes with ``T × C ≤ n``, plus one oversubscribed
    ``(min(2n, max_tasks), 1)`` when ``max_tasks > n``."""
    cs = sorted({1, n} | {2 ** i for i in range(20) if 2 ** i < n})
    out = []
    for c in cs:
        ts = sorted({1, n // c} | {2 ** i for i in range(20) if 2 ** i <= n // c})
        out += [(t, c) for t in ts if t <= max_tasks]
    if max_tasks > n:
        out.append((min(2 * n, max_tasks), 1))
    return out


def is_contended(value: Any) -> bool:
    """Whether a probe row's ``contended`` field says *contended*: ``True``, ``"True"``,
    ``1`` (a CSV read back); ``None``, NaN, ``False`` and ``"False"`` do not."""
    if isinstance(value, str):
        return value.strip().lower() in ("true", "1", "1.0")
    if value is None or is_nan(value):
        return False
    return bool(value)


def _clean_keys(rows: list[dict]) -> set[tuple[int, int]]:
    """Layouts with at least one successful probe that no other process disturbed."""
    return {(int(r["tasks"]), int(r["cpus_per_task"])) for r in rows
            if r.get("kind", PROBE_KIND) == PROBE_KIND and r.get("status") == "ok"
            and not is_contended(r.get("contended"))}


def disturbed(rows: list[dict]) -> list[dict[str, Any]]:
    """The probes whose every successful measurement was *contended*, grouped by kind and
    layout, in the order first probed.

    ``rows``: probe-table rows (dicts; ``contended`` as written by :func:`summarize` or read
    back from probes.csv). A group with one undisturbed ``ok`` row is not listed (the model
    and the ingest figures then drop its contended rows). Returns ``[{"kind", "tasks",
    "cpus_per_task", "node_cpus", "probes" (contended ok rows: 2 or more means it was measured
    again), "other_cores_busy_min", "other_cores_busy_max" (cores other processes kept busy,
    NaN when not recorded), "probe_ids"}]``.
    """
    groups: dict[tuple[str, int, int], list[dict]] = {}
    for r in rows:
        if r.get("status") != "ok":
            continue
        key = (str(r.get("kind") or PROBE_KIND), int(r["tasks"]), int(r["cpus_per_task"]))
        groups.setdefault(key, []).append(r)
    out = []
    for (kind, t, c), rs in groups.items():
        if not all(is_contended(r.get("contended")) for r in rs):
            continue
        load = [float(r["other_cores_busy"]) for r in rs if not is_nan(r.get("other_cores_busy"))]
        out.append({"kind": kind, "tasks": t, "cpus_per_task": c,
                    "node_cpus": max((int(r["node_cpus"]) for r in rs if not is_nan(r.get("node_cpus"))),
                                     default=0),
                    "probes": len(rs), "other_cores_busy_min": min(load, default=math.nan),
                    "other_cores_busy_max": max(load, default=math.nan),
                    "probe_ids": [r.get("probe_id") for r in rs]})
    return out


def _stats(rows: list[dict]) -> dict[tuple[int, int], dict[str, float]]:
    out: dict[tuple[int, int], list[float]] = {}
    util: dict[tuple[int, int], list[float]] = {}
    clean = _clean_keys(rows)
    for r in rows:
        if r.get("kind", PROBE_KIND) != PROBE_KIND or r.get("status") != "ok":
            continue
        if is_contended(r.get("contended")) and (int(r["tasks"]), int(r["cpus_per_task"])) in clean:
            continue
        key = (int(r["tasks"]), int(r["cpus_per_task"]))
        out.setdefault(key, []).append(float(r["samples_per_sec"]))
        if r.get("cpu_util") is not None and not is_nan(r.get("cpu_util")):
            util.setdefault(key, []).append(float(r["cpu_util"]))
    res = {}
    for k, v in out.items():
        mean = sum(v) / len(v)
        sd = math.sqrt(sum((x - mean) ** 2 for x in v) / (len(v) - 1)) if len(v) > 1 else math.nan
        res[k] = {"mean": mean, "count": len(v), "cv": sd / mean if mean > 0 and len(v) > 1 else math.nan,
                  "util": sum(util[k]) / len(util[k]) if util.get(k) else math.nan}
    return res


def is_nan(x: Any) -> bool:
    """True for NaN, ``None`` and anything that is not a number."""
    try:
        return math.isnan(float(x))
    except (TypeError, ValueError):
        return True


def next_probe(rows: list[dict], n: int, max_tasks: int, want_ingest: bool = True,
               predict: Callable[[int, int], float] | None = None,
               want_served: bool | None = None) -> tuple[str, int, int] | None:
    """The next probe ``(kind, T, C)`` after the probes in ``rows`` (dicts with ``kind``,
    ``status``, ``tasks``, ``cpus_per_task``, ``samples_per_sec``, ``cpu_util``), or
    ``None`` when nothing more is worth measuring. ``predict(T, C)`` is the current fit's
    node rate (samples/s), used to rank unmeasured layouts (default: rank by ``T × C``).
    ``want_served``: plan the ``served`` probes (default: ``want_ingest``; PyTorch: served
    probes over the data plane without the tf.data service ingest probe). The order is the
    module docstring's: the brackets here, then :func:`_ingest_step` (2, 2b),
    :func:`_spread_step` (3, 4, 4b) and :func:`_refine_step` (5)."""
    served_ok = (want_ingest if want_served is None else want_served) and max_tasks >= 2
    cands = candidates(n, max_tasks)
    attempted: dict[tuple[int, int], int] = {}
    for r in rows:
        if r.get("kind", PROBE_KIND) == PROBE_KIND:
            key = (int(r["tasks"]), int(r["cpus_per_task"]))
            attempted[key] = attempted.get(key, 0) + 1
    st = _stats(rows)
    # 1. brackets
    for key in dict.fromkeys([(1, n), (n, 1), (1, 1)]):
        if key in cands and key not in attempted:
            return PROBE_KIND, key[0], key[1]
    if not st:
        return None  # every bracket failed: nothing to refine
    return (_ingest_step(rows, n, cands, st, attempted, want_ingest, served_ok)
            or _spread_step(rows, n, cands, st, attempted, served_ok)
            or _refine_step(rows, n, cands, st, attempted, predict, served_ok))


def _ingest_step(rows: list[dict], n: int, cands: list[tuple[int, int]],
                 st: dict[tuple[int, int], dict[str, float]], attempted: dict[tuple[int, int], int],
                 want_ingest: bool, served_ok: bool) -> tuple[str, int, int] | None:
    """Steps 2 and 2b of :func:`next_probe`: the chief's ingest (it caps every multi-node
    layout: measured early) and the first served probe; then a layout or the ingest probe
    measured only while other processes were busy, once more (:func:`_measure_again`)."""
    if want_ingest and not any(r.get("kind") == INGEST_KIND for r in rows):
        return INGEST_KIND, 1, n
    if served_ok and not any(r.get("kind") == SERVED_KIND for r in rows):
        return SERVED_KIND, 2, 1
    return _measure_again(rows, n, cands, st, attempted, want_ingest)


def _spread_step(rows: list[dict], n: int, cands: list[tuple[int, int]],
                 st: dict[tuple[int, int], dict[str, float]], attempted: dict[tuple[int, int], int],
                 served_ok: bool) -> tuple[str, int, int] | None:
    """Steps 3, 4 and 4b of :func:`next_probe`: one repeat of the best layout (the spread is
    known early), oversubscription when ``n × 1`` left CPUs idle, a second served probe (its
    worker and chief costs are single windows otherwise)."""
    best = max(st, key=lambda k: st[k]["mean"])
    if all(v["count"] < 2 for v in st.values()) and attempted.get(best, 0) < 3:
        return PROBE_KIND, best[0], best[1]
    over = [c for c in cands if c[0] * c[1] > n]
    util_all = st.get((n, 1), {}).get("util", math.nan)
    if over and over[0] not in attempted and not is_nan(util_all) and util_all < 0.8:
        return PROBE_KIND, over[0][0], over[0][1]
    if served_ok and sum(1 for r in rows if r.get("kind") == SERVED_KIND) < 2:
        return SERVED_KIND, 2, 1
    return None


def _refine_step(rows: list[dict], n: int, cands: list[tuple[int, int]],
                 st: dict[tuple[int, int], dict[str, float]], attempted: dict[tuple[int, int], int],
                 predict: Callable[[int, int], float] | None, served_ok: bool) -> tuple[str, int, int] | None:
    """Step 5 of :func:`next_probe`: alternate the unmeasured layout the fit (``predict``, else
    ``T × C``) rates highest and repeats of the best three until each has three; then the
    rest unmeasured, a third served probe, and repeats of noisy layouts (spread over 5 %)."""
    rank = predict or (lambda t, c: float(t * c))
    unmeasured = [c for c in cands if c[0] * c[1] <= n and c not in attempted]
    best_rate = max(v["mean"] for v in st.values())
    promising = sorted((c for c in unmeasured if rank(*c) >= 0.7 * best_rate), key=lambda c: -rank(*c))
    top = sorted(st, key=lambda k: -st[k]["mean"])[:3]
    need_repeat = [k for k in top if st[k]["count"] < 3 and attempted.get(k, 0) < 4]
    if promising and (not need_repeat or len(rows) % 2 == 0):
        return PROBE_KIND, promising[0][0], promising[0][1]
    if need_repeat:
        k = min(need_repeat, key=lambda k: (st[k]["count"], -st[k]["mean"]))
        return PROBE_KIND, k[0], k[1]
    if unmeasured:
        k = max(unmeasured, key=lambda c: rank(*c))
        return PROBE_KIND, k[0], k[1]
    if served_ok and sum(1 for r in rows if r.get("kind") == SERVED_KIND) < 3:
        return SERVED_KIND, 2, 1
    noisy = [k for k in top if not is_nan(st[k]["cv"]) and st[k]["cv"] > 0.05 and attempted.get(k, 0) < 6]
    if noisy:
        k = max(noisy, key=lambda k: st[k]["cv"])
        return PROBE_KIND, k[0], k[1]
    return None


def _measure_again(rows: list[dict], n: int, cands: list[tuple[int, int]],
                   st: dict[tuple[int, int], dict[str, float]], attempted: dict[tuple[int, int], int],
                   want_ingest: bool) -> tuple[str, int, int] | None:
    """Step 2b of the planner: the first candidate layout (``cands``: those the processes
    allow) with a successful probe but none undisturbed and a single attempt (the brackets
    ``1 × n``, ``n × 1``, ``1 × 1`` first), else the ingest probe when its only run was
    contended; ``None`` when nothing is to be measured again."""
    clean = _clean_keys(rows)
    for key in dict.fromkeys([(1, n), (n, 1), (1, 1), *cands]):
        if key in cands and key in st and key not in clean and attempted.get(key, 0) < 2:
            return PROBE_KIND, key[0], key[1]
    ingest = [r for r in rows if r.get("kind") == INGEST_KIND]
    if want_ingest and len(ingest) == 1 and ingest[0].get("status") == "ok" \
            and is_contended(ingest[0].get("contended")):
        return INGEST_KIND, 1, n
    return None


def summarize(kind: str, tasks: int, cpus: int, node_cpus: int, results: list[dict], status: str,
              error: str, started: float, elapsed: float, warmup: float, node: str, probe_id: int) -> dict:
    """One probe-table row from the per-process results of a probe.

    ``samples_per_sec`` is the sum of the processes' rates over their (overlapping)
    windows; ``cpu_cores_used`` the sum of their CPU-seconds per second; ``cpu_util`` that
    over the cores the probe was given (``min(T × C, n)``); ``cpu_seconds_per_sample`` the
    CPU-seconds over the samples; byte rates are bytes/s summed over the processes.
    """
    row: dict[str, Any] = {
        "probe_id": probe_id, "kind": kind, "tasks": int(tasks), "cpus_per_task": int(cpus),
        "node_cpus": int(node_cpus), "node": node, "status": status, "error": error,
        "samples_per_sec": math.nan, "task_rate_min": math.nan, "task_rate_max": math.nan,
        "cpu_cores_used": math.nan, "cpu_util": math.nan, "cpu_seconds_per_sample": math.nan,
        "read_bytes_per_sec": math.nan, "disk_read_bytes_per_sec": math.nan,
        "element_bytes_per_sec": math.nan, "window_s": math.nan, "warmup_s": warmup,
        "first_element_s": math.nan, "elapsed_s": elapsed, "started_at": started,
    }
    if status != "ok" or not results:
        return row
    rates = [float(r["samples_per_sec"]) for r in results]
    windows = [float(r["window_s"]) for r in results]
    cores = sum(float(r["cpu_seconds"]) / float(r["window_s"]) for r in results if r["window_s"] > 0)
    samples = sum(int(r["samples"]) for r in results)
    cpu_s = sum(float(r["cpu_seconds"]) for r in results)
    given = min(tasks * cpus, node_cpus) if kind == PROBE_KIND else node_cpus
    row.update({
        "samples_per_sec": sum(rates), "task_rate_min": min(rates), "task_rate_max": max(rates),
        "cpu_cores_used": cores, "cpu_util": cores / given if given else math.nan,
        "cpu_seconds_per_sample": cpu_s / samples if samples else math.nan,
        "read_bytes_per_sec": sum(r.get("read_chars", 0) / r["window_s"] for r in results),
        "disk_read_bytes_per_sec": sum(r.get("read_bytes", 0) / r["window_s"] for r in results),
        "element_bytes_per_sec": sum(r.get("element_bytes", 0) / r["window_s"] for r in results),
        "window_s": sum(windows) / len(windows),
        "first_element_s": max(float(r.get("first_element_s", 0.0)) for r in results),
    })
    host = [float(r["host_busy_cores"]) for r in results if r.get("host_busy_cores") is not None]
    if host:
        # CPU the rest of the machine used meanwhile (other jobs on a shared host).
        row["other_cores_busy"] = max(0.0, sum(host) / len(host) - cores)
        row["contended"] = bool(row["other_cores_busy"] > CONTENDED_CORES * node_cpus)
    if not all(r.get("synchronized", True) for r in results):
        row["error"] = "windows not synchronized (a process was late to the barrier)"
    if kind != PROBE_KIND and samples and len(results) >= 2:
        # The chief (process 0) and the input workers measured their CPU apart.
        chief_cpu = sum(float(r["cpu_seconds"]) for r in results if int(r.get("index", 0)) == 0)
        row["chief_cpu_seconds_per_sample"] = chief_cpu / samples
        row["worker_cpu_seconds_per_sample"] = (cpu_s - chief_cpu) / samples
        local = [float(r["local_cpu_seconds_per_sample"]) for r in results
                 if r.get("local_cpu_seconds_per_sample") is not None]
        if local:
            row["worker_local_cpu_seconds_per_sample"] = sum(local) / len(local)
        _chief_feed(row, [r for r in results if int(r.get("index", 0)) == 0])
    row["_elements_per_sec"] = sum(r["batches"] / r["window_s"] for r in results)
    batches = sum(int(r["batches"]) for r in results)
    if kind == PROBE_KIND and batches:
        row["samples_per_element"] = samples / batches
    return row


def _chief_feed(row: dict[str, Any], chiefs: list[dict]) -> None:
    """A served probe's chief fed through the runtime's device feed (PyTorch): its device
    (``feed_device``, e.g. ``cuda:0``; absent for TensorFlow) and the bytes/s it delivered
    there (``chief_feed_bytes_per_sec``), which the report names beside the ingest ceiling."""
    for r in chiefs:
        dev = (r.get("input") or {}).get("feed_device")
        if dev and r.get("window_s"):
            row["feed_device"] = str(dev)
            row["chief_feed_bytes_per_sec"] = float(r.get("element_bytes", 0)) / float(r["window_s"])

