"""The flags of ``csrun_wse`` and ``csrun_cpu``: each declared once, and as typed values.

Every flag is one :class:`~csrun_common.flagspec.FlagSpec` (its parameter name, flag text,
type, default and help): the layout flags in :data:`csrun_common.layout.LAYOUT_FLAGS`, a flag
that wins over a site-config key on that key (:data:`launcher.config.KEYS`, the site policy's
in :class:`launcher.policy.SitePolicy`), the others here; :data:`POLICY_OPTIONS`,
:data:`WSE_OPTIONS` and :data:`CPU_OPTIONS` list them in ``--help``'s order, the key's
``[default: ...]`` added (:data:`launcher.config.FLAG_NOTES`). The click
options of both CLIs are built from these tuples (:func:`wse_options`, :func:`cpu_options`),
so a flag is not written per CLI. click parses the command line; the command functions then
hold a :class:`WseFlags` or :class:`CpuFlags` instead of an untyped ``**kw`` dict, so a
misspelt flag name is a type error (mypy) or a ``TypeError`` naming the field at the first
call, not a ``KeyError`` deep in a launch. The typed fields are checked against the
declarations, names and defaults, by ``tests/unit/launcher/test_flags.py``; the layout flags' and the
site-policy flags' values travel as one mapping each (:attr:`WseFlags.layout`,
:attr:`CommonFlags.policy`), so a new layout or policy flag needs no field here.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any, TypeVar

import click
from click.shell_completion import CompletionItem

from csrun_common.env import VERBOSE
from csrun_common.errors import CsrunError
from csrun_common.flagspec import FlagSpec, click_options
from csrun_common.layout import HELP_LATER, LAYOUT_FLAGS

from . import slurm
from .config import FLAG_NOTES, KEY_FLAGS
from .policy import POLICY_KEYS

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
#: The site-policy flags' completions: what Slurm knows.
_COMPLETIONS = {"partition": _complete(_partitions), "account": _complete(slurm.accounts),
                "qos": _complete(slurm.qos_names), "reservation": _complete(slurm.reservations)}
#: The site-policy flags, declared with their ``[slurm]`` keys (:data:`launcher.policy.POLICY_KEYS`):
#: :attr:`CommonFlags.policy`'s keys.
POLICY_SPECS: tuple[FlagSpec, ...] = tuple(
    replace(k.spec, options={**k.spec.options, "shell_complete": _COMPLETIONS[k.spec.name]})
    if k.spec.name in _COMPLETIONS else k.spec for k in POLICY_KEYS if k.spec)
#: The site-policy, preflight and logging flags both CLIs take (docs/SLURM.md "Site policies").
POLICY_OPTIONS: tuple[FlagSpec, ...] = (
    *POLICY_SPECS,
    FlagSpec("check", "--check", bool, False, "Ask Slurm whether the job could run (--test-only) and check its "
             "files; submit nothing. Exit 0 or 2."),
    KEY_FLAGS["no_path_checks"],
    FlagSpec("verbose", "--verbose", bool, False, "Let the tasks print every TensorFlow C++ log line (also "
             f"{VERBOSE.name}=1); by default INFO lines are hidden, warnings and errors kept."),
)
_MOUNT_DIRS = KEY_FLAGS["mount_dirs"]
_USE_SBATCH = FlagSpec("use_sbatch", "--use-sbatch", bool, False, "Submit as a batch het job and print the job id.")
_DRY_RUN = FlagSpec("dry_run", "--dry-run", bool, False, "Print exactly what would run (srun line, or the sbatch "
                    "script); submit nothing. Works without slurmctld when nothing it must answer is unknown.")
_LAYOUT_HEAD = tuple(s for s in LAYOUT_FLAGS if s.name not in HELP_LATER)
_LAYOUT_LATER = tuple(s for s in LAYOUT_FLAGS if s.name in HELP_LATER)
#: ``csrun_wse``'s flags, in ``--help``'s order: the layout flags (:data:`LAYOUT_FLAGS`), the
#: container, the shard plan, ``--requeue``, the chief's input CPUs, node loss, ``--autoscale``,
#: then :data:`POLICY_OPTIONS` and the launch's.
WSE_OPTIONS: tuple[FlagSpec, ...] = (
    *_LAYOUT_HEAD,
    _MOUNT_DIRS,
    FlagSpec("shard_plan", "--shard-plan", str, None, "Shard plan JSON (cs_input_analyzer shard-plan): each input "
             "worker reads only its files.", options={"type": click.Path(dir_okay=False)}),
    KEY_FLAGS["requeue"],
    KEY_FLAGS["requeue_signal"],
    KEY_FLAGS["max_requeues"],
    *_LAYOUT_LATER,
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
    KEY_FLAGS["no_batch_check"],
    _USE_SBATCH,
    _DRY_RUN,
)
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
#: The flags whose values travel as one mapping (:attr:`CommonFlags.policy`, :attr:`WseFlags.layout`),
#: by the mapping's name.
GROUPS: dict[str, tuple[FlagSpec, ...]] = {"policy": POLICY_SPECS, "layout": LAYOUT_FLAGS}


def wse_options(fn: F) -> F:
    """The click options of ``csrun_wse`` (:data:`WSE_OPTIONS`)."""
    return click_options(WSE_OPTIONS, notes=FLAG_NOTES)(fn)


def cpu_options(fn: F) -> F:
    """The click options of ``csrun_cpu`` (:data:`CPU_OPTIONS`)."""
    return click_options(CPU_OPTIONS, notes=FLAG_NOTES)(fn)


# --------------------------------------------------------------------------- typed values
@dataclass(frozen=True)
class CommonFlags:
    """The flags both CLIs take: ``policy`` (the site-policy flags' values by their parameter
    name, :data:`POLICY_SPECS`; ``None``: not given), the preflight, logging and launch flags."""

    policy: dict[str, Any] = field(default_factory=lambda: {s.name: s.default for s in POLICY_SPECS})
    check: bool = False
    no_path_checks: bool = False
    verbose: bool = False
    mount_dirs: str | None = None
    use_sbatch: bool = False
    dry_run: bool = False

    @classmethod
    def from_click(cls: type[T], kw: dict[str, Any]) -> T:
        """The typed flags of one parsed command line (click's keyword arguments); the flags of
        :data:`GROUPS` as their mapping.

        Raises ``TypeError`` naming a parameter the dataclass does not declare."""
        known = {f.name for f in fields(cls)}
        groups = {g: specs for g, specs in GROUPS.items() if g in known}
        grouped = {s.name for specs in groups.values() for s in specs}
        unknown = sorted(set(kw) - known - grouped)
        if unknown:
            raise TypeError(f"{cls.__name__}: click parameter(s) {unknown} are not declared; "
                            f"valid: {sorted((known - set(groups)) | grouped)}")
        values: dict[str, Any] = {k: v for k, v in kw.items() if k not in grouped}
        for g, specs in groups.items():
            values[g] = {s.name: tuple(kw[s.name]) if s.multiple and s.name in kw else kw.get(s.name, s.default)
                         for s in specs}
        return cls(**values)

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


__all__ = ["CommonFlags", "WseFlags", "CpuFlags", "POLICY_SPECS", "POLICY_OPTIONS", "WSE_OPTIONS", "CPU_OPTIONS",
           "GROUPS", "wse_options", "cpu_options"]
