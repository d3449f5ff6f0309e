"""The heterogeneous job layout of ``csrun_wse``: pure data, no Slurm calls.

A layout is a list of het components (Slurm het groups), each ``nodes × tasks_per_node``
tasks with ``cpus_per_task`` CPUs. The shapes are the original ``csrun_wse``'s:

* 1 node: one component of T tasks × C CPUs, exclusive, with the GRES.
* N > 1, no single-task nodes: component 0 = 1 node × T tasks × C CPUs with the GRES;
  component 1 = N−1 nodes × T tasks × C CPUs, exclusive, block or cyclic.
* S single-task nodes (0 < S < N): S components of 1 node × 1 task holding all the
  node's CPUs (the first with the GRES), then N−S nodes × T tasks × C CPUs, exclusive,
  block or cyclic. Total tasks S + (N−S)·T.

* several trainer ranks (``world = chief_nodes × chief_tasks_per_node > 1``,
  docs/MULTI-RANK.md): component 0 = ``chief_nodes`` nodes × ``R = chief_tasks_per_node``
  tasks × ``node_cpus // R`` CPUs, every task a trainer rank, the GRES scaled to ``R`` ranks
  per node (:func:`scale_gres`), exclusive, block; component 1 = N − chief_nodes nodes × T
  tasks × C CPUs, exclusive, block or cyclic (none when the ranks' own input workers are the
  only ones). Total tasks ``world + (N − chief_nodes)·T``.

Task roles (see ``docs/CONTRACT.md``): task 0 of het group 0 is the chief; every other
task is an input worker. With ``chief_input_cpus = N`` the chief's task also runs input
worker 0 as a process of its own on N of its CPUs (docs/CHIEF-INPUT.md):
the tasks' input-worker indices then start at 1. With several ranks every task of het
group 0 is a trainer rank; with ``chief_input_cpus`` rank ``r`` runs input worker ``r`` in
its task, and the worker tasks' indices start at ``world``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from csrun_common.errors import CsrunError
from csrun_common.layout import LayoutSpec, flag, resolve_counts

CHIEF, SINGLE_TASK, WORKER = "chief", "single-task", "worker"

__all__ = ["CHIEF", "SINGLE_TASK", "WORKER", "Component", "JobLayout", "plan", "plan_layout", "resolve_counts",
           "scale_gres"]


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
    trainer_tasks: int = 1

    @property
    def ntasks(self) -> int:
        """Tasks in this component: ``nodes × tasks_per_node``."""
        return self.nodes * self.tasks_per_node

    @property
    def num_input_workers(self) -> int:
        """Input-worker tasks in this component (the chief and the trainer ranks are not)."""
        return self.ntasks - self.trainer_tasks if self.role == CHIEF else self.ntasks


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
    def world_size(self) -> int:
        """Trainer ranks of the job: the ``chief`` component's trainer tasks (1: one chief)."""
        return sum(c.trainer_tasks for c in self.components if c.role == CHIEF) or 1

    @property
    def local_world_size(self) -> int:
        """Trainer ranks on each chief node (1: one chief)."""
        chief = next((c for c in self.components if c.role == CHIEF), None)
        return chief.tasks_per_node if chief is not None and self.world_size > 1 else 1

    @property
    def num_input_workers(self) -> int:
        """Input workers in the whole job: all tasks but the trainer ranks, plus one per rank with
        ``chief_input_cpus`` (:attr:`LayoutSpec.num_input_workers`)."""
        own = self.world_size if self.chief_input_cpus else 0
        return sum(c.num_input_workers for c in self.components) + own

    @property
    def worker_component(self) -> Component | None:
        """The ``worker`` component (the input-worker nodes), or ``None`` when the layout has none."""
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
    """:func:`plan` of the layout flags' values (``T``, ``C`` resolved by :func:`resolve_counts`) as a
    :class:`~csrun_common.layout.LayoutSpec`. Raises :class:`CsrunError` as :func:`plan`."""
    spec = LayoutSpec(total_nodes, tasks_per_node, cpus_per_task, single_task_nodes, chief_input_cpus, cyclic)
    return plan(spec, gres, node_cpus)


def scale_gres(gres: str, ranks: int) -> str:
    """The GRES of one node of ``ranks`` trainer ranks, from ``gres``, what *one* rank needs
    (the site's ``gres.resource``): its count times ``ranks`` (``"gpu:1"``, 4 ranks:
    ``"gpu:4"``; ``"gpu:a100:2"``, 2: ``"gpu:a100:4"``; a spec without a count counts 1:
    ``"gpu"``, 2: ``"gpu:2"``). ``gres`` unchanged for one rank or an empty spec
    (docs/MULTI-RANK.md "GRES": ``--gres`` per node rather than ``--gpus-per-task``)."""
    if ranks <= 1 or not gres:
        return gres
    head, _, last = gres.rpartition(":")
    if head and last.isdigit():
        return f"{head}:{int(last) * ranks}"
    return f"{gres}:{ranks}"


def plan(spec: LayoutSpec, gres: str = "", node_cpus: int = 1) -> JobLayout:
    """Build the het components of the layout ``spec`` (shapes: the module docstring).

    ``gres`` goes to the chief's component (scaled to its ranks per node with several trainer
    ranks: :func:`scale_gres`); ``node_cpus`` is given to single-task components (one task
    owns the node) and divided among a chief node's ranks. ``spec.chief_input_cpus``: CPUs of
    the chief's task (of each rank's) that run input worker 0 (worker ``rank``) beside the
    training step; every task's input-worker index is then one (``world``) higher. Raises
    :class:`CsrunError` naming the flag for N < 1, T < 1, C < 1, S < 0, S ≥ N, a negative
    ``chief_input_cpus``, or one above the chief's CPUs or with CPUs Slurm chooses, and for
    the rules of several ranks (:meth:`LayoutSpec.check`, :meth:`LayoutSpec.check_chief_input`;
    more ranks per node than ``node_cpus``).
    """
    spec.check()
    dist = "cyclic" if spec.cyclic else "block"
    comps: list[Component] = []
    world = spec.world_size
    task_off, worker_off = 0, (1 if spec.chief_input_cpus and world == 1 else 0)

    def add(role: str, nodes: int, t: int, c: int | None, g: str, distribution: str, trainers: int = 1) -> None:
        nonlocal task_off, worker_off
        comp = Component(len(comps), role, nodes, t, c, g, True, distribution, task_off, worker_off, trainers)
        comps.append(comp)
        task_off += comp.ntasks
        worker_off += comp.num_input_workers

    n, t, c, s = spec.nodes, spec.tasks_per_node, spec.cpus_per_task, spec.single_task_nodes
    if world > 1:
        ranks = spec.chief_tasks_per_node
        if ranks > node_cpus:
            raise CsrunError(f"{flag('chief_tasks_per_node')} {ranks}: more trainer ranks than the {node_cpus} "
                             "CPUs of a node")
        add(CHIEF, spec.chief_nodes, ranks, spec.chief_task_cpus(node_cpus), scale_gres(gres, ranks), "block",
            trainers=world)
        worker_off = world if spec.chief_input_cpus else 0  # rank r's own input worker is r
        if n > spec.chief_nodes:
            add(WORKER, n - spec.chief_nodes, t, c, "", dist)
    elif s == 0:
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
