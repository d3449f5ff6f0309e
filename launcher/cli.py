"""The click CLIs ``csrun_wse`` and ``csrun_cpu``.

Light at start-up: no TensorFlow, no jinja2 until an sbatch script is rendered.
Every bad input ends in one line ``<prog>: error: <message naming the flag/key and value>``
with exit status 2, before anything is submitted. Shell completion is click's
(``eval "$(_CSRUN_WSE_COMPLETE=bash_source csrun_wse)"``, docs/SLURM.md "Shell completion").
"""
from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import click

from csrun_common.autoscale import AutoscaleSpec, plan_autoscale
from csrun_common.cli import OneLineErrors
from csrun_common.errors import CsrunError
from csrun_common.jobsecret import with_new_secret
from csrun_common.layout import FLAGS, LayoutSpec, flag, resolve_counts
from csrun_common.roles import RENDEZVOUS_ENV
from csrun_common.shardplan_schema import check_plan_workers, load_plan

from . import batchcheck, preflight, rankfit, slurm
from .builders import EXECUTION_MODES, CpuRequest, WseRequest, expand_python_word
from .config import SiteConfig, format_config, load_config
from .container import site_container
from .flags import CPU_OPTIONS, WSE_OPTIONS, CommonFlags, CpuFlags, WseFlags, cpu_options, wse_options
from .layout import JobLayout, plan
from .policy import SitePolicy
from .requeue import REQUEUE_COUNT_ENV, REQUEUE_EXIT, RequeueSpec
from .resolve import (
    ClusterView,
    check_site_names,
    cluster_view,
    gres_nodes,
    offline_node_cpus,
    requeue_spec,
    site_policy,
    task_env,
)
from .runs.recorder import Recorder, flag_argv
from .version import version_option

F = TypeVar("F", bound=Callable[..., Any])

COMMAND_SETTINGS = {
    "allow_interspersed_args": False,  # everything from the command's first word on is its argv
    "help_option_names": ["-h", "--help"],
    "max_content_width": 100,
}


POSITIVE = click.IntRange(min=1)


def _emit_launch(line: str, dry_run: bool) -> None:
    if dry_run:
        click.echo(line)
    else:
        click.echo(f"Launching: {line}", err=True)


def _note(prog: str, message: str) -> None:
    click.echo(f"{prog}: note: {message}", err=True)


def _presubmit(prog: str, req: WseRequest | CpuRequest, flags: CommonFlags) -> None:
    """The file checks of every launch (:func:`launcher.preflight.presubmit`): a failure is
    one error line (exit 2, nothing submitted); for a ``--dry-run`` a note per failure (the
    printed line is still printed); a warning line per check that passed with one
    (:attr:`launcher.preflight.Check.warning`); nothing with ``--no-path-checks``."""
    if flags.no_path_checks:
        return
    if not flags.dry_run:
        checks = preflight.presubmit(req)
    else:
        checks = preflight.presubmit_checks(req)
        for c in checks:
            if not c.ok:
                _note(prog, f"{c.message()}: a launch would refuse this ({preflight.SKIP_HINT})")
    for c in checks:  # passed, with something to say (a relative data path found only beside the script)
        if c.ok and c.warning:
            click.echo(f"{prog}: warning: {c.warning}", err=True)


def _warn_options_after_command(prog: str, command: tuple[str, ...]) -> None:
    """One warning line when the command's arguments (after its first word) hold an option
    name this CLI declares (``--partition``): everything from the command's first word on
    is the command's own argv, so it was not taken as a csrun option. Not an error: the
    user's script may have an option of the same name. ``-h``/``--help`` and ``-V``/``--version``,
    which most programs take too, are not flagged."""
    names: set[str] = set()
    for param in click.get_current_context().command.params:
        if isinstance(param, click.Option):
            names.update(param.opts)
            names.update(param.secondary_opts)
    names -= {"-h", "--help", "-V", "--version"}
    found = []
    for word in command[1:]:
        name = word.split("=", 1)[0] if word.startswith("--") else word
        if name in names and name not in found:
            found.append(name)
    if found:
        listed = ", ".join(found)
        click.echo(f"{prog}: warning: {listed} after the command {preflight.show(command[0])}: passed to the "
                   f"command, not to {prog}; {prog}'s options go before the command "
                   f"({prog} [OPTIONS] COMMAND [ARGS]...)", err=True)


