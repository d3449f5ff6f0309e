"""The results table of BENCHMARKS.md: each benchmark's result file summarized in rows (figure,
value, spread, what it is compared with; one summarizer per benchmark, :data:`SUMMARIZERS`),
rendered as Markdown between :data:`TABLE_START` and :data:`TABLE_END` with a line naming the
machines the results came from (``python bench/run.py`` writes it).
"""
from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import common  # bench/ is on sys.path: these modules run as scripts from it; puts the repository there

from analyzer.probe_plan import is_nan
from csrun_common import atomic

TABLE_START = "<!-- bench:table:start -->"
TABLE_END = "<!-- bench:table:end -->"


def _g(d: Any, *keys: Any, default: Any = None) -> Any:
    for k in keys:
        if isinstance(d, Mapping) and k in d:
            d = d[k]
        elif isinstance(d, (list, tuple)) and isinstance(k, int) and -len(d) <= k < len(d):
            d = d[k]
        else:
            return default
    return d


def fmt(x: Any, unit: str = "", digits: int = 3) -> str:
    """A number for the table: 3 significant digits (thousands separated), ``—`` for
    missing values."""
    if x is None or is_nan(x):
        return "—"
    x = float(x)
    if x == 0:
        s = "0"
    elif abs(x) >= 10 ** digits:
        s = f"{x:,.0f}"
    else:
        s = f"{x:.{digits}g}"
        if "e" in s:
            s = f"{x:.{digits}f}"
    return f"{s} {unit}".rstrip() if unit else s


def _iqr_text(sp: Any, unit: str = "") -> str:
    if not isinstance(sp, Mapping):
        return ""
    q1, q3 = sp.get("q1"), sp.get("q3")
    if q1 is None or q3 is None:
        return ""
    return f"IQR {fmt(q1)}–{fmt(q3, unit)}, n={sp.get('n')}"


Row = dict  # {"figure", "value", "spread", "compared"}


def _rows_launch(r: dict) -> list[Row]:
    rows = []
    c = r.get("compare") or {}
    rows.append({"figure": "launch time csrun_wse / bare srun (median of pair ratios)",
                 "value": fmt(c.get("median_ratio"), "×"),
                 "spread": (f"pair ratios IQR {fmt(_g(c, 'ratio_iqr', 0))}–{fmt(_g(c, 'ratio_iqr', 1))}, "
                            f"{c.get('pairs')} pairs"),
                 "compared": f"same het layout: {r.get('layout_text', '?')}"})
    rows.append({"figure": "csrun_wse overhead over srun (median of pair differences)",
                 "value": fmt(c.get("median_difference"), "s"),
                 "spread": (f"csrun_wse {fmt(_g(r, 'csrun_wse_s', 'median'), 's')}, "
                            f"srun {fmt(_g(r, 'srun_s', 'median'), 's')} (medians)"),
                 "compared": "`csrun_wse ... true` vs `srun <same components> true`"})
    return rows


def _rows_startup(r: dict) -> list[Row]:
    rows = []
    base = _g(r, "commands", "python -c pass", "median")
    for name, rec in (r.get("commands") or {}).items():
        if name == "python -c pass":
            continue
        rows.append({"figure": f"start-up: `{name}`", "value": fmt(rec.get("median"), "s"),
                     "spread": _iqr_text(rec, "s"),
                     "compared": (f"{fmt(_g(r, 'ratios', name), '×')} `python -c pass` "
                                  f"({fmt(base, 's')})")})
    return rows


