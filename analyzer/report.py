"""The analyzer's report: text, JSON, CSV and a PNG plot, all in the output directory.

Files (``out`` is the output directory, default ``<model_dir>/input_analysis/``):

* ``report.txt`` — the text report (also printed), in the original cs_input_analyzer's
  spirit: recommended nodes, tasks_per_node, cpus_per_task, the estimated input throughput,
  ending with the exact ``csrun_wse`` command;
* ``report.json`` — everything: ``"recommendation": {"nodes", "tasks_per_node",
  "cpus_per_task", "chief_input_cpus", "predicted_samples_per_sec", "interval": [lo, hi], ...}`` (read by
  ``cs_input_analyzer shard-plan --from-report``), every probe, the fitted model, the
  bottleneck class, the target and its source;
* ``probes.csv`` — the probe table (:data:`analyzer.model.PROBE_COLUMNS`);
* ``throughput.png`` — node throughput against tasks per node, one line per CPUs per task
  (measured points with their spread, the model dashed), the chosen layout starred; and
  the predicted rate against nodes for the chosen tasks × CPUs with the target.
"""
from __future__ import annotations

import math
import os
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from csrun_common import atomic
from csrun_common.layout import LayoutSpec, flag
from csrun_runtime.probing import DEFAULT_FRAMEWORK, facts
from csrun_runtime.registry import facts as backend_facts
from csrun_runtime.registry import launchers
from launcher.config import KEY_FLAGS

REPORT_JSON, REPORT_TXT, PROBES_CSV, PLOT_PNG = "report.json", "report.txt", "probes.csv", "throughput.png"

_MODE_FLAGS = ("--validate_only", "--compile_only")


def train_command(command: Sequence[str], framework: str = DEFAULT_FRAMEWORK) -> list[str]:
    """The user's command as a training command for csrun_wse: the first word (``python``,
    a python path, a launcher word) becomes ``framework``'s launcher word
    (:func:`csrun_runtime.registry.launchers`: ``python-ws``, ``python-pt`` for
    ``framework="pytorch"``); ``--mode X`` / ``--mode=X`` becomes
    ``--mode train`` and ``--validate_only`` / ``--compile_only`` are dropped (``--mode
    train`` is added when no mode was given)."""
    words = list(command)
    if not words:
        return words
    launcher = backend_facts(framework).launcher
    out = [launcher] if _is_python(words[0]) else [words[0]]
    rest = words[1:]
    i, has_mode = 0, False
    while i < len(rest):
        w = rest[i]
        if w == "--mode" and i + 1 < len(rest):
            out += ["--mode", "train"]
            has_mode = True
            i += 2
            continue
        if w.startswith("--mode="):
            out.append("--mode=train")
            has_mode = True
        elif w in _MODE_FLAGS:
            pass
        else:
            out.append(w)
        i += 1
    if not has_mode:
        out += ["--mode", "train"]
    return out


def _is_python(word: str) -> bool:
    base = os.path.basename(word)
    return base.startswith("python") or base in launchers().values()


def csrun_wse_command(rec: dict[str, Any], command: Sequence[str], mount_dirs: str | None = None,
                      shard_plan: str | None = None, framework: str = DEFAULT_FRAMEWORK) -> str:
    """The exact csrun_wse line for recommendation ``rec`` and the user's ``command``
    (the chief's input CPUs ``L`` when the recommendation gives the chief's task an input worker
    of ``L`` CPUs; ``python-pt`` for ``framework="pytorch"``). The layout's flags:
    :meth:`csrun_common.layout.LayoutSpec.to_flags`."""
    words = ["csrun_wse", *LayoutSpec.from_record(rec).to_flags()]
    if mount_dirs:
        words += [KEY_FLAGS["mount_dirs"].flag, mount_dirs]
    if shard_plan:
        words += ["--shard-plan", shard_plan]
    return shlex.join(words + train_command(command, framework))


def _fmt_rate(x: Any) -> str:
    try:
        x = float(x)
    except (TypeError, ValueError):
        return "n/a"
    if math.isnan(x):
        return "n/a"
    return f"{x:,.0f}"


