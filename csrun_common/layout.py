"""The csrun_wse job layout as one value, and its one encoder to ``csrun_wse`` flags.

A :class:`LayoutSpec` is what the user chooses with the layout flags of ``csrun_wse``
(``--total-nodes``, ``--tasks-per-node``, ``--cpus-per-task``, ``--single-task-nodes``,
``--cyclic``, ``--chief-input-cpus``). Both sides use it:

* the launcher plans its het components from it (:func:`launcher.layout.plan`,
  :func:`launcher.layout.plan_layout`);
* the analyzer recommends and predicts layouts keyed by its :meth:`LayoutSpec.record` keys,
  prints the ``csrun_wse`` line of the chosen one (:func:`analyzer.report.csrun_wse_command`)
  and launches it (:func:`analyzer.verify.drain_command`), both through
  :meth:`LayoutSpec.to_flags`, the only layout -> flags encoder.

Each layout flag is declared once, in :data:`LAYOUT_FLAGS` (its text, type, bound and help):
the click options of ``csrun_wse``, ``cs_input_analyzer verify`` and ``shard-plan`` are built
from it (:func:`csrun_common.flagspec.click_options`), :meth:`LayoutSpec.check` applies its
bounds, and :func:`flag` gives its text to every message elsewhere. The layout's rules live
here only: the bounds and ``S < N`` (:meth:`LayoutSpec.check`), the fit in a node
(:meth:`LayoutSpec.check_node`, :func:`resolve_counts`), the chief's input CPUs
(:meth:`LayoutSpec.check_chief_input`) and the input-worker count
(:attr:`LayoutSpec.num_input_workers`, :meth:`LayoutSpec.workers_per_node`).

Pure Python, no import of ``launcher``, ``analyzer`` or ``csrun_runtime``.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from .errors import CsrunError
from .flagspec import FlagSpec

__all__ = ["LayoutSpec", "NodeShape", "RankWorkersError", "LAYOUT_FLAGS", "FLAGS", "HELP_LATER", "RECORD_KEYS",
           "RANK_FIELDS", "flag",
           "resolve_counts"]

#: The layout flags, declared once, in the order :meth:`LayoutSpec.to_flags` writes them
#: (``csrun_wse --help`` lists :data:`HELP_LATER` later);
#: ``name`` is the :class:`LayoutSpec` field. The first three are always written (when set),
#: the others only when not their default. ``min``: the bound :meth:`LayoutSpec.check`
#: applies (and click, where ``click_range``).
LAYOUT_FLAGS: tuple[FlagSpec, ...] = (
    FlagSpec("nodes", "--total-nodes", int, None, "Nodes in the job, the chief's included", min=1,
             slurm_options=("--nodes", "-N")),
    FlagSpec("tasks_per_node", "--tasks-per-node", int, None, "Tasks on each input-worker node", min=1,
             slurm_options=("--ntasks", "-n", "--ntasks-per-node")),
    FlagSpec("cpus_per_task", "--cpus-per-task", int, None, "CPUs of each input-worker task", min=1,
             slurm_options=("--cpus-per-task", "-c")),
    FlagSpec("single_task_nodes", "--single-task-nodes", int, 0,
             "Nodes, the chief's first, that run a single task holding the whole node", min=0, show_default=True),
    FlagSpec("chief_input_cpus", "--chief-input-cpus", int, 0,
             "Run input worker 0 inside the chief's task on N of its CPUs, beside training: pinned "
             "apart when Slurm binds the task and N is fewer than its CPUs, else sharing them at "
             "lower priority (docs/CHIEF-INPUT.md)", min=0, click_range=False, metavar="N", show_default=True),
    FlagSpec("cyclic", "--cyclic", bool, False,
             "Distribute input-worker tasks cyclically over nodes (default: block)",
             slurm_options=("--distribution", "-m")),
    FlagSpec("chief_nodes", "--chief-nodes", int, 1,
             "Nodes of the chief's het group, each running --chief-tasks-per-node trainer ranks "
             "(docs/MULTI-RANK.md)", min=1, show_default=True),
    FlagSpec("chief_tasks_per_node", "--chief-tasks-per-node", int, 1,
             "Trainer ranks (tasks, one per accelerator) on each chief node: PyTorch DDP or "
             "TensorFlow's MultiWorkerMirroredStrategy over all ranks (docs/MULTI-RANK.md)", min=1,
             show_default=True),
)
#: The layout flags ``csrun_wse --help`` lists apart, after ``--requeue``'s
#: (:data:`launcher.flags.WSE_OPTIONS`); the others come first.
HELP_LATER = frozenset({"chief_input_cpus"})
#: Field -> its flag text (from :data:`LAYOUT_FLAGS`).
FLAGS: dict[str, str] = {s.name: s.flag for s in LAYOUT_FLAGS}
#: Keys of a layout in the analyzer's records (``report.json``'s ``recommendation``,
#: ``verify.json``'s ``layout``): :meth:`LayoutSpec.record`.
RECORD_KEYS = ("nodes", "tasks_per_node", "cpus_per_task", "single_task_nodes", "chief_input_cpus")
_BOOL = frozenset(s.name for s in LAYOUT_FLAGS if s.type is bool)
_DEFAULTS = {s.name: s.default for s in LAYOUT_FLAGS}
#: The fields of several trainer ranks: a layout with both at 1 is the original csrun_wse's.
RANK_FIELDS = ("chief_nodes", "chief_tasks_per_node")
_ALWAYS = ("nodes", "tasks_per_node", "cpus_per_task")


def flag(name: str) -> str:
    """Flag text of layout field ``name`` (``"--tasks-per-node"``); ``KeyError`` for an unknown one."""
    return FLAGS[name]


def _bound_error(name: str, value: Any, low: float) -> CsrunError:
    what = "must be a positive integer" if low == 1 else f"must be {low:g} or more"
    return CsrunError(f"{FLAGS[name]} {value}: {what}")


def _fit_error(t: int, c: int, node_cpus: int) -> CsrunError:
    return CsrunError(f"{FLAGS['tasks_per_node']} {t} × {FLAGS['cpus_per_task']} {c} = {t * c}: "
                      f"more than the {node_cpus} CPUs of a node")


@dataclass(frozen=True)
class NodeShape:
    """One node of a layout: its ``tasks`` of ``cpus`` CPUs each (``None``: Slurm chooses),
    how many of them are input workers (``workers``), and whether the chief runs there."""

    tasks: int
    cpus: int | None
    workers: int
    chief: bool


class RankWorkersError(CsrunError):
    """The input workers are not a multiple of the world size: ``reason`` is the message without
    the counts that would be (the launcher, knowing the partition, names a layout instead)."""

    def __init__(self, reason: str, counts: str):
        super().__init__(f"{reason} ({counts} would be)")
        self.reason = reason


@dataclass(frozen=True)
class LayoutSpec:
    """One csrun_wse layout (the shapes: ``launcher/layout.py``'s module docstring).

    Attributes:
        nodes: ``N``, nodes in the job, the chief's included (``--total-nodes``).
        tasks_per_node: ``T``, tasks on each input-worker node (``--tasks-per-node``).
        cpus_per_task: ``C``, CPUs of each input-worker task (``--cpus-per-task``);
            ``None``: Slurm chooses (the flag is then not written).
        single_task_nodes: ``S``, nodes (the chief's first) running one task that holds the
            whole node (``--single-task-nodes``); ``0 <= S < N``.
        chief_input_cpus: ``L``, CPUs of the chief's task that run input worker 0
            (``--chief-input-cpus``); 0: none.
        cyclic: input-worker tasks distributed cyclically over their nodes (``--cyclic``),
            else block.
        chief_nodes: nodes of the chief's het group (``--chief-nodes``), 1 by default.
        chief_tasks_per_node: trainer ranks on each of them (``--chief-tasks-per-node``), 1 by
            default. With ``world_size = chief_nodes × chief_tasks_per_node > 1`` the chief's
            nodes run trainer ranks only (each with its own input worker under
            ``chief_input_cpus``), the input workers run on the other ``N - chief_nodes`` nodes,
            ``T`` per node, and their count must be a multiple of the world size
            (docs/MULTI-RANK.md).
    """

    nodes: int
    tasks_per_node: int
    cpus_per_task: int | None
    single_task_nodes: int = 0
    chief_input_cpus: int = 0
    cyclic: bool = False
    chief_nodes: int = 1
    chief_tasks_per_node: int = 1

    @property
    def world_size(self) -> int:
        """Trainer ranks of the job: ``chief_nodes × chief_tasks_per_node`` (1: one chief)."""
        return self.chief_nodes * self.chief_tasks_per_node

    def check(self) -> LayoutSpec:
        """Return ``self`` when the values are a layout; raise :class:`CsrunError` naming the
        flag and value (one line, exit 2) for a value below its flag's bound (N, T, C ≥ 1;
        S, L ≥ 0: :data:`LAYOUT_FLAGS`) or S ≥ N (S > 0). Rules: the original csrun_wse's help
        text."""
        self.check_given(self.values())
        if self.single_task_nodes and self.single_task_nodes >= self.nodes:
            raise CsrunError(f"{FLAGS['single_task_nodes']} {self.single_task_nodes}: must be less than "
                             f"{FLAGS['nodes']} {self.nodes}")
        if self.world_size > 1:
            self._check_ranks()
        return self

    def _check_ranks(self) -> None:
        """The rules of several trainer ranks (docs/MULTI-RANK.md): no single-task nodes, the
        chief's nodes fewer than the job's unless each rank has its own input worker, and the
        input workers a multiple of the world size (the message says which counts would be)."""
        c, world = self.chief_nodes, self.world_size
        if self.single_task_nodes:
            raise CsrunError(f"{FLAGS['single_task_nodes']} {self.single_task_nodes}: not with several trainer "
                             f"ranks ({FLAGS['chief_nodes']} {c} {FLAGS['chief_tasks_per_node']} "
                             f"{self.chief_tasks_per_node})")
        if c > self.nodes or (c == self.nodes and not self.chief_input_cpus):
            raise CsrunError(f"{FLAGS['chief_nodes']} {c}: must be less than {FLAGS['nodes']} {self.nodes} "
                             f"(the input workers run on the other nodes), or give {FLAGS['chief_input_cpus']}")
        w = self.num_input_workers
        if w % world:
            low, high = w - w % world, w + world - w % world
            reason = (f"{FLAGS['nodes']} {self.nodes} {FLAGS['tasks_per_node']} {self.tasks_per_node}: "
                      f"{w} input workers for {world} trainer ranks; they must be a multiple of the world size")
            raise RankWorkersError(reason, ", ".join(str(x) for x in (low, high) if x > 0))

    @staticmethod
    def check_given(values: Mapping[str, Any]) -> None:
        """Raise :class:`CsrunError` naming the flag for a given value (not ``None``) of
        ``values`` (field -> value) below its flag's ``min`` (:data:`LAYOUT_FLAGS`)."""
        for spec in LAYOUT_FLAGS:
            value = values.get(spec.name)
            if spec.min is not None and value is not None and value < spec.min:
                raise _bound_error(spec.name, value, spec.min)

    def values(self) -> dict[str, Any]:
        """Field -> value, every field of :data:`LAYOUT_FLAGS`."""
        return {s.name: getattr(self, s.name) for s in LAYOUT_FLAGS}

    def node_shapes(self, node_cpus: int) -> list[NodeShape]:
        """The job's nodes, the chief's first (the shapes: ``launcher/layout.py``'s module
        docstring): with ``S = 0`` the chief's node runs ``T - 1`` input workers beside the
        chief and every other node ``T``; with ``S > 0`` the chief's node and ``S - 1`` more run
        one task holding the node's ``node_cpus`` (the chief; one input worker each), then
        ``N - S`` nodes ``T`` input workers each. The chief's own input worker
        (``chief_input_cpus``) is not in them."""
        n, t, c, s = self.nodes, self.tasks_per_node, self.cpus_per_task, self.single_task_nodes
        if self.world_size > 1:  # the chief's nodes run trainer ranks only
            ranks = self.chief_tasks_per_node
            return ([NodeShape(ranks, node_cpus // ranks or None, 0, True) for _ in range(self.chief_nodes)]
                    + [NodeShape(t, c, t, False) for _ in range(n - self.chief_nodes)])
        if s == 0:
            return [NodeShape(t, c, t - 1, True)] + [NodeShape(t, c, t, False) for _ in range(n - 1)]
        return ([NodeShape(1, node_cpus, 0, True)] + [NodeShape(1, node_cpus, 1, False) for _ in range(s - 1)]
                + [NodeShape(t, c, t, False) for _ in range(n - s)])

    @property
    def num_input_workers(self) -> int:
        """Input workers of the job (``CSRUN_NUM_WORKERS``, counts in docs/CONTRACT.md): every task but the
        trainer ranks, plus one per rank with ``chief_input_cpus``; 0: the chief reads its input."""
        tasks = sum(shape.workers for shape in self.node_shapes(1))
        return tasks + self.chief_input_workers

    @property
    def chief_input_workers(self) -> int:
        """Input workers in the trainer ranks' own tasks: one per rank with ``--chief-input-cpus``, else 0."""
        return self.world_size if self.chief_input_cpus else 0

    def without_chief_input(self) -> LayoutSpec:
        """This layout with no input worker in the trainer ranks' tasks."""
        return replace(self, chief_input_cpus=0)

    def chief_task_cpus(self, node_cpus: int) -> int | None:
        """CPUs of the chief's task: the whole node's ``node_cpus`` with single-task nodes,
        ``node_cpus // chief_tasks_per_node`` for each of several trainer ranks, else
        ``cpus_per_task`` (``None`` when Slurm chooses)."""
        if self.world_size > 1:
            return max(1, node_cpus // self.chief_tasks_per_node)
        return node_cpus if self.single_task_nodes else self.cpus_per_task

    def check_node(self, node_cpus: int) -> LayoutSpec:
        """:meth:`check`, then the rules that need a node's CPUs (``node_cpus``, from Slurm or
        the analyzer's probes): ``T × C`` within the node, and ``chief_input_cpus`` within the
        chief's task (which must have known CPUs). Raises :class:`CsrunError` naming the flag."""
        self.check()
        c = self.cpus_per_task
        if c is not None and self.tasks_per_node * c > node_cpus:
            raise _fit_error(self.tasks_per_node, c, node_cpus)
        return self.check_chief_input(node_cpus)

    def check_chief_input(self, node_cpus: int) -> LayoutSpec:
        """Raise :class:`CsrunError` when ``chief_input_cpus`` is set and the chief's CPUs are
        left to Slurm, or when it is above the chief task's CPUs (:meth:`chief_task_cpus`)."""
        chief = self.chief_task_cpus(node_cpus)
        flag_l, value = FLAGS["chief_input_cpus"], self.chief_input_cpus
        if value and chief is None:
            raise CsrunError(f"{flag_l} {value}: the chief's CPUs are left to Slurm; give {FLAGS['cpus_per_task']}")
        if chief is not None and value > chief:
            raise CsrunError(f"{flag_l} {value}: more than the chief task's {chief} CPU(s)")
        return self

    def to_flags(self) -> list[str]:
        """The ``csrun_wse`` argv flags of this layout, e.g. ``["--total-nodes", "3",
        "--tasks-per-node", "2", "--cpus-per-task", "1", "--chief-input-cpus", "1"]``:
        ``--cpus-per-task`` only when set, the others only when not their default (0, 1 for
        ``--chief-nodes`` / ``--chief-tasks-per-node``), ``--cyclic`` only when true. The one layout -> flags encoder
        (:meth:`from_flags` reads it back)."""
        out: list[str] = []
        for name, text in FLAGS.items():
            value = getattr(self, name)
            if name in _BOOL:
                out += [text] if value else []
            elif value is not None and (name in _ALWAYS or value != _DEFAULTS[name]):
                out += [text, str(int(value))]
        return out

    @classmethod
    def from_flags(cls, argv: Sequence[str]) -> LayoutSpec:
        """The layout of the flags in ``argv`` (``--flag VALUE`` or ``--flag=VALUE``; other
        words are skipped, so a whole ``csrun_wse`` line may be given, up to its command).
        Raises :class:`CsrunError` for a missing ``--total-nodes`` / ``--tasks-per-node``, a
        flag without a value or a value that is not an integer."""
        by_flag = {text: name for name, text in FLAGS.items()}
        values: dict[str, Any] = {}
        words = list(argv)
        i = 0
        while i < len(words):
            word, value = words[i], None
            if "=" in word and word.startswith("--"):
                word, value = word.split("=", 1)
            name = by_flag.get(word)
            if name in _BOOL:
                values[name] = True
            elif name is not None:
                if value is None:
                    if i + 1 >= len(words):
                        raise CsrunError(f"{word}: needs a value")
                    i += 1
                    value = words[i]
                try:
                    values[name] = int(value)
                except ValueError:
                    raise CsrunError(f"{word} {value!r}: not an integer") from None
            i += 1
        for name in _ALWAYS[:2]:
            if name not in values:
                raise CsrunError(f"{FLAGS[name]}: missing from {' '.join(words)!r}")
        values.setdefault("cpus_per_task", None)
        return cls(**values)

    @classmethod
    def from_record(cls, rec: Mapping[str, Any] | LayoutSpec) -> LayoutSpec:
        """The layout of an analyzer record (a recommendation, a prediction, ``verify.json``'s
        ``layout``, another :class:`LayoutSpec`): keys :data:`RECORD_KEYS`, the last two
        optional (0 when missing or ``None``); ``cpus_per_task`` ``None``: Slurm chooses.
        Raises ``KeyError`` for a missing ``nodes``/``tasks_per_node``/``cpus_per_task``."""
        if isinstance(rec, LayoutSpec):
            return rec
        cpus = rec["cpus_per_task"]
        return cls(int(rec["nodes"]), int(rec["tasks_per_node"]), None if cpus is None else int(cpus),
                   int(rec.get("single_task_nodes") or 0), int(rec.get("chief_input_cpus") or 0),
                   bool(rec.get("cyclic") or False), int(rec.get("chief_nodes") or 1),
                   int(rec.get("chief_tasks_per_node") or 1))

    def record(self) -> dict[str, Any]:
        """``{"nodes", "tasks_per_node", "cpus_per_task", "single_task_nodes",
        "chief_input_cpus"}`` (:data:`RECORD_KEYS`), plus ``"cyclic": True`` when cyclic and
        ``chief_nodes`` / ``chief_tasks_per_node`` when several trainer ranks."""
        out = {k: getattr(self, k) for k in RECORD_KEYS}
        if self.world_size > 1:
            out.update({k: getattr(self, k) for k in RANK_FIELDS})
        return {**out, "cyclic": True} if self.cyclic else out

    def with_(self, **changes: Any) -> LayoutSpec:
        """A copy with ``changes`` (field names)."""
        return replace(self, **changes)



def resolve_counts(tasks_per_node: int | None, cpus_per_task: int | None, default_tasks: int,
                   default_cpus: int, node_cpus: int) -> tuple[int, int | None]:
    """Resolve ``(tasks_per_node, cpus_per_task)`` from the flags (``None``: not given), the
    site's defaults and the CPUs of a node (from Slurm: ``sinfo %c``).

    Rules (csrun_wse issue; the original's help text):

    * both given: kept; ``T × C`` must fit the node.
    * the tasks only: keep the default CPUs if T of them fit, else ``None`` (Slurm chooses).
    * the CPUs only: ``T = floor(node_cpus / C)``.
    * neither: the defaults, by the rule for the tasks only.

    Raises :class:`CsrunError` naming the flag (or ``defaults.*`` key) and value when T
    or C alone exceeds the node, or ``T × C`` does.
    """
    if node_cpus < 1:
        raise CsrunError(f"node CPUs {node_cpus}: Slurm reports no CPUs on the nodes")
    if cpus_per_task is not None and cpus_per_task > node_cpus:
        raise CsrunError(f"{FLAGS['cpus_per_task']} {cpus_per_task}: more than the {node_cpus} CPUs of a node")
    if tasks_per_node is None and cpus_per_task is not None:
        return node_cpus // cpus_per_task, cpus_per_task
    t_flag = FLAGS["tasks_per_node"] if tasks_per_node is not None else "defaults.tasks_per_node"
    t = tasks_per_node if tasks_per_node is not None else default_tasks
    if t > node_cpus:
        raise CsrunError(f"{t_flag} {t}: more tasks than the {node_cpus} CPUs of a node")
    if cpus_per_task is not None:
        if t * cpus_per_task > node_cpus:
            raise _fit_error(t, cpus_per_task, node_cpus)
        return t, cpus_per_task
    return t, (default_cpus if t * default_cpus <= node_cpus else None)