def _rows_recommend(r: dict) -> list[Row]:
    rows = []
    for name, p in (r.get("pipelines") or {}).items():
        if p.get("error"):
            rows.append({"figure": f"recommendation quality, {name}", "value": "error",
                         "spread": str(p["error"])[:120], "compared": ""})
            continue
        rec = p.get("recommended") or {}
        orc = p.get("oracle") or {}
        job = p.get("job_recommendation_quality") or {}
        ar = p.get("analyzer_recommendation") or {}
        anyb = p.get("oracle_any") or {}
        over_text = (f"; rec = {fmt(p.get('quality_vs_any'))} of the oversubscribed {anyb.get('layout')}"
                     if anyb.get("layout") and p.get("quality_vs_any") not in (None, p.get("quality")) else "")
        job_text = over_text + (f"; CLI's job layout {ar.get('nodes')} node(s) × "
                                f"{ar.get('tasks_per_node')}×{ar.get('cpus_per_task')}: "
                                f"{fmt(job.get('quality'))} of oracle" if ar else "")
        layouts = sorted({f"{s.get('tasks')}x{s.get('cpus_per_task')}" for s in (p.get("sweep") or [])})
        rows.append({
            "figure": f"recommended / oracle throughput, {name}",
            "value": fmt(p.get("quality")),
            "spread": (f"rec {rec.get('tasks')}×{rec.get('cpus')}: {fmt(rec.get('samples_per_sec'), 'samples/s')}; "
                       f"oracle {orc.get('tasks')}×{orc.get('cpus')}: {fmt(orc.get('samples_per_sec'), 'samples/s')} "
                       f"(medians of {p.get('repeats')}){job_text}"),
            "compared": f"exhaustive sweep of {len(layouts)} T×C layouts on one node"})
        rows.append({"figure": f"analyzer wall time / sweep wall time, {name}",
                     "value": fmt(p.get("time_ratio")),
                     "spread": f"analyzer {fmt(p.get('analyzer_s'), 's')}, sweep {fmt(p.get('sweep_s'), 's')}",
                     "compared": "cs_input_analyzer (budget "
                                 f"{fmt(p.get('analyzer_budget_s'), 's')}) vs the sweep"})
        d = p.get("vs_default") or {}
        if d:
            rows.append({
                "figure": f"recommended / default delivered throughput, {name}",
                "value": fmt(_g(d, "compare", "median_ratio"), "×") if not d.get("error") else "error",
                "spread": (f"rec {fmt(_g(d, 'recommended', 'median'), 'samples/s')}, default "
                           f"{fmt(_g(d, 'default', 'median'), 'samples/s')} (medians, "
                           f"{_g(d, 'compare', 'pairs')} pairs)") if not d.get("error") else str(d["error"])[:120],
                "compared": f"default: {d.get('default_layout_text', '1 task × all CPUs, AUTOTUNE')}"})
    return rows


def _rows_streaming(r: dict) -> list[Row]:
    rows = []
    for key, s in (r.get("runs") or {}).items():
        if s.get("error"):
            rows.append({"figure": f"streaming efficiency, {key}", "value": "error",
                         "spread": str(s["error"])[:120], "compared": ""})
            continue
        if s.get("efficiency") is not None:
            rows.append({
                "figure": f"streaming efficiency, {key}",
                "value": fmt(s.get("efficiency")),
                "spread": (f"service {fmt(_g(s, 'service', 'median'), 'samples/s')} vs "
                           f"standalone sum {fmt(_g(s, 'standalone_concurrent_sum', 'median'), 'samples/s')} "
                           f"(medians of {_g(s, 'service', 'n')})"),
                "compared": "tf.data service to the chief vs the same workers in-process, concurrently"})
        if s.get("efficiency_dataplane") is not None:
            who = "PyTorch DataLoaders" if s.get("framework") == "pytorch" else "the same workers"
            rows.append({
                "figure": f"streaming efficiency, data plane, {key}",
                "value": fmt(s.get("efficiency_dataplane")),
                "spread": (f"data plane {fmt(_g(s, 'dataplane', 'median'), 'samples/s')} vs "
                           f"standalone sum {fmt(_g(s, 'standalone_concurrent_sum', 'median'), 'samples/s')} "
                           f"(medians of {_g(s, 'dataplane', 'n')})"),
                "compared": f"csrun's data plane to the chief vs {who} in-process, concurrently"})
        if s.get("efficiency_vs_alone") is not None:
            rows.append({"figure": f"streaming vs sum of rates measured alone, {key}",
                         "value": fmt(s.get("efficiency_vs_alone")),
                         "spread": f"sum alone {fmt(_g(s, 'standalone_alone_sum'), 'samples/s')}",
                         "compared": "each worker measured alone on the host"})
    return rows