def render_text(report: dict[str, Any]) -> str:
    """The text report of a ``report.json`` dict: a warning naming the disturbed probes first
    (:func:`warning_lines`), the header, the recommendation with the target's verdict, the
    bottleneck's evidence, the fitted model, the probe table, the next best layouts, the
    notes and the ``csrun_wse`` command to run."""
    rec = report.get("recommendation") or {}
    lines = warning_lines(report) + ["cs_input_analyzer report", "========================", ""]
    lines += _header_lines(report) + [""]
    if not rec:
        lines.append("No recommendation: " + (report.get("error") or "no successful probe"))
        return "\n".join(lines + _notes(report)) + "\n"
    lines += _recommendation_lines(rec) + _target_lines(report, rec)
    lines += _bottleneck_lines(report) + _model_lines(report.get("model") or {}) + _probe_lines(report)
    lines += _alternative_lines(rec) + _notes(report)
    lines += ["", "Files: " + ", ".join([REPORT_JSON, PROBES_CSV, PLOT_PNG, REPORT_TXT])
              + f" in {report.get('output_dir', '.')}", "",
              "Run it with:", f"  {report.get('csrun_wse_command', '')}"]
    return "\n".join(lines + _dataloader_how(rec)) + "\n"


def _dataloader_how(rec: dict[str, Any]) -> list[str]:
    """How to set the recommended DataLoader ``num_workers`` (a PyTorch report; else ``[]``):
    the runtime's params take no override of ``train_input`` on the command line."""
    k = rec.get("dataloader_workers")
    if k is None:
        return []
    return [f"  with train_input.num_workers: {k} in the params YAML (the DataLoader's worker processes per "
            f"input worker; the command line has no override for it)"]


def warning_lines(report: dict[str, Any]) -> list[str]:
    """The lines that lead the text report when probes stayed disturbed (``report["disturbed"]``:
    :func:`analyzer.probe_plan.disturbed`): one per probe kind and ``T×C`` with the cores
    other processes kept busy and whether it was measured again (the planner does so once,
    budget permitting; docs/ANALYZER.md), then a blank line. ``[]`` when none was."""
    dist = report.get("disturbed") or []
    if not dist:
        return []
    lines = ["WARNING: disturbed measurements: other processes kept the probe node's CPUs busy while these",
             "  probes ran, and no undisturbed measurement of them was made:"]
    for d in dist:
        lines.append(f"  - {d.get('kind', 'pipeline')} {d['tasks']}×{d['cpus_per_task']}: {_load_clause(d)}; "
                     + _again_clause(d, report.get("stopped")))
    lines += ["  The rates, the bottleneck and the recommendation below rest on these figures: rerun on a quiet",
              "  node (nothing else running on it) before relying on them.", ""]
    return lines


def _load_clause(d: dict[str, Any]) -> str:
    lo, hi, n = d.get("other_cores_busy_min"), d.get("other_cores_busy_max"), d.get("node_cpus")
    of = f" of the {n} CPUs" if n else " CPUs"
    if not _finite(lo) or not _finite(hi):
        return "other processes kept CPUs busy"
    lo, hi = float(lo), float(hi)  # type: ignore[arg-type]  # _finite: numbers
    load = f"{lo:.2f}" if abs(hi - lo) < 0.005 else f"{lo:.2f}–{hi:.2f}"
    return f"other processes kept {load}{of} busy"


def _again_clause(d: dict[str, Any], stopped: Any) -> str:
    if int(d.get("probes") or 1) >= 2:
        return f"measured {d['probes']} times, disturbed every time"
    if stopped == "budget":
        return "not measured again: the time budget ran out (a larger --time-budget measures it again)"
    return "not measured again"


