"""The input-worker task: serve the user's ``input_fn`` to the chief through tf.data service.

Input worker ``i`` (its index from :mod:`csrun_common.roles`) waits for the chief's
``endpoints.json`` in the rendezvous (:mod:`csrun_runtime.rendezvous`), starts a
``WorkerServer`` (port 0, ``worker_address="<host>:%port%"``) attached to dispatcher ``i``,
builds *its own* dataset with ``input_fn(params_i)`` as input worker ``i`` of the job
(:func:`csrun_runtime.tensorflow.pipeline.build_worker_input`: its shuffle seed, ``TF_CONFIG`` and global
seed, which the task keeps; with a shard plan its files and a ``data_dir`` view of them under
``<rendezvous>/data_views/<i>/``), reads back the files its pipeline lists
(:func:`csrun_runtime.tensorflow.pipeline.pipeline_files`), checks the dataset against the input_fn
contract (:mod:`csrun_runtime.tensorflow.contract`), registers it
as :data:`csrun_runtime.tensorflow.service.DATASET_ID` (``compression=None``; small batches bundled
several per service element, :func:`csrun_runtime.tensorflow.service.plan_bundle`) and writes
``workers/<i>.json`` (with ``bundle``: the batches per element). It then serves until the
chief writes ``done.json`` (or its heartbeat goes stale), and leaves a report of what it
produced.

TensorFlow is imported inside the functions, as everywhere in :mod:`csrun_runtime`: a run.py
imports the runtime before TensorFlow, so that the runtime's quiet-logging settings are in
the environment when TensorFlow starts.
"""
from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

from csrun_common.autoscale import ENV as AUTOSCALE_ENV
from csrun_common.modes import TRAIN_MODES
from csrun_common.roles import Role

from .. import workernames
from ..bundles import AUTOSCALE_MAX_BUNDLE
from ..elastic import ATTEMPT_ENV, tell_supervisor
from ..params import ParamsError, Resolved, load_shard_plan
from ..rendezvous import CHIEF_LOST_SECS, STALE_SECS, SUPERSEDED, Heartbeat, Rendezvous
from ..sharding import TF_CONFIG_VAR
from .bundling import BundlePlan, limit_threads, plan_bundle
from .contract import check_dataset
from .pipeline import WorkerInput, build_worker_input, pipeline_files
from .resume import resume_at
from .service import register_stream, start_worker_server

__all__ = ["run_worker", "InputWorker"]

log = logging.getLogger("csrun.runtime")

#: Servers kept referenced until the process leaves with ``os._exit``: destroying a
#: ``WorkerServer`` tears its pipeline down while holding the GIL, which deadlocks a
#: pipeline that uses ``tf.py_function`` (seen here with a GIL-bound input_fn).
_KEEP_ALIVE: list[Any] = []

#: seconds between polls of the rendezvous files.
POLL_SECS = 0.5


def run_worker(role: Role, resolved: Resolved, input_fn: Callable[..., Any]) -> int:
    """An input-worker task's whole life (:meth:`InputWorker.run`); returns its exit code."""
    return InputWorker(role, resolved, input_fn).run()


def _identity(role: Role, index: int, attempt: int) -> dict[str, Any]:
    """What every registration and report of input worker ``index`` (``attempt``: > 0 for a
    replacement) says of it: node, host, pid, component and the CPUs it may run on."""
    return {"index": index, "node": role.node, "host": role.host, "pid": os.getpid(),
            "attempt": attempt,
            "component": role.component,  # "chief-input": in the chief's task
            "cpu_affinity": sorted(os.sched_getaffinity(0))}  # the CPUs it may run on


