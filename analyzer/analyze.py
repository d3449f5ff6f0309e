"""``cs_input_analyzer [options] python run.py --params P --mode validate_only|compile_only``.

The main command: runs the user's command first (through ``csrun_cpu``; with ``--local``
directly), then probes the same run.py's ``input_fn`` with the same params
(:mod:`analyzer.probe_driver`), fits the node model (:mod:`analyzer.model`), chooses a layout
(:mod:`analyzer.recommend`) and writes the report (:mod:`analyzer.report`) into the output
directory (default ``<model_dir>/input_analysis/``) — nothing else of the user's is written.

The target rate (samples/s the accelerator consumes) is ``--target-samples-per-sec``, else
the estimate of ``<model_dir>/compile_report.json`` / ``compile_report.txt`` (compile_only),
else ``est_samples_per_sec`` of a previous run's ``<model_dir>/performance/performance.json``,
else none ("best for the available nodes").

The steps of :func:`analyze`, in order: :func:`_prepare` (the command, its params, Slurm's
facts, the output directory), :func:`run_user_command`, :func:`_probe_target`,
:func:`_report_base`, :func:`_probe` (:func:`analyzer.probe_driver.run_probes`),
:func:`build_report`, :func:`_finish`. A new check of the user's input (e.g. of its data
files) is one more step that adds its findings to the report base's ``notes``.

This module is imported by the CLI at start-up: it imports neither TensorFlow nor pandas
nor matplotlib at module level.
"""
from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

import click

from csrun_common import exits
from csrun_common.errors import CsrunError
from csrun_common.flagspec import by_name, click_options
from csrun_common.layout import LAYOUT_FLAGS, RANK_FIELDS, LayoutSpec
from csrun_runtime.registry import launchers
from launcher import slurm
from launcher.config import FLAG_NOTES, KEY_FLAGS, SiteConfig, load_config
from launcher.container import site_container, split_mount_dirs
from launcher.resolve import gres_nodes

from . import file_coverage
from . import report as rp
from .probe_driver import ProbeLoadError, ProbeRun, Target, disturbed, run_probes

if TYPE_CHECKING:
    from .model import NodeModel

DEFAULT_BUDGET_S = 120.0


@dataclass
class Command:
    """The user's command split: ``python`` word, ``run_py`` (absolute), ``argv`` after it."""

    words: list[str]
    python_word: str | None
    run_py: str
    argv: list[str] = field(default_factory=list)


def split_command(words: Sequence[str], cwd: str) -> Command:
    """``python run.py ARGS`` / ``python-ws run.py ARGS`` / ``run.py ARGS`` → :class:`Command`.

    Raises :class:`CsrunError` (exit 2) when no ``*.py`` script follows the interpreter.
    """
    words = list(words)
    if not words:
        raise CsrunError("COMMAND: missing (expected `python run.py --params ... --mode validate_only`)")
    first = words[0]
    if first.endswith(".py"):
        py_word, script, rest = None, first, words[1:]
    else:
        base = os.path.basename(first)
        if not (base.startswith("python") or base in launchers().values()):
            raise CsrunError(f"COMMAND {first!r}: expected `python run.py ...` (a Python run.py)")
        if len(words) < 2 or not words[1].endswith(".py"):
            raise CsrunError(f"COMMAND {' '.join(words[:2])!r}: expected a run.py after {first}")
        py_word, script, rest = first, words[1], words[2:]
    path = Path(script) if os.path.isabs(script) else Path(cwd) / script
    if not path.is_file():
        raise CsrunError(f"COMMAND: {script}: no such file")
    return Command(words=words, python_word=py_word, run_py=str(path.resolve()), argv=list(rest))