def _header_lines(report: dict[str, Any]) -> list[str]:
    where = report.get("probed_on") or {}
    probes = report.get("probes", [])
    fw = facts(report.get("framework")).input_note
    return [f"Input function: {report.get('run_py')} {' '.join(report.get('argv', []))}{fw}",
            f"Probed on {where.get('node', '?')} ({report.get('node_cpus')} CPUs"
            f"{', local' if report.get('local') else ''}) for {report.get('probing_s', 0):.0f} s: "
            f"{sum(1 for p in probes if p.get('status') == 'ok')} probe(s) ok, "
            f"{sum(1 for p in probes if p.get('status') not in ('ok', 'invalid'))} failed"
            + (f", {invalid} invalid (a DataLoader num_workers its data function cannot build at)"
               if (invalid := sum(1 for p in probes if p.get("status") == "invalid")) else "")
            + (f", {busy} disturbed by other processes" if (busy := sum(1 for p in probes if p.get("status") == "ok"
                                                                        and _contended(p))) else "")]


def _contended(probe: dict[str, Any]) -> bool:
    """The probe row's ``contended`` flag (a bool, or a string read back from probes.csv)."""
    return str(probe.get("contended")).strip().lower() in ("true", "1", "1.0")


def _recommendation_lines(rec: dict[str, Any]) -> list[str]:
    lo, hi = rec["interval"]
    return [
        "Recommended Slurm settings for csrun_wse:",
        f"  nodes:          {rec['nodes']}",
        *_rank_lines(rec),
        f"  tasks_per_node: {rec['tasks_per_node']}",
        f"  cpus_per_task:  {rec['cpus_per_task']}",
        *_dataloader_line(rec),
        f"Estimated input throughput: {_fmt_rate(rec['predicted_samples_per_sec'])} samples/s "
        f"(interval {_fmt_rate(lo)} – {_fmt_rate(hi)})" + _per_rank_clause(rec) + f", {workers_text(rec)}"
        + _chief_input_clause(rec) + f", limited by {rec.get('limited_by', '?')}",
        f"Why this layout: {rec.get('reason', '')}",
    ]


def _world(rec: dict[str, Any]) -> int:
    """The trainer ranks of a recommendation or prediction (1: one chief)."""
    return int(rec.get("chief_nodes") or 1) * int(rec.get("chief_tasks_per_node") or 1)


def workers_text(rec: dict[str, Any]) -> str:
    """The input workers of a recommendation or prediction ``rec``: ``"8 input worker(s)"``; with
    several trainer ranks per rank and in total, ``"8 input workers, 2 per rank × 4 ranks"``."""
    w, world = int(rec.get("input_workers") or 0), _world(rec)
    if world == 1:
        return f"{w} input worker(s)"
    return f"{w} input workers, {w // world} per rank × {world} ranks"


def _rank_lines(rec: dict[str, Any]) -> list[str]:
    """The chief's nodes of several trainer ranks (``[]`` with one chief)."""
    world = _world(rec)
    if world == 1:
        return []
    cn, r = int(rec["chief_nodes"]), int(rec["chief_tasks_per_node"])
    return [f"  chief nodes:    {cn} × {r} trainer rank(s) = world size {world} (ranks only; the input workers "
            f"run on the other {int(rec['nodes']) - cn} node(s))"]


def _per_rank_clause(rec: dict[str, Any]) -> str:
    """``" for the 4 ranks, 1,000 per rank (slowest)"``: the world's rate per rank (``""`` with
    one chief). Each rank receives its own workers' rate; the ranks step together, so the world
    takes the slowest rank's times the world size."""
    world = _world(rec)
    if world == 1:
        return ""
    per = [float(x) for x in rec.get("per_rank_samples_per_sec") or []]
    slowest = f"; slowest rank {per.index(min(per))}" if per and max(per) > min(per) * 1.001 else ""
    return (f" for the {world} ranks, {_fmt_rate(float(rec['predicted_samples_per_sec']) / world)} per rank"
            + slowest)


def _dataloader_line(rec: dict[str, Any]) -> list[str]:
    """The DataLoader ``num_workers`` line of a PyTorch recommendation (else ``[]``)."""
    dl = rec.get("dataloader") or {}
    if rec.get("dataloader_workers") is None:
        return []
    how = (f"best measured at {dl.get('measured_at_cpus')} CPU(s) per task" if dl.get("how") == "measured" else
           f"scaled from the best measured at {dl.get('measured_at_cpus')} CPU(s) per task")
    return [f"  DataLoader num_workers (train_input.num_workers): {rec['dataloader_workers']} ({how})"]


