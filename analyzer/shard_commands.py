"""The ``shard-plan`` and ``reshard`` subcommands of ``cs_input_analyzer``.

Rule sources: "Shard your input data" in the Cerebras document "Performance Optimization
Practices" and "Multiple input workers" in "Limitations of the CerebrasEstimator" (quoted in
:mod:`analyzer.shard_planner`). The work is done by :mod:`analyzer.filescan` (the files' sizes
and records), :mod:`analyzer.shard_planner` (the plan), :mod:`analyzer.shardplan` (its file) and
:mod:`analyzer.reshard`; this module parses flags, resolves the worker layout and prints.
Bad input is one line ``cs_input_analyzer: error: ...`` with exit status 2
(:class:`csrun_common.errors.CsrunError`).

Those modules load NumPy: they are imported inside the functions that use them, so that the
CLI's start-up (``cs_input_analyzer --help``) does without.
"""
from __future__ import annotations

import json
import os
import shlex
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

import click
import psutil

from csrun_common.errors import CsrunError
from csrun_common.flagspec import click_options
from csrun_common.layout import LAYOUT_FLAGS, RANK_FIELDS, LayoutSpec, flag

from .datafiles import ParamsData, expand_sources, read_params
from .reshard import ReshardVerificationError, reshard

if TYPE_CHECKING:
    from .filescan import GatherResult
    from .shard_planner import ShuffleBuffers
    from .shardplan import ShardPlan

__all__ = ["shard_plan_cmd", "reshard_cmd", "resolve_layout"]


#: ``shard-plan``'s ``[default: ...]`` of the layout flags (the plan is for csrun_wse's layout).
#: The flags whose default is 0 show it (their ``None`` here means "not given").
SHARD_PLAN_NOTES = {"nodes": "none; with it the plan is for csrun_wse's input workers, every task but the chief",
                    "tasks_per_node": "1", **{s.name: "0" for s in LAYOUT_FLAGS if s.type is int and s.default == 0}}


#: The layout keys a shard plan records even when 0 (the others only when set).
_ALWAYS_RECORDED = ("nodes", "tasks_per_node", "cpus_per_task", "single_task_nodes")

def _bad(message: str) -> CsrunError:
    return CsrunError(message)


