"""PyTorch's part of ``cs_input_analyzer verify``'s drain task
(:class:`csrun_runtime.probing.DrainBackend`, driven by :mod:`analyzer.verify_task`, launched
with ``csrun_wse ... python-pt``):

* an **input worker** runs exactly what a PyTorch training job's worker runs (:func:`worker`:
  :class:`.worker.InputWorker`, its DataLoader as streamer ``i`` of ``W``, streamed over the
  data plane) until the chief is done;
* the **chief** (:class:`ChiefDrain`) sets up what the PyTorch chief sets up for training —
  the rendezvous with its heartbeat, the CPU split and input worker 0 in its own task with
  the chief's input CPUs (:class:`.own_input.OwnInput`), the data-plane receiver
  (:class:`.remote.RemoteSource`) — or, with no input worker, the in-process DataLoader
  (:func:`.worker.build_loader`, ``torch`` held to the task's CPUs).

``--dataloader-workers K`` (:func:`adjust`) sets ``train_input.num_workers`` (the DataLoader's
worker processes) in every task: verify measures the count the report recommends for the
layout, not the YAML's. The result adds ``framework``, ``dataloader_workers`` and the own input
worker's description; ``job_cpu_cores_on_host`` counts the chief only. torch is imported when
the task runs; never TensorFlow.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from csrun_common.roles import Role, RoleError

from ..params import Resolved
from ..probing import DrainSource
from ..rendezvous import Heartbeat, Rendezvous

__all__ = ["prepare", "adjust", "worker", "ChiefDrain"]


def prepare() -> None:
    # nothing to load before run.py: a PyTorch run.py imports csrun_runtime.pytorch itself, and torch
    # is imported when the DataLoader is built
    pass


def adjust(resolved: Resolved, captured: Any, dataloader_workers: int | None) -> None:
    """The task's params as the runtime resolves them (``default_params_fn`` applied), with
    ``train_input.num_workers = dataloader_workers`` when given."""
    resolved.params = captured.params
    if dataloader_workers is not None:
        resolved.params["train_input"] = {**(resolved.params.get("train_input") or {}),
                                          "num_workers": int(dataloader_workers)}


def worker(role: Role, resolved: Resolved, captured: Any) -> int:
    """The input worker's whole task (:meth:`.worker.InputWorker.run`). Returns the exit code."""
    from .worker import InputWorker

    return InputWorker(role, resolved, captured.input_fn).run()


class _Remote:
    """:class:`.remote.RemoteSource` as a :class:`csrun_runtime.probing.DrainSource` (its own
    timeouts: ``runconfig``'s, raising ``InputStalled``)."""

    def __init__(self, remote: Any):
        self.remote = remote

    @property
    def counts(self) -> dict[int, int]:
        """Batches per input worker so far."""
        return self.remote.counts

    def get(self, timeout: float) -> tuple[int, Any]:
        """The next batch and its worker. Raises ``InterruptedError`` on a stop signal."""
        nest, worker_index = self.remote.next()
        if nest is None:
            raise InterruptedError("stopped by a signal")
        return worker_index, nest


class _Local:
    """The chief's own DataLoader, pass after pass, as ``get(timeout) -> (0, batch)``."""

    def __init__(self, loader: Any):
        from .contract import epochs

        self.it = epochs(loader)

    def get(self, timeout: float) -> tuple[int, Any]:
        """The next batch (worker 0)."""
        return 0, next(self.it)


class ChiefDrain:
    """The chief's side (:class:`csrun_runtime.probing.ChiefDrain`, module docstring)."""

    def __init__(self, role: Role, resolved: Resolved, captured: Any, t_proc: float):
        from .own_input import OwnInput

        self.role, self.resolved, self.train_data_fn = role, resolved, captured.input_fn
        self.own = OwnInput(role, os.environ)
        self.rdv: Rendezvous | None = None
        self.heartbeat: Heartbeat | None = None
        self.remote: Any = None

    def open(self) -> tuple[DrainSource, list[int]]:
        """The data-plane stream of the input workers (the own input worker started), or the
        in-process DataLoader with none; no pid (the chief's CPU only is reported)."""
        from .remote import RemoteSource
        from .worker import build_loader

        role, params = self.role, self.resolved.params
        Path(self.resolved.model_dir).mkdir(parents=True, exist_ok=True)
        if role.num_input_workers == 0:
            loader, _, _ = build_loader(self.train_data_fn, params, 0, 1, 0, threads=role.cpus_per_task or None)
            return _Local(loader), []
        if role.rendezvous_key is None:
            raise RoleError("SLURM_JOB_ID is required when CSRUN_NUM_WORKERS > 0")
        self.rdv = Rendezvous(Path(self.resolved.model_dir), role.rendezvous_key)
        self.rdv.reset()
        self.heartbeat = Heartbeat(self.rdv, "chief").start()
        self.own.place()
        self.remote = RemoteSource(self.rdv, role, params["runconfig"])
        self.own.start()
        return _Remote(self.remote), []

    def samples_of(self, batch: Any) -> int:
        """The batch's leading dimension (:func:`.contract.batch_size_of`; 1 when none)."""
        from .contract import batch_size_of

        return batch_size_of(batch) or 1

    def describe(self) -> dict[str, Any]:
        """``framework``, ``dataloader_workers`` (the DataLoader's worker processes) and the own
        input worker's description."""
        return {"framework": "pytorch",
                "dataloader_workers": (self.resolved.params.get("train_input") or {}).get("num_workers"),
                **self.own.describe()}

    def close(self, ok: bool) -> None:
        """Mark the job done (the input workers leave), close the receiver, stop the own input
        worker and the heartbeat."""
        if self.rdv is not None:
            self.rdv.mark_done("ok" if ok else "failed", "drain finished")
        if self.remote is not None:
            self.remote.close()
        self.own.stop()
        if self.heartbeat is not None:
            self.heartbeat.stop()