class _CommandCli(OneLineErrors):
    """csrun_wse/csrun_cpu: a missing COMMAND points to ``--help``."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:  # noqa: D102
        try:
            return super().parse_args(ctx, args)
        except click.MissingParameter as exc:
            if exc.param is not None and exc.param.name == "command":
                raise _missing_command(ctx.info_name or self.name or "csrun") from None
            raise


def _missing_command(prog: str) -> click.UsageError:
    return click.UsageError(f"Missing argument 'COMMAND...': the program to run and its arguments, after "
                            f"{prog}'s options ({prog} [OPTIONS] COMMAND [ARGS]...); see '{prog} --help' for "
                            "the options and examples")


def _check_names_or_note(prog: str, view: ClusterView, policy: SitePolicy, sources: Mapping[str, str]) -> None:
    """With slurmctld answering, refuse a partition, account, QOS, reservation or feature
    Slurm does not know (:func:`launcher.resolve.check_site_names`); without it (a dry run),
    say once why nothing was checked."""
    if view.online:
        check_site_names(policy, sources)
    else:
        _note(prog, view.note)


#: The layout flags appear as ``{field}`` (their text from :data:`csrun_common.layout.FLAGS`).
WSE_EPILOG = """\b
Layouts (N = {nodes}, T = {tasks_per_node}, C = {cpus_per_task}, S = {single_task_nodes}):
  N = 1          one het component: T tasks x C CPUs with the GRES
  N > 1, S = 0   het group 0: 1 node x T tasks with the GRES (task 0 is the chief);
                 het group 1: N-1 nodes x T tasks x C CPUs (input workers)
  0 < S < N      S groups of 1 node x 1 task (the first with the GRES: the chief),
                 then N-S nodes x T tasks x C CPUs (input workers)
  {chief_nodes} K {chief_tasks_per_node} R (K x R > 1): het group 0: K nodes x R trainer ranks
                 (the GRES x R per node); het group 1: N-K nodes x T tasks x C CPUs
\b
Examples:
  csrun_wse python-ws run.py --params configs/params.yaml --mode train --max_steps 1000
  csrun_wse {nodes} 4 {single_task_nodes} 1 {tasks_per_node} 2 python-ws run.py --mode train
  csrun_wse {nodes}=3 {cpus_per_task}=1 {cyclic} --dry-run python run.py --mode train
  csrun_wse --use-sbatch --time 4:00:00 --requeue {nodes} 2 python-ws run.py --mode train
  csrun_wse --check --qos debug {nodes} 4 python-ws run.py --mode train
  csrun_wse {nodes} 4 {tasks_per_node} 2 --autoscale --min-workers 1 python-ws run.py --mode train
  csrun_wse {nodes} 6 {tasks_per_node} 2 {chief_nodes} 2 {chief_tasks_per_node} 2 python-pt run.py --mode train
