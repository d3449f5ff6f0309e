"""The flags of ``csrun_wse`` and ``csrun_cpu``: each declared once, and as typed values.

Every flag is one :class:`~csrun_common.flagspec.FlagSpec` (its parameter name, flag text,
type, default and help): the layout flags in :data:`csrun_common.layout.LAYOUT_FLAGS`, the
others here (:data:`POLICY_OPTIONS`, :data:`WSE_OPTIONS`, :data:`CPU_OPTIONS`). The click
options of both CLIs are built from these tuples (:func:`wse_options`, :func:`cpu_options`),
so a flag is not written per CLI. click parses the command line; the command functions then
hold a :class:`WseFlags` or :class:`CpuFlags` instead of an untyped ``**kw`` dict, so a
misspelt flag name is a type error (mypy) or a ``TypeError`` naming the field at the first
call, not a ``KeyError`` deep in a launch. The typed fields are checked against the
declarations, names and defaults, by ``tests/unit/test_options.py``; the layout flags' values
travel as one mapping (:attr:`WseFlags.layout`), so a new layout flag needs no field here.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any, TypeVar

import click
from click.shell_completion import CompletionItem

from csrun_common.env import NO_PATH_CHECKS
from csrun_common.errors import CsrunError
from csrun_common.flagspec import FlagSpec, click_options
from csrun_common.layout import LAYOUT_FLAGS

from . import slurm
from .resolve import PolicyFlags

T = TypeVar("T", bound="CommonFlags")
F = TypeVar("F", bound=Callable[..., Any])


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


# --------------------------------------------------------------------------- declarations
#: The site-policy, preflight and logging flags both CLIs take (docs/SLURM.md "Site policies").
POLICY_OPTIONS: tuple[FlagSpec, ...] = (
    FlagSpec("partition", "--partition", str, None, "Slurm partition [default: slurm.partition].",
             options={"shell_complete": _complete(_partitions)}),
    FlagSpec("account", "--account", str, None, "Slurm account [default: slurm.account].",
             options={"shell_complete": _complete(slurm.accounts)}),
    FlagSpec("qos", "--qos", str, None, "Quality of service [default: slurm.qos].",
             options={"shell_complete": _complete(slurm.qos_names)}),
    FlagSpec("reservation", "--reservation", str, None, "Reservation(s) to run in [default: slurm.reservation].",
             options={"shell_complete": _complete(slurm.reservations)}),
    FlagSpec("constraint", "--constraint", str, None,
             "Node features required (e.g. 'skylake&ib') [default: slurm.constraint]."),
    FlagSpec("time", "--time", str, None, "Time limit in Slurm's format: minutes, minutes:seconds, "
             "hours:minutes:seconds, days-hours[:minutes[:seconds]] [default: slurm.time, else the partition's].",
             metavar="TIME"),
    FlagSpec("slurm_args", "--slurm-arg", str, (), "An option passed verbatim to every het component, e.g. "
             "--slurm-arg=--mem=0 (repeatable; added to slurm.extra_args).", metavar="ARG", multiple=True),
    FlagSpec("check", "--check", bool, False, "Ask Slurm whether the job could run (--test-only) and check its "
             "files; submit nothing. Exit 0 or 2."),
    FlagSpec("no_path_checks", "--no-path-checks", bool, False, "Skip the checks every launch makes of the "
             "script, --params, the data paths the params name, the model_dir's parent and a shard plan's files "
             "(for clusters whose login node does not see the compute nodes' paths; also CSRUN_NO_PATH_CHECKS=1; "
             "docs/CHECKS.md).", options={"envvar": NO_PATH_CHECKS.name}),
    FlagSpec("verbose", "--verbose", bool, False, "Let the tasks print every TensorFlow C++ log line (also "
             "CSRUN_VERBOSE=1); by default INFO lines are hidden, warnings and errors kept."),
)
_MOUNT_DIRS = FlagSpec("mount_dirs", "--mount-dirs", str, None,
                       "Directories to bind-mount in the container, added to container.mount_dirs.",
                       metavar="DIR[,DIR...]")
_USE_SBATCH = FlagSpec("use_sbatch", "--use-sbatch", bool, False, "Submit as a batch het job and print the job id.")
_DRY_RUN = FlagSpec("dry_run", "--dry-run", bool, False, "Print exactly what would run (srun line, or the sbatch "
                    "script); submit nothing. Works without slurmctld when nothing it must answer is unknown.")
_LAYOUT_HEAD = tuple(s for s in LAYOUT_FLAGS if s.name != "chief_input_cpus")
_CHIEF_INPUT = tuple(s for s in LAYOUT_FLAGS if s.name == "chief_input_cpus")
#: ``csrun_wse``'s flags, in ``--help``'s order: the layout flags (:data:`LAYOUT_FLAGS`), the
#: container, the shard plan, ``--requeue``, the chief's input CPUs, node loss, ``--autoscale``,
#: then :data:`POLICY_OPTIONS` and the launch's.
WSE_OPTIONS: tuple[FlagSpec, ...] = (
    *_LAYOUT_HEAD,
    _MOUNT_DIRS,
    FlagSpec("shard_plan", "--shard-plan", str, None, "Shard plan JSON (cs_input_analyzer shard-plan): each input "
             "worker reads only its files.", options={"type": click.Path(dir_okay=False)}),
    FlagSpec("requeue", "--requeue", bool, None, "On the warning signal before the time limit, preemption or "
             "scontrol requeue, checkpoint, stop and requeue the job; it resumes from the checkpoint "
             "[default: requeue.enabled].", off_flag="--no-requeue"),
    FlagSpec("requeue_signal", "--requeue-signal", str, None, "Warning signal and its lead time before the time "
             "limit [default: requeue.signal, USR2@90].", metavar="SIG@SECONDS"),
    FlagSpec("max_requeues", "--max-requeues", int, None, "Requeues allowed before the job is left failed "
             "[default: requeue.max_requeues, 3]."),
    *_CHIEF_INPUT,
    FlagSpec("survive_node_loss", "--survive-node-loss", bool, False, "Run the input-worker nodes as a job of "
             "their own (--no-kill), so that losing one of them does not end the run: its workers start again on "
             "the surviving nodes (docs/RESILIENCE.md)."),
    FlagSpec("autoscale", "--autoscale", bool, False, "Grow and shrink the streaming input workers while "
             "training, within the layout's input-worker tasks (docs/AUTOSCALE.md)."),
    FlagSpec("min_workers", "--min-workers", int, None,
             "With --autoscale: never fewer streaming input workers [1]."),
    FlagSpec("max_workers", "--max-workers", int, None,
             "With --autoscale: never more [every input-worker task of the layout]."),
    FlagSpec("initial_workers", "--initial-workers", int, None, "With --autoscale: input workers streaming at "
             "the start, e.g. the analyzer's recommendation [--min-workers]."),
    FlagSpec("autoscale_policy", "--autoscale-policy", str, "rate", "rate: grow to the tf.data service "
             "AutoScaler's estimate at once; step: ±1 per window.", choices=("rate", "step"), show_default=True),
    FlagSpec("autoscale_window", "--autoscale-window", float, 10.0,
             "Seconds of training measured between two autoscale decisions.", metavar="SECONDS",
             show_default=True),
    *POLICY_OPTIONS,
    FlagSpec("no_batch_check", "--no-batch-check", bool, False, "Do not pull one batch of the training input "
             "on this host before queueing (by default a training run's first batch is pulled, bounded by "
             "checks.batch_secs seconds, and a launch whose input code raises is refused; docs/CHECKS.md)."),
    _USE_SBATCH,
    _DRY_RUN,
)
#: ``csrun_wse``'s ``[default: ...]`` of the layout flags: the site config's keys.
WSE_LAYOUT_NOTES = {"nodes": "defaults.nodes", "tasks_per_node": "defaults.tasks_per_node, or node CPUs / C",
                    "cpus_per_task": "defaults.cpus_per_task if T of them fit, else Slurm's choice"}
#: ``csrun_cpu``'s flags, in ``--help``'s order.
CPU_OPTIONS: tuple[FlagSpec, ...] = (
    FlagSpec("alloc_node", "--alloc-node", bool, True, "Reserve the whole CPU node (srun --nodes=1 --exclusive, "
             "all its CPUs); with --no-alloc-node ask for defaults.cpus_per_task CPUs.", off_flag="--no-alloc-node",
             show_default=True),
    _MOUNT_DIRS,
    *POLICY_OPTIONS,
    replace(_USE_SBATCH, help="Submit as a batch job and print the job id."),
    replace(_DRY_RUN, help="Print exactly what would run; submit nothing."),
    FlagSpec("show_config", "--show-config", bool, False,
             "Print every resolved site-config value and its source, then exit."),
)
#: The layout fields (:data:`LAYOUT_FLAGS`' names): :attr:`WseFlags.layout`'s keys.
LAYOUT_NAMES = frozenset(s.name for s in LAYOUT_FLAGS)


def wse_options(fn: F) -> F:
    """The click options of ``csrun_wse`` (:data:`WSE_OPTIONS`)."""
    return click_options(WSE_OPTIONS, notes=WSE_LAYOUT_NOTES)(fn)


def cpu_options(fn: F) -> F:
    """The click options of ``csrun_cpu`` (:data:`CPU_OPTIONS`)."""
    return click_options(CPU_OPTIONS)(fn)


# --------------------------------------------------------------------------- typed values
@dataclass(frozen=True)
class CommonFlags(PolicyFlags):
    """The site-policy (:class:`launcher.resolve.PolicyFlags`, inherited), preflight, logging
    and launch flags both CLIs take."""

    check: bool = False
    no_path_checks: bool = False
    verbose: bool = False
    mount_dirs: str | None = None
    use_sbatch: bool = False
    dry_run: bool = False

    @classmethod
    def from_click(cls: type[T], kw: dict[str, Any]) -> T:
        """The typed flags of one parsed command line (click's keyword arguments).

        Raises ``TypeError`` naming a parameter the dataclass does not declare."""
        known = {f.name for f in fields(cls)}
        layout_names = LAYOUT_NAMES if "layout" in known else frozenset()
        unknown = sorted(set(kw) - known - layout_names)
        if unknown:
            raise TypeError(f"{cls.__name__}: click parameter(s) {unknown} are not declared; "
                            f"valid: {sorted((known - {'layout'}) | layout_names)}")
        values: dict[str, Any] = {k: tuple(v) if k == "slurm_args" else v for k, v in kw.items()
                                  if k not in layout_names}
        if layout_names:
            values["layout"] = {s.name: kw.get(s.name, s.default) for s in LAYOUT_FLAGS}
        return cls(**values)

    def policy(self) -> PolicyFlags:
        """The site-policy flags (:class:`launcher.resolve.PolicyFlags`)."""
        return PolicyFlags(**{f.name: getattr(self, f.name) for f in fields(PolicyFlags)})

    def without_path_checks(self: T) -> T:
        """These flags with ``--no-path-checks`` set (the site key ``checks.paths = false``)."""
        return replace(self, no_path_checks=True)


@dataclass(frozen=True)
class WseFlags(CommonFlags):
    """``csrun_wse``'s flags: ``layout`` (the layout flags' values by
    :class:`~csrun_common.layout.LayoutSpec` field, :data:`LAYOUT_FLAGS`; ``None``: the site
    default), ``--shard-plan``, ``--requeue`` and its budget, ``--survive-node-loss`` and
    ``--autoscale`` with its bounds (worker counts) and window (seconds)."""

    layout: dict[str, Any] = field(default_factory=lambda: {s.name: s.default for s in LAYOUT_FLAGS})
    shard_plan: str | None = None
    requeue: bool | None = None
    requeue_signal: str | None = None
    max_requeues: int | None = None
    survive_node_loss: bool = False
    autoscale: bool = False
    min_workers: int | None = None
    max_workers: int | None = None
    initial_workers: int | None = None
    autoscale_policy: str = "rate"
    autoscale_window: float = 10.0
    no_batch_check: bool = False


@dataclass(frozen=True)
class CpuFlags(CommonFlags):
    """``csrun_cpu``'s flags: ``--alloc-node`` (the whole node) and ``--show-config``."""

    alloc_node: bool = True
    show_config: bool = False


__all__ = ["CommonFlags", "WseFlags", "CpuFlags", "POLICY_OPTIONS", "WSE_OPTIONS", "CPU_OPTIONS", "wse_options",
           "cpu_options"]
