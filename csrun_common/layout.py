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

A new layout flag is one field here, its entry in :data:`FLAGS`, its rule in
:meth:`LayoutSpec.check`, its click option in ``launcher/cli.py`` and its use in
``launcher/layout.py`` (and, when the analyzer should choose it, in ``analyzer/recommend.py``).

Pure Python, no import of ``launcher``, ``analyzer`` or ``csrun_runtime``.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from .errors import CsrunError

__all__ = ["LayoutSpec", "FLAGS", "RECORD_KEYS"]

#: Field -> its ``csrun_wse`` flag, in the order :meth:`LayoutSpec.to_flags` writes them.
#: The first three are always written (when set); the others only when not their default.
FLAGS: dict[str, str] = {
    "nodes": "--total-nodes",
    "tasks_per_node": "--tasks-per-node",
    "cpus_per_task": "--cpus-per-task",
    "single_task_nodes": "--single-task-nodes",
    "chief_input_cpus": "--chief-input-cpus",
    "cyclic": "--cyclic",
}
#: Keys of a layout in the analyzer's records (``report.json``'s ``recommendation``,
#: ``verify.json``'s ``layout``): :meth:`LayoutSpec.record`.
RECORD_KEYS = ("nodes", "tasks_per_node", "cpus_per_task", "single_task_nodes", "chief_input_cpus")
_BOOL = frozenset({"cyclic"})


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
    """

    nodes: int
    tasks_per_node: int
    cpus_per_task: int | None
    single_task_nodes: int = 0
    chief_input_cpus: int = 0
    cyclic: bool = False

    def check(self) -> LayoutSpec:
        """Return ``self`` when the values are a layout; raise :class:`CsrunError` naming the
        flag and value (one line, exit 2) for N < 1, T < 1, C < 1, S < 0, S >= N (S > 0) or
        a negative ``chief_input_cpus``. Rules: the original csrun_wse's help text."""
        if self.nodes < 1:
            raise CsrunError(f"--total-nodes {self.nodes}: must be a positive integer")
        if self.tasks_per_node < 1:
            raise CsrunError(f"--tasks-per-node {self.tasks_per_node}: must be a positive integer")
        if self.cpus_per_task is not None and self.cpus_per_task < 1:
            raise CsrunError(f"--cpus-per-task {self.cpus_per_task}: must be a positive integer")
        if self.single_task_nodes < 0:
            raise CsrunError(f"--single-task-nodes {self.single_task_nodes}: must be 0 or more")
        if self.single_task_nodes and self.single_task_nodes >= self.nodes:
            raise CsrunError(f"--single-task-nodes {self.single_task_nodes}: must be less than "
                             f"--total-nodes {self.nodes}")
        if self.chief_input_cpus < 0:
            raise CsrunError(f"--chief-input-cpus {self.chief_input_cpus}: must be 0 or more")
        return self

    @property
    def num_workers(self) -> int:
        """Input workers of the job (``CSRUN_NUM_WORKERS``): every task but the chief —
        ``N·T − 1`` without single-task nodes, ``S − 1 + (N − S)·T`` with them — plus input
        worker 0 in the chief's task with ``chief_input_cpus`` (docs/CONTRACT.md). 0: the chief
        runs the input pipeline in-process."""
        n, t, s = self.nodes, self.tasks_per_node, self.single_task_nodes
        tasks = n * t if s == 0 else s + (n - s) * t
        return tasks - 1 + (1 if self.chief_input_cpus else 0)

    def chief_task_cpus(self, node_cpus: int) -> int | None:
        """CPUs of the chief's task: the whole node's ``node_cpus`` with single-task nodes,
        else ``cpus_per_task`` (``None`` when Slurm chooses)."""
        return node_cpus if self.single_task_nodes else self.cpus_per_task

    def check_node(self, node_cpus: int) -> LayoutSpec:
        """:meth:`check`, then the rules that need a node's CPUs (``node_cpus``, from Slurm or
        the analyzer's probes): ``T × C`` within the node, and ``chief_input_cpus`` within the
        chief's task (which must have known CPUs). Raises :class:`CsrunError` naming the flag."""
        self.check()
        c = self.cpus_per_task
        if c is not None and self.tasks_per_node * c > node_cpus:
            raise CsrunError(f"--tasks-per-node {self.tasks_per_node} × --cpus-per-task {c}: more than the "
                             f"{node_cpus} CPUs of a node")
        return self.check_chief_input(node_cpus)

    def check_chief_input(self, node_cpus: int) -> LayoutSpec:
        """Raise :class:`CsrunError` when ``chief_input_cpus`` is set and the chief's CPUs are
        left to Slurm, or when it is above the chief task's CPUs (:meth:`chief_task_cpus`)."""
        chief = self.chief_task_cpus(node_cpus)
        if self.chief_input_cpus and chief is None:
            raise CsrunError(f"--chief-input-cpus {self.chief_input_cpus}: the chief's CPUs are left to Slurm; "
                             f"give --cpus-per-task")
        if chief is not None and self.chief_input_cpus > chief:
            raise CsrunError(f"--chief-input-cpus {self.chief_input_cpus}: more than the chief task's "
                             f"{chief} CPU(s)")
        return self

    def to_flags(self) -> list[str]:
        """The ``csrun_wse`` argv flags of this layout, e.g. ``["--total-nodes", "3",
        "--tasks-per-node", "2", "--cpus-per-task", "1", "--chief-input-cpus", "1"]``:
        ``--cpus-per-task`` only when set, ``--single-task-nodes`` / ``--chief-input-cpus``
        only when non-zero, ``--cyclic`` only when true. The one layout -> flags encoder
        (:meth:`from_flags` reads it back)."""
        out: list[str] = []
        for name, flag in FLAGS.items():
            value = getattr(self, name)
            if name in _BOOL:
                out += [flag] if value else []
            elif value is not None and (name in ("nodes", "tasks_per_node", "cpus_per_task") or value):
                out += [flag, str(int(value))]
        return out

    @classmethod
    def from_flags(cls, argv: Sequence[str]) -> LayoutSpec:
        """The layout of the flags in ``argv`` (``--flag VALUE`` or ``--flag=VALUE``; other
        words are skipped, so a whole ``csrun_wse`` line may be given, up to its command).
        Raises :class:`CsrunError` for a missing ``--total-nodes`` / ``--tasks-per-node``, a
        flag without a value or a value that is not an integer."""
        by_flag = {flag: name for name, flag in FLAGS.items()}
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
        for name in ("nodes", "tasks_per_node"):
            if name not in values:
                raise CsrunError(f"{FLAGS[name]}: missing from {' '.join(words)!r}")
        values.setdefault("cpus_per_task", None)
        return cls(**values)

    @classmethod
    def from_record(cls, rec: Mapping[str, Any] | LayoutSpec) -> LayoutSpec:
        """The layout of an analyzer record (a recommendation, a prediction, ``verify.json``'s
        ``layout``, another :class:`LayoutSpec`): keys :data:`RECORD_KEYS`, the last two
        optional (0 when missing or ``None``). Raises ``KeyError`` for a missing
        ``nodes``/``tasks_per_node``/``cpus_per_task``."""
        if isinstance(rec, LayoutSpec):
            return rec
        return cls(int(rec["nodes"]), int(rec["tasks_per_node"]), int(rec["cpus_per_task"]),
                   int(rec.get("single_task_nodes") or 0), int(rec.get("chief_input_cpus") or 0),
                   bool(rec.get("cyclic") or False))

    def record(self) -> dict[str, Any]:
        """``{"nodes", "tasks_per_node", "cpus_per_task", "single_task_nodes",
        "chief_input_cpus"}`` (:data:`RECORD_KEYS`), plus ``"cyclic": True`` when cyclic."""
        out = {k: getattr(self, k) for k in RECORD_KEYS}
        return {**out, "cyclic": True} if self.cyclic else out

    def with_(self, **changes: Any) -> LayoutSpec:
        """A copy with ``changes`` (field names)."""
        return replace(self, **changes)