def find_target(model_dir: str) -> tuple[float | None, str]:
    """The accelerator's consumption rate (samples/s) and where it came from.

    Looks, in order, at ``compile_report.json`` (``est_samples_per_sec``), ``compile_report.txt``
    (a number followed by ``samples/s`` or ``samples per second``) and
    ``performance/performance.json`` (``est_samples_per_sec``) in ``model_dir``. Returns
    ``(None, reason)`` when none has one.
    """
    md = Path(model_dir)
    for name in ("compile_report.json",):
        v = _json_rate(md / name)
        if v:
            return v, f"estimate in {md / name}"
    txt = md / "compile_report.txt"
    if txt.is_file():
        m = re.search(r"([0-9][0-9,]*\.?[0-9]*)\s*(?:samples/s(?:ec)?|samples per sec)",
                      txt.read_text(errors="replace"), re.IGNORECASE)
        if m:
            try:
                return float(m.group(1).replace(",", "")), f"estimate in {txt}"
            except ValueError:
                pass
    perf = md / "performance" / "performance.json"
    v = _json_rate(perf)
    if v:
        return v, f"est_samples_per_sec of a previous run ({perf})"
    return None, "no --target-samples-per-sec, compile report or previous run"


def _json_rate(path: Path) -> float | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    for key in ("est_samples_per_sec", "estimated_samples_per_sec", "samples_per_sec_estimate"):
        v = data.get(key)
        if isinstance(v, (int, float)) and v > 0:
            return float(v)
    for sub in data.values():
        if isinstance(sub, dict):
            v = sub.get("est_samples_per_sec")
            if isinstance(v, (int, float)) and v > 0:
                return float(v)
    return None


def console_script(name: str) -> str:
    """Path of the console script ``name`` (``csrun_cpu``, ``csrun_wse``,
    ``cs_input_analyzer``) beside the interpreter running this code, else the one on PATH,
    else ``name`` itself."""
    here = Path(sys.executable).parent / name
    return str(here) if here.exists() else (shutil.which(name) or name)


def run_user_command(cmd: Command, local: bool, mount_dirs: str | None, cwd: str, log: Path,
                     python: str, timeout_s: float = 1800) -> int:
    """Run the user's command first (``csrun_cpu [--mount-dirs] CMD`` or, locally, CMD with
    ``python`` for the interpreter word). Output goes to ``log`` and, on failure, its tail
    to stderr. Returns the exit status."""
    if local:
        argv = [python, cmd.run_py, *cmd.argv]
    else:
        mount = [KEY_FLAGS["mount_dirs"].flag, mount_dirs] if mount_dirs else []
        argv = [console_script("csrun_cpu"), *mount, *cmd.words]
    shown = argv[:1] + [os.path.basename(argv[1])] + argv[2:] if local else argv
    click.echo(f"cs_input_analyzer: running {' '.join(shown)}", err=True)
    with open(log, "wb") as f:
        try:
            proc = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT, cwd=cwd, timeout=timeout_s,
                                  stdin=subprocess.DEVNULL)
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            rc = exits.TIMEOUT
        except OSError as exc:
            raise CsrunError(f"cannot run {argv[0]}: {exc.strerror}", 2) from None
    if rc != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-15:]
        click.echo("\n".join(tail), err=True)
    return rc


class ClusterInfo(TypedDict):
    """Slurm facts for probing and the layout model (``report.json``'s ``cluster``):
    ``nodes`` (names, the chief's GRES node first), ``node_cpus`` (CPUs of one CPU node),
    ``node_hosts`` (the host of each node, in the order of ``nodes``) and ``host_cores``
    (per host: the CPUs its nodes declare together; :func:`_topology` replaces it by the
    probe's measured host CPUs where nodes share a host)."""

    nodes: list[str]
    node_cpus: int
    node_hosts: list[str]
    host_cores: dict[str, int]