def _rows_ingest(r: dict) -> list[Row]:
    rows: list[Row] = []
    for k, rec in (r.get("ceiling") or {}).items():
        if rec.get("error"):
            rows.append({"figure": f"ingest ceiling, {k}", "value": "error", "spread": str(rec["error"])[:120],
                         "compared": ""})
            continue
        for size, p in (rec.get("sizes") or {}).items():
            svc, raw = p.get("service") or {}, p.get("raw TCP") or {}
            unb, inp = p.get("service, unbundled") or {}, p.get("in-process") or {}
            rows.append({
                "figure": f"ingest ceiling, {size} batches, {k}",
                "value": fmt(svc.get("mb_per_sec"), "MB/s"),
                "spread": (f"{fmt(_g(svc, 'batches_per_sec', 'median'))} batches/s "
                           f"({_iqr_text(svc.get('batches_per_sec'))}); chief {fmt(svc.get('chief_cpu_s_per_mb'))} "
                           f"CPU-s/MB, workers {fmt(svc.get('workers_cpu_s_per_mb'))}; unbundled "
                           f"{fmt(unb.get('mb_per_sec'), 'MB/s')}; in-process "
                           f"{fmt(_g(inp, 'batches_per_sec', 'median'))} batches/s"),
                "compared": (f"raw TCP {fmt(raw.get('mb_per_sec'), 'MB/s')}: service = "
                             f"{fmt(_g(p, 'service / raw TCP', 'median_ratio'))} of it; "
                             f"{fmt(_g(p, 'service / unbundled', 'median_ratio'))} × unbundled")})
    variants: dict[str, list[str]] = {}
    ratios: dict[str, list[float]] = {}
    for k, sizes in (r.get("hop") or {}).items():
        for size, vs in sizes.items():
            for v, rec in vs.items():
                ratio = _g(rec, "vs_service", "median_ratio")
                variants.setdefault(v, []).append(f"{k} {size} {fmt(ratio)}")
                if ratio is not None:
                    ratios.setdefault(v, []).append(float(ratio))
    for v, texts in variants.items():
        rows.append({"figure": f"hop: {v} / the runtime's default", "value": fmt(common.median(ratios.get(v, []))),
                     "spread": "; ".join(texts), "compared": "MB/s, median of per-repetition ratios"})
    loop = r.get("loop") or {}
    if loop.get("error"):
        rows.append({"figure": "training loop", "value": "error", "spread": str(loop["error"])[:120], "compared": ""})
    elif loop:
        pct = lambda key: fmt(100 * (loop.get(key) or float("nan")))  # noqa: E731
        micro = loop.get("micro_us_per_step") or {}
        chunked = next((v for k, v in micro.items() if k.startswith("TrainSteps, ") and "256" not in k), {})
        rows.append({
            "figure": "training loop, digits: µs per step (TrainingDriver, free input)",
            "value": fmt(_g(loop, "loop_us_per_step", "median"), "µs"),
            "spread": (f"floor {fmt(loop.get('floor_us_per_step'))} µs (256 steps/call); "
                       f"{fmt(_g(chunked, 'median'))} µs at {loop.get('bundle')} steps/call; "
                       f"train_on_batch {fmt(_g(micro, 'train_on_batch', 'median'))} µs"),
            "compared": (f"overhead {fmt(loop.get('overhead_us_per_step'))} µs/step = "
                         f"{pct('overhead_vs_step_at_digits_rate')} % of the step at digits' rate "
                         f"({fmt(loop.get('digits_in_process_samples_per_sec'))} samples/s); "
                         f"train_on_batch: {pct('train_on_batch_overhead_vs_step_at_digits_rate')} %")})
    many = r.get("many") or {}
    if many.get("error"):
        rows.append({"figure": "many input workers", "value": "error", "spread": str(many["error"])[:120],
                     "compared": ""})
    elif many:
        exits = many.get("worker_exits") or []
        rows.append({
            "figure": f"chief + {many.get('k')} input workers (digits): all registered after",
            "value": fmt(many.get("workers_registered_secs"), "s"),
            "spread": (f"chief exit {many.get('chief_exit')}, workers exit 0: {sum(1 for c in exits if c == 0)}/"
                       f"{len(exits)}; {fmt(many.get('samples_per_sec'))} samples/s; "
                       f"{many.get('workers_that_delivered')} workers delivered"),
            "compared": (f"one input worker: RSS {fmt(_g(many, 'worker_rss_mb', 'median'))} MB, "
                         f"PSS {fmt(_g(many, 'worker_pss_mb', 'median'))} MB, "
                         f"USS {fmt(_g(many, 'worker_uss_mb', 'median'))} MB (medians)")})
    return rows


