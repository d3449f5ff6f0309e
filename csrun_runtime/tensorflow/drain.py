"""TensorFlow's part of ``cs_input_analyzer verify``'s drain task
(:class:`csrun_runtime.probing.DrainBackend`, driven by :mod:`analyzer.verify_task`):

* an **input worker** runs exactly what a training job's worker runs (:func:`worker`:
  :func:`.worker.run_worker`, its own ``input_fn(params_i)`` on the transport the chief
  publishes: the data plane or a tf.data service worker) until the chief is done;
* the **chief** (:class:`ChiefDrain`) sets up what the runtime's chief sets up for training —
  the rendezvous, the transport of ``runconfig.transport`` (one data-plane receiver, or one
  dispatcher per input worker), the wait for their registrations and the merged stream from
  every stream's start (:meth:`.chief_streams.ChiefStreams.training_source`), or the
  in-process pipeline (:class:`.sources.LocalSource`, its pipeline held to the task's
  ``CSRUN_CPUS_PER_TASK`` threads as an input worker's is) when there is no input worker; with
  the layout's chief input CPUs it splits its CPUs and starts
  input worker 0 in its own task as the runtime's chief does (:mod:`csrun_runtime.chief_input`).
  The result's ``chief_input`` is that worker's CPU split
  (:meth:`csrun_runtime.chief_input.ChiefInputWorker.describe`); ``job_cpu_cores_on_host``
  counts the input workers on the chief's host, the chief's own and its children included.

TensorFlow is imported when the task runs (:func:`prepare`: the runner, as a launched task's
run.py imports it), not when this module is imported.
"""
from __future__ import annotations

import os
import socket
from typing import Any

from csrun_common.roles import Role, RoleError

from ..input_backend import samples_in
from ..params import Resolved
from ..probing import DrainSource, process_tree
from ..rendezvous import Heartbeat, Rendezvous

__all__ = ["prepare", "adjust", "worker", "ChiefDrain", "samples"]

#: Objects that must never be destroyed before ``os._exit``: tearing down tf.data service
#: servers and iterators can block (forever, seen here) in their destructors.
_KEEP: list[Any] = []


def prepare() -> None:
    """Import the runner as a launched task's run.py imports it: TensorFlow's start-up lines
    quieted, the stop signals caught before it loads."""
    from . import runner  # noqa: F401

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def adjust(resolved: Resolved, captured: Any, dataloader_workers: int | None) -> None:
    # nothing to adjust: the params are the task's own (dataloader_workers means nothing to tf.data)
    pass


def worker(role: Role, resolved: Resolved, captured: Any) -> int:
    """The input worker's whole task (:func:`.worker.run_worker`); its tf.data service servers
    kept until ``os._exit``. Returns the exit code."""
    from .worker import run_worker

    _keep_worker_servers()
    return run_worker(role, resolved, captured.input_fn)


def _keep_worker_servers() -> None:
    """Keep every tf.data service ``WorkerServer`` this process creates referenced until
    ``os._exit``. Destroying one stops it, and stopping it destroys its tasks' iterators
    while holding the GIL: a pipeline with a ``tf.py_function`` then deadlocks (its calls
    wait for the GIL) — seen here with a worker whose ``run_worker`` returned."""
    import tensorflow as tf  # the task's: loaded by the runner

    svc = tf.data.experimental.service
    base = svc.WorkerServer
    if getattr(base, "_csrun_kept", False):
        return

    class KeptWorkerServer(base):  # type: ignore[misc, valid-type]
        _csrun_kept = True

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            _KEEP.append(self)

    svc.WorkerServer = KeptWorkerServer


def samples(batch: Any) -> int:
    """Samples in one tf.data element (its leading dimension, :func:`csrun_runtime.input_backend.samples_in`)."""
    import tensorflow as tf  # loaded already: the task's pipeline is running

    return samples_in(tf.nest.flatten(batch))