""".format_map(FLAGS)


@click.command("csrun_wse", cls=_CommandCli, context_settings=COMMAND_SETTINGS, epilog=WSE_EPILOG)
@wse_options
@version_option("csrun_wse")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def csrun_wse(command: tuple[str, ...], **kw: Any) -> int:  # kw: click's values, typed at once as WseFlags
    """Launch COMMAND as one heterogeneous Slurm job: the chief on the accelerator (GRES)
    node and input-worker tasks on CPU nodes.

    `python-ws` (or `python-pt`) as the first word runs the configured Python with the
    weight-streaming (or PyTorch) execution mode exported, so
    `csrun_wse python-ws run.py ...` works verbatim. Each task learns its role
    (chief / single-task / worker) from CSRUN_* variables (docs/CONTRACT.md).
    """
    _warn_options_after_command("csrun_wse", command)
    flags = WseFlags.from_click(kw)
    cfg = load_config()
    if not cfg.path_checks:  # site key checks.paths = false: as --no-path-checks
        flags = flags.without_path_checks()
    _refuse_check_with_dry_run(flags)
    policy, sources = site_policy(flags.policy, cfg)
    requeue = requeue_spec(flags.requeue, flags.requeue_signal, flags.max_requeues, cfg, policy, sources["time"])
    container = site_container(cfg, flags.mount_dirs)
    cmd, mode = expand_python_word(command, cfg.python)
    _refuse_not_wired(flags, mode)
    view = cluster_view(policy.partition, sources["partition"], cfg, flags.dry_run, exclude=cfg.gres_node)
    layout = _wse_layout(flags, cfg, view)
    _check_names_or_note("csrun_wse", view, policy, sources)
    worker_job = _worker_job(flags, layout)
    req = WseRequest(layout=layout, command=tuple(cmd), python=cfg.python, container=container,
                     execution_mode=mode, policy=policy, exclude_node=cfg.gres_node,
                     shard_plan=_shard_plan(flags.shard_plan, layout), requeue=requeue,
                     task_env=task_env(flags.verbose), slurm_version=_slurm_major_minor(),
                     autoscale=_autoscale(flags, layout), worker_job=worker_job,
                     rendezvous_key=f"wse-{uuid.uuid4().hex[:12]}" if worker_job else "",
                     master_port=cfg.master_port)
    if flags.check:
        return _check("csrun_wse", req, flags.use_sbatch, not flags.no_path_checks)
    _presubmit("csrun_wse", req, flags)
    _batch_check("csrun_wse", req, flags, cfg)
    recording = _Recording(cfg.state_dir, [*flag_argv(WSE_OPTIONS, flags), *command])
    return _launch(req, flags.use_sbatch, flags.dry_run, recording)


def _batch_check(prog: str, req: WseRequest, flags: WseFlags, cfg: SiteConfig) -> None:
    """Pull one batch of the training input on this host before queueing
    (:mod:`launcher.batchcheck`): the user's input code raising is refused with the worker's
    lines (:class:`CsrunError`, exit 2, nothing submitted); over the bound, or not checkable
    here, one note line and the launch goes on."""
    skipped = next((name for name, on in (("--no-batch-check", flags.no_batch_check), ("--dry-run", flags.dry_run),
                                          ("--check", flags.check), ("--no-path-checks", flags.no_path_checks))
                    if on), "")
    secs = 0 if skipped else batchcheck.bound(cfg.batch_check_secs)
    spec = req.layout.spec
    check = batchcheck.plan(req.command, secs=secs, container=req.container.runtime != "none",
                            workers=req.layout.num_input_workers, cpus=(spec.cpus_per_task if spec else None) or 1,
                            skipped_by=skipped)
    if check is None:
        return
    outcome = batchcheck.run(check)
    if outcome.status == "user_error":
        raise CsrunError(f"{outcome.text}\n{batchcheck.HINT}")
    line = batchcheck.note(outcome, check.secs)
    if line:
        _note(prog, line)


#: csrun_wse flags that the PyTorch runtime does not act on yet (docs/PYTORCH.md "Not yet for
#: PyTorch"; the runtime's csrun_runtime.pytorch.runner.NOT_WIRED names the same): WseFlags
#: attribute -> flag. Refused with ``python-pt``; a plain ``python run.py`` command gets the
#: runtime's warning instead (the launcher cannot know its framework). None at present
#: (--autoscale and --survive-node-loss are wired); kept so that the next such flag is refused.
NOT_WIRED_FOR_PYTORCH: dict[str, str] = {}


def _refuse_not_wired(flags: WseFlags, mode: str | None) -> None:
    """Raise :class:`CsrunError` (one line naming the flag) when the command's first word is
    ``python-pt`` (execution ``mode`` ``pytorch``) and a flag of
    :data:`NOT_WIRED_FOR_PYTORCH` is set: before Slurm is asked anything, nothing submitted."""
    if mode != EXECUTION_MODES["python-pt"]:
        return
    for attr, text in NOT_WIRED_FOR_PYTORCH.items():
        if getattr(flags, attr):
            raise CsrunError(f'{text} with python-pt: not wired for PyTorch yet '
                             f'(docs/PYTORCH.md "Not yet for PyTorch")')


def _refuse_check_with_dry_run(flags: CommonFlags) -> None:
    if flags.check and flags.dry_run:
        raise CsrunError("--check with --dry-run: choose one (--check asks Slurm, --dry-run prints the job)")


def _wse_layout(flags: WseFlags, cfg: SiteConfig, view: ClusterView) -> JobLayout:
    """Plan the het layout from the flags, the defaults and the cluster (named steps: node
    count and GRES against the partition, tasks × CPUs against a node)."""
    given = flags.layout
    n = given["nodes"] if given["nodes"] is not None else cfg.nodes
    n_flag = flag("nodes") if given["nodes"] is not None else "defaults.nodes"
    if view.online:
        node_cpus = view.node_cpus or 1
        if n > len(view.nodes):
            raise CsrunError(f"{n_flag} {n}: the partition has only {len(view.nodes)} node(s)")
        missing = rankfit.gres_missing(cfg.gres_resource, view.nodes)
        if missing:
            raise CsrunError(missing)
    else:
        node_cpus = offline_node_cpus(view, given["tasks_per_node"], given["cpus_per_task"],
                                      given["single_task_nodes"])
    t, c = resolve_counts(given["tasks_per_node"], given["cpus_per_task"], cfg.tasks_per_node, cfg.cpus_per_task,
                          node_cpus)
    spec = LayoutSpec(**{**given, "nodes": n, "tasks_per_node": t, "cpus_per_task": c})
    if view.online and spec.world_size > 1:  # the partition's refusal names a layout that fits
        rankfit.check(spec, cfg.gres_resource, cfg.gres_node, view.nodes, node_cpus)
    return plan(spec, cfg.gres_resource, node_cpus)


def _autoscale(flags: WseFlags, layout: JobLayout) -> AutoscaleSpec | None:
    """``--autoscale`` and its bounds against the layout's input-worker tasks (each rank's,
    ``W / world``, with several trainer ranks: docs/AUTOSCALE.md); a bound given without
    ``--autoscale`` is refused (it would be silently ignored)."""
    if not flags.autoscale:
        for flag in ("min_workers", "max_workers", "initial_workers"):
            value = getattr(flags, flag)
            if value is not None:
                raise CsrunError(f"--{flag.replace('_', '-')} {value}: needs --autoscale")
        return None
    world = layout.world_size  # with several ranks the bounds count each rank's input workers
    try:
        return plan_autoscale(layout.num_input_workers // world, flags.initial_workers, flags.min_workers,
                              flags.max_workers, flags.autoscale_policy, flags.autoscale_window)
    except ValueError as exc:
        if world > 1:
            raise CsrunError(f"{exc} (per trainer rank: {layout.num_input_workers} input workers for {world} "
                             "ranks; the bounds count each rank's)") from None
        raise CsrunError(str(exc)) from None


def _worker_job(flags: WseFlags, layout: JobLayout) -> bool:
    """``--survive-node-loss`` against the layout and the launch path (docs/RESILIENCE.md "A lost node").

    Raises :class:`CsrunError` with several trainer ranks (not yet: a lost worker's adoption
    is per rank directory, docs/MULTI-RANK.md), with single-task nodes (het components of the chief's job,
    which Slurm ends whole when one of its nodes fails), and when the input workers' job would
    have fewer than 2 nodes (slurmctld keeps a job running on its other nodes only when it has
    more than one: ``kill_running_job_by_node_name``)."""
    if not flags.survive_node_loss:
        return False
    if layout.world_size > 1:
        raise CsrunError(f"--survive-node-loss with {flag('chief_nodes')} {flags.layout['chief_nodes']} "
                         f"{flag('chief_tasks_per_node')} {flags.layout['chief_tasks_per_node']}: not yet with several "
                         "trainer ranks (docs/MULTI-RANK.md)")
    single = flags.layout["single_task_nodes"]
    if single:
        raise CsrunError(f"--survive-node-loss with {flag('single_task_nodes')} {single}: single-task "
                         "nodes belong to the chief's het job, which Slurm ends whole when one of its nodes fails")
    workers = layout.worker_component
    nodes = workers.nodes if workers else 0
    if nodes < 2:
        raise CsrunError(f"--survive-node-loss: the input workers' job would have {nodes} node(s) "
                         f"({flag('nodes')} {layout.total_nodes} minus the chief's); Slurm keeps a job running "
                         f"after a node fails only when it has 2 or more: use {flag('nodes')} 3 or more")
    return True


def _shard_plan(path: str | None, layout: JobLayout) -> str | None:
    if path is None:
        return None
    try:
        check_plan_workers(load_plan(path), layout.num_input_workers)
    except (ValueError, OSError) as exc:
        raise CsrunError(f"--shard-plan {path}: {exc}") from None
    return str(Path(path).resolve())


def _slurm_major_minor() -> tuple[int, int] | None:
    rel = slurm.slurm_release()
    return (rel[0], rel[1]) if rel else None


def _check(prog: str, req: WseRequest | CpuRequest, use_sbatch: bool, path_checks: bool = True) -> int:
    """``--check``: print the report; exit 0, or 2 with one error line after the report."""
    try:
        report, code = preflight.run_check(prog, req, use_sbatch, path_checks=path_checks)
    except preflight.PreflightFailed as exc:
        click.echo(exc.report)
        raise
    click.echo(report)
    return code


@dataclass(frozen=True)
class _Recording:
    """Where a launch is recorded (the site key ``runs.state_dir``) and its command line (the
    options given, :func:`launcher.runs.recorder.flag_argv`, and the command as typed)."""

    state_dir: str
    argv: list[str]

    def start(self, req: WseRequest | CpuRequest, use_sbatch: bool) -> Recorder | None:
        """The run's record (:mod:`launcher.runs.recorder`), its id said on stderr."""
        kind = "csrun_wse" if isinstance(req, WseRequest) else "csrun_cpu"
        rec = Recorder.start(self.state_dir, kind, self.argv, req, use_sbatch)
        if rec is not None:
            click.echo(f"{kind}: run {rec.rec.run_id} (csrun status {rec.rec.run_id})", err=True)
        return rec


