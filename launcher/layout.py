"""The heterogeneous job layout of ``csrun_wse``: pure data, no Slurm calls.

A layout is a list of het components (Slurm het groups), each ``nodes × tasks_per_node``
tasks with ``cpus_per_task`` CPUs. The shapes are the original ``csrun_wse``'s:

* 1 node: one component of T tasks × C CPUs, exclusive, with the GRES.
* N > 1, no single-task nodes: component 0 = 1 node × T tasks × C CPUs with the GRES;
  component 1 = N−1 nodes × T tasks × C CPUs, exclusive, block or cyclic.
* S single-task nodes (0 < S < N): S components of 1 node × 1 task holding all the
  node's CPUs (the first with the GRES), then N−S nodes × T tasks × C CPUs, exclusive,
  block or cyclic. Total tasks S + (N−S)·T.

Task roles (see ``docs/CONTRACT.md``): task 0 of het group 0 is the chief; every other
task is an input worker. With ``chief_input_cpus = N`` the chief's task also runs input
worker 0 as a process of its own on N of its CPUs (docs/CHIEF-INPUT.md):
the tasks' input-worker indices then start at 1.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from csrun_common.layout import LayoutSpec, resolve_counts

CHIEF, SINGLE_TASK, WORKER = "chief", "single-task", "worker"

__all__ = ["CHIEF", "SINGLE_TASK", "WORKER", "Component", "JobLayout", "plan", "plan_layout", "resolve_counts"]


@dataclass(frozen=True)
class Component:
    """One het component (het group) of the job.

    ``cpus_per_task`` is ``None`` when Slurm chooses (the tasks per node given and the
    default CPUs do not fit: :func:`~csrun_common.layout.resolve_counts`). ``task_offset`` is
    the global ``SLURM_PROCID`` of its first task; ``worker_offset`` the input-worker index of
    its first input-worker task.
    """

    het_group: int
    role: str
    nodes: int
    tasks_per_node: int
    cpus_per_task: int | None
    gres: str
    exclusive: bool
    distribution: str
    task_offset: int
    worker_offset: int

    @property
    def ntasks(self) -> int:
        """Tasks in this component: ``nodes × tasks_per_node``."""
        return self.nodes * self.tasks_per_node

    @property
    def num_input_workers(self) -> int:
        """Input-worker tasks in this component (the chief is not one)."""
        return self.ntasks - 1 if self.role == CHIEF else self.ntasks


@dataclass(frozen=True)
class JobLayout:
    """All het components of a csrun_wse job, in het-group order.

    ``chief_input_cpus``: CPUs of the chief's task given to input worker 0, a process the
    chief starts beside its training step (0: none, the tasks' workers start at index 0).
    ``spec``: the :class:`~csrun_common.layout.LayoutSpec` it was planned from (its
    ``to_flags()`` gives the csrun_wse flags of this job).
    """

    components: tuple[Component, ...]
    chief_input_cpus: int = 0
    #: The layout the components were planned from (:func:`plan`); ``None`` for components
    #: built by hand.
    spec: LayoutSpec | None = field(default=None, compare=False)

    @property
    def total_nodes(self) -> int:
        """Nodes in the whole job (:attr:`LayoutSpec.nodes`)."""
        return sum(c.nodes for c in self.components)

    @property
    def num_tasks(self) -> int:
        """Tasks in the whole het step (``SLURM_NTASKS``)."""
        return sum(c.ntasks for c in self.components)

    @property
    def num_input_workers(self) -> int:
        """Input workers in the whole job: all tasks but the chief, plus the chief's own
        input worker with ``chief_input_cpus``."""
        return self.num_tasks - 1 + (1 if self.chief_input_cpus else 0)

    @property
    def worker_component(self) -> Component | None:
        """The ``worker`` component (the input-worker nodes), or ``None`` when the layout has
        none (a chief alone, or single-task nodes only)."""
        return next((c for c in self.components if c.role == WORKER), None)


def plan_layout(
    total_nodes: int,
    tasks_per_node: int,
    cpus_per_task: int | None,
    single_task_nodes: int = 0,
    cyclic: bool = False,
    gres: str = "",
    node_cpus: int = 1,
    chief_input_cpus: int = 0,
) -> JobLayout:
    """:func:`plan` of the :class:`~csrun_common.layout.LayoutSpec` of ``N = total_nodes``,
    ``T``, ``C``, ``S``, ``cyclic`` and ``chief_input_cpus`` (the layout flags' values, ``T``
    and ``C`` resolved by :func:`resolve_counts`). Raises :class:`CsrunError` as :func:`plan`."""
    spec = LayoutSpec(total_nodes, tasks_per_node, cpus_per_task, single_task_nodes, chief_input_cpus, cyclic)
    return plan(spec, gres, node_cpus)


def plan(spec: LayoutSpec, gres: str = "", node_cpus: int = 1) -> JobLayout:
    """Build the het components of the layout ``spec`` (shapes: the module docstring).

    ``gres`` goes to the chief's component; ``node_cpus`` is given to single-task components
    (one task owns the node). ``spec.chief_input_cpus``: CPUs of the
    chief's task that run input worker 0 beside the training step; every task's input-worker
    index is then one higher. Raises :class:`CsrunError` naming the flag for N < 1, T < 1,
    C < 1, S < 0, S ≥ N, a negative ``chief_input_cpus``, or one above the chief's CPUs or
    with CPUs Slurm chooses (:meth:`LayoutSpec.check`, :meth:`LayoutSpec.check_chief_input`).
    """
    spec.check()
    dist = "cyclic" if spec.cyclic else "block"
    comps: list[Component] = []
    task_off, worker_off = 0, (1 if spec.chief_input_cpus else 0)

    def add(role: str, nodes: int, t: int, c: int | None, g: str, distribution: str) -> None:
        nonlocal task_off, worker_off
        comp = Component(len(comps), role, nodes, t, c, g, True, distribution, task_off, worker_off)
        comps.append(comp)
        task_off += comp.ntasks
        worker_off += comp.num_input_workers

    n, t, c, s = spec.nodes, spec.tasks_per_node, spec.cpus_per_task, spec.single_task_nodes
    if s == 0:
        add(CHIEF, 1, t, c, gres, "block")
        if n > 1:
            add(WORKER, n - 1, t, c, "", dist)
    else:
        add(CHIEF, 1, 1, node_cpus, gres, "block")
        for _ in range(s - 1):
            add(SINGLE_TASK, 1, 1, node_cpus, "", "block")
        add(WORKER, n - s, t, c, "", dist)
    spec.check_chief_input(node_cpus)
    return JobLayout(tuple(comps), spec.chief_input_cpus, spec)
