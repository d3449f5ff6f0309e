"""Benchmarks 3 and 4: the analyzer's recommendation against an exhaustive sweep (the oracle)
and against the usual default, for each pipeline on a CPU node of the test cluster.

Pipelines: ``examples/digits`` (light parse of TFRecords), ``examples/images`` (JPEG
decode + crop + resize: CPU-parallel) and ``bench/pipelines/serial`` (a GIL-bound
``tf.py_function``: only more processes help).

**3. Recommendation quality.**

* *Analyzer*: ``cs_input_analyzer --no-run-command --time-budget B python run.py ...
  --mode validate_only`` on the cluster, as a user runs it (its default budget in full
  mode, 30 s in quick mode); its wall time is measured (seconds, the whole command). Its
  recommended layout for an input-worker node is what its fitted model
  (``report.json``) and its choice rule give for one such node (:func:`per_node_choice`):
  the fewest cores within 5 % of the best predicted ``T × C``. The CLI's whole-job
  recommendation is recorded too (``job_recommendation_quality``): on this cluster, whose
  nodes share one host, it often is ``1 node × 1 task`` — the chief's in-process pipeline,
  which is no input-worker layout to compare with the sweep.
* *Oracle*: an exhaustive sweep of every ``T`` tasks × ``C`` CPUs per task on one CPU node
  (``T × C ≤ n``, the layouts the analyzer chooses from; full mode adds the oversubscribed
  ``T × C ≤ 2n``), each measured ``repeats`` times in rotating order with the analyzer's own
  probe machinery (:class:`analyzer.probe_session.ProbeSession`: ``T`` processes pinned to ``C``
  CPUs each, ``private_threadpool_size = C``, a common window; samples/s summed), with
  the probe timing the analyzer uses for the same budget. Its wall time is the session's
  (load included).
* Figures: ``quality`` = median samples/s of the recommended layout / median samples/s of
  the best layout (1.0: the analyzer found the best); ``time_ratio`` = analyzer wall time
  / sweep wall time; both layouts' medians and IQRs; how many probes other processes
  disturbed (``contended``: the host was busy with other work during the window).

**4. Against the usual default.** Delivered samples/s at the chief (``analyzer.verify_task``,
the chief only draining the stream — what ``cs_input_analyzer verify`` launches) with
``csrun_wse --total-nodes 2 --single-task-nodes 1``: the chief alone on the GRES node
and one input-worker node laid out either as recommended (``T × C``) or as the usual
default, one task holding all ``n`` CPUs of the node (``1 × n``; the pipeline's own
``tf.data.AUTOTUNE``, its thread pool the node's CPUs). Alternated pairs; the figure is
the median of the per-pair ratios recommended/default. When the recommendation *is*
``1 × n`` nothing is launched and the ratio is 1 by construction.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import clusters
import common  # bench/ is on sys.path: these modules run as scripts from it

from analyzer.model import NodeModel
from analyzer.probe_plan import PROBE_KIND
from analyzer.probe_session import ProbeSession, Target, Timing
from analyzer.recommend import predict_layout
from analyzer.slurm_facts import cluster_info
from analyzer.verify import drain_command, launch_drain
from csrun_common.layout import LayoutSpec
from launcher.config import load_config

REPO = common.REPO

#: Seconds a drain job may run on after its result file appeared before it is cancelled.
RESULT_GRACE_S = 45.0
#: Tags of drain launches whose tasks did not leave after writing the result (this run).
HUNG: list[str] = []


# --------------------------------------------------------------------------- analyzer
def run_analyzer(pipeline: str, budget_s: float, out: Path, model_dir: Path, env: dict) -> tuple[float, dict]:
    """Run ``cs_input_analyzer`` on ``pipeline`` (cluster mode, ``--no-run-command``:
    :func:`common.run_analyzer`); returns ``(wall seconds, report.json dict)``. Raises when it
    produced no recommendation."""
    run_py, argv = common.PIPELINES[pipeline]
    return common.run_analyzer(run_py, [*argv, "--model_dir", str(model_dir), "--mode", "validate_only"], budget_s,
                               out, env, timeout_s=budget_s * 3 + 180)


# --------------------------------------------------------------------------- the sweep
def cluster_target() -> Target:
    """The probe target the analyzer uses on the cluster: one CPU node (not the GRES node)
    of the configured partition, all its CPUs (:class:`analyzer.probe_session.Target`)."""
    cfg = load_config()
    info = cluster_info(cfg.slurm.partition, cfg.gres_node)
    return Target(local=False, partition=cfg.slurm.partition, account=cfg.slurm.account, exclude=cfg.gres_node,
                          container=None, node_cpus=int(info["node_cpus"]), python=cfg.python)


def sweep_layouts(n: int, oversubscribe: bool) -> list[tuple[int, int]]:
    """Every ``(T, C)`` with ``T × C ≤ n`` (``≤ 2n`` with ``oversubscribe``), ``C ≤ n``."""
    cap = 2 * n if oversubscribe else n
    return [(t, c) for c in range(1, n + 1) for t in range(1, cap // c + 1)]


def sweep(pipeline: str, layouts: list[tuple[int, int]], repeats: int, budget_s: float, workdir: Path,
          target: Target) -> dict:
    """Measure every layout ``repeats`` times (rotating order) in one probe session on a
    cluster node. Returns ``{"wall_s", "rows", "stats": {"TxC": spread of samples/s},
    "contended", "failed", "sessions"}``."""
    run_py, argv = common.PIPELINES[pipeline]
    argv = [*argv, "--model_dir", str(workdir / "model_dir"), "--mode", "validate_only"]
    timing = Timing.for_budget(budget_s)
    workers = max(t for t, _ in layouts)
    t0 = time.perf_counter()
    sessions = 0
    rows: list[dict] = []

    def new_session() -> ProbeSession:
        nonlocal sessions
        s = ProbeSession(str(run_py), argv, str(REPO), workdir / f"sweep{sessions}", target, workers,
                                 deadline=time.time() + 3600)
        sessions += 1
        s.start(timing.load_timeout_s)
        return s

    session = new_session()
    try:
        for r in range(repeats):
            k = r % len(layouts)
            for T, C in layouts[k:] + layouts[:k]:
                if session is None or not session.alive():
                    session = new_session()
                row = session.probe(PROBE_KIND, T, C, timing,
                                    timeout_s=timing.first_probe_timeout_s + timing.barrier_timeout_s)
                rows.append(row)
                if row["status"] == "timeout":
                    session.close(force=True)
                    session = None
    finally:
        if session is not None:
            session.close()
    wall = time.perf_counter() - t0
    stats = {}
    for T, C in layouts:
        vals = [r["samples_per_sec"] for r in rows
                if r["tasks"] == T and r["cpus_per_task"] == C and r["status"] == "ok"]
        stats[f"{T}x{C}"] = common.spread(vals, 2)
    slim = [{k: r.get(k) for k in ("tasks", "cpus_per_task", "status", "samples_per_sec", "cpu_cores_used",
                                   "other_cores_busy", "contended", "error")} for r in rows]
    return {"wall_s": round(wall, 2), "rows": slim, "stats": stats, "sessions": sessions,
            "timing": vars(timing), "contended": sum(1 for r in rows if r.get("contended")),
            "failed": sum(1 for r in rows if r["status"] != "ok")}


def _best(stats: dict, keys: list[str]) -> str | None:
    ok = [k for k in keys if stats.get(k, {}).get("median") is not None]
    return max(ok, key=lambda k: stats[k]["median"]) if ok else None


def _tc(key: str) -> tuple[int, int]:
    t, c = key.split("x")
    return int(t), int(c)


def per_node_choice(rep: dict, n: int, tolerance: float = 0.05) -> tuple[int, int] | None:
    """The analyzer's choice for one input-worker node: its fitted model (``report.json``'s
    ``model``) predicts each ``T × C ≤ n`` layout of a worker node
    (:func:`analyzer.recommend.predict_layout` of the chief alone plus that node, no host
    sharing) and its rule without a target picks the fewest cores within ``tolerance`` of
    the best (:func:`analyzer.recommend.recommend`). ``None`` when the report has no model."""
    try:
        m = NodeModel.from_dict(rep["model"])
        preds = {(t, c): float(predict_layout(m, LayoutSpec(2, t, c, single_task_nodes=1))["predicted_samples_per_sec"])
                 for c in range(1, n + 1) for t in range(1, n // c + 1)}
    except Exception:  # noqa: BLE001 - the report's model shape changed
        return None
    best = max(preds.values())
    near = [k for k, v in preds.items() if v >= (1 - tolerance) * best]
    return min(near, key=lambda k: (k[0] * k[1], -preds[k]))


# --------------------------------------------------------------------------- delivered (4)
def delivered(report_dir: Path, rep: dict, layout: dict, seconds: float, warmup: float, env: dict,
              tag: str, timeout_s: float = 900.0) -> float:
    """Samples/s the chief drains from ``layout`` (a ``csrun_wse`` launch of
    ``analyzer.verify_task``, built by :func:`analyzer.verify.drain_command`). The timeout
    (seconds) covers waiting in the Slurm queue behind other users' jobs; the rate is the
    drain's own window, so a queue wait does not change it."""
    out_dir = report_dir / "bench_drain" / tag
    out_dir.mkdir(parents=True, exist_ok=True)
    argv = drain_command(rep, out_dir, layout, seconds, warmup, None)
    clusters.wait_queue_empty(env, max_wait=60.0)
    result = out_dir / "drain.json"
    # The figure is in drain.json; a launch whose tasks do not leave within RESULT_GRACE_S of
    # it only holds the nodes: launch_drain cancels it, and the tag is noted.
    launch = launch_drain(argv, rep.get("cwd") or str(REPO), out_dir / "csrun_wse.log", result, timeout_s,
                          RESULT_GRACE_S, env)
    if launch.stopped_after_result:
        HUNG.append(tag)
    try:
        res = json.loads(result.read_text())
    except (OSError, ValueError):
        res = {}
    if res.get("status") != "ok":
        tail = (out_dir / "csrun_wse.log").read_text(errors="replace").strip().splitlines()[-4:]
        raise RuntimeError(f"drain of {layout} failed: {res.get('error') or ' | '.join(tail)[:400]}")
    return float(res["samples_per_sec"])


