"""``cs_input_analyzer verify [--report DIR]``: check a prediction on the cluster.

Launches the recommended layout (or one given with csrun_wse's layout flags,
:data:`csrun_common.layout.LAYOUT_FLAGS`) with ``csrun_wse``, every task running
:mod:`analyzer.verify_task` on the report's run.py and params: the input workers serve the
input_fn exactly as in training (with the chief's input CPUs, input worker 0 in the chief's
task, as training runs it) and the chief only drains the stream for ``--seconds`` after a
``--warmup``. Prints predicted vs
measured samples/s and the error in % (``100 × (measured − predicted) / predicted``), and
writes ``verify.json`` (and appends to ``verify_history.jsonl``) in the report directory.
The drain's model_dir (rendezvous files) is ``<report dir>/verify/model_dir``: nothing else
of the user's is written.

The launch is a heterogeneous ``csrun_wse`` job, exactly what the user would run: it is not a
submitit job (submitit submits one sbatch script of one component, and verify measures
csrun_wse's own layout); :func:`launch_drain` runs it and stops it with
:func:`launcher.slurm.stop_process_group`.

Imports no TensorFlow/pandas at module level.
"""
from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from csrun_common import exits
from csrun_common.atomic import write_json
from csrun_common.errors import CsrunError
from csrun_common.flagspec import click_options
from csrun_common.layout import LAYOUT_FLAGS, RANK_FIELDS, LayoutSpec
from launcher.config import KEY_FLAGS
from launcher.slurm import stop_process_group

from .user_command import console_script

#: ``verify``'s ``[default: ...]`` of the layout flags: the recommendation's.
VERIFY_NOTES = {s.name: "the recommendation's" + ("" if s.name in ("nodes", "tasks_per_node", "cpus_per_task",
                                                                   *RANK_FIELDS)
                                                 else "; 0 when nodes, tasks or CPUs are given")
                for s in LAYOUT_FLAGS if s.type is not bool}

def find_report(report: str | None) -> Path:
    """The report directory: ``report`` (a directory or its ``report.json``), else
    ``./model_dir/input_analysis`` or ``./input_analysis``. Raises :class:`CsrunError`."""
    cands = [Path(report)] if report else [Path("model_dir/input_analysis"), Path("input_analysis")]
    for c in cands:
        if c.is_file() and c.name.endswith(".json"):
            return c.parent.resolve()
        if (c / "report.json").is_file():
            return c.resolve()
    if report:
        raise CsrunError(f"--report {report}: no report.json there (run cs_input_analyzer first)")
    raise CsrunError("--report: no report.json in ./model_dir/input_analysis or ./input_analysis; "
                        "give --report DIR")


def load_report(d: Path) -> dict[str, Any]:
    """``report.json`` of directory ``d``. Raises :class:`CsrunError` when unreadable or
    without a recommendation."""
    try:
        rep = json.loads((d / "report.json").read_text())
    except (OSError, ValueError) as exc:
        raise CsrunError(f"--report {d}: cannot read report.json ({exc})") from None
    if not rep.get("recommendation") or not rep.get("model"):
        raise CsrunError(f"--report {d}: the report has no recommendation "
                            f"({rep.get('error') or 'no successful probe'})")
    return rep


def predicted_for(rep: dict[str, Any], spec: LayoutSpec) -> dict[str, Any]:
    """The report model's prediction for the layout ``spec`` (the recommendation's own when it
    is that layout, ``cyclic`` aside): :func:`analyzer.recommend.predict_layout`'s dict
    (``predicted_samples_per_sec``, ``interval`` [low, high] in samples/s, ``limited_by``; with
    several trainer ranks the world's). Raises :class:`CsrunError` for a layout the model does
    not predict (the chief's input worker with several ranks)."""
    rec = rep["recommendation"]
    if spec.with_(cyclic=False) == LayoutSpec.from_record(rec).with_(cyclic=False):
        return rec
    # numpy (the model) only when another layout is asked for: not at the CLI's start-up.
    from .model import NodeModel
    from .recommend import predict_layout

    try:
        return predict_layout(NodeModel.from_dict(rep["model"]), spec, rep.get("ingest"), rep.get("topology"))
    except ValueError as exc:
        raise CsrunError(str(exc)) from None