def _chief_input_clause(rec: dict[str, Any]) -> str:
    """``", input worker 0 in the chief's task on L CPU(s)"`` when ``rec`` has
    ``chief_input_cpus`` L > 0, else ``""``."""
    cpus = rec.get("chief_input_cpus")
    return f", input worker 0 in the chief's task on {cpus} CPU(s)" if cpus else ""


def _target_lines(report: dict[str, Any], rec: dict[str, Any]) -> list[str]:
    tgt = report.get("target") or {}
    if not tgt.get("samples_per_sec"):
        return [f"Target: none ({tgt.get('source', 'not given')}): best layout for "
                f"{report.get('available_nodes')} available node(s)"
                + (f" and {tgt['world_size']} trainer ranks" if int(tgt.get("world_size") or 1) > 1 else "")]
    state = rec.get("input_starved")
    verdict = {True: "the accelerator WOULD BE INPUT-STARVED at this rate",
               "at risk": "the prediction meets it but its interval's low end does not: "
                          "the accelerator may be input-starved at times",
               False: "met: the accelerator would not be input-starved"}.get(state, "")
    world = int(tgt.get("world_size") or 1)
    per_rank = (f" for {world} trainer ranks ({_fmt_rate(tgt.get('per_rank_samples_per_sec'))} per rank × {world})"
                if world > 1 else "")
    lines = [f"Target: {_fmt_rate(tgt['samples_per_sec'])} samples/s{per_rank} ({tgt.get('source', '')}): {verdict}"]
    if state is True:
        lines.append(f"  best for {report.get('available_nodes')} available node(s): "
                     f"{_fmt_rate(rec.get('best_available_samples_per_sec'))} samples/s")
    return lines