class InputWorker:
    """One input-worker task (see the module docstring); :meth:`run` is its life."""

    def __init__(self, role: Role, resolved: Resolved, input_fn: Callable[..., Any]):
        if role.worker_index is None or role.rendezvous_key is None:
            raise ValueError(f"{role.describe()} is not an input worker of a Slurm job step")
        self.role, self.resolved, self.input_fn = role, resolved, input_fn
        self.index: int = role.worker_index
        rc = resolved.params["runconfig"]
        self.rdv = Rendezvous(rc["model_dir"], role.rendezvous_key)
        self.start_timeout = float(rc["worker_start_timeout_secs"])
        self.attempt = int(os.environ.get(ATTEMPT_ENV) or 0)  # > 0: a replacement
        self.me = _identity(role, self.index, self.attempt)
        self.t0 = time.monotonic()
        self.heartbeat = Heartbeat(self.rdv, f"workers/{self.index}")
        self.counter = [0]  # service elements produced (bundles of ``self.bundling.bundle`` batches)
        self.bundling = BundlePlan(1, None, "auto", "not planned yet")
        self.plan: dict[str, Any] | None = None
        self.files: list[str] | None = None  # the files its pipeline lists (pipeline_files)

    def run(self) -> int:
        """Serve, or wait for the chief in modes that stream nothing; returns the exit code. 0: the chief
        finished (``done.json``), or the mode streams nothing (eval, validate_only, compile_only). 1: no
        rendezvous within ``runconfig.worker_start_timeout_secs``, or the chief's heartbeat went stale
        (:data:`csrun_runtime.rendezvous.CHIEF_LOST_SECS`). 2: the shard plan or the input_fn violates the
        contract (registered as ``status: failed``, so that the chief names it)."""
        tell_supervisor(str(self.rdv.dir), self.index)  # where a death of this process is recorded
        if self.resolved.mode not in TRAIN_MODES:
            return self._wait_for_chief()
        if not self._load_plan():
            self.left_unserved(None, "failed")
            return 2
        address = self._wait_for_dispatcher()
        if address is None:
            done = self.rdv.done()
            if done is None:
                return 1
            self.left_unserved(done.get("status"))
            return 0
        if (self.rdv.endpoints() or {}).get("transport") == "dataplane":  # runconfig.transport
            from .dataplane_serve import serve  # the chief's receiver instead of a dispatcher

            return serve(self, address)
        # Build and register before the server starts: a replacement's server is handed the
        # dispatcher's running job at once, whose graph (registered by its predecessor) looks its
        # tf.py_function callbacks up by name in this process; they must exist by then (measured:
        # "Could not find callback with key=pyfunc_1" when the server started first).
        served = self.build_and_plan()
        if served is None:
            self.left_unserved(None, "failed")
            return 2
        register_stream(address, limit_threads(served[1].dataset, self.role.cpus_per_task), self.bundling,
                        self.counter, positioned=resume_at(self.rdv, self.index, self.attempt, self.start_timeout))
        server = self._start_server(address)
        batch_size, built = served
        self._register(address, server, batch_size, built)
        code, status = self.serve_until_done()
        self.heartbeat.stop()
        if status != SUPERSEDED:  # the replacement's report is the one for this index
            self.write_report(built, batch_size, status)
        return code

    # ------------------------------------------------------------------ steps
    def _chief_gone(self) -> str | None:
        age = self.rdv.age("chief")
        if age is not None and age > CHIEF_LOST_SECS:
            return f"the chief's heartbeat is {age:.0f} s old"
        return None

    def _wait_for_chief(self) -> int:
        """Modes without training input: wait for the chief's done marker."""
        self.heartbeat.start()
        log.info("mode %s streams no training input; waiting for the chief", self.resolved.mode)
        while True:
            d = self.rdv.done()
            if d is not None:
                log.info("chief done (%s); leaving", d.get("status"))
                self.left_unserved(d.get("status"))
                return 0
            gone = self._chief_gone()
            if gone:
                log.error("leaving: %s", gone)
                return 1
            if self.rdv.age("chief") is None and time.monotonic() - self.t0 > self.start_timeout:
                log.error("no chief heartbeat in %s after %.0f s", self.rdv.dir, self.start_timeout)
                return 1
            time.sleep(POLL_SECS)

    def _load_plan(self) -> bool:
        """Load the shard plan, if any, into ``self.plan``; ``False`` after registering a
        failure when it is unusable."""
        self.plan = None
        try:
            if self.role.shard_plan:
                self.plan = load_shard_plan(self.role.shard_plan, self.role.num_streamers)
        except ParamsError as e:
            self.rdv.register_worker(self.index, {**self.me, "status": "failed", "violations": e.problems})
            log.error("%s", e)
            return False
        return True

    def _wait_for_dispatcher(self) -> str | None:
        """Poll for ``endpoints.json``; returns dispatcher ``index``'s address, or ``None``
        when the chief is already done or never published (logged)."""
        disp = None
        while disp is None:
            if self.rdv.done() is not None:
                log.info("chief already done; leaving")
                return None
            disp = self.rdv.endpoints()
            if disp is None:
                if time.monotonic() - self.t0 > self.start_timeout:
                    log.error("no endpoints.json in %s after %.0f s (is the chief running?)",
                              self.rdv.dir, self.start_timeout)
                    return None
                time.sleep(0.25)
        self.heartbeat.start()
        addresses = disp["endpoints"]
        if len(addresses) != self.role.num_input_workers:
            log.error("the chief published %d dispatchers for %d workers", len(addresses),
                      self.role.num_input_workers)
            return None
        return str(addresses[self.index])

    def _start_server(self, address: str) -> Any:
        server = start_worker_server(address, self.role.host)
        _KEEP_ALIVE.append(server)
        return server

    def _build(self) -> WorkerInput:
        """``input_fn`` built as this input worker, streamer ``g`` of the job's ``W`` (a job-wide
        shard; TF_CONFIG and the global seed stay set)."""
        if os.environ.get(TF_CONFIG_VAR):
            log.info("replacing the inherited TF_CONFIG with this input worker's")
        built = build_worker_input(self.input_fn, self.resolved.params, self.role.streamer_index or 0,
                                   self.role.num_streamers, self.plan,
                                   job_key=self.role.rendezvous_key,
                                   view_root=self.rdv.dir / "data_views", restore=False)
        if built.view is not None:
            for note in built.view.notes:
                log.warning("%s", note)
            if built.view.outside:
                log.warning("%d shard-plan file(s) of this worker lie outside train_input.data_dir; "
                            "a pipeline reading only data_dir will not see them",
                            len(built.view.outside))
        return built

    def build_and_plan(self) -> tuple[int | None, WorkerInput] | None:
        """Build the dataset, check the contract, plan its bundling (``self.bundling``:
        :func:`csrun_runtime.tensorflow.service.plan_bundle`) and list its files (``self.files``), for
        either transport. Returns ``(batch_size, built input)``, or ``None`` after registering
        the violations (an error of the input_fn too) as ``status: failed``."""
        try:
            built = self._build()
            ds = built.dataset
            ti = built.params["train_input"]
            rep = check_dataset(ds, "train", batch_size=ti.get("batch_size"))
            violations = rep.violations
        except Exception as e:  # noqa: BLE001 - any error of the user's input_fn is reported
            violations = [f"train_input: input_fn raised {type(e).__name__}: {e}"]
        if violations:
            self.rdv.register_worker(self.index, {**self.me, "status": "failed", "violations": violations})
            for v in violations:
                log.error("%s", v)
            return None
        batch_size = rep.info["train_input"]["batch_size"]
        # the files its first pass lists; iterating them here does not change what is served
        # (the server rebuilds the dataset from its graph; see pipeline_files)
        self.files = pipeline_files(ds)
        rc = self.resolved.params["runconfig"]
        steps = [int(rc[k]) for k in ("max_steps", "num_steps") if rc.get(k)]
        cap = min(steps) // (4 * max(1, self.role.num_input_workers)) if steps else None
        if os.environ.get(AUTOSCALE_ENV):
            # finer elements: the chief's buffers hold whole elements and its autoscale windows
            # must see a removed worker (csrun_runtime.autoscale)
            cap = min(cap, AUTOSCALE_MAX_BUNDLE) if cap is not None else AUTOSCALE_MAX_BUNDLE
        self.bundling = plan_bundle(ds.element_spec, rc.get("input_bundle", "auto"), max_batches=cap)
        return batch_size, built

    def _register(self, address: str, server: Any, batch_size: int | None, built: WorkerInput) -> None:
        ti = built.params["train_input"]
        files = ti.get("data_files")
        # The address the dispatcher hands to the chief: our host and the port the server bound
        # (WorkerServer._address is TF's local view, always "localhost:<port>").
        bound = getattr(server, "_address", None)
        worker_address = f"{self.role.host}:{bound.rsplit(':', 1)[1]}" if bound else None
        self.rdv.register_worker(self.index, {
            **self.me, "status": "ok", "dispatcher": address,
            "worker_address": worker_address, "batch_size": batch_size,
            "shuffle_seed": ti.get("shuffle_seed"), "data_files": files,
            "pipeline_files": self.files, **built.describe(), "registered": time.time(),
            "bundle": self.bundling.bundle, "bundling": self.bundling.describe()})
        log.info("serving input_fn to the chief (dispatcher %s, batch_size %s, shuffle_seed %s, "
                 "TF_CONFIG task.index %d of %d, %s%s; bundling %s)", address, batch_size, ti.get("shuffle_seed"),
                 built.tf_config["task"]["index"], len(built.tf_config["cluster"]["worker"]),
                 f"{len(self.files)} file(s) listed by its pipeline" if self.files is not None
                 else "files not seen", ", file list shuffled with the job-wide seed"
                 if built.file_list_job_wide else "", self.bundling.reason)

    def serve_until_done(self) -> tuple[int, str | None]:
        """Serve until ``done.json`` (exit 0 and the chief's status), the chief is lost (1) or
        a later attempt of this worker registered (0 and :data:`SUPERSEDED`)."""
        while True:
            d = self.rdv.done()
            if d is not None:
                return 0, d.get("status")
            gone = self._chief_gone()
            if gone:
                log.error("leaving: %s", gone)
                return 1, None
            newer = self.superseded()
            if newer is not None:
                log.warning("leaving: %s was replaced by attempt %s on %s (the chief "
                            "took this one for lost: no heartbeat for over %.0f s); its replacement serves "
                            "dispatcher %d", workernames.name(self.index), newer.get("attempt"), newer.get("node"),
                            STALE_SECS, self.index)
                return 0, SUPERSEDED
            time.sleep(POLL_SECS)

    def superseded(self) -> dict[str, Any] | None:
        """The registration of a later attempt of this worker's index, or ``None`` (a hung worker that finds
        one leaves: docs/RESILIENCE.md "A lost node")."""
        reg = self.rdv.worker(self.index)
        if reg and int(reg.get("attempt") or 0) > self.attempt:
            return reg
        return None

    def left_unserved(self, chief_status: str | None, status: str = "left") -> None:
        """The report of a worker that leaves without having served (``status``: ``left`` on
        the chief's ``done.json``, ``failed`` after registering its violations): the chief,
        exiting after its workers, counts it (:func:`csrun_runtime.preemption.wait_workers_left`)."""
        self.rdv.write_report(self.index, {**self.me, "served": False, "status": status,
                                           "chief_status": chief_status,
                                           "seconds": round(time.monotonic() - self.t0, 3)})

    def write_report(self, built: WorkerInput, batch_size: int | None, status: str | None) -> None:
        ti = built.params["train_input"]
        files = ti.get("data_files")
        elements = self.counter[0] * self.bundling.bundle  # batches produced (served or buffered)
        report = {**self.me, "files": files,
                  "files_source": "shard_plan" if files is not None else "input_fn",
                  "pipeline_files": self.files, **built.describe(),
                  "shuffle_seed": ti.get("shuffle_seed"), "elements": elements,
                  "samples": elements * (batch_size or 0), "batch_size": batch_size,
                  "service_elements": self.counter[0], "bundle": self.bundling.bundle,
                  "chief_status": status, "seconds": round(time.monotonic() - self.t0, 3)}
        self.rdv.write_report(self.index, report)
        log.info("produced %d batch(es) (%d samples); chief status %s; leaving", elements,
                 report["samples"], status)