class OneLineCommand(click.Command):
    """Reports click's own usage errors (bad option values, missing flags) as one line
    with exit status 2, like every other bad input."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as exc:
            raise _bad(exc.format_message()) from None


def _pos_int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _bad(f"{where}: expected a positive integer, got {value!r}")
    return value


def _read_report(path: str) -> tuple[dict, str]:
    file = os.path.join(path, "report.json") if os.path.isdir(path) else path
    try:
        with open(file, encoding="utf-8") as fh:
            report = json.load(fh)
    except FileNotFoundError:
        raise _bad(f"--from-report {path}: no report.json there (run cs_input_analyzer first)") from None
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise _bad(f"--from-report {path}: cannot read {file} ({exc})") from None
    if not isinstance(report, dict):
        raise _bad(f"--from-report {path}: {file}: expected a JSON object")
    return report, file


def _report_number(report: dict, *keys: tuple[str, ...]) -> float | None:
    for path in keys:
        cur: Any = report
        for k in path:
            cur = cur.get(k) if isinstance(cur, dict) else None
        if isinstance(cur, (int, float)) and not isinstance(cur, bool) and cur > 0:
            return float(cur)
    return None


def resolve_layout(workers: int | None, given: Mapping[str, Any],
                   report_dir: str | None) -> tuple[int, dict, int, dict]:
    """Resolve the worker layout from exactly one of ``--workers``, the layout flags
    (``given``: :data:`csrun_common.layout.LAYOUT_FLAGS` field -> value, ``None``/``False``: not
    given; the nodes also as ``--nodes``) and ``--from-report``.

    The layout flags and the report's recommendation are csrun_wse's: the input workers are
    every task but the chief, plus the chief's own with its input CPUs
    (:attr:`csrun_common.layout.LayoutSpec.num_input_workers`).

    Returns ``(num_input_workers, layout dict, workers_per_node, report or {})``. Raises
    :class:`csrun_common.errors.CsrunError` (exit 2) naming the flag or report field.
    """
    named = {k: v for k, v in given.items() if v is not None and v is not False}
    nodes = named.get("nodes")
    sources = [n for n, v in (("--workers", workers), ("--nodes", nodes), ("--from-report", report_dir))
               if v is not None]
    if len(sources) != 1:
        raise _bad(f"give exactly one worker layout: --workers N, --nodes N [{flag('tasks_per_node')} T] "
                   f"[{flag('single_task_nodes')} S], or --from-report DIR"
                   + (f" (got {' and '.join(sources)})" if sources else ""))
    if nodes is None and named:
        raise _bad(f"{flag(next(iter(named)))}: only with --nodes (it describes csrun_wse's layout)")
    if workers is not None:
        return _pos_int(workers, "--workers"), {"source": "--workers", "input_workers": workers}, 1, {}
    report: dict[str, Any] = {}
    if nodes is not None:
        lay = _layout_from_flags(named)
    else:
        lay, report = _layout_from_report(str(report_dir))
    spec = lay.spec
    if lay.workers < 1:
        raise _bad(f"{lay.names[0]} {spec.nodes} {lay.names[1]} {spec.tasks_per_node}: the layout has no input "
                   "worker (the chief runs input_fn in-process); no shard plan is needed")
    layout = {"source": lay.source, **{k: v for k, v in spec.record().items() if v or k in _ALWAYS_RECORDED},
              "input_workers": lay.workers, "rule": "input workers = every task but the chief (docs/CONTRACT.md)"}
    return lay.workers, layout, spec.tasks_per_node, report


class _Layout(NamedTuple):
    """A csrun_wse layout, where it came from, the names of its nodes and tasks in messages,
    and its input workers."""

    spec: LayoutSpec
    source: str
    names: tuple[str, str]
    workers: int


def _layout_from_flags(named: Mapping[str, Any]) -> _Layout:
    """The layout of the layout flags given (``--nodes`` for the nodes; the tasks per node 1
    when not given)."""
    spec = LayoutSpec(**{"tasks_per_node": 1, "cpus_per_task": None, **named})
    try:
        spec.check()
    except CsrunError as exc:
        raise _bad(str(exc).replace(flag("nodes"), "--nodes")) from None
    return _Layout(spec, "--nodes", ("--nodes", flag("tasks_per_node")), spec.num_input_workers)


def _layout_from_report(report_dir: str) -> tuple[_Layout, dict[str, Any]]:
    """The layout recommended in ``report_dir``'s ``report.json`` and the report."""
    report, file = _read_report(report_dir)
    rec = report.get("recommendation")
    if not isinstance(rec, dict):
        raise _bad(f"--from-report {report_dir}: {file}: recommendation: missing "
                   f"(the analysis made no recommendation)")
    checked = {k: _pos_int(rec.get(k) or 1 if k in RANK_FIELDS else rec.get(k), f"--from-report {file}: "
                           f"recommendation.{k}") for k in ("nodes", "tasks_per_node", *RANK_FIELDS)}
    cpus = rec.get("cpus_per_task")
    try:
        spec = LayoutSpec.from_record({**rec, **checked, "cpus_per_task": cpus if isinstance(cpus, int) else None})
        w = spec.check().num_input_workers
    except (CsrunError, TypeError, ValueError) as exc:
        raise _bad(f"--from-report {file}: {exc}") from None
    n, t, s = spec.nodes, spec.tasks_per_node, spec.single_task_nodes
    stated = rec.get("input_workers")
    if isinstance(stated, int) and not isinstance(stated, bool) and stated != w:
        own = " + the chief's own input worker" if spec.chief_input_workers else ""
        world = (f", chief_nodes {spec.chief_nodes} × chief_tasks_per_node {spec.chief_tasks_per_node} ranks"
                 if spec.world_size > 1 else "")
        raise _bad(f"--from-report {file}: recommendation.input_workers {stated} disagrees with "
                   f"nodes {n} × tasks_per_node {t} (single_task_nodes {s}{world}){own} = {w} input workers")
    return _Layout(spec, f"--from-report {file}", ("recommendation.nodes", "recommendation.tasks_per_node"),
                   w), report


def _node_memory() -> tuple[int | None, str]:
    try:
        return int(psutil.virtual_memory().total), "this host's memory (psutil)"
    except Exception:  # noqa: BLE001 - psutil cannot read it here: ask the OS
        try:
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "this host's memory"
        except (ValueError, OSError, AttributeError):
            return None, ""


@click.command("shard-plan", cls=OneLineCommand)
@click.argument("sources", nargs=-1)
@click.option("--params", "params_path", metavar="YAML",
              help="Model Zoo params: the data is train_input.data_dir (str or list); also "
                   "reads shuffle_buffer, batch_size, shuffle_seed.")