def _launch(req: WseRequest | CpuRequest, use_sbatch: bool, dry_run: bool, recording: _Recording | None = None) -> int:
    # the job's secret: in the environment srun or sbatch gets (Slurm keeps a batch job's for its
    # requeues), never in argv, the script or the Launching line (docs/SECURITY.md)
    env = with_new_secret(os.environ) if isinstance(req, WseRequest) else dict(os.environ)
    if use_sbatch:
        script = req.materialize_sbatch()
        if dry_run:
            click.echo(script, nl=False)
            return 0
        job_id = slurm.submit_batch(script, env=env)
        rec = recording.start(req, True) if recording else None
        if rec is not None:
            rec.submitted(job_id)
        click.echo(job_id)
        return 0
    _emit_launch(req.srun_line(), dry_run)
    if dry_run:
        return 0
    rec = recording.start(req, False) if recording else None
    status = 1
    try:
        status = _run_srun(req, env, rec)
    finally:
        if rec is not None:
            rec.exited(status)
    return status


def _run_srun(req: WseRequest | CpuRequest, env: dict[str, str], rec: Recorder | None) -> int:
    if isinstance(req, WseRequest):
        env.update(dict(req.job_env()))
        if req.requeue is not None:
            return _run_with_requeues(req, req.requeue, env, rec)
        return _run_wse(req, env, rec)
    return slurm.run_foreground(req.materialize_srun(), env=env)