def cluster_info(partition: str, exclude: str) -> ClusterInfo:
    """The :class:`ClusterInfo` of ``partition`` ("" : Slurm's default partitions), with
    ``exclude`` (the site's ``gres.node``: a name, a comma list or a Slurm hostlist) first, from
    :func:`launcher.slurm.list_nodes` and :func:`launcher.slurm.node_hosts`.

    Raises :class:`CsrunError` (exit 2) when Slurm cannot be reached, suggesting ``--local``,
    or when ``exclude`` does not parse.
    """
    gres = gres_nodes(exclude)
    try:
        nodes = slurm.list_nodes(partition)
        n = slurm.cpu_node_cpus(nodes, exclude=gres)
    except CsrunError as exc:
        raise CsrunError(f"cannot use Slurm ({exc}); run with --local to probe this machine instead") from None
    try:
        hosts = slurm.node_hosts(partition)
    except CsrunError:
        hosts = {}  # every node its own host
    names = list(dict.fromkeys(x.name for x in nodes))
    order = [x for x in names if x in gres] + [x for x in names if x not in gres]
    node_hosts = [hosts.get(x, x) for x in order]
    cpus = {x.name: x.cpus for x in nodes}
    host_cores: dict[str, int] = {}
    for name, h in zip(order, node_hosts, strict=True):
        host_cores[h] = host_cores.get(h, 0) + cpus.get(name, n)
    return {"nodes": order, "node_cpus": n, "node_hosts": node_hosts, "host_cores": host_cores}


