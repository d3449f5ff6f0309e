"""What the probes found: the report dict built from the probe rows (:func:`build_report`):
the node model, the bottleneck, the chief's ingest, the recommendation with its rate-vs-nodes
curve, the notes and the csrun_wse command. Pure given its inputs; pandas and numpy load
only when it runs.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from csrun_common.layout import RANK_FIELDS, LayoutSpec

from . import report as rp
from .probe_plan import disturbed

if TYPE_CHECKING:
    from .model import NodeModel


def build_report(base: dict[str, Any], rows: list[dict[str, Any]],
                 topology: dict[str, Any] | None) -> dict[str, Any]:
    """The report dict from the probe rows: model, bottleneck, ingest, recommendation, the
    rate-vs-nodes curve of the chosen tasks × CPUs (and chief input CPUs), and the csrun_wse
    command. Pure given its inputs (used by :func:`analyzer.analyze.analyze` and by tests on recorded tables)."""
    # pandas and numpy (the model) and the backend's facts: when the analysis runs, not at the CLI's start-up
    import pandas as pd

    from csrun_runtime.probing import facts, framework_of_report

    from . import dataloader_plan as dlp
    from .model import ModelError, classify, fit, ingest_limits

    rep = dict(base)
    rep["probes"] = rows
    rep["topology"] = topology
    # probes only ever measured while other processes were busy: they lead report.txt
    rep["disturbed"] = disturbed(rows)
    sweep = any(dlp.has_dataloader_workers(r) for r in rows)
    fw = framework_of_report(base.get("framework"), sweep)
    fw_facts = facts(fw)
    sweep = sweep or fw_facts.dataloader_workers
    # a DataLoader's: the per-task rate at C CPUs is the best measured over its num_workers
    df = pd.DataFrame(dlp.at_best(rows) if sweep else rows)
    try:
        model = fit(df, base.get("node_cpus"))
    except ModelError as exc:
        rep["error"] = f"{exc}" + (f" (last error: {rows[-1].get('error')})" if rows else "")
        return rep
    # no ingest hop of its own (PyTorch: its served probes measure the data plane): no prior
    ingest = ingest_limits(df, prior=fw_facts.ingest_probe and not sweep)
    rep["model"] = model.to_dict()
    rep["ingest"] = ingest
    rep["bottleneck"] = classify(df, model)
    rec = _recommend(rep, model, ingest, topology)
    if rec is None:
        return rep
    if sweep:
        _dataloader_parts(rep, rows, rec, fw)
    rep["csrun_wse_command"] = rp.csrun_wse_command(rec, base.get("command") or [], base.get("mount_dirs"),
                                                    framework=fw)
    if notes := _layout_notes(topology, ingest):
        rep["notes"] = list(rep.get("notes") or []) + notes
    return rep


def _recommend(rep: dict[str, Any], model: NodeModel, ingest: dict[str, Any],
               topology: dict[str, Any] | None) -> dict[str, Any] | None:
    """The recommendation for the report ``rep`` (its target, available nodes and ``world``:
    :func:`analyzer.recommend.recommend`) and the rate-vs-nodes curve of its tasks × CPUs
    (``nodes_curve``: every node count whose layout the world takes), both set in ``rep``.
    ``None``, the reason in ``rep["error"]``, when no layout fits the world."""
    from . import recommend as rc

    world = rep.get("world") or {}
    ranks = {k: int(world.get(k) or 1) for k in RANK_FIELDS}
    available = int(rep.get("available_nodes") or 1)
    tgt = (rep.get("target") or {}).get("samples_per_sec")
    try:
        rec = rc.recommend(model, available, tgt, ingest, topology, **ranks)
    except ValueError as exc:
        rep["error"] = str(exc)
        return None
    rep["recommendation"] = rec
    curve = []
    spec = LayoutSpec.from_record(rec)  # the recommendation's tasks, CPUs, chief input and ranks
    for n in range(1, available + 1):
        try:
            curve.append(rc.predict_layout(model, spec.with_(nodes=n), ingest, topology))
        except ValueError:  # a node count the world does not take (W not a multiple of it)
            continue
    rep["nodes_curve"] = curve
    return rec


def _layout_notes(topology: dict[str, Any] | None, ingest: dict[str, Any]) -> list[str]:
    """The report's notes on what bounds every layout's prediction: hosts the nodes share, an
    ingest probe that left CPUs idle (a fixed cap), a served probe that did not run."""
    notes: list[str] = []
    if topology:
        notes += [
            f"nodes {', '.join(topology.get('nodes') or [])} share host(s) "
            f"{', '.join(topology['shared_hosts'])} with {', '.join(str(v) for v in topology['host_cores'].values())} "
            f"CPU(s): predictions cap the whole job by those cores"]
    if ingest.get("samples_per_sec") and not ingest.get("cpu_bound"):
        notes += [
            "the chief's ingest probe left CPUs idle: its rate caps every layout with input workers "
            "(a latency or GIL limit of the chief's stream)"]
    if ingest.get("worker_hop_cpu_seconds_per_sample") is None and ingest.get("cpu_seconds_per_sample"):
        notes += [
            "no served probe ran: what serving costs the input workers is unknown (taken as 0) and the "
            "chief's share is the whole hop" + ("" if ingest.get("samples_per_sec") else
                                              " (a prior from the element size)")
            + "; give a larger --time-budget to measure it"]
    return notes


def _dataloader_parts(rep: dict[str, Any], rows: list[dict[str, Any]], rec: dict[str, Any], framework: str) -> None:
    """The parts of a report whose probes swept a DataLoader's worker count (PyTorch):
    ``framework``, the DataLoader ``num_workers`` of the recommendation and of each alternative
    (:func:`analyzer.dataloader_plan.workers_for`), the best count measured at each CPUs per
    task (``dataloader_workers``), and the notes saying what the served probes measured of the
    chief's ingest (or that none ran) and how to set ``num_workers``."""
    from csrun_runtime.probing import facts

    from . import dataloader_plan as dlp

    rep["framework"] = framework
    rep["dataloader_workers"] = {str(c): k for c, k in dlp.best_workers(rows).items()}
    rec["dataloader"] = dlp.workers_for(rows, int(rec["cpus_per_task"]))
    rec["dataloader_workers"] = rec["dataloader"].get("num_workers")
    for alt in rec.get("alternatives") or []:
        alt["dataloader_workers"] = dlp.workers_for(rows, int(alt["cpus_per_task"])).get("num_workers")
    invalid = sorted({int(r["dataloader_workers"]) for r in rows
                      if dlp.has_dataloader_workers(r) and r.get("status") == dlp.INVALID})
    notes = list(rep.get("notes") or [])
    f = facts(framework)
    notes.append(_served_ingest_note(rep.get("ingest") or {}, rows, f.title, f.via))
    if invalid:
        notes.append(f"DataLoader num_workers {', '.join(map(str, invalid))}: the data function could not build "
                     f"its DataLoader there (skipped; see the probes' errors)")
    rep["notes"] = notes