def drain_command(rep: dict[str, Any], out_dir: Path, layout: Mapping[str, Any] | LayoutSpec, seconds: float,
                  warmup: float, mount_dirs: str | None) -> list[str]:
    """The ``csrun_wse ... python-ws -m analyzer.verify_task --framework tensorflow ...`` argv
    (the report's framework's launcher word, :func:`csrun_runtime.registry.launchers`; where its
    probes swept DataLoader workers, ``--dataloader-workers K``) for ``layout`` (a
    :class:`~csrun_common.layout.LayoutSpec`, or its record ``{"nodes", "tasks_per_node",
    "cpus_per_task", "single_task_nodes", "chief_input_cpus"}``, the last two optional); its
    flags: :meth:`~csrun_common.layout.LayoutSpec.to_flags`."""
    # the registry and the backend's facts (not its framework) only when verify runs
    from csrun_runtime.probing import facts, framework_of_report
    from csrun_runtime.registry import facts as backend_facts

    argv = [console_script("csrun_wse"), *LayoutSpec.from_record(layout).to_flags()]
    md = mount_dirs or rep.get("mount_dirs")
    if md:
        argv += [KEY_FLAGS["mount_dirs"].flag, md]
    user = _strip_model_dir(rep.get("argv") or [])
    fw = framework_of_report(rep.get("framework"), False)
    argv += [backend_facts(fw).launcher, "-m", "analyzer.verify_task", "--framework", fw]
    if facts(fw).dataloader_workers:  # the DataLoader count the report gives for the layout's C
        cpus = LayoutSpec.from_record(layout).record()["cpus_per_task"]
        argv += _dataloader_flag(rep, int(cpus))
    argv += ["--seconds", f"{seconds:g}", "--warmup", f"{warmup:g}",
             "--out", str(out_dir / "drain.json"), rep["run_py"], *user,
             "--model_dir", str(out_dir / "model_dir")]
    return argv


def _dataloader_flag(rep: dict[str, Any], cpus: int) -> list[str]:
    """``["--dataloader-workers", K]``: the report's DataLoader worker count for ``cpus`` CPUs per task
    (the recommendation's at its own C, else :func:`analyzer.dataloader_plan.workers_for` of
    the probes); ``[]`` when the report has none (the params' count is used)."""
    from .dataloader_plan import workers_for

    rec = rep.get("recommendation") or {}
    k = rec.get("dataloader_workers") if int(rec.get("cpus_per_task") or 0) == cpus else None
    if k is None:
        k = workers_for(list(rep.get("probes") or []), cpus).get("num_workers")
    return [] if k is None else ["--dataloader-workers", str(int(k))]


def _strip_model_dir(argv: list[str]) -> list[str]:
    # The runtime package (its __init__ loads the runner) only when verify runs: not at the
    # CLI's start-up.
    from csrun_runtime.params import drop_options

    return drop_options(argv, valued=("--model_dir", "-o"))