def _topology(info: ClusterInfo | None, hellos: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Host sharing for :func:`analyzer.recommend.predict_layout`: the hosts that carry
    several nodes declaring more CPUs together than the host has (``cpu_count`` seen by the
    probe processes on that host; the Slurm test cluster unpinned); nodes pinned to their
    own CPUs of one host (``cluster up --pin``) are independent. ``None`` when none is
    shared."""
    if not info:
        return None
    counts: dict[str, int] = {}
    for h in info["node_hosts"]:
        counts[h] = counts.get(h, 0) + 1
    seen: dict[str, int] = {}
    for hello in hellos:
        if hello.get("host") and hello.get("cpu_count"):
            seen[hello["host"]] = int(hello["cpu_count"])
    cores = {}
    for h, c in counts.items():
        declared = info["host_cores"][h]
        if c > 1 and h in seen and declared > seen[h]:
            cores[h] = seen[h]
        elif c > 1 and h not in seen:
            cores[h] = declared  # not probed: what the nodes declare together
    shared = {h for h, c in cores.items() if c < info["host_cores"][h]}
    if not shared:
        return None
    return {"nodes": info["nodes"], "node_hosts": info["node_hosts"],
            "host_cores": {h: cores[h] for h in shared}, "shared_hosts": sorted(shared)}


@dataclass
class Options:
    """Parsed options of the main command (see :func:`analyze`)."""

    command: list[str]
    available_nodes: int | None = None
    mount_dirs: str | None = None
    target: float | None = None
    local: bool = False
    budget_s: float = DEFAULT_BUDGET_S
    output: str | None = None
    partition: str | None = None
    run_command: bool = True
    progress: bool = True
    strict: bool = False
    chief_nodes: int = 1
    chief_tasks_per_node: int = 1

    @property
    def world_size(self) -> int:
        """Trainer ranks the layout feeds: ``chief_nodes × chief_tasks_per_node`` (1: one chief)."""
        return self.chief_nodes * self.chief_tasks_per_node


@dataclass
class Analysis:
    """What the steps of :func:`analyze` share: the options, the working directory, the
    user's command and its ``model_dir``, the output directory, the site configuration and
    Slurm's facts (``None`` with ``--local``), the interpreter of the user's command, and
    the report's fields known before probing (``base``)."""

    opts: Options
    cwd: str
    cmd: Command
    model_dir: str
    out: Path
    python: str = sys.executable
    cfg: SiteConfig | None = None
    info: ClusterInfo | None = None
    base: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # the report's notes known before probing

    @property
    def available_nodes(self) -> int:
        """``--available-nodes``, else the partition's nodes (1 with ``--local``)."""
        return self.opts.available_nodes or (len(self.info["nodes"]) if self.info else 1)


def analyze(opts: Options) -> int:
    """Run the whole analysis; returns the exit status (0 ok, 1 no usable probe / the user's
    command failed). Raises :class:`CsrunError` for bad input (exit 2)."""
    a = _prepare(opts)
    if opts.run_command and not _run_command_first(a):
        return 1
    target = _probe_target(a)
    a.base = _report_base(a)
    stop = _check_files(a)
    if stop is not None:
        return stop
    run = _probe(a, target)
    if run is None:
        return 1
    _record_run(a.base, run)
    return _finish(a.out, build_report(a.base, run.rows, _topology(a.info, run.hellos)))


def _prepare(opts: Options) -> Analysis:
    """The user's command and its resolved params, the site configuration and Slurm's
    facts (not with ``--local``), and the output directory (created). Raises
    :class:`CsrunError` for a bad command, bad params, an unusable Slurm or output
    directory, or more ``--available-nodes`` than the partition has."""
    # The runtime package (its __init__ loads the runner) only when an analysis runs: ~40 ms
    # that the CLI's start-up (--help) does not need.
    from csrun_runtime.params import ParamsError, resolve_params

    cwd = os.getcwd()
    cmd = split_command(opts.command, cwd)
    try:
        resolved = resolve_params(cmd.argv, run_py=cmd.run_py, cwd=cwd)
    except ParamsError as exc:
        raise CsrunError(f"COMMAND: {exc}") from None
    model_dir = resolved.model_dir
    out = Path(opts.output).resolve() if opts.output else Path(model_dir) / "input_analysis"
    a = Analysis(opts=opts, cwd=cwd, cmd=cmd, model_dir=model_dir, out=out)
    if not opts.local:
        a.cfg = load_config()
        a.python = a.cfg.python
        a.info = cluster_info(_partition(a), a.cfg.gres_node)
        if opts.available_nodes is not None and opts.available_nodes > len(a.info["nodes"]):
            raise CsrunError(f"--available-nodes {opts.available_nodes}: the partition has only "
                             f"{len(a.info['nodes'])} node(s)")
    _check_world(a)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CsrunError(f"--output {out}: {exc.strerror}") from None
    return a


def _check_world(a: Analysis) -> None:
    """Before any probe, the layouts the recommendation would draw from against csrun_wse's own
    checks (:func:`analyzer.layoutcheck.usable_nodes`: GRES, input-worker nodes, the layout's
    rules); raises :class:`CsrunError` (one line naming the flags) when none fits, and holds the
    available nodes to those that do. With several trainer ranks and nodes of unknown CPUs
    (``--local``): only that the chief's nodes leave one for input workers."""
    from .layoutcheck import usable_nodes
    from .recommend import candidate_layouts, no_rank_layout, rank_layouts

    opts, cpus = a.opts, (a.info["node_cpus"] if a.info else None)
    if opts.world_size == 1:
        specs = [LayoutSpec(n, t, c) for n, t, c in candidate_layouts(cpus, a.available_nodes)] if cpus else []
    else:
        specs = rank_layouts(cpus, a.available_nodes, opts.chief_nodes, opts.chief_tasks_per_node) if cpus else []
        if a.available_nodes <= opts.chief_nodes or (cpus and not specs):
            raise CsrunError(no_rank_layout(opts.chief_nodes, opts.chief_tasks_per_node, a.available_nodes, cpus))
    usable = usable_nodes(specs, a.cfg, _partition(a), cpus, a.available_nodes)
    if usable < a.available_nodes:
        a.notes.append(f"at most {usable} of the {a.available_nodes} nodes: csrun_wse takes no layout of more "
                       f"(the input workers' nodes must lie outside gres.node {a.cfg.gres_node if a.cfg else ''!r})")
        opts.available_nodes = usable


def _partition(a: Analysis) -> str:
    """``--partition``, else the site configuration's ``slurm.partition``."""
    if a.opts.partition is not None:
        return a.opts.partition
    return a.cfg.slurm.partition if a.cfg is not None else ""


def _run_command_first(a: Analysis) -> bool:
    """Run the user's command (:func:`run_user_command`); False, with a message, when it
    failed."""
    log = a.out / "command.log"
    rc = run_user_command(a.cmd, a.opts.local, a.opts.mount_dirs, a.cwd, log, a.python)
    if rc != 0:
        click.echo(f"cs_input_analyzer: the command failed (exit status {rc}); fix it before analysing "
                   f"its input (log: {log})", err=True)
    return rc == 0


def _probe_target(a: Analysis) -> Target:
    """Where the probes run: this machine (``--local``), or one CPU node of the partition
    (the GRES node excluded) in the site's container. Raises :class:`CsrunError` for a bad
    container configuration."""
    if a.opts.local or a.cfg is None or a.info is None:
        return Target(local=True, node_cpus=None, python=a.python)
    cont = site_container(a.cfg, a.opts.mount_dirs)
    return Target(local=False, partition=_partition(a), account=a.cfg.slurm.account, exclude=a.cfg.gres_node,
                  container=cont if cont.runtime != "none" else None, node_cpus=a.info["node_cpus"],
                  python=a.python)


def _report_base(a: Analysis) -> dict[str, Any]:
    """The report's fields known before probing: the command, where it ran, the budget, the
    target rate with its source (:func:`find_target`; the world's with several trainer ranks:
    :func:`world_target`) and, with several ranks, ``"world"`` (``{"chief_nodes",
    "chief_tasks_per_node", "world_size"}``)."""
    target: float | None
    if a.opts.target:
        target, target_src = a.opts.target, "--target-samples-per-sec"
    else:
        target, target_src = find_target(a.model_dir)
    cmd = a.cmd
    o = a.opts
    world = ({"world": {"chief_nodes": o.chief_nodes, "chief_tasks_per_node": o.chief_tasks_per_node,
                        "world_size": o.world_size}} if o.world_size > 1 else {})
    return {
        "version": 1, "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "command": cmd.words,
        "run_py": cmd.run_py, "argv": cmd.argv, "cwd": a.cwd, "model_dir": a.model_dir,
        "output_dir": str(a.out), "local": a.opts.local, "available_nodes": a.available_nodes,
        "time_budget_s": a.opts.budget_s, "mount_dirs": a.opts.mount_dirs,
        "target": world_target(target, target_src, o.world_size),
        "cluster": a.info, "notes": list(a.notes), **world,
    }


def world_target(per_rank: float | None, source: str, world_size: int) -> dict[str, Any]:
    """``report.json``'s ``target``: ``{"samples_per_sec", "source"}``; ``per_rank`` is what one
    accelerator consumes (samples/s, from ``--target-samples-per-sec`` or :func:`find_target`;
    ``None``: no target). With several trainer ranks the target is the world's:
    ``samples_per_sec = per_rank × world_size``, plus ``"per_rank_samples_per_sec"`` and
    ``"world_size"``."""
    if world_size == 1:
        return {"samples_per_sec": per_rank, "source": source}
    return {"samples_per_sec": per_rank * world_size if per_rank else None, "source": source,
            "per_rank_samples_per_sec": per_rank, "world_size": world_size}


def _check_files(a: Analysis) -> int | None:
    """Build the input as two input workers would (:mod:`analyzer.file_coverage`): files
    that overlap or stay unread are a note in the report and a warning (with ``--strict`` an
    error: the exit status returned, nothing probed). ``None``: go on."""
    coverage = file_coverage.run_check(a.cmd.run_py, a.cmd.argv, a.cwd, a.python, a.out / "file_coverage.json")
    notes, stop = file_coverage.findings(coverage, a.opts.strict, lambda m: click.echo(m, err=True))
    a.base["file_coverage"], a.base["notes"] = coverage, notes
    return stop


def _probe(a: Analysis, target: Target) -> ProbeRun | None:
    """Probe the input_fn (:func:`analyzer.probe_driver.run_probes`) in ``<out>/work``,
    saving the partial report after every probe. ``None`` (the report says why) when the
    probes could not load run.py."""
    work = a.out / "work"
    if work.exists():
        shutil.rmtree(work, ignore_errors=True)
    rows: list[dict[str, Any]] = []

    def on_row(row: dict[str, Any]) -> None:
        rows.append(row)
        _save_partial(a.out, a.base, rows)

    t0 = time.monotonic()
    try:
        run = run_probes(a.cmd.run_py, a.cmd.argv, a.cwd, work, target, a.opts.budget_s, on_row=on_row,
                         progress=a.opts.progress, fit_fn=_fit_rows)
    except ProbeLoadError as exc:
        a.base["error"] = f"the probes could not load run.py: {exc}"
        _save_partial(a.out, a.base, rows)
        rp.write_text(a.out, {**a.base, "probes": rows})
        click.echo(f"cs_input_analyzer: {a.base['error']}", err=True)
        return None
    a.base["probing_s"] = time.monotonic() - t0
    return run


def _record_run(base: dict[str, Any], run: ProbeRun) -> None:
    """Add what probing found besides the probe rows to the report base: the node's CPUs,
    the node probed, why it stopped, the timings, load times and notes."""
    base["node_cpus"] = run.node_cpus
    base["probed_on"] = (run.hellos[0] if run.hellos else {})
    base["stopped"] = run.stopped
    base["framework"] = run.framework
    base["timing"] = vars(run.timing) if run.timing else None
    base["load_s"] = run.load_times
    base["notes"] += run.notes
    if run.stopped == "interrupted":
        base["notes"].append("interrupted: the report uses the probes measured so far")


def _fit_rows(rows: list[dict[str, Any]], n: int) -> NodeModel:
    """The node model fitted to the probe rows so far (the planner ranks layouts by it)."""
    # pandas and the model (numpy) load only once probing runs: not at the CLI's start-up.
    import pandas as pd

    # numpy + pandas (the model): when the analysis runs, not at the CLI's start-up.
    from .dataloader_plan import at_best
    from .model import fit

    return fit(pd.DataFrame(at_best(rows)), n)  # PyTorch: each C at its best DataLoader num_workers


def _save_partial(out: Path, base: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    rp.write_probes_csv(out, rows)
    rp.write_json(out, {**base, "partial": True, "probes": rows})


def build_report(base: dict[str, Any], rows: list[dict[str, Any]],
                 topology: dict[str, Any] | None) -> dict[str, Any]:
    """The report dict from the probe rows: model, bottleneck, ingest, recommendation, the
    rate-vs-nodes curve of the chosen tasks × CPUs (and chief input CPUs), and the csrun_wse
    command. Pure given its inputs (used by :func:`analyze` and by tests on recorded tables)."""
    # pandas and numpy (the model) are imported here, not at the CLI's start-up.
    import pandas as pd

    # the backend's facts (not its framework) once the analysis runs
    from csrun_runtime.probing import facts, framework_of_report

    # numpy + pandas (the model): when the analysis runs, not at the CLI's start-up.
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
    ranks = {"chief_nodes": int(world.get("chief_nodes") or 1),
             "chief_tasks_per_node": int(world.get("chief_tasks_per_node") or 1)}
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


def _finish(out: Path, rep: dict[str, Any]) -> int:
    """Write the report's files (:mod:`analyzer.report`; a plot that fails is a note) and
    print its text. Returns 0 with a recommendation, else 1."""
    rp.write_probes_csv(out, rep.get("probes") or [])
    rp.write_json(out, rep)
    try:
        rp.plot(out, rep)
    except Exception as exc:  # noqa: BLE001 - the plot is not worth failing the analysis
        rep.setdefault("notes", []).append(f"plot failed: {exc}")
        rp.write_json(out, rep)
    text = rp.write_text(out, rep)
    click.echo(text, nl=False)
    return 0 if rep.get("recommendation") else 1


# --------------------------------------------------------------------------- click command
def _positive_float(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
    if value is not None and not value > 0:
        raise click.BadParameter(f"{value}: must be a number > 0", ctx=ctx, param=param)
    return value


#: The analyzing command's help of csrun_wse's trainer-rank flags (:data:`csrun_common.layout.RANK_FIELDS`):
#: the world the layout feeds.
RANK_HELP = {
    "chief_nodes": {"help": "Chief nodes of the job to feed, trainer ranks only (docs/MULTI-RANK.md): the "
                            "recommendation keeps them for the ranks and sizes the input workers on the "
                            "other nodes for the whole world."},
    "chief_tasks_per_node": {"help": "Trainer ranks (one per accelerator) on each chief node: the target is "
                                     "the per-accelerator rate × the world size (chief nodes × ranks per node)."},
}

ANALYZE_EPILOG = "\n".join([
    "\b",
    "Examples:",
    "  cs_input_analyzer python run.py --params configs/params.yaml --mode validate_only",
    "  cs_input_analyzer --available-nodes 4 --target-samples-per-sec 5000 python run.py "
    "--params configs/params.yaml --mode compile_only",
    "  cs_input_analyzer --local --time-budget 30 python run.py --params configs/params.yaml --mode validate_only",
    "  cs_input_analyzer verify --report model_dir/input_analysis",
    ""])


@click.command("analyze", context_settings={"allow_interspersed_args": False,
                                            "help_option_names": ["-h", "--help"], "max_content_width": 100},
               epilog=ANALYZE_EPILOG)
@click.option("--available-nodes", type=click.IntRange(min=1), default=None,
              help="Nodes the layout may use [default: the partition's nodes; 1 with --local].")
@KEY_FLAGS["mount_dirs"].click_option(
    help="Directories to bind-mount in the container (passed to csrun_cpu and the probes).")
@click.option("--target-samples-per-sec", type=float, default=None, callback=_positive_float,
              help="Samples/s one accelerator (one trainer rank) consumes [default: compile_report.txt's estimate in "
                   "model_dir, else a previous run's performance.json, else best for the available nodes].")
@click.option("--local", is_flag=True, help="Probe this machine with plain processes (no Slurm).")
@click.option("--time-budget", type=float, default=DEFAULT_BUDGET_S, show_default=True, callback=_positive_float,
              metavar="SECONDS", help="Seconds for probing (loading run.py included).")
@click.option("--output", type=click.Path(file_okay=False), default=None,
              help="Output directory [default: <model_dir>/input_analysis/].")
@KEY_FLAGS["partition"].click_option(FLAG_NOTES["partition"])
@click.option("--no-run-command", is_flag=True,
              help="Do not run COMMAND first (it already succeeded); only analyse its input_fn.")
@click.option("--no-progress", is_flag=True, help="No progress bar / per-probe lines.")
@click.option("--strict", is_flag=True,
              help="Input workers' files that overlap or leave files unread are an error (exit 2, "
                   "nothing probed), not a warning.")
@click_options(by_name(LAYOUT_FLAGS, *RANK_FIELDS), over=RANK_HELP)
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def analyze_command(available_nodes: int | None, mount_dirs: str | None, target_samples_per_sec: float | None,
                    local: bool, time_budget: float, output: str | None, partition: str | None,
                    no_run_command: bool, no_progress: bool, strict: bool, chief_nodes: int,
                    chief_tasks_per_node: int, command: tuple[str, ...]) -> int:
    """Measure the input_fn of COMMAND's run.py and recommend nodes, tasks per node and CPUs
    per task for csrun_wse, with a predicted input throughput.

    COMMAND (`python run.py --params configs/params.yaml --mode validate_only|compile_only`)
    runs first (through csrun_cpu; with --local directly); then its run.py's input_fn is
    probed with the same params.
    """
    if mount_dirs:
        split_mount_dirs(mount_dirs)
    opts = Options(command=list(command), available_nodes=available_nodes, mount_dirs=mount_dirs,
                   target=target_samples_per_sec, local=local, budget_s=time_budget, output=output,
                   partition=partition, run_command=not no_run_command, progress=not no_progress,
                   strict=strict, chief_nodes=chief_nodes, chief_tasks_per_node=chief_tasks_per_node)
    return analyze(opts)