def _rows_shardplan(r: dict) -> list[Row]:
    return [
        {"figure": f"shard plan: {fmt(r.get('files'))} files onto {fmt(r.get('workers'))} workers",
         "value": fmt(_g(r, "plan_s", "median"), "s"),
         "spread": (f"min {fmt(_g(r, 'plan_s', 'min'), 's')}, max {fmt(_g(r, 'plan_s', 'max'), 's')}, "
                    f"n={r.get('repeats')}"),
         "compared": (f"textbook heap LPT {fmt(r.get('reference_heap_lpt_s'), 's')}"
                      if r.get("reference_heap_lpt_s") is not None else "requirement < 2 s")},
        {"figure": "shard plan imbalance (max / mean worker bytes)", "value": fmt(r.get("imbalance"), digits=6),
         "spread": f"max / lower bound {fmt(r.get('max_over_lower_bound'), digits=6)}",
         "compared": "1.0 is perfect balance"},
    ]


def _rows_verify(r: dict) -> list[Row]:
    rows = []
    runs = r.get("runs") or r.get("results") or r.get("layouts")
    items: list[tuple[str, Mapping]] = []
    if isinstance(runs, Mapping):
        items = [(str(k), v) for k, v in runs.items() if isinstance(v, Mapping)]
    elif isinstance(runs, list):
        for v in runs:
            if isinstance(v, Mapping):
                label = (v.get("name") or v.get("label")
                         or f"{v.get('worker_nodes', v.get('nodes', '?'))} worker node(s)")
                items.append((str(label), v))
    for label, v in items:
        err = v.get("error_pct", _g(v, "error_pct", "median"))
        if isinstance(err, Mapping):
            err = err.get("median")
        pred = v.get("predicted_samples_per_sec")
        meas = v.get("measured_samples_per_sec")
        if isinstance(meas, Mapping):
            meas = meas.get("median")
        err_sp = v.get("error_pct") if isinstance(v.get("error_pct"), Mapping) else None
        err_iqr = f"; error {_iqr_text(err_sp, '%')}" if err_sp and err_sp.get("n", 0) > 1 else ""
        rows.append({"figure": f"prediction error, {label}",
                     "value": fmt(err, "%") if err is not None else ("error" if v.get("error") else "—"),
                     "spread": (f"predicted {fmt(pred, 'samples/s')}, measured {fmt(meas, 'samples/s')} (median)"
                                f"{err_iqr}" if not v.get("error") else str(v.get("error"))[:120]),
                     "compared": "cs_input_analyzer verify: predicted vs measured"})
    if not rows:
        rows = _rows_generic(r)
    return rows


