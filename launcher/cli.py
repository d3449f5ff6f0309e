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
from pathlib import Path
from typing import Any, TypeVar

import click
from click.shell_completion import CompletionItem

from csrun_common.autoscale import AutoscaleSpec, plan_autoscale
from csrun_common.cli import OneLineErrors
from csrun_common.env import NO_PATH_CHECKS
from csrun_common.errors import CsrunError
from csrun_common.layout import LayoutSpec
from csrun_common.roles import RENDEZVOUS_ENV
from csrun_common.shardplan_schema import check_plan_workers, load_plan

from . import preflight, slurm
from .builders import EXECUTION_MODES, CpuRequest, WseRequest, expand_python_word
from .config import SiteConfig, format_config, load_config
from .container import site_container
from .flags import CommonFlags, CpuFlags, WseFlags
from .layout import JobLayout, plan, resolve_counts
from .policy import SitePolicy
from .requeue import REQUEUE_COUNT_ENV, REQUEUE_EXIT, RequeueSpec
from .resolve import (
    ClusterView,
    check_site_names,
    cluster_view,
    offline_node_cpus,
    requeue_spec,
    site_policy,
    task_env,
)
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
    name this CLI declares (``--total-nodes``): everything from the command's first word on
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


# --------------------------------------------------------------------------- completion
def _complete(query: Callable[[], list[str] | None]) -> Callable[..., list[CompletionItem]]:
    """A click ``shell_complete`` callback offering what ``query`` returns from Slurm (nothing
    when Slurm does not answer within its query timeout)."""

    def complete(_ctx: click.Context, _param: click.Parameter, incomplete: str) -> list[CompletionItem]:
        try:
            names = query() or []
        except CsrunError:
            return []
        return [CompletionItem(n) for n in names if n.startswith(incomplete)]

    return complete


def _partitions() -> list[str]:
    return sorted({n.partition for n in slurm.list_nodes("")})