@click.option("--pattern", metavar="GLOB", help="File names to take from data directories "
              "(default: *.tfrecord* if any, else every non-hidden file).")
@click.option("--workers", type=int, help="Number of input workers.")
@click_options(LAYOUT_FLAGS, notes=SHARD_PLAN_NOTES, aliases={"nodes": ("--nodes",)},
               over={s.name: {"default": None} for s in LAYOUT_FLAGS})
@click.option("--from-report", "report_dir", metavar="DIR",
              help="Use the layout recommended in DIR/report.json (cs_input_analyzer's output).")
@click.option("--seed", type=int, help="Base shuffle seed (default: train_input.shuffle_seed, else 0); "
              "each worker gets a distinct seed derived from it.")
@click.option("--mode", type=click.Choice(["auto", "shard", "replicate"]), default="auto",
              show_default=True, help="shard: each file to one worker; replicate: every worker reads "
              "all files with its own seed; auto: shard unless there are fewer files than workers.")
@click.option("--balance-by", type=click.Choice(["auto", "bytes", "records"]), default="auto",
              show_default=True, help="auto: records when every file was counted, else bytes.")
@click.option("--count", type=click.Choice(["auto", "yes", "no"]), default="auto", show_default=True,
              help="Count TFRecord records (walks the framing; no proto parsing).")
@click.option("--count-budget", type=float, default=10.0, show_default=True, metavar="SECONDS",
              help="Time budget for counting; past it records are estimated from bytes.")
@click.option("--shuffle-buffer", type=int, metavar="N",
              help="Elements in each worker's shuffle buffer (default: train_input.shuffle_buffer, "
                   "else 10 × batch_size).")
@click.option("--element-bytes", metavar="SIZE",
              help="Bytes per element in the shuffle buffer (default: the report's measurement, else "
                   "the mean TFRecord record size).")
@click.option("--node-memory", metavar="SIZE", help="Memory of an input node, e.g. 256G "
              "(default: the report's, else this host's).")
@click.option("-o", "--output", default="shard_plan.json", show_default=True, metavar="PATH",
              help="Where to write the plan (JSON).")
@click.option("--json", "as_json", is_flag=True, help="Print the plan summary as JSON.")
def shard_plan_cmd(sources: tuple[str, ...], params_path: str | None, pattern: str | None,
                   workers: int | None, report_dir: str | None, seed: int | None,
                   mode: str, balance_by: str, count: str, count_budget: float,
                   shuffle_buffer: int | None, element_bytes: str | None,
                   node_memory: str | None, output: str, as_json: bool, **given: Any) -> None:
    """Plan which data files each input worker reads (SOURCES: files, directories, globs).

    Files are assigned whole, balancing records (when counted) or bytes with LPT; each
    worker gets a distinct shuffle seed. Warns, with the fix, about too few files, a
    dominating file, uneven loads and shuffle buffers that do not fit a node. Use the
    plan with: csrun_wse --shard-plan PLAN ...
    """
    from .shard_planner import PlanOptions, plan_shards  # NumPy: when the command runs

    num_input_workers, layout, per_node, report = resolve_layout(workers, given, report_dir)
    if count_budget < 0:
        raise _bad(f"--count-budget {count_budget}: must be >= 0")
    if shuffle_buffer is not None and shuffle_buffer < 0:
        raise _bad(f"--shuffle-buffer {shuffle_buffer}: must be >= 0")
    elem = _size_flag("--element-bytes", element_bytes)
    mem = _size_flag("--node-memory", node_memory)
    params = _read_params_flag(params_path)
    gathered = _gather(sources, params, params_path, pattern, count, count_budget)
    shuffle, mem_src = _shuffle_buffers(params, report, gathered, shuffle_buffer, (elem, mem), per_node)
    base_seed = seed if seed is not None else (params.shuffle_seed if params and params.shuffle_seed
                                               is not None else 0)
    hint_sources = list(sources) or (params.data_dirs if params else [])
    try:
        plan = plan_shards(gathered.table, num_input_workers, PlanOptions(
            base_seed=base_seed, mode=mode, balance_by=None if balance_by == "auto" else balance_by,
            layout=layout, records_exact=gathered.records_exact, records_estimate=gathered.records_estimate,
            shuffle=shuffle, reshard_hint=shlex.join(hint_sources), extra_warnings=gathered.warnings))
    except ValueError as exc:
        raise _bad(str(exc)) from None
    if plan.shuffle is not None and plan.shuffle.get("checked"):
        plan.shuffle["node_memory_source"] = mem_src
    try:
        written = plan.write_json(output)
    except OSError as exc:
        raise _bad(f"--output {output}: cannot write ({exc.strerror})") from None
    if as_json:
        out = plan.header_dict()
        out["output"] = written
        click.echo(json.dumps(out, indent=1))
        return
    _print_plan(plan, layout, mem_src, written)