def vs_default(report_dir: Path, rep: dict, T: int, C: int, n: int, pairs: int, seconds: float, warmup: float,
               env: dict) -> dict:
    """Benchmark 4 for one pipeline (see the module docstring)."""
    rec = {"nodes": 2, "single_task_nodes": 1, "tasks_per_node": T, "cpus_per_task": C}
    dflt = {"nodes": 2, "single_task_nodes": 1, "tasks_per_node": 1, "cpus_per_task": n}
    out: dict[str, Any] = {"recommended_layout": rec, "default_layout": dflt,
                           "default_layout_text": f"1 task × {n} CPUs (AUTOTUNE)",
                           "recommended_layout_text": f"{T} task(s) × {C} CPU(s)",
                           "seconds": seconds, "warmup_s": warmup}
    if (T, C) == (1, n):
        out.update({"same_layout": True, "compare": {"median_ratio": 1.0, "pairs": 0},
                    "note": "the recommendation is the default layout: nothing to measure"})
        return out
    calls = {"n": 0}

    def a() -> float:
        calls["n"] += 1
        return delivered(report_dir, rep, rec, seconds, warmup, env, f"rec{calls['n']}")

    def b() -> float:
        calls["n"] += 1
        return delivered(report_dir, rep, dflt, seconds, warmup, env, f"default{calls['n']}")

    HUNG.clear()
    av, bv = common.alternate_pairs(a, b, pairs=pairs, warmup=0)
    out.update({"recommended": common.spread(av, 2), "default": common.spread(bv, 2),
                "compare": common.compare(av, bv)})
    if HUNG:
        out["launches_cancelled_after_result"] = list(HUNG)
        out["note"] = (f"{len(HUNG)} launch(es) did not end within {RESULT_GRACE_S:.0f} s of writing their result "
                       "(an input worker stuck in WorkerServer.Stop); cancelled, their figures kept")
    return out