# --------------------------------------------------------------------------- shared options
def policy_options(fn: F) -> F:
    """The site-policy, preflight and logging flags both CLIs take (docs/SLURM.md "Site policies")."""
    options = [
        click.option("--partition", default=None, shell_complete=_complete(_partitions),
                     help="Slurm partition [default: slurm.partition]."),
        click.option("--account", default=None, shell_complete=_complete(slurm.accounts),
                     help="Slurm account [default: slurm.account]."),
        click.option("--qos", default=None, shell_complete=_complete(slurm.qos_names),
                     help="Quality of service [default: slurm.qos]."),
        click.option("--reservation", default=None, shell_complete=_complete(slurm.reservations),
                     help="Reservation(s) to run in [default: slurm.reservation]."),
        click.option("--constraint", default=None, help="Node features required (e.g. 'skylake&ib') "
                     "[default: slurm.constraint]."),
        click.option("--time", "time_limit", default=None, metavar="TIME",
                     help="Time limit in Slurm's format: minutes, minutes:seconds, hours:minutes:seconds, "
                          "days-hours[:minutes[:seconds]] [default: slurm.time, else the partition's]."),
        click.option("--slurm-arg", "slurm_args", multiple=True, metavar="ARG",
                     help="An option passed verbatim to every het component, e.g. --slurm-arg=--mem=0 "
                          "(repeatable; added to slurm.extra_args)."),
        click.option("--check", is_flag=True,
                     help="Ask Slurm whether the job could run (--test-only) and check its files; "
                          "submit nothing. Exit 0 or 2."),
        click.option("--no-path-checks", is_flag=True, envvar=NO_PATH_CHECKS.name,
                     help="Skip the checks every launch makes of the script, --params, the data paths the "
                          "params name, the model_dir's parent and a shard plan's files (for clusters whose "
                          "login node does not see the compute nodes' paths; also CSRUN_NO_PATH_CHECKS=1; "
                          "docs/CHECKS.md)."),
        click.option("--verbose", is_flag=True,
                     help="Let the tasks print every TensorFlow C++ log line (also CSRUN_VERBOSE=1); by "
                          "default INFO lines are hidden, warnings and errors kept."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


WSE_EPILOG = """\b
Layouts (N = --total-nodes, T = --tasks-per-node, C = --cpus-per-task, S = --single-task-nodes):
  N = 1          one het component: T tasks x C CPUs with the GRES
  N > 1, S = 0   het group 0: 1 node x T tasks with the GRES (task 0 is the chief);
                 het group 1: N-1 nodes x T tasks x C CPUs (input workers)
  0 < S < N      S groups of 1 node x 1 task (the first with the GRES: the chief),
                 then N-S nodes x T tasks x C CPUs (input workers)
\b
Examples:
  csrun_wse python-ws run.py --params configs/params.yaml --mode train --max_steps 1000
  csrun_wse --total-nodes 4 --single-task-nodes 1 --tasks-per-node 2 python-ws run.py --mode train
  csrun_wse --total-nodes=3 --cpus-per-task=1 --cyclic --dry-run python run.py --mode train
  csrun_wse --use-sbatch --time 4:00:00 --requeue --total-nodes 2 python-ws run.py --mode train
  csrun_wse --check --qos debug --total-nodes 4 python-ws run.py --mode train
  csrun_wse --total-nodes 4 --tasks-per-node 2 --autoscale --min-workers 1 python-ws run.py --mode train
"""


@click.command("csrun_wse", cls=_CommandCli, context_settings=COMMAND_SETTINGS, epilog=WSE_EPILOG)
@click.option("--total-nodes", type=POSITIVE, default=None,
              help="Nodes in the job, the chief's included [default: defaults.nodes].")
@click.option("--tasks-per-node", type=POSITIVE, default=None,
              help="Tasks on each input-worker node [default: defaults.tasks_per_node, or node CPUs / C].")
@click.option("--cpus-per-task", type=POSITIVE, default=None,
              help="CPUs of each input-worker task "
                   "[default: defaults.cpus_per_task if T of them fit, else Slurm's choice].")
@click.option("--single-task-nodes", type=click.IntRange(min=0), default=0, show_default=True,
              help="Nodes, the chief's first, that run a single task holding the whole node.")
@click.option("--cyclic", is_flag=True, help="Distribute input-worker tasks cyclically over nodes (default: block).")
@click.option("--mount-dirs", metavar="DIR[,DIR...]", default=None,
              help="Directories to bind-mount in the container, added to container.mount_dirs.")
@click.option("--shard-plan", type=click.Path(dir_okay=False), default=None,
              help="Shard plan JSON (cs_input_analyzer shard-plan): each input worker reads only its files.")
@click.option("--requeue/--no-requeue", "requeue", default=None,
              help="On the warning signal before the time limit, preemption or scontrol requeue, checkpoint, "
                   "stop and requeue the job; it resumes from the checkpoint [default: requeue.enabled].")
@click.option("--requeue-signal", default=None, metavar="SIG@SECONDS",
              help="Warning signal and its lead time before the time limit [default: requeue.signal, USR2@90].")
@click.option("--max-requeues", type=int, default=None,
              help="Requeues allowed before the job is left failed [default: requeue.max_requeues, 3].")
@click.option("--chief-input-cpus", type=int, default=0, show_default=True, metavar="N",
              help="Run input worker 0 inside the chief's task on N of its CPUs, beside training: pinned "
                   "apart when Slurm binds the task and N is fewer than its CPUs, else sharing them at "
                   "lower priority (docs/CHIEF-INPUT.md).")
@click.option("--survive-node-loss", is_flag=True,
              help="Run the input-worker nodes as a job of their own (--no-kill), so that losing one "
                   "of them does not end the run: its workers start again on the surviving nodes "
                   "(docs/RESILIENCE.md).")
@click.option("--autoscale", is_flag=True,
              help="Grow and shrink the streaming input workers while training, within the layout's "
                   "input-worker tasks (docs/AUTOSCALE.md).")
@click.option("--min-workers", type=int, default=None,
              help="With --autoscale: never fewer streaming input workers [1].")
@click.option("--max-workers", type=int, default=None,
              help="With --autoscale: never more [every input-worker task of the layout].")
@click.option("--initial-workers", type=int, default=None,
              help="With --autoscale: input workers streaming at the start, e.g. the analyzer's "
                   "recommendation [--min-workers].")
@click.option("--autoscale-policy", type=click.Choice(["rate", "step"]), default="rate", show_default=True,
              help="rate: grow to the tf.data service AutoScaler's estimate at once; step: ±1 per window.")
@click.option("--autoscale-window", type=float, default=10.0, show_default=True, metavar="SECONDS",
              help="Seconds of training measured between two autoscale decisions.")
@policy_options
@click.option("--use-sbatch", is_flag=True, help="Submit as a batch het job and print the job id.")
@click.option("--dry-run", is_flag=True,
              help="Print exactly what would run (srun line, or the sbatch script); submit nothing. "
                   "Works without slurmctld when nothing it must answer is unknown.")
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
    policy, sources = site_policy(flags.policy(), cfg)
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
                     rendezvous_key=f"wse-{uuid.uuid4().hex[:12]}" if worker_job else "")
    if flags.check:
        return _check("csrun_wse", req, flags.use_sbatch, not flags.no_path_checks)
    _presubmit("csrun_wse", req, flags)
    return _launch(req, flags.use_sbatch, flags.dry_run)


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
    for attr, flag in NOT_WIRED_FOR_PYTORCH.items():
        if getattr(flags, attr):
            raise CsrunError(f'{flag} with python-pt: not wired for PyTorch yet '
                             f'(docs/PYTORCH.md "Not yet for PyTorch")')


def _refuse_check_with_dry_run(flags: CommonFlags) -> None:
    if flags.check and flags.dry_run:
        raise CsrunError("--check with --dry-run: choose one (--check asks Slurm, --dry-run prints the job)")


def _wse_layout(flags: WseFlags, cfg: SiteConfig, view: ClusterView) -> JobLayout:
    """Plan the het layout from the flags, the defaults and the cluster (named steps: node
    count and GRES against the partition, tasks × CPUs against a node)."""
    n = flags.total_nodes if flags.total_nodes is not None else cfg.nodes
    n_flag = "--total-nodes" if flags.total_nodes is not None else "defaults.nodes"
    if view.online:
        node_cpus = view.node_cpus or 1
        if n > len(view.nodes):
            raise CsrunError(f"{n_flag} {n}: the partition has only {len(view.nodes)} node(s)")
        if cfg.gres_resource:
            gres_name = cfg.gres_resource.split(":")[0]
            if not any(node.gres.split(":")[0] == gres_name for node in view.nodes):
                raise CsrunError(f"gres.resource = {cfg.gres_resource!r}: no node in the partition has GRES "
                                 f"{gres_name!r}")
    else:
        node_cpus = offline_node_cpus(view, flags.tasks_per_node, flags.cpus_per_task, flags.single_task_nodes)
    t, c = resolve_counts(flags.tasks_per_node, flags.cpus_per_task, cfg.tasks_per_node, cfg.cpus_per_task,
                          node_cpus)
    spec = LayoutSpec(n, t, c, flags.single_task_nodes, flags.chief_input_cpus, flags.cyclic)
    return plan(spec, cfg.gres_resource, node_cpus)


def _autoscale(flags: WseFlags, layout: JobLayout) -> AutoscaleSpec | None:
    """``--autoscale`` and its bounds against the layout's input-worker tasks; a bound given
    without ``--autoscale`` is refused (it would be silently ignored)."""
    if not flags.autoscale:
        for flag in ("min_workers", "max_workers", "initial_workers"):
            value = getattr(flags, flag)
            if value is not None:
                raise CsrunError(f"--{flag.replace('_', '-')} {value}: needs --autoscale")
        return None
    try:
        return plan_autoscale(layout.num_workers, flags.initial_workers, flags.min_workers, flags.max_workers,
                              flags.autoscale_policy, flags.autoscale_window)
    except ValueError as exc:
        raise CsrunError(str(exc)) from None


def _worker_job(flags: WseFlags, layout: JobLayout) -> bool:
    """``--survive-node-loss`` against the layout and the launch path (docs/RESILIENCE.md "A lost node").

    Raises :class:`CsrunError` with single-task nodes (het components of the chief's job,
    which Slurm ends whole when one of its nodes fails), and when the input workers' job would
    have fewer than 2 nodes (slurmctld keeps a job running on its other nodes only when it has
    more than one: ``kill_running_job_by_node_name``)."""
    if not flags.survive_node_loss:
        return False
    if flags.single_task_nodes:
        raise CsrunError(f"--survive-node-loss with --single-task-nodes {flags.single_task_nodes}: single-task "
                         "nodes belong to the chief's het job, which Slurm ends whole when one of its nodes fails")
    workers = layout.worker_component
    nodes = workers.nodes if workers else 0
    if nodes < 2:
        raise CsrunError(f"--survive-node-loss: the input workers' job would have {nodes} node(s) "
                         f"(--total-nodes {layout.total_nodes} minus the chief's); Slurm keeps a job running "
                         "after a node fails only when it has 2 or more: use --total-nodes 3 or more")
    return True


def _shard_plan(path: str | None, layout: JobLayout) -> str | None:
    if path is None:
        return None
    try:
        check_plan_workers(load_plan(path), layout.num_workers)
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


def _launch(req: WseRequest | CpuRequest, use_sbatch: bool, dry_run: bool) -> int:
    env = dict(os.environ)
    if use_sbatch:
        script = req.materialize_sbatch()
        if dry_run:
            click.echo(script, nl=False)
            return 0
        job_id = slurm.submit_batch(script, env=env)
        click.echo(job_id)
        return 0
    _emit_launch(req.srun_line(), dry_run)
    if dry_run:
        return 0
    if isinstance(req, WseRequest):
        env.update(dict(req.job_env()))
        if req.requeue is not None:
            return _run_with_requeues(req, req.requeue, env)
        return _run_wse(req, env)
    return slurm.run_foreground(req.materialize_srun(), env=env)


def _run_wse(req: WseRequest, env: dict[str, str]) -> int:
    """One srun launch of csrun_wse: the chief's job, with the input workers' own job beside it
    under ``--survive-node-loss``. The tasks' output passes through :mod:`launcher.tasklog`
    (docs/ERRORS.md)."""
    workers = req.materialize_worker_srun()
    if workers is None:
        return slurm.run_foreground(req.materialize_srun(), env=env, output=req.task_output())
    return slurm.run_with_worker_job(req.materialize_srun(), workers, env=env, output=req.task_output())


def _run_with_requeues(req: WseRequest, spec: RequeueSpec, env: dict[str, str]) -> int:
    """The srun path of ``--requeue``: an interactive job cannot be requeued (scontrol(1)
    ``requeue`` takes batch jobs), so csrun_wse launches the same srun again while the
    chief exits with :data:`REQUEUE_EXIT` (checkpoint saved) and the budget allows; the
    new job resumes from the checkpoint. A Ctrl-C or SIGTERM of csrun_wse ends the loop."""
    attempt = 0
    while True:
        run_env = {**env, REQUEUE_COUNT_ENV: str(attempt)}
        if req.worker_job:  # each launch of the two jobs has a rendezvous of its own
            run_env[RENDEZVOUS_ENV] = f"{req.rendezvous_key}.r{attempt}"
        rc = _run_wse(req, run_env)
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
@click.option("--alloc-node/--no-alloc-node", default=True, show_default=True,
              help="Reserve the whole CPU node (srun --nodes=1 --exclusive, all its CPUs); "
                   "with --no-alloc-node ask for defaults.cpus_per_task CPUs.")
@click.option("--mount-dirs", metavar="DIR[,DIR...]", default=None,
              help="Directories to bind-mount in the container, added to container.mount_dirs.")
@policy_options
@click.option("--use-sbatch", is_flag=True, help="Submit as a batch job and print the job id.")
@click.option("--dry-run", is_flag=True, help="Print exactly what would run; submit nothing.")
@click.option("--show-config", is_flag=True, help="Print every resolved site-config value and its source, then exit.")
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
    policy, sources = site_policy(flags.policy(), cfg)
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
    return _launch(req, flags.use_sbatch, flags.dry_run)


def _cpu_node_cpus(flags: CpuFlags, cfg: SiteConfig, view: ClusterView) -> int:
    """CPUs of the CPU node csrun_cpu asks for (all of them with ``--alloc-node``)."""
    if not view.online:
        if view.node_cpus:
            return view.node_cpus
        if not flags.alloc_node:
            return cfg.cpus_per_task
        raise CsrunError("--dry-run: slurmctld does not answer and --alloc-node needs the CPUs of a node: set "
                         "defaults.node_cpus in the site config, or use --no-alloc-node")
    if cfg.gres_node and all(node.name == cfg.gres_node for node in view.nodes):
        raise CsrunError(f"gres.node = {cfg.gres_node!r} is the only node in the partition; csrun_cpu excludes it")
    node_cpus = view.node_cpus or 1
    if not flags.alloc_node and cfg.cpus_per_task > node_cpus:
        raise CsrunError(f"defaults.cpus_per_task {cfg.cpus_per_task}: more than the {node_cpus} CPUs of a node")
    return node_cpus


__all__ = ["csrun_wse", "csrun_cpu", "policy_options"]