def _size_flag(flag: str, value: str | None) -> int | None:
    """``--element-bytes`` / ``--node-memory`` in bytes (:func:`analyzer.shardplan.parse_size`)."""
    from .shardplan import parse_size  # NumPy: when the command runs

    try:
        return parse_size(value) if value is not None else None
    except ValueError as exc:
        raise _bad(f"{flag} {value!r}: {exc}") from None


def _read_params_flag(params_path: str | None) -> ParamsData | None:
    if params_path is None:
        return None
    try:
        return read_params(params_path)
    except ValueError as exc:
        raise _bad(str(exc)) from None


def _gather(sources: tuple[str, ...], params: ParamsData | None, params_path: str | None, pattern: str | None,
            count: str, count_budget: float) -> GatherResult:
    """The data files of SOURCES and the params' ``train_input.data_dir``, stat'ed and (with
    ``--count``) their records counted (:func:`analyzer.filescan.gather_files`)."""
    from .filescan import gather_files  # NumPy: when the command runs

    if not sources and params is None:
        raise _bad("no data files: give SOURCES (files, directories, globs) or --params YAML "
                   "with train_input.data_dir")
    try:
        paths, dups = expand_sources(list(sources), pattern=pattern, what="SOURCES") if sources else ([], 0)
        if params is not None:
            more, d2 = expand_sources(params.data_dirs, pattern=pattern,
                                      what=f"--params {params_path}: train_input.data_dir")
            merged, d3 = expand_sources(paths + more, what="SOURCES") if paths else (more, 0)
            paths, dups = merged, dups + d2 + d3
        return gather_files(paths, count=count, budget_s=count_budget, duplicates=dups)
    except ValueError as exc:
        raise _bad(str(exc)) from None


def _shuffle_buffers(params: ParamsData | None, report: dict, gathered: GatherResult,
                     shuffle_buffer: int | None, sizes: tuple[int | None, int | None],
                     per_node: int) -> tuple[ShuffleBuffers, str]:
    """The shuffle-memory check's inputs: the buffer (``--shuffle-buffer``, else the params'),
    the element size (``--element-bytes``, else the analyzer's measurement in the report,
    else the mean TFRecord record) and the node's memory (``--node-memory``, else the
    report's, else this host's). Returns them and where the memory figure came from."""
    from .shard_planner import ShuffleBuffers  # NumPy: when the command runs

    elem: float | None
    elem, mem = sizes
    buf = shuffle_buffer if shuffle_buffer is not None else (params.shuffle_buffer if params else None)
    elem_src = "--element-bytes"
    if elem is None:
        rep_elem = _report_number(report, ("element_bytes",), ("measurements", "element_bytes"),
                                  ("recommendation", "element_bytes"))
        if rep_elem is not None:
            elem, elem_src = rep_elem, "measured by the analyzer (report.json)"
        elif gathered.mean_record_bytes:
            elem = gathered.mean_record_bytes
            elem_src = "mean serialized TFRecord record; decoded elements may be larger (--element-bytes)"
    mem_src = "--node-memory"
    if mem is None:
        rep_mem = _report_number(report, ("node_memory_bytes",), ("node", "memory_bytes"))
        if rep_mem is not None:
            mem, mem_src = int(rep_mem), "report.json"
        else:
            mem, mem_src = _node_memory()
    return ShuffleBuffers(buffer_elements=buf, element_bytes=elem, element_source=elem_src,
                          workers_per_node=per_node, node_memory_bytes=mem), mem_src


