"""``cs_input_analyzer [options] python run.py --params P --mode validate_only|compile_only``.

The main command: runs the user's command first (:mod:`analyzer.user_command`: through
``csrun_cpu``; with ``--local`` directly), then probes the same run.py's ``input_fn`` with the
same params (:mod:`analyzer.probe_driver`), builds the report from the probe rows
(:mod:`analyzer.findings`: the node model, the layout chosen) and writes it
(:mod:`analyzer.report`) into the output directory (default ``<model_dir>/input_analysis/``) —
nothing else of the user's is written.

The target rate (samples/s the accelerator consumes) is ``--target-samples-per-sec``, else
:func:`analyzer.user_command.find_target`'s, else none ("best for the available nodes").

The steps of :func:`analyze`, in order: :func:`_prepare` (the command, its params, Slurm's
facts, the output directory), :func:`run_user_command`, :func:`_probe_target`,
:func:`_report_base`, :func:`_check_files`, :func:`_probe`
(:func:`analyzer.probe_driver.run_probes`), :func:`analyzer.findings.build_report`,
:func:`_finish`. A new check of the user's input is one more step that adds its findings to
the report base's ``notes``.

Imported by the CLI at start-up: no TensorFlow, pandas or matplotlib at module level.
"""
from __future__ import annotations

import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from csrun_common.errors import CsrunError
from csrun_common.flagspec import by_name, click_options
from csrun_common.layout import LAYOUT_FLAGS, RANK_FIELDS, LayoutSpec
from launcher.config import FLAG_NOTES, KEY_FLAGS, SiteConfig, load_config
from launcher.container import site_container, split_mount_dirs

from . import file_coverage
from . import report as rp
from .findings import build_report
from .probe_driver import ProbeRun, run_probes
from .probe_session import ProbeLoadError, Target
from .slurm_facts import ClusterInfo, cluster_info, topology
from .user_command import Command, find_target, run_user_command, split_command

if TYPE_CHECKING:
    from .model import NodeModel

DEFAULT_BUDGET_S = 120.0


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
    return _finish(a.out, build_report(a.base, run.rows, topology(a.info, run.hellos)))


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
    """``report.json``'s ``target``: ``{"samples_per_sec", "source"}`` from one accelerator's
    ``per_rank`` samples/s (``None``: no target); with several trainer ranks the world's
    (× ``world_size``), plus ``"per_rank_samples_per_sec"`` and ``"world_size"``."""
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
