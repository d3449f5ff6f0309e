"""The chief's input CPUs on the PyTorch chief (docs/CHIEF-INPUT.md, :mod:`csrun_runtime.chief_input`):
input worker 0 runs as a supervised process of the chief's own task.

The framework-neutral pieces are :mod:`csrun_runtime.chief_input`'s, as on the TensorFlow chief:
:func:`~csrun_runtime.chief_input.place` splits the task's CPUs (and pins the chief's threads
when the split is disjoint) and :class:`~csrun_runtime.chief_input.ChiefInputWorker` starts the
chief's own command again under ``python -m csrun_runtime.supervise`` with
``CSRUN_ROLE=chief-input``: there the task's lifecycle (:mod:`csrun_runtime.lifecycle`) resolves input worker 0
of ``CSRUN_NUM_WORKERS`` and runs :class:`csrun_runtime.pytorch.worker.InputWorker`, which
builds its DataLoader as streamer 0 of W and streams it over the data plane like any other.
This module only says when: placed before the model is built, started once the data-plane
endpoint is published, stopped after ``done.json``.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from csrun_common.roles import Role

from .. import chief_input
from ..params import ParamsError

__all__ = ["OwnInput"]

log = logging.getLogger("csrun.runtime")


class OwnInput:
    """The PyTorch chief's input worker 0 (module docstring); every method is a no-op without
    the chief's input CPUs (or with 0) in ``env``.

    Args:
        role: the chief's role (its ``procid`` and ``cpus_per_task``).
        env: the chief's environment (``os.environ``).
    """

    def __init__(self, role: Role, env: Mapping[str, str]):
        self.role, self.env = role, env
        self.split: chief_input.CpuSplit | None = None
        self.worker: chief_input.ChiefInputWorker | None = None
        self.record: dict[str, Any] | None = None
        try:
            self.requested = chief_input.requested(env)
        except ValueError:
            self.requested = 0  # place() raises it

    def place(self) -> None:
        """Split the task's CPUs (:func:`csrun_runtime.chief_input.place`) before the model is
        built; when pinned, torch's intra-op threads are set to the training CPUs. Raises
        :class:`csrun_runtime.params.ParamsError` naming the variable for a bad value."""
        try:
            self.split = chief_input.place(self.role, self.env)
        except ValueError as e:
            raise ParamsError(str(e)) from None
        if self.split is None:
            return
        if self.split.pinned:
            import torch

            torch.set_num_threads(len(self.split.training))
        self.record = chief_input.record(self.split)

    def start(self) -> None:
        """Start input worker 0 in this task once the data-plane endpoint is published (after
        :meth:`place` placed one). Raises ``OSError`` when the process cannot be started."""
        if self.split is not None and self.worker is None:
            self.worker = chief_input.ChiefInputWorker.start(self.role, self.split)
            assert self.record is not None
            self.record.update(pid=self.worker.pid, node=self.role.node)  # the chief's node

    def stop(self) -> None:
        """After ``done.json``: wait for input worker 0 to leave (it writes its report first),
        stopping it after 15 s (:meth:`csrun_runtime.chief_input.ChiefInputWorker.stop`)."""
        if self.worker is not None:
            log.info("input worker 0 in the chief's task left with %s", self.worker.stop())

    def missing(self) -> int:
        """Input workers that will write no report: 1 when worker 0 was asked for but not started, else 0."""
        return 1 if self.requested and self.worker is None else 0

    def describe(self) -> dict[str, Any]:
        """performance.json's ``chief_input``, ``{}`` when none was placed (the TensorFlow chief's, pid, node)."""
        return {"chief_input": dict(self.record)} if self.record is not None else {}