def _print_plan(plan: ShardPlan, layout: dict, mem_src: str, written: str) -> None:
    """The plan's summary: files, workers, balance, seeds, the shuffle check, the warnings
    with their fixes, where it was written and how to use it."""
    from .shardplan import format_bytes  # NumPy: when the command runs

    num_input_workers = plan.num_input_workers
    tot_rec = plan.total_records
    rec_text = (f", {tot_rec:,} records" if tot_rec is not None else
                (f", ~{plan.records_estimate:,} records (estimated)" if plan.records_estimate else ""))
    flags = LayoutSpec.from_record({**layout, "cpus_per_task": None}).to_flags() if "nodes" in layout else []
    lay = f" (csrun_wse {' '.join(flags)}: every task but the chief)" if flags else ""
    click.echo(f"shard plan: {len(plan.paths):,} files ({format_bytes(plan.total_bytes)}{rec_text}) "
               f"-> {num_input_workers:,} input workers{lay}")
    imb = f"imbalance (max/mean): {plan.imbalance_bytes:.3f} bytes"
    if plan.imbalance_records is not None:
        imb += f", {plan.imbalance_records:.3f} records"
    click.echo(f"mode: {plan.mode}; balanced by {plan.balance_by}; {imb}")
    if plan.mode == "shard":
        per = [int(plan.offsets[i + 1] - plan.offsets[i]) for i in range(min(num_input_workers, 1_000_000))]
        click.echo(f"files per worker: {min(per)}..{max(per)}; seeds: distinct, from base seed {plan.base_seed}")
    else:
        click.echo(f"every worker reads all {len(plan.paths)} files; seeds: distinct, from base seed "
                   f"{plan.base_seed}")
    if plan.shuffle and plan.shuffle.get("checked"):
        s = plan.shuffle
        click.echo(f"shuffle buffers: {format_bytes(s['per_node_bytes'])} per node "
                   f"({s['workers_per_node']} × {s['buffer_elements']} × {format_bytes(s['element_bytes'])}) "
                   f"of {format_bytes(s['node_memory_bytes'])} ({mem_src}): "
                   f"{'fits' if s['fits'] else 'does NOT fit'}")
    for w in plan.warnings:
        click.echo(f"{w.severity} [{w.code}]: {w.message}")
        if w.fix:
            click.echo(f"  fix: {w.fix}")
    click.echo(f"written: {written}")
    click.echo(f"use it: csrun_wse --shard-plan {shlex.quote(written)} ...")


@click.command("reshard", cls=OneLineCommand)
@click.argument("sources", nargs=-1, required=True)
@click.option("--num-shards", type=int, required=True, help="Number of shards to write (e.g. k × workers).")
@click.option("-o", "--output", required=True, metavar="DIR", help="New directory for the shards "
              "(must not exist).")
@click.option("--prefix", default="shard", show_default=True, help="Shard file name prefix.")
@click.option("--pattern", metavar="GLOB", help="File names to take from source directories.")
@click.option("--verify-crc", is_flag=True, help="Also check every record's data CRC (slow "
              "without a crc32c package).")
@click.option("--progress/--no-progress", default=True, show_default=True, help="Progress bars on stderr.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def reshard_cmd(sources: tuple[str, ...], num_shards: int, output: str, prefix: str,
                pattern: str | None, verify_crc: bool, progress: bool, as_json: bool) -> None:
    """Rewrite TFRecord files (SOURCES: files, directories, globs) into N balanced shards.

    Records are copied verbatim and dealt to the shard with the fewest bytes. The shards
    appear in DIR only when complete and verified (same record count and
    order-independent checksum); an existing DIR is never overwritten; an interrupted
    run leaves neither DIR nor temporary files, and never touches the input.
    """
    from .shardplan import format_bytes  # NumPy: when the command runs

    try:
        res = reshard(list(sources), num_shards, output, prefix=prefix, verify_crc=verify_crc,
                      progress=progress, pattern=pattern)
    except ValueError as exc:
        raise _bad(str(exc)) from None
    except ReshardVerificationError as exc:
        raise click.ClickException(f"verification failed, nothing written: {exc}") from None
    if as_json:
        click.echo(json.dumps(res.to_dict(), indent=1))
        return
    click.echo(f"resharded {res.sources} file(s): {res.records:,} records, {format_bytes(res.bytes)} "
               f"-> {res.num_shards} shards in {res.output} (shard bytes max/mean "
               f"{res.imbalance_bytes:.3f}; {min(res.shard_records)}..{max(res.shard_records)} records "
               f"per shard) in {res.seconds:.1f} s")
    click.echo(f"verified: the multiset of records is unchanged ({res.records:,} records, "
               f"order-independent checksum {res.checksum})")
    for p in res.removed_stale:
        click.echo(f"removed a leftover temporary directory: {p}", err=True)
    sys.stdout.flush()