def verify_layout(rec: dict[str, Any], node_cpus: int, given: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The :meth:`~csrun_common.layout.LayoutSpec.record` of the layout verify launches: ``rec``'s
    with the layout flags ``given`` (field -> value; ``None``/``False``: not given); a given N, T
    or C drops S and L unless they are given too. Raises :class:`CsrunError` naming the flag
    (:meth:`~csrun_common.layout.LayoutSpec.check_node` on nodes of ``node_cpus`` CPUs)."""
    named = {k: v for k, v in (given or {}).items() if v is not None and v is not False}
    LayoutSpec.check_given(named)
    spec = LayoutSpec.from_record(rec)
    if any(named.get(k) for k in ("nodes", "tasks_per_node", "cpus_per_task")):
        spec = spec.with_(single_task_nodes=0, chief_input_cpus=0)
    return spec.with_(**named).check_node(node_cpus).record()


def result_paths(out_dir: Path, world_size: int) -> list[Path]:
    """The drain results verify waits for in ``out_dir``: ``drain.json``, or each trainer rank's
    ``drain.rank<r>.json`` (:func:`analyzer.verify_task.rank_out`)."""
    path = out_dir / "drain.json"
    if world_size <= 1:
        return [path]
    return [path.with_name(f"{path.stem}.rank{r}{path.suffix}") for r in range(world_size)]


def verify(report: str | None, seconds: float, warmup: float, given: Mapping[str, Any], timeout_s: float,
           mount_dirs: str | None) -> dict:
    """Run the check of the recommendation with the layout flags ``given`` (:func:`verify_layout`);
    returns the ``verify.json`` record (``predicted_samples_per_sec``,
    ``interval``, ``measured_samples_per_sec``, ``error_pct``, ``within_interval``, ``layout``,
    ``drain`` (the drain's JSON; with several trainer ranks :func:`merge_rank_drains` of the
    ranks'), ``exit_status``, ``wall_s``; with the chief's input worker also ``chief_input``
    (:func:`chief_input_measured`)). Raises :class:`CsrunError`."""
    d = find_report(report)
    rep = load_report(d)
    rec = rep["recommendation"]
    layout = verify_layout(rec, int(rep["model"]["node_cpus"]), given)
    spec = LayoutSpec.from_record(layout)
    pred = predicted_for(rep, spec)
    out_dir = d / "verify"
    out_dir.mkdir(parents=True, exist_ok=True)
    results = result_paths(out_dir, spec.world_size)
    for path in results:
        path.unlink(missing_ok=True)
    argv = drain_command(rep, out_dir, layout, seconds, warmup, mount_dirs)
    click.echo(f"cs_input_analyzer verify: {' '.join(argv)}", err=True)
    log_path = out_dir / "csrun_wse.log"
    launch = launch_drain(argv, rep.get("cwd") or os.getcwd(), log_path, results, timeout_s, grace_s=60.0)
    rc, wall = launch.exit_status, launch.wall_s
    drain_res = read_drains(results)
    p = float(pred["predicted_samples_per_sec"])
    lo, hi = pred["interval"]
    rec_out = {"report": str(d), "layout": layout, "predicted_samples_per_sec": p, "interval": [lo, hi],
               "limited_by": pred.get("limited_by"), "exit_status": rc, "wall_s": wall, "drain": drain_res,
               "command": argv, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    if drain_res.get("status") == "ok":
        m = float(drain_res["samples_per_sec"])
        rec_out.update({"measured_samples_per_sec": m, "error_pct": 100.0 * (m - p) / p if p else None,
                        "within_interval": lo <= m <= hi})
        if layout["chief_input_cpus"]:
            rec_out["chief_input"] = chief_input_measured(drain_res, pred)
    else:
        tail = log_path.read_text(errors="replace").strip().splitlines()[-8:] if log_path.exists() else []
        rec_out.update({"measured_samples_per_sec": None, "error_pct": None, "within_interval": None,
                        # no rank wrote a result: csrun_wse's own failure is the reason to show
                        "error": (drain_res.get("error") if any(r.exists() for r in results) else None)
                        or (f"csrun_wse exited {rc}" + (
                            " (timeout)" if rc == exits.TIMEOUT else ""))
                        + ("; log: " + " | ".join(tail) if tail else "")})
    write_json(d / "verify.json", rec_out)
    with open(d / "verify_history.jsonl", "a") as f:
        f.write(json.dumps(rec_out, default=str) + "\n")
    return rec_out


def read_drains(paths: Sequence[Path]) -> dict[str, Any]:
    """The drain's result from ``paths`` (:func:`result_paths`): the one file's JSON (``{}``
    when missing or unreadable), or with several trainer ranks :func:`merge_rank_drains` of
    theirs."""
    found: list[dict[str, Any] | None] = []
    for path in paths:
        try:
            found.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            found.append(None)
    if len(paths) == 1:
        return found[0] or {}
    return merge_rank_drains(found)


def merge_rank_drains(results: Sequence[dict[str, Any] | None]) -> dict[str, Any]:
    """The world's drain from each trainer rank's (``results[r]``; ``None``: rank ``r`` wrote
    none): rank 0's host figures, ``"ranks"`` (``[{"rank", "status", "samples_per_sec",
    "num_workers", "error"}]``), ``"world_size"``, and ``"status"`` ``"ok"`` only when every
    rank's is. Then ``"samples_per_sec"``, ``"samples"``, ``"batches"`` and ``"num_workers"``
    are the ranks' sums (the world's input), ``"window_s"`` the longest window,
    ``"startup_s"`` the latest first batch, ``"slowest_rank"`` the rank of the lowest rate and
    ``"batches_per_worker"`` keyed by the job-wide input-worker index (slot × world + rank,
    :func:`csrun_common.ranks.worker_rank`'s inverse); else ``"error"`` names each failed rank."""
    world = len(results)
    ranks = []
    for r, res in enumerate(results):
        res = res or {"status": "failed", "error": "no result written"}
        ranks.append({"rank": r, "status": res.get("status"), "samples_per_sec": res.get("samples_per_sec"),
                      "num_workers": res.get("num_workers"), "error": res.get("error")})
    out: dict[str, Any] = {**(results[0] or {}), "ranks": ranks, "world_size": world}
    failed = [x for x in ranks if x["status"] != "ok"]
    if failed:
        return {**out, "status": "failed",
                "error": "; ".join(f"rank {x['rank']}: {x['error'] or 'failed'}" for x in failed)}
    ok = [res for res in results if res is not None]
    rates = [float(res["samples_per_sec"]) for res in ok]
    per_worker = {str(int(slot) * world + r): n for r, res in enumerate(ok)
                  for slot, n in (res.get("batches_per_worker") or {}).items()}
    return {**out, "status": "ok", "samples_per_sec": sum(rates),
            "samples": sum(int(res.get("samples") or 0) for res in ok),
            "batches": sum(int(res.get("batches") or 0) for res in ok),
            "num_workers": sum(int(res.get("num_workers") or 0) for res in ok),
            "window_s": max(float(res.get("window_s") or 0.0) for res in ok),
            "startup_s": max(float(res.get("startup_s") or 0.0) for res in ok),
            "slowest_rank": rates.index(min(rates)), "batches_per_worker": per_worker}


def chief_input_measured(drain_res: dict[str, Any], pred: dict[str, Any]) -> dict[str, Any]:
    """Input worker 0's stream (the chief's own input worker) in a drain: ``{"batches",
    "share" (of the drained batches, a fraction), "measured_samples_per_sec" (the drain's
    samples/s × that share), "predicted_samples_per_sec"}``, the figures ``None`` when the
    drain counted no batch."""
    per = {str(k): int(v) for k, v in (drain_res.get("batches_per_worker") or {}).items()}
    total = sum(per.values())
    b0 = per.get("0", 0)
    share = b0 / total if total else None
    rate = drain_res.get("samples_per_sec")
    return {"batches": b0, "share": share,
            "measured_samples_per_sec": float(rate) * share if share is not None and rate is not None else None,
            "predicted_samples_per_sec": pred.get("chief_input_samples_per_sec")}


@dataclass(frozen=True)
class DrainLaunch:
    """How a drain launch ended: ``exit_status`` (csrun_wse's; 124 when the timeout stopped
    it), ``wall_s`` (seconds from start to end) and ``stopped_after_result`` (its tasks did
    not leave by themselves after the drain's result was written: it was stopped)."""

    exit_status: int
    wall_s: float
    stopped_after_result: bool


def launch_drain(argv: Sequence[str], cwd: str, log_path: Path, result_path: Path | Sequence[Path],
                 timeout_s: float, grace_s: float, env: Mapping[str, str] | None = None) -> DrainLaunch:
    """Run the ``csrun_wse`` line ``argv`` (:func:`drain_command`) in its own process group,
    its output in ``log_path``, and wait for it. Stop it (:func:`launcher.slurm.stop_process_group`:
    its srun step is cancelled) after ``timeout_s`` seconds, or ``grace_s`` seconds after
    ``result_path`` appeared (every one of them when several: each trainer rank's,
    :func:`result_paths`; a task that does not leave must not hold the check; seen: an
    input worker of a ``tf.py_function`` pipeline deadlocking in ``WorkerServer.Stop``).
    Used by :func:`verify` and the benchmarks."""
    paths = [result_path] if isinstance(result_path, Path) else list(result_path)
    t0 = time.monotonic()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(list(argv), stdout=log, stderr=subprocess.STDOUT, cwd=cwd, stdin=subprocess.DEVNULL,
                                env=dict(env) if env is not None else None, start_new_session=True)
        t_result: float | None = None
        while True:
            try:
                return DrainLaunch(proc.wait(timeout=0.5), time.monotonic() - t0, False)
            except subprocess.TimeoutExpired:
                pass
            now = time.monotonic()
            if t_result is None and all(p.exists() for p in paths):
                t_result = now
            timed_out = now > t0 + timeout_s
            if timed_out or (t_result is not None and now - t_result > grace_s):
                stop_process_group(proc, grace=15.0)
                rc = exits.TIMEOUT if timed_out else (proc.returncode if proc.returncode is not None else 0)
                return DrainLaunch(rc, time.monotonic() - t0, t_result is not None)


def render(res: dict[str, Any]) -> str:
    """The lines verify prints."""
    lay = res["layout"]
    lines = [f"layout: {lay['nodes']} node(s) × {lay['tasks_per_node']} task(s) × {lay['cpus_per_task']} CPU(s)"
             + (f", {lay['single_task_nodes']} single-task node(s)" if lay.get("single_task_nodes") else "")
             + (f", input worker 0 in the chief's task on {lay['chief_input_cpus']} CPU(s)"
                if lay.get("chief_input_cpus") else "")
             + (f", {lay['chief_nodes']} chief node(s) × {lay['chief_tasks_per_node']} trainer rank(s)"
                if lay.get("chief_nodes") else ""),
             f"predicted: {res['predicted_samples_per_sec']:,.0f} samples/s "
             f"(interval {res['interval'][0]:,.0f} – {res['interval'][1]:,.0f}; limited by {res.get('limited_by')})"]
    if res.get("measured_samples_per_sec") is not None:
        dr = res["drain"]
        lines += [f"measured:  {res['measured_samples_per_sec']:,.0f} samples/s over {dr['window_s']:.1f} s "
                  f"({dr.get('num_workers', 0)} input worker(s); "
                  f"first batch {dr.get('startup_s', 0):.0f} s after start)",
                  f"error:     {res['error_pct']:+.1f} %"
                  + ("" if res.get("within_interval") else " (outside the interval)")]
        lines += _rank_lines(dr)
        ci = res.get("chief_input") or {}
        if ci.get("measured_samples_per_sec") is not None:
            pred = ci.get("predicted_samples_per_sec")
            lines.append(f"chief's input worker 0: {ci['measured_samples_per_sec']:,.0f} samples/s "
                         f"({ci['share'] * 100:.0f} % of the batches"
                         + (f"; predicted {pred:,.0f}" if pred is not None else "") + ")")
        if dr.get("other_cores_busy") is not None:
            lines.append(f"host CPU:  this job {dr.get('job_cpu_cores_on_host') or 0:.2f} cores on the chief's host, "
                         f"other processes {dr['other_cores_busy']:.2f} of {dr.get('host_cpus')} cores")
    else:
        lines.append(f"measured:  none: {res.get('error')}")
    return "\n".join(lines)


def _rank_lines(drain: dict[str, Any]) -> list[str]:
    """Each trainer rank's drained rate and the slowest rank (``[]`` with one chief)."""
    ranks = drain.get("ranks") or []
    if not ranks:
        return []
    each = ", ".join(f"rank {x['rank']} {float(x['samples_per_sec'] or 0):,.0f} ({x.get('num_workers') or 0} input "
                     f"worker(s))" for x in ranks)
    return [f"ranks:     {each}; slowest: rank {drain.get('slowest_rank')}"]


@click.command("verify", context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--report", "report", type=click.Path(), default=None,
              help="Report directory (or its report.json) [default: ./model_dir/input_analysis].")
@click.option("--seconds", type=click.FloatRange(min=1), default=20.0, show_default=True,
              help="Measured drain window (s).")
@click.option("--warmup", type=click.FloatRange(min=0), default=5.0, show_default=True,
              help="Seconds drained after the first batch before measuring.")
@click_options(LAYOUT_FLAGS, notes=VERIFY_NOTES, over={s.name: {"default": None, "show_default": False}
                                                        for s in LAYOUT_FLAGS if s.type is not bool})
@KEY_FLAGS["mount_dirs"].click_option(help="Passed to csrun_wse.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=10), default=600.0, show_default=True,
              help="Give up (and cancel the job) after this many seconds.")
def verify_command(report: str | None, seconds: float, warmup: float, mount_dirs: str | None,
                   timeout_s: float, **given: Any) -> int:
    """Launch the recommended layout with csrun_wse, the chief only draining the input stream,
    and print predicted vs measured samples/s and the error in %."""
    try:
        LayoutSpec.check_given(given)
    except CsrunError as exc:
        raise click.UsageError(str(exc)) from None
    res = verify(report, seconds, warmup, given, timeout_s, mount_dirs)
    click.echo(render(res))
    return 0 if res.get("measured_samples_per_sec") is not None else 1