# --------------------------------------------------------------------------- run
@dataclass(frozen=True)
class Settings:
    """One run's settings: ``pipelines``, the analyzer's ``budget_s`` (seconds), sweep
    ``repeats``, whether the sweep adds oversubscribed layouts (``oversubscribe``), and the
    delivered comparison's ``pairs`` of ``seconds``-long drains after ``warmup`` seconds."""

    pipelines: tuple[str, ...]
    budget_s: float
    repeats: int
    oversubscribe: bool
    pairs: int
    seconds: float
    warmup: float


QUICK = Settings(("serial",), 30.0, 2, False, 2, 3.0, 1.0)
FULL = Settings(("digits", "images", "serial"), 120.0, 3, True, 3, 10.0, 3.0)


def run(quick: bool = False) -> dict:
    """Benchmarks 3 and 4 for every pipeline (quick: the serial pipeline only, analyzer
    budget 30 s, the ``T × C ≤ n`` layouts twice each, 2 pairs of 3 s drains; full: all
    three pipelines, the analyzer's default 120 s budget, oversubscribed layouts too, 3
    repeats, 3 pairs of 10 s drains). Figures in samples/s, seconds and ratios."""
    env = clusters.slurm_env()
    os.environ["SLURM_CONF"] = env.get("SLURM_CONF", "")
    os.environ["PATH"] = env["PATH"]
    settings = QUICK if quick else FULL
    target = cluster_target()
    layouts = sweep_layouts(int(target.node_cpus or 1), settings.oversubscribe)
    result: dict[str, Any] = {
        "benchmark": "recommendation quality (vs exhaustive sweep) and vs the default layout",
        "unit": "samples/s (rates), seconds (times)", "node_cpus": target.node_cpus,
        "analyzer_budget_s": settings.budget_s, "sweep_layouts": [f"{t}x{c}" for t, c in layouts],
        "repeats": settings.repeats, "pipelines": {},
    }
    for name in settings.pipelines:
        work = Path(tempfile.mkdtemp(prefix=f"bench_recommend_{name}_"))
        try:
            result["pipelines"][name] = bench_pipeline(name, settings, target, layouts, work, env)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return result