def _run_wse(req: WseRequest, env: dict[str, str], rec: Recorder | None = None, attempt: int = 1) -> int:
    """One srun launch of csrun_wse: the chief's job, with the input workers' own job beside it
    under ``--survive-node-loss``. The tasks' output passes through :mod:`launcher.tasklog`
    (docs/ERRORS.md); with a record, each task's lines also go to ``attempt``'s directory
    (:class:`launcher.slurm.TaskLogFile`)."""
    log = slurm.task_log(attempt, rec.on_job) if rec is not None else slurm.task_log()
    try:
        workers = req.materialize_worker_srun()
        if workers is None:
            return slurm.run_foreground(req.materialize_srun(), env=env, output=req.task_output(), log=log)
        return slurm.run_with_worker_job(req.materialize_srun(), workers, env=env, output=req.task_output(), log=log)
    finally:
        log.close()


def _run_with_requeues(req: WseRequest, spec: RequeueSpec, env: dict[str, str], rec: Recorder | None = None) -> int:
    """The srun path of ``--requeue``: an interactive job cannot be requeued (scontrol(1)
    ``requeue`` takes batch jobs), so csrun_wse launches the same srun again while the
    chief exits with :data:`REQUEUE_EXIT` (checkpoint saved) and the budget allows; the
    new job resumes from the checkpoint. A Ctrl-C or SIGTERM of csrun_wse ends the loop."""
    attempt = 0
    while True:
        run_env = {**env, REQUEUE_COUNT_ENV: str(attempt)}
        if req.worker_job:  # each launch of the two jobs has a rendezvous of its own
            run_env[RENDEZVOUS_ENV] = f"{req.rendezvous_key}.r{attempt}"
        rc = _run_wse(req, run_env, rec, attempt + 1)
        if rc != REQUEUE_EXIT:
            return rc
        if attempt >= spec.max_requeues:
            click.echo(f"csrun_wse: retry budget spent ({attempt} requeue(s), --max-requeues {spec.max_requeues}): "
                       "resubmit to resume from the checkpoint", err=True)
            return rc
        attempt += 1
        click.echo(f"csrun_wse: the chief saved a checkpoint and stopped: launching again "
                   f"(requeue {attempt} of {spec.max_requeues})", err=True)
        _emit_launch(req.srun_line(), False)


