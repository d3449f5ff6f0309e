"""The input-worker task: serve the user's ``input_fn`` to the chief through tf.data service.

Input worker ``i`` (its index from :mod:`csrun_common.roles`) waits for the chief's
``dispatchers.json`` in the rendezvous (:mod:`csrun_runtime.rendezvous`), starts a
``WorkerServer`` (port 0, ``worker_address="<host>:%port%"``) attached to dispatcher ``i``,
builds *its own* dataset with ``input_fn(params_i)`` (its shuffle seed, its shard-plan
files), checks it against the input_fn contract (:mod:`csrun_runtime.contract`), registers it
as :data:`csrun_runtime.service.DATASET_ID` (``compression=None``; small batches bundled
several per service element, :func:`csrun_runtime.service.plan_bundle`) and writes
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

from csrun_common.roles import Role

from .contract import call_input_fn, check_dataset
from .params import TRAIN_MODES, ParamsError, Resolved, load_shard_plan, worker_params
from .rendezvous import CHIEF_LOST_SECS, Heartbeat, Rendezvous
from .service import BundlePlan, limit_threads, plan_bundle, register_stream, start_worker_server

__all__ = ["run_worker", "InputWorker"]

log = logging.getLogger("csrun.runtime")

#: Servers kept referenced until the process leaves with ``os._exit``: destroying a
#: ``WorkerServer`` tears its pipeline down while holding the GIL, which deadlocks a
#: pipeline that uses ``tf.py_function`` (seen here with a GIL-bound input_fn).
_KEEP_ALIVE: list[Any] = []

#: seconds between polls of the rendezvous files.
POLL_SECS = 0.5


def run_worker(role: Role, resolved: Resolved, input_fn: Callable[..., Any]) -> int:
    """The whole life of an input-worker task; returns its exit code.

    0: the chief finished (``done.json``), or the mode needs no streaming (eval, validate_only,
    compile_only: the worker waits for the chief's done marker). 1: no rendezvous within
    ``runconfig.worker_start_timeout_secs``, or the chief's heartbeat went stale
    (:data:`csrun_runtime.rendezvous.CHIEF_LOST_SECS`). 2: the shard plan or the input_fn
    violates the contract (registered as ``status: failed`` so that the chief names it).
    """
    return InputWorker(role, resolved, input_fn).run()


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
        self.me = {"index": self.index, "node": role.node, "host": role.host, "pid": os.getpid()}
        self.t0 = time.monotonic()
        self.heartbeat = Heartbeat(self.rdv, f"workers/{self.index}")
        self.counter = [0]  # service elements produced (bundles of ``self.plan.bundle`` batches)
        self.plan = BundlePlan(1, None, "auto", "not planned yet")

    def run(self) -> int:
        """Serve, or wait for the chief in modes that stream nothing; returns the exit code."""
        if self.resolved.mode not in TRAIN_MODES:
            return self._wait_for_chief()
        params = self._worker_params()
        if params is None:
            return 2
        address = self._wait_for_dispatcher()
        if address is None:
            return 0 if self.rdv.done() is not None else 1
        server = self._start_server(address)
        served = self._build_and_register(params, address)
        if served is None:
            return 2
        batch_size, ti = served
        self._register(address, server, batch_size, ti)
        code, status = self._serve_until_done()
        self._write_report(ti, batch_size, status)
        self.heartbeat.stop()
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
                return 0
            gone = self._chief_gone()
            if gone:
                log.error("leaving: %s", gone)
                return 1
            if self.rdv.age("chief") is None and time.monotonic() - self.t0 > self.start_timeout:
                log.error("no chief heartbeat in %s after %.0f s", self.rdv.dir, self.start_timeout)
                return 1
            time.sleep(POLL_SECS)

    def _worker_params(self) -> dict[str, Any] | None:
        """This worker's params (its seed, its shard-plan files) and TensorFlow's global seed;
        ``None`` after registering a failure when the shard plan is unusable."""
        plan = None
        try:
            if self.role.shard_plan:
                plan = load_shard_plan(self.role.shard_plan, self.role.num_workers)
        except ParamsError as e:
            self.rdv.register_worker(self.index, {**self.me, "status": "failed", "violations": e.problems})
            log.error("%s", e)
            return None
        wp = worker_params(self.resolved.params, self.index, self.role.num_workers, plan)
        seed = wp["train_input"].get("shuffle_seed")
        if seed is not None:
            import tensorflow as tf

            tf.random.set_seed(int(seed))
        return wp

    def _wait_for_dispatcher(self) -> str | None:
        """Poll for ``dispatchers.json``; returns dispatcher ``index``'s address, or ``None``
        when the chief is already done or never published (logged)."""
        disp = None
        while disp is None:
            if self.rdv.done() is not None:
                log.info("chief already done; leaving")
                return None
            disp = self.rdv.dispatchers()
            if disp is None:
                if time.monotonic() - self.t0 > self.start_timeout:
                    log.error("no dispatchers.json in %s after %.0f s (is the chief running?)",
                              self.rdv.dir, self.start_timeout)
                    return None
                time.sleep(0.25)
        self.heartbeat.start()
        addresses = disp["dispatchers"]
        if len(addresses) != self.role.num_workers:
            log.error("the chief published %d dispatchers for %d workers", len(addresses),
                      self.role.num_workers)
            return None
        return str(addresses[self.index])

    def _start_server(self, address: str) -> Any:
        server = start_worker_server(address, self.role.host)
        _KEEP_ALIVE.append(server)
        return server

    def _build_and_register(self, params: dict[str, Any], address: str
                            ) -> tuple[int | None, dict[str, Any]] | None:
        """Build ``input_fn(params)``, check the contract, register the dataset with the
        dispatcher, bundled as ``runconfig.input_bundle`` and the batch's size say
        (:func:`csrun_runtime.service.plan_bundle`). Returns ``(batch_size, train_input
        params)``, or ``None`` after registering the violations as a failure."""
        ti = params["train_input"]
        try:
            ds = call_input_fn(self.input_fn, params, "train")
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
        self.plan = plan_bundle(ds.element_spec, self.resolved.params["runconfig"].get("input_bundle", "auto"))
        register_stream(address, limit_threads(ds, self.role.cpus_per_task), self.plan, self.counter)
        return batch_size, ti

    def _register(self, address: str, server: Any, batch_size: int | None, ti: dict[str, Any]) -> None:
        files = ti.get("data_files")
        self.rdv.register_worker(self.index, {
            **self.me, "status": "ok", "dispatcher": address,
            "worker_address": getattr(server, "_address", None), "batch_size": batch_size,
            "shuffle_seed": ti.get("shuffle_seed"), "data_files": files, "registered": time.time(),
            "bundle": self.plan.bundle, "bundling": self.plan.describe()})
        log.info("serving input_fn to the chief (dispatcher %s, batch_size %s, shuffle_seed %s, %s; "
                 "bundling %s)", address, batch_size, ti.get("shuffle_seed"),
                 f"{len(files)} shard-plan file(s)" if files is not None else "files chosen by input_fn",
                 self.plan.reason)

    def _serve_until_done(self) -> tuple[int, str | None]:
        """Serve until ``done.json`` (exit 0 and the chief's status) or the chief is lost (1)."""
        while True:
            d = self.rdv.done()
            if d is not None:
                return 0, d.get("status")
            gone = self._chief_gone()
            if gone:
                log.error("leaving: %s", gone)
                return 1, None
            time.sleep(POLL_SECS)

    def _write_report(self, ti: dict[str, Any], batch_size: int | None, status: str | None) -> None:
        files = ti.get("data_files")
        elements = self.counter[0] * self.plan.bundle  # batches produced (served or buffered)
        report = {**self.me, "files": files,
                  "files_source": "shard_plan" if files is not None else "input_fn",
                  "shuffle_seed": ti.get("shuffle_seed"), "elements": elements,
                  "samples": elements * (batch_size or 0), "batch_size": batch_size,
                  "service_elements": self.counter[0], "bundle": self.plan.bundle,
                  "chief_status": status, "seconds": round(time.monotonic() - self.t0, 3)}
        self.rdv.write_report(self.index, report)
        log.info("produced %d batch(es) (%d samples); chief status %s; leaving", elements,
                 report["samples"], status)