def _bottleneck_lines(report: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    b = report.get("bottleneck") or {}
    if b:
        lines += ["", f"Bottleneck: {b.get('class')}"]
        lines += [f"  - {e}" for e in b.get("evidence", [])]
    ing = report.get("ingest") or {}
    if ing.get("samples_per_sec"):
        lines.append(f"  - the chief ingests up to {_fmt_rate(ing['samples_per_sec'])} samples/s from a "
                     f"tf.data service worker ({(ing.get('cpu_seconds_per_sample') or 0) * 1e3:.3f} CPU-ms per "
                     f"sample, both ends{'; CPU-bound' if ing.get('cpu_bound') else ''})")
    if ing.get("worker_hop_cpu_seconds_per_sample") is not None:
        via = facts(report.get("framework")).via
        lines.append(f"  - serving the real pipeline {via} costs an input worker "
                     f"{ing['worker_hop_cpu_seconds_per_sample'] * 1e3:.3f} CPU-ms per sample more and the "
                     f"chief {(ing.get('chief_cpu_seconds_per_sample') or 0) * 1e3:.3f} CPU-ms per sample")
    return lines


def _model_lines(m: dict[str, Any]) -> list[str]:
    if not m:
        return []
    io = m.get("io_cap")
    return ["", "Fitted node model: node_rate(T, C) = min(T·r1/((1-p)+p/C)/(1+σ(T-1)), n/k"
            + (", io_cap" if io else "") + ")",
            f"  r1 = {m['r1']:.1f} samples/s per task-CPU, p = {m['p']:.2f}, σ = {m['sigma']:.2f}, "
            f"k = {m['k'] * 1e3:.3f} CPU-ms/sample, n = {m['node_cpus']}"
            + (f", io_cap = {io:.0f} samples/s" if io else "")
            + f"; measurement spread ±{m['rel_spread'] * 100:.1f} % (1 sd), "
            f"fit residual {m['resid_rms'] * 100:.1f} %"]


def _probe_lines(report: dict[str, Any]) -> list[str]:
    lines = ["", "Probes (samples/s per node; tasks × CPUs per task):",
             f"  {'#':>3} {'kind':8} {'T×C':>6} {'status':8} {'samples/s':>10} {'cores':>6} "
             f"{'util':>5} {'MB/s read':>9}"]
    for p in report.get("probes", []):
        rd = p.get("read_bytes_per_sec")
        layout = f"{p['tasks']}×{p['cpus_per_task']}"
        dl = p.get("dataloader_workers")
        if dl is not None and _finite(dl):
            layout += f" w{int(dl)}"  # PyTorch: the DataLoader's num_workers
        error = p.get("error")
        lines.append(
            f"  {p.get('probe_id', ''):>3} {p.get('kind', ''):8} {layout:>6} "
            f"{p.get('status', ''):8} {_fmt_rate(p.get('samples_per_sec')):>10} "
            f"{_num(p.get('cpu_cores_used'), '.2f'):>6} {_num(_pct(p.get('cpu_util')), '.0f'):>4}% "
            f"{_num(rd / 1e6 if _finite(rd) else None, '.1f'):>9}"
            + (f"  {error[:90]}" if isinstance(error, str) and error else ""))
    return lines


def _alternative_lines(rec: dict[str, Any]) -> list[str]:
    if not rec.get("alternatives"):
        return []
    return ["", "Next best layouts:"] + [
        f"  {a['nodes']} node(s) × {a['tasks_per_node']} task(s) × {a['cpus_per_task']} CPU(s)"
        + (f", chief's input worker on {a['chief_input_cpus']} CPU(s)" if a.get("chief_input_cpus") else "")
        + (f", {workers_text(a)}" if _world(a) > 1 else "")
        + (f", DataLoader num_workers {a['dataloader_workers']}" if a.get("dataloader_workers") is not None else "")
        + f": {_fmt_rate(a['predicted_samples_per_sec'])} samples/s" for a in rec["alternatives"]]


def _notes(report: dict) -> list[str]:
    notes = report.get("notes") or []
    return (["", "Notes:"] + [f"  - {n}" for n in notes]) if notes else []


def _finite(x: Any) -> bool:
    try:
        return math.isfinite(float(x))
    except (TypeError, ValueError):
        return False


def _pct(x: Any) -> float | None:
    return float(x) * 100 if _finite(x) else None


def _num(x: Any, fmt: str) -> str:
    return format(float(x), fmt) if _finite(x) else "-"


def _clean(obj: Any) -> Any:
    """JSON-safe copy: NaN/inf → None, numpy scalars → Python."""
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items() if not str(k).startswith("_")}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if hasattr(obj, "item") and not isinstance(obj, (str, bytes)):
        try:
            obj = obj.item()
        except (ValueError, AttributeError):
            pass
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def write_probes_csv(out: Path, rows: list[dict[str, Any]]) -> Path:
    """Write the probe table to ``out/probes.csv`` atomically (columns
    :data:`analyzer.model.PROBE_COLUMNS`); returns its path."""
    # pandas and the model module (numpy) are imported here, not at the CLI's start-up.
    import pandas as pd

    # numpy + pandas (the model): when a report is written, not at the CLI's start-up.
    from .model import PROBE_COLUMNS

    df = pd.DataFrame([{k: r.get(k) for k in PROBE_COLUMNS} for r in rows], columns=PROBE_COLUMNS)
    path = Path(out) / PROBES_CSV
    with atomic.atomic_open(path) as f:
        df.to_csv(f, index=False)
    return path


def write_json(out: Path, report: dict[str, Any]) -> Path:
    """Write ``report.json`` atomically (NaN and infinities as ``null``); returns its path."""
    return atomic.write_json(Path(out) / REPORT_JSON, _clean(report))


def write_text(out: Path, report: dict[str, Any]) -> str:
    """Render and write ``report.txt`` atomically; returns the text."""
    text = render_text(report)
    atomic.write_text(Path(out) / REPORT_TXT, text)
    return text