def _served_ingest_note(ingest: dict[str, Any], rows: list[dict[str, Any]], title: str, via: str) -> str:
    """The note on the chief's ingest ``via`` the framework's transport (``title``: its name,
    e.g. ``PyTorch``; ``via``: ``"over csrun's data plane"``): what the ``served`` probes
    measured and how the prediction uses it, or that none ran (the prediction then has no
    chief-ingest term)."""
    served = [r for r in rows if r.get("kind") == "served" and r.get("status") == "ok"]
    k_c = ingest.get("chief_cpu_seconds_per_sample")
    if not served or k_c is None:
        return (f"{title}: no served probe ran (the time budget): the chief's ingest {via} "
                "was not measured and the prediction leaves it out; give a larger --time-budget")
    h = ingest.get("worker_hop_cpu_seconds_per_sample")
    rate = ingest.get("served_samples_per_sec")
    return (f"{title}: the chief's ingest {via} was measured by {len(served)} served "
            f"probe(s) (an input worker streaming the DataLoader, the chief draining it one batch at a time"
            + (f": {rate:.0f} samples/s delivered" if rate else "") + f"): the chief spends "
            f"{k_c * 1e6:.2f} CPU-µs per sample (at most {1 / k_c if k_c > 0 else math.inf:.0f} samples/s "
            f"per chief CPU)" + (f", sending adds {h * 1e6:.2f} CPU-µs per sample to an input worker's"
                                 if h is not None else "")
            + "; the prediction caps the chief by it" + _device_feed_note(served))


def _device_feed_note(served: list[dict[str, Any]]) -> str:
    """``"; into cuda:0 ..."`` when the served probes' chief fed a GPU (the runtime's device feed,
    ``input.feed_device`` of its rows): the bytes/s it delivered into device memory, which the
    samples/s above already count; ``""`` on a CPU chief."""
    fed = [r for r in served if str(r.get("feed_device", "cpu")).startswith("cuda")
           and r.get("chief_feed_bytes_per_sec")]
    if not fed:
        return ""
    rate = max(float(r["chief_feed_bytes_per_sec"]) for r in fed)
    return (f"; into {fed[0]['feed_device']} the device feed delivered {rate / 1e9:.2f} GB/s "
            "(pinned ring, copy stream), the rate its samples/s were measured at")