class ChiefDrain:
    """The chief's side (:class:`csrun_runtime.probing.ChiefDrain`, module docstring): the
    runtime's :class:`.chief.Chief` for ``role`` and ``resolved``, the stream it would train on."""

    def __init__(self, role: Role, resolved: Resolved, captured: Any, t_proc: float):
        from .chief import Chief

        self.role = role
        self.chief = Chief(role, resolved, captured.input_fn, captured.model_fn, captured.eval_input_fn, t_proc)
        self.rdv: Rendezvous | None = None

    def open(self) -> tuple[DrainSource, list[int]]:
        """The stream (:meth:`_streamed_source`, or :meth:`_local_source` with no input worker)
        and the pids of the input workers on this host (their CPU is reported apart)."""
        self.chief.model_dir.mkdir(parents=True, exist_ok=True)
        if self.role.num_input_workers > 0:
            self.chief.place_chief_input()  # before the source is built: the chief's threads pinned
            self.rdv = self._rendezvous()
            return self._streamed_source()
        return self._local_source(), []

    def samples_of(self, batch: Any) -> int:
        """:func:`samples`."""
        return samples(batch)

    def describe(self) -> dict[str, Any]:
        """``{"chief_input": its CPU split}`` with the chief's input CPUs, else ``{}``."""
        ci = self.chief.chief_input
        return {} if ci is None else {"chief_input": ci.describe()}

    def close(self, ok: bool) -> None:
        """Mark the job done (the input workers, the chief's own included, leave on done.json);
        the chief and its servers are kept until ``os._exit``."""
        if self.rdv is not None:
            self.rdv.mark_done("ok" if ok else "failed", "drain finished")
        if self.chief.chief_input is not None:
            self.chief.chief_input.stop()
        _KEEP.append(self.chief)

    def _rendezvous(self) -> Rendezvous:
        """The rendezvous the runtime's chief sets up before training (reset, with its
        heartbeat), given to the chief for :meth:`.chief.Chief.wait_workers`."""
        key = self.role.rendezvous_key
        if key is None:  # resolve_role already requires SLURM_JOB_ID when there are input workers
            raise RoleError("SLURM_JOB_ID is required when CSRUN_NUM_WORKERS > 0")
        rdv = Rendezvous(self.chief.model_dir, key)
        rdv.reset()
        Heartbeat(rdv, "chief").start()
        self.chief.rdv = rdv
        return rdv

    def _streamed_source(self) -> tuple[DrainSource, list[int]]:
        """The training chief's stream, by its own code: what ``runconfig.transport`` sets up
        (one data-plane receiver, or one tf.data service dispatcher per input worker), published;
        the chief's own input worker started (when placed); the registrations awaited; every
        stream from its start (``positions.json``: every input worker waits for it) merged.
        Returns the source and the pids of the input workers on this host."""
        role, chief = self.role, self.chief
        addresses = chief.streams.start_dispatchers()
        chief.start_chief_input()
        source = chief.streams.training_source(None, addresses, start=0)
        _KEEP.append(source)
        registry = chief.streams.registry
        local_pids = [int(r["pid"]) for r in registry.values()
                      if r.get("pid") and r.get("host") in (role.host, socket.gethostname())]
        if chief.chief_input is not None:
            local_pids += [pid for pid in process_tree(chief.chief_input.pid) if pid not in local_pids]
        return source, local_pids

    def _local_source(self) -> DrainSource:
        """No input worker: the chief's in-process pipeline, held to the task's CPUs as
        run_worker holds an input worker and the runtime's chief its in-process pipeline (and
        as the probes were): on a cluster that does not bind tasks to CPUs the pipeline would
        otherwise use every core of the node."""
        from .bundling import limit_threads
        from .sources import LocalSource

        ds, _spec, _bs = self.chief.streams.check_train_input()
        source = LocalSource(limit_threads(ds, self.role.cpus_per_task))
        _KEEP.append(source)
        return source