CPU_EPILOG = """\b
Examples:
  csrun_cpu python run.py --params configs/params.yaml --mode validate_only
  csrun_cpu python run.py --params configs/params.yaml --mode compile_only
  csrun_cpu --no-alloc-node --mount-dirs /data,/scratch bash
  csrun_cpu --use-sbatch --time 30 python prepare_data.py
  csrun_cpu --check python run.py --params configs/params.yaml --mode validate_only
  csrun_cpu --show-config
"""


@click.command("csrun_cpu", cls=_CommandCli, context_settings=COMMAND_SETTINGS, epilog=CPU_EPILOG)
@cpu_options
@version_option("csrun_cpu")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def csrun_cpu(command: tuple[str, ...], **kw: Any) -> int:  # kw: click's values, typed at once as CpuFlags
    """Run COMMAND on one CPU node of the cluster (never the accelerator node),
    inside the configured container: validate, compile, prepare data, or a shell.

    `python-ws`/`python-pt` as the first word run the configured Python, as in csrun_wse.
    """
    flags = CpuFlags.from_click(kw)
    cfg = load_config()
    if not cfg.path_checks:  # site key checks.paths = false: as --no-path-checks
        flags = flags.without_path_checks()
    if flags.show_config:
        click.echo(format_config(cfg))
        return 0
    if not command:
        raise _missing_command("csrun_cpu")
    _warn_options_after_command("csrun_cpu", command)
    _refuse_check_with_dry_run(flags)
    policy, sources = site_policy(flags.policy, cfg)
    container = site_container(cfg, flags.mount_dirs)
    cmd, _mode = expand_python_word(command, cfg.python)
    view = cluster_view(policy.partition, sources["partition"], cfg, flags.dry_run, exclude=cfg.gres_node)
    node_cpus = _cpu_node_cpus(flags, cfg, view)
    _check_names_or_note("csrun_cpu", view, policy, sources)
    pty = sys.stdin.isatty() and sys.stdout.isatty() and not flags.use_sbatch
    req = CpuRequest(command=tuple(cmd), python=cfg.python, alloc_node=flags.alloc_node, node_cpus=node_cpus,
                     cpus_per_task=cfg.cpus_per_task, container=container, policy=policy,
                     exclude_node=cfg.gres_node, pty=pty, task_env=task_env(flags.verbose),
                     slurm_version=_slurm_major_minor())
    if flags.check:
        return _check("csrun_cpu", req, flags.use_sbatch, not flags.no_path_checks)
    _presubmit("csrun_cpu", req, flags)
    recording = _Recording(cfg.state_dir, [*flag_argv(CPU_OPTIONS, flags), *command])
    return _launch(req, flags.use_sbatch, flags.dry_run, recording)


def _cpu_node_cpus(flags: CpuFlags, cfg: SiteConfig, view: ClusterView) -> int:
    """CPUs of the CPU node csrun_cpu asks for (all of them with ``--alloc-node``)."""
    if not view.online:
        if view.node_cpus:
            return view.node_cpus
        if not flags.alloc_node:
            return cfg.cpus_per_task
        raise CsrunError("--dry-run: slurmctld does not answer and --alloc-node needs the CPUs of a node: set "
                         "defaults.node_cpus in the site config, or use --no-alloc-node")
    excluded = gres_nodes(cfg.gres_node)
    if excluded and all(node.name in excluded for node in view.nodes):
        what = "is the only node" if len(excluded) == 1 else "names every node"
        raise CsrunError(f"gres.node = {cfg.gres_node!r} {what} in the partition; csrun_cpu excludes it")
    node_cpus = view.node_cpus or 1
    if not flags.alloc_node and cfg.cpus_per_task > node_cpus:
        raise CsrunError(f"defaults.cpus_per_task {cfg.cpus_per_task}: more than the {node_cpus} CPUs of a node")
    return node_cpus


__all__ = ["csrun_wse", "csrun_cpu"]