def bench_pipeline(name: str, settings: Settings, target: Target, layouts: list[tuple[int, int]], work: Path,
                   env: dict) -> dict:
    """Benchmarks 3 and 4 for pipeline ``name``: the analyzer, the sweep of ``layouts`` (and
    the two layouts the analyzer chose), the quality figures, and the delivered comparison
    against the default layout. An error is recorded in the result, not raised."""
    n = int(target.node_cpus or 1)
    rec: dict[str, Any] = {"analyzer_budget_s": settings.budget_s, "repeats": settings.repeats}
    try:
        a_wall, rep = run_analyzer(name, settings.budget_s, work / "analysis", work / "model_dir", env)
        r = rep["recommendation"]
        job = int(r["tasks_per_node"]), int(r["cpus_per_task"])
        chosen = per_node_choice(rep, n) or job
        rec.update({"analyzer_s": round(a_wall, 2),
                    "analyzer_recommendation": {k: r.get(k) for k in (
                        "nodes", "tasks_per_node", "cpus_per_task", "single_task_nodes",
                        "predicted_samples_per_sec", "limited_by")},
                    "analyzer_probes": len(rep.get("probes") or []),
                    "bottleneck": (rep.get("bottleneck") or {}).get("class")})
        lays = list(dict.fromkeys([*layouts, chosen, job]))
        sw = sweep(name, lays, settings.repeats, settings.budget_s, work, target)
        rec.update(quality(sw, chosen, job, [f"{t}x{c}" for t, c in layouts if t * c <= n]))
        rec["time_ratio"] = round(a_wall / sw["wall_s"], 4) if sw["wall_s"] else None
        try:
            rec["vs_default"] = vs_default(work / "analysis", rep, chosen[0], chosen[1], n, settings.pairs,
                                           settings.seconds, settings.warmup, env)
        except Exception as exc:  # noqa: BLE001
            rec["vs_default"] = {"error": f"{type(exc).__name__}: {str(exc)[:600]}"}
    except Exception as exc:  # noqa: BLE001 - recorded; the other pipelines go on
        rec["error"] = f"{type(exc).__name__}: {str(exc)[:800]}"
    return rec


def quality(sw: dict, chosen: tuple[int, int], job: tuple[int, int], within: list[str]) -> dict:
    """The sweep's figures for the analyzer's per-node choice ``chosen`` and its whole-job
    layout ``job`` (``(T, C)``): their medians against the best of the ``within`` layouts
    (the oracle) and of every swept layout (samples/s; ratios rounded to 4 digits)."""
    st = sw["stats"]
    key, job_key = f"{chosen[0]}x{chosen[1]}", f"{job[0]}x{job[1]}"
    best = _best(st, within)
    best_any = _best(st, list(st))

    def rate(k: str | None) -> float | None:
        return (st.get(k) or {}).get("median") if k else None

    def ratio(x: str | None, y: str | None) -> float | None:
        rx, ry = rate(x), rate(y)
        return round(rx / ry, 4) if rx and ry else None

    return {
        "sweep_s": sw["wall_s"], "sweep": sw["rows"], "sweep_stats": st, "sweep_timing": sw["timing"],
        "contended_probes": sw["contended"], "failed_probes": sw["failed"],
        "recommended": {"tasks": chosen[0], "cpus": chosen[1], "samples_per_sec": rate(key),
                        "iqr": [st.get(key, {}).get("q1"), st.get(key, {}).get("q3")],
                        "how": "the analyzer's model and choice rule for one input-worker node"},
        "oracle": {"tasks": _tc(best)[0] if best else None, "cpus": _tc(best)[1] if best else None,
                   "samples_per_sec": rate(best)},
        "oracle_any": {"layout": best_any, "samples_per_sec": rate(best_any)},
        "quality": ratio(key, best),
        "quality_vs_any": ratio(key, best_any),
        "job_recommendation_quality": {
            "layout": job_key, "quality": ratio(job_key, best),
            "note": ("the CLI's whole-job recommendation; with nodes = 1 and 1 task its T x C is "
                     "the chief's in-process pipeline, not an input-worker node's layout")},
    }


if __name__ == "__main__":
    print(json.dumps(run(quick="--quick" in sys.argv), indent=1, default=str))