def _rows_requeue(r: dict) -> list[Row]:
    rows = []
    what = {"warning": "warning signal (SIGUSR2, as --signal sends)",
            "scontrol_requeue": "scontrol requeue (SIGTERM, KillWait 5 s)",
            "no_hook": "scontrol requeue without csrun's stop hook (checkpoint_steps 100)"}
    for way, s in (r.get("summary") or {}).items():
        rows.append({"figure": f"signal → resumed first step, {what.get(way, way)}",
                     "value": fmt(_g(s, "resume_s", "median"), "s"),
                     "spread": (f"stop {fmt(_g(s, 'stop_s', 'median'), 's')}, requeue wait "
                                f"{fmt(_g(s, 'requeue_wait_s', 'median'), 's')}, start-up "
                                f"{fmt(_g(s, 'startup_s', 'median'), 's')} (medians, n={_g(s, 'resume_s', 'n')})"),
                     "compared": str(r.get("slurm_settings", ""))})
        rows.append({"figure": f"steps lost per requeue, {what.get(way, way)}",
                     "value": fmt(_g(s, "lost_steps", "median"), "steps"),
                     "spread": _iqr_text(s.get("lost_steps") or {}, "steps"),
                     "compared": f"interrupted after {r.get('interrupt_after_steps')} of {r.get('max_steps')} steps"})
    return rows


def _rows_interrupt(r: dict) -> list[Row]:
    rows = []
    for way, s in (r.get("summary") or {}).items():
        rows.append({"figure": f"queue empty after {way.replace('_', ' ')}",
                     "value": fmt(_g(s, "empty_queue_s", "median"), "s"),
                     "spread": f"max {fmt(s.get('max_empty_queue_s'), 's')}, exit status {s.get('exit_statuses')}",
                     "compared": str(r.get("command", ""))})
    return rows


def _rows_quiet(r: dict) -> list[Row]:
    return [{"figure": "non-csrun log lines of the 7-task main job, default (TF_CPP_MIN_LOG_LEVEL=1)",
             "value": fmt(_g(r, "quiet_lines", "median"), "lines"),
             "spread": f"--verbose: {fmt(_g(r, 'verbose_lines', 'median'), 'lines')} (n={r.get('pairs')} pairs)",
             "compared": "same job with --verbose (every C++ line: the tasks' output before issue 11)"}]


def _rows_autoscale(r: dict) -> list[Row]:
    rows = []
    s = r.get("summary") or {}
    steady = r.get("steady_samples_per_sec")
    what = {"fixed4": "fixed 4 workers", "rate": "autoscale from 1, rate policy (AutoScaler estimate)",
            "step": "autoscale from 1, ±1 per window (Cachew-style)"}
    for name, f in s.items():
        rows.append({"figure": f"{what.get(name, name)}: time to 95 % of the steady rate",
                     "value": fmt(_g(f, "reach95_s", "median"), "s"),
                     "spread": (f"worker-seconds {fmt(_g(f, 'worker_seconds', 'median'))}, "
                                f"{fmt(_g(f, 'samples_per_worker_second', 'median'))} samples per worker-second, "
                                f"final workers {fmt(_g(f, 'final_workers', 'median'))} "
                                f"(medians, n={_g(f, 'train_s', 'n')})"),
                     "compared": f"steady rate {fmt(steady, 'samples/s')} (fixed 4 workers' windows)"})
    return rows


def _rows_chief_input(r: dict) -> list[Row]:
    s = r.get("summary") or {}
    med = {k: _g(s, k, "median") for k in ("tasks", "chief_input", "producers")}
    n = _g(s, "tasks", "n")
    return [
        {"figure": "--chief-input-cpus 1 / chief + 1 worker task, delivered samples/s (GIL-bound, 1 node × 2 CPUs)",
         "value": fmt(r.get("chief_input_over_tasks"), "×"),
         "spread": (f"chief input {fmt(med['chief_input'], 'samples/s')}, tasks only {fmt(med['tasks'], 'samples/s')} "
                    f"(medians, n={n})"),
         "compared": "same node and layout without the chief's input worker"},
        {"figure": "delivered / two producer processes: tasks only → with --chief-input-cpus 1",
         "value": f"{fmt(r.get('tasks_over_producers'))} → {fmt(r.get('chief_input_over_producers'))}",
         "spread": f"producers {fmt(med['producers'], 'samples/s')} (median, n={_g(s, 'producers', 'n')})",
         "compared": "2 processes iterating input_fn on the host, no Slurm, no training"},
    ]


