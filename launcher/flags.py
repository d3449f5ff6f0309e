"""The flags of ``csrun_wse`` and ``csrun_cpu`` as typed values.

click parses the command line; the command functions then hold a :class:`WseFlags` or
:class:`CpuFlags` instead of an untyped ``**kw`` dict, so a misspelt flag name is a type
error (mypy) or a ``TypeError`` naming the field at the first call, not a ``KeyError`` deep
in a launch. ``tests/unit/test_options.py`` fails when these fields and the click options
drift apart. Each field is named as click names its option's parameter (``--time`` is
``time_limit``, ``--slurm-arg`` is ``slurm_args``).
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, TypeVar

from .resolve import PolicyFlags

T = TypeVar("T", bound="CommonFlags")


@dataclass(frozen=True)
class CommonFlags:
    """The site-policy, preflight, logging and launch flags both CLIs take."""

    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    reservation: str | None = None
    constraint: str | None = None
    time_limit: str | None = None
    slurm_args: tuple[str, ...] = ()
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
        unknown = sorted(set(kw) - known)
        if unknown:
            raise TypeError(f"{cls.__name__}: click parameter(s) {unknown} are not declared; "
                            f"valid: {sorted(known)}")
        values: dict[str, Any] = {k: tuple(v) if k == "slurm_args" else v for k, v in kw.items()}
        return cls(**values)

    def policy(self) -> PolicyFlags:
        """The site-policy flags (:class:`launcher.resolve.PolicyFlags`)."""
        return PolicyFlags(partition=self.partition, account=self.account, qos=self.qos,
                           reservation=self.reservation, constraint=self.constraint, time=self.time_limit,
                           slurm_args=self.slurm_args)

    def without_path_checks(self: T) -> T:
        """These flags with ``--no-path-checks`` set (the site key ``checks.paths = false``)."""
        return replace(self, no_path_checks=True)


@dataclass(frozen=True)
class WseFlags(CommonFlags):
    """``csrun_wse``'s flags: the layout (``None``: the site default), ``--shard-plan``,
    ``--requeue`` and its budget, ``--chief-input-cpus``, ``--survive-node-loss`` and
    ``--autoscale`` with its bounds (worker counts) and window (seconds)."""

    total_nodes: int | None = None
    tasks_per_node: int | None = None
    cpus_per_task: int | None = None
    single_task_nodes: int = 0
    cyclic: bool = False
    shard_plan: str | None = None
    requeue: bool | None = None
    requeue_signal: str | None = None
    max_requeues: int | None = None
    chief_input_cpus: int = 0
    survive_node_loss: bool = False
    autoscale: bool = False
    min_workers: int | None = None
    max_workers: int | None = None
    initial_workers: int | None = None
    autoscale_policy: str = "rate"
    autoscale_window: float = 10.0


@dataclass(frozen=True)
class CpuFlags(CommonFlags):
    """``csrun_cpu``'s flags: ``--alloc-node`` (the whole node) and ``--show-config``."""

    alloc_node: bool = True
    show_config: bool = False


__all__ = ["CommonFlags", "WseFlags", "CpuFlags"]