def plot(out: Path, report: dict[str, Any]) -> Path | None:
    """Write ``throughput.png`` (matplotlib, Agg): the node's throughput against tasks per node
    (:func:`_plot_node`) and the predicted rate against nodes (:func:`_plot_nodes_curve`);
    ``None`` when there is nothing to plot."""
    # matplotlib and pandas are imported here, not at the CLI's start-up.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    from .dataloader_plan import at_best

    # numpy + pandas (the model): when a report is written, not at the CLI's start-up.
    from .model import NodeModel

    # a DataLoader sweep's: each CPUs per task at its best num_workers, as the model was fitted
    probes = pd.DataFrame(at_best(list(report.get("probes") or [])))
    if probes.empty or report.get("model") is None:
        return None
    model = NodeModel.from_dict(report["model"])
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    _plot_node(axes[0], model, probes, report.get("recommendation") or {})
    _plot_nodes_curve(axes[1], report)
    fig.tight_layout()
    path = Path(out) / PLOT_PNG
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _plot_node(ax: Any, model: Any, probes: Any, rec: dict[str, Any]) -> None:
    """The left panel: one node's throughput (samples/s) against tasks per node, one colour per
    CPUs per task: the measured means with their spread, the model (``NodeModel``) dashed, the
    chosen layout ``rec`` starred."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    from .model import aggregate

    agg = aggregate(probes)
    n = model.node_cpus
    cs = sorted(set(agg["cpus_per_task"].astype(int)) | {1, n})
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    t_max = max([int(agg["tasks"].max()) if len(agg) else 1, n])
    for i, c in enumerate(cs):
        col = colors[i % len(colors)]
        ts = list(range(1, max(1, t_max // c if c > 1 else t_max) + 1))
        ax.plot(ts, [model.model_rate(t, c) for t in ts], "--", color=col, alpha=0.6)
        a = agg[agg["cpus_per_task"] == c]
        if len(a):
            ax.errorbar(a["tasks"], a["mean"], yerr=a["std"], fmt="o", color=col, capsize=3,
                        label=f"{c} CPU(s)/task (measured ± sd; model dashed)")
        else:
            ax.plot([], [], "--", color=col, label=f"{c} CPU(s)/task (model)")
    if rec:
        t, c = rec["tasks_per_node"], rec["cpus_per_task"]
        ax.plot([t], [model.node_rate(t, c)], marker="*", markersize=18, color="crimson", linestyle="none",
                label=f"chosen: {t} task(s) × {c} CPU(s)")
    ax.axvline(n, color="grey", linewidth=0.8, linestyle=":")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("tasks per node")
    ax.set_ylabel("node throughput (samples/s)")
    ax.set_title(f"One node ({n} CPUs): throughput vs tasks and CPUs per task")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)


def _plot_nodes_curve(ax: Any, report: dict[str, Any]) -> None:
    """The right panel: the rate delivered to the chief (samples/s) predicted against nodes for
    the chosen tasks × CPUs, its interval, the chosen point and the target (nothing without a
    ``nodes_curve``)."""
    from matplotlib.ticker import MaxNLocator

    curve = report.get("nodes_curve") or []
    if not curve:
        return
    rec = report.get("recommendation") or {}
    xs = [p["nodes"] for p in curve]
    ax.plot(xs, [p["predicted_samples_per_sec"] for p in curve], "o-", label="predicted")
    ax.fill_between(xs, [p["interval"][0] for p in curve], [p["interval"][1] for p in curve], alpha=0.2,
                    label="interval")
    if rec:
        ax.plot([rec["nodes"]], [rec["predicted_samples_per_sec"]], marker="*", markersize=18,
                color="crimson", linestyle="none", label="chosen")
    tgt = (report.get("target") or {}).get("samples_per_sec")
    if tgt:
        ax.axhline(tgt, color="black", linestyle="--", linewidth=1, label=f"target {tgt:,.0f}")
    ax.set_xlabel(f"nodes (csrun_wse {flag('nodes')})")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    world = _world(rec) if rec else 1
    ax.set_ylabel(f"delivered to the {world} ranks (samples/s)" if world > 1 else "delivered to the chief (samples/s)")
    if rec:
        ax.set_title(f"Layouts of {rec['tasks_per_node']} task(s) × {rec['cpus_per_task']} CPU(s)"
                     + (f", chief's input worker on {rec['chief_input_cpus']}" if rec.get("chief_input_cpus")
                        else ""))
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