def _rows_ingest_dataplane(r: dict) -> list[Row]:
    rows = []
    for k, by_k in (r.get("ceiling") or {}).items():
        for size, cell in (by_k.get("sizes") or {}).items():
            dp, raw, svc = (cell.get(n) or {} for n in ("data plane (zmq)", "raw TCP", "service"))
            if "mb_per_sec" not in dp:
                continue
            ratio = (cell.get("data plane / raw TCP") or {}).get("median_ratio")
            rows.append({"figure": f"data plane ingest, {size} batches, {k}", "value": fmt(dp["mb_per_sec"], "MB/s"),
                         "spread": (f"{fmt(ratio)} of raw TCP (median of pair ratios); chief "
                                    f"{fmt(dp.get('chief_cpu_s_per_mb'))} CPU-s/MB"),
                         "compared": (f"raw TCP {fmt(raw.get('mb_per_sec'), 'MB/s')}, "
                                      f"tf.data service {fmt(svc.get('mb_per_sec'), 'MB/s')}")})
    return rows


def _rows_ingest_gap(r: dict) -> list[Row]:
    """bench_ingest_gap.py: per k and element size of its all-variants run, the data plane's
    share of raw TCP beside zmq bare and the data plane sending pre-stacked bundles."""
    run = (r.get("runs") or {}).get("all_variants") or r
    rows = []
    for k, by_k in (run.get("results") or {}).items():
        for size, cell in by_k.items():
            ratio = {v: (cell.get(v) or {}).get("vs_raw_tcp") for v in ("data plane", "zmq bare",
                                                                         "data plane, pre-stacked")}
            us = ((run.get("framing_only") or {}).get(size) or {}).get("us_per_bundle")
            rows.append({"figure": f"data plane gap, {size} batches, {k}: share of raw TCP",
                         "value": fmt(ratio["data plane"]),
                         "spread": (f"zmq bare {fmt(ratio['zmq bare'])}, data plane pre-stacked "
                                    f"{fmt(ratio['data plane, pre-stacked'])}"),
                         "compared": f"framing only {fmt(us, 'µs')} per bundle"})
    return rows


def _rows_ingest_shm(r: dict) -> list[Row]:
    """bench_ingest_gap.py's shared-memory rows (issue 43, item 4): per k and element size, GB/s
    into the chief through the ring beside TCP, and the chief's core-s per GB on each path."""
    def gbs(cell: dict, v: str) -> Any:
        x = (cell.get(v) or {}).get("mb_per_sec")
        return None if x is None else fmt(x / 1000, "GB/s")

    def cost(cell: dict, v: str) -> Any:  # CPU-s per MB (recorded to 5 decimals) x 1000: core-s per GB
        x = (cell.get(v) or {}).get("chief_cpu_s_per_mb")
        return None if x is None else "< 0.01" if x == 0 else fmt(x * 1000)

    rows = []
    for k, by_k in (r.get("results") or {}).items():
        for size, c in by_k.items():
            rows.append({"figure": f"co-located worker, {size} batches, {k}: GB/s into the chief, shared memory",
                         "value": gbs(c, "shared memory"),
                         "spread": (f"chief {cost(c, 'shared memory')} core-s/GB (TCP {cost(c, 'data plane')}, "
                                    f"TCP copied out {cost(c, 'data plane, copied out')})"),
                         "compared": (f"TCP {gbs(c, 'data plane')}, copied out {gbs(c, 'data plane, copied out')}, "
                                      f"raw TCP {gbs(c, 'raw TCP')}")})
    return rows


def _rows_fanin(r: dict) -> list[Row]:
    rows = []
    for key, cell in (r.get("fanin") or {}).items():
        dp, pp = cell.get("dataplane") or {}, cell.get("zmq PUSH/PULL") or {}
        if "mb_per_sec" not in dp:
            rows.append({"figure": f"data plane fan-in, {key.split('=')[-1]} senders", "value": "error",
                         "spread": str(dp.get("error"))[:160], "compared": ""})
            continue
        rows.append({"figure": f"data plane fan-in, {key.split('=')[-1]} senders: MB/s through one receiver",
                     "value": fmt(dp["mb_per_sec"], "MB/s"),
                     "spread": (f"chief {fmt(dp.get('chief_cpu_s_per_mb'))} CPU-s/MB, "
                                f"RSS {fmt(dp.get('chief_rss_mb'))} MB, "
                                f"all connected in {fmt(dp.get('connect_s'), 's')}"),
                     "compared": f"zmq PUSH/PULL {fmt(pp.get('mb_per_sec'), 'MB/s')}"})
    t = r.get("targets") or {}
    for name, v in t.items():
        rows.append({"figure": f"target {name}", "value": "met" if v.get("met") else "not met",
                     "spread": ", ".join(f"{k} {fmt(x)}" for k, x in v.items() if k != "met"), "compared": ""})
    return rows


def _rows_generic(r: dict) -> list[Row]:
    rows = []
    for k, v in r.items():
        if k in ("meta", "machine") or isinstance(v, (dict, list)) or isinstance(v, bool):
            continue
        if isinstance(v, (int, float)):
            rows.append({"figure": k, "value": fmt(v), "spread": "", "compared": ""})
    return rows[:8]


SUMMARIZERS: dict[str, Callable[[dict], list[Row]]] = {
    "launch": _rows_launch, "startup": _rows_startup, "recommend": _rows_recommend,
    "verify": _rows_verify, "streaming": _rows_streaming, "shardplan": _rows_shardplan,
    "requeue": _rows_requeue, "interrupt": _rows_interrupt, "quiet": _rows_quiet,
    "ingest": _rows_ingest, "autoscale": _rows_autoscale, "chief_input": _rows_chief_input,
    "fanin": _rows_fanin, "ingest_dataplane": _rows_ingest_dataplane, "ingest_gap": _rows_ingest_gap,
    "ingest_shm": _rows_ingest_shm,
    "streaming_frameworks": _rows_streaming, "verify_frameworks": _rows_verify,
}

#: Table order (numbers of the issue's list).
ORDER = ["launch", "startup", "recommend", "verify", "verify_frameworks", "streaming", "streaming_frameworks",
         "ingest", "shardplan", "requeue", "interrupt", "quiet", "autoscale", "chief_input", "fanin"]


def load_results(results_dir: Path) -> dict[str, dict]:
    """Every ``*.json`` of ``results_dir`` (not recursive) by file stem; a file that does
    not parse is kept as ``{"error": "unreadable: ..."}``."""
    out: dict[str, dict] = {}
    for p in sorted(Path(results_dir).glob("*.json")):
        try:
            data = json.loads(p.read_text())
            out[p.stem] = data if isinstance(data, dict) else {"error": "not a JSON object"}
        except (OSError, ValueError) as exc:
            out[p.stem] = {"error": f"unreadable: {exc}"}
    return out


def _sort_key(stem: str) -> tuple:
    base = stem[:-len("_quick")] if stem.endswith("_quick") else stem
    return (ORDER.index(base) if base in ORDER else len(ORDER), stem)


def summary_rows(results: Mapping[str, dict]) -> list[dict]:
    """Table rows from the result dicts by name: each row ``{"benchmark", "figure",
    "value", "spread", "compared", "mode", "date"}``. A result with ``error`` gives one
    error row; a summarizer that fails on an unexpected shape falls back to the result's
    numeric top-level values."""
    rows = []
    for stem in sorted(results, key=_sort_key):
        r = results[stem]
        base = stem[:-len("_quick")] if stem.endswith("_quick") else stem
        meta = r.get("meta") or {}
        quick = meta.get("quick", stem.endswith("_quick"))
        date = str(meta.get("date") or r.get("when") or "")[:10]
        mode = "quick" if quick else "full"
        if r.get("error"):
            got = [{"figure": "(benchmark failed)", "value": "error", "spread": str(r["error"])[:160],
                    "compared": ""}]
        else:
            try:
                got = SUMMARIZERS.get(base, _rows_generic)(r)
            except Exception as exc:  # noqa: BLE001 - a result of an older shape
                got = _rows_generic(r) or [{"figure": "(unreadable result)", "value": "—",
                                            "spread": f"{type(exc).__name__}: {exc}"[:160], "compared": ""}]
        for g in got:
            rows.append({"benchmark": stem, "mode": mode, "date": date, **g})
    return rows


def _cell(s: Any) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def render_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """A Markdown table of :func:`summary_rows` rows."""
    head = "| benchmark | figure | value | spread / detail | compared with | mode | date |"
    sep = "|---|---|---:|---|---|---|---|"
    lines = [head, sep]
    for r in rows:
        lines.append("| " + " | ".join(_cell(r.get(k, "")) for k in
                                        ("benchmark", "figure", "value", "spread", "compared", "mode", "date")) + " |")
    if not rows:
        lines.append("| (no results) | | | | | | |")
    return "\n".join(lines)


def machine_line(results: Mapping[str, dict]) -> str:
    """One sentence naming the machine(s) the results came from (cores, pinned or not,
    versions), from the results' metadata."""
    seen = []
    for r in results.values():
        m = r.get("meta")
        if not m or not m.get("host_cores"):  # a result written without bench/run.py's metadata
            continue
        c = m.get("cluster") or {}
        v = m.get("versions") or {}
        pinned = "pinned to disjoint cores" if m.get("pinned") else "NOT pinned (all nodes share the host cores)"
        where = (f"test cluster of {c.get('nodes')} nodes × {c.get('node_cpus')} CPUs, nodes {pinned}"
                 if c.get("nodes") else "local processes (no test cluster)")
        s = (f"{m.get('host_cores')} host cores ({m.get('processor')}), {where}; "
             f"Python {v.get('python')}, TensorFlow {v.get('tensorflow')}"
             + (f", {v.get('slurm')}" if v.get("slurm") else ""))
        if s not in seen:
            seen.append(s)
    loads = [float(x[0]) for r in results.values() for x in ((r.get("meta") or {}).get("loadavg"),
                                                              (r.get("meta") or {}).get("loadavg_end")) if x]
    text = "; ".join(seen) if seen else "no metadata in the result files"
    if loads:
        text += (f"; 1-min load average {min(loads):.1f}–{max(loads):.1f} at the benchmarks' starts and ends "
                 f"(other jobs shared the machine)")
    return text


def generated_section(results: Mapping[str, dict], results_dir: str = "bench/results") -> str:
    """The text between the table markers: provenance line, the machine and the table."""
    return "\n".join([
        TABLE_START,
        f"<!-- generated by `python bench/run.py` from {results_dir}/*.json; do not edit by hand -->",
        "",
        f"Machine: {machine_line(results)}.",
        "",
        render_table(summary_rows(results)),
        TABLE_END,
    ])


def update_markdown(path: Path, section: str) -> None:
    """Replace the text between :data:`TABLE_START` and :data:`TABLE_END` in ``path`` with
    ``section`` (which includes the markers); append it when the markers are missing;
    create the file when it does not exist."""
    path = Path(path)
    text = path.read_text() if path.exists() else "# Benchmarks\n\n"
    if TABLE_START in text and TABLE_END in text and text.index(TABLE_START) < text.index(TABLE_END):
        a = text.index(TABLE_START)
        b = text.index(TABLE_END) + len(TABLE_END)
        text = text[:a] + section + text[b:]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    atomic.write_text(path, text)
