"""The chief's input side: the training input's contract checks, the input workers'
dispatchers (or data-plane receiver), their rendezvous registrations, the chief's own input
worker (:mod:`csrun_runtime.chief_input`) and the batch source training reads.

:class:`ChiefStreams` gets what it uses (the role, the params, the input function, the
rendezvous), not the chief (:mod:`csrun_runtime.tensorflow.chief` owns one and delegates to it).
TensorFlow is imported inside the functions (see :mod:`csrun_runtime.tensorflow.worker`).
"""
from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from typing import Any

from csrun_common.autoscale import AutoscaleSpec
from csrun_common.roles import Role

from .. import chief_input, workernames
from ..coverage import check_job_files
from ..params import ParamsError
from ..position import InputPositions, say_in_process_restart
from ..rendezvous import Rendezvous
from ..streams import InputStalled, dataplane_options
from . import remote
from .bundling import limit_threads, plan_bundle
from .contract import Refused, check_dataset, check_signature, check_workers
from .deviceprefetch import PrefetchPlan, plan_prefetch
from .pipeline import build_worker_input
from .service import ServiceSource, start_dispatchers
from .sources import BatchSource, LocalSource

__all__ = ["ChiefStreams"]

log = logging.getLogger("csrun.runtime")


class ChiefStreams:
    """Where the chief's training batches come from, and what it learns on the way.

    Args:
        role: the chief's role (host, node, input-worker count, CPUs, rendezvous key).
        params: the resolved params (``runconfig`` among them).
        mode: ``runconfig.mode``.
        input_fn: the user's training input function.

    Attributes set from outside: ``rdv`` (the rendezvous, with input workers), ``plan`` (the
    shard plan, or None), ``autoscale`` (``--autoscale``'s spec, or None). Kept for the
    training loop and performance.json: ``ingest_info`` (``input_bundle``,
    ``workers_registered_secs``, ``chief_input``), ``addresses`` and ``registry`` (every
    dispatcher address and registration, for :mod:`csrun_runtime.autoscale`).
    """

    def __init__(self, role: Role, params: dict[str, Any], mode: str, input_fn: Callable[..., Any]):
        self.role, self.params, self.mode, self.input_fn = role, params, mode, input_fn
        self.rc = params["runconfig"]
        self.num_input_workers = role.num_input_workers
        self.rdv: Rendezvous | None = None
        self.plan: dict[str, Any] | None = None
        self.autoscale: AutoscaleSpec | None = None
        self.ingest_info: dict[str, Any] = {}
        self.addresses: list[str] = []
        self.registry: dict[int, dict[str, Any]] = {}
        self.input_split: chief_input.CpuSplit | None = None
        self.chief_input: chief_input.ChiefInputWorker | None = None
        self._servers: list[Any] = []  # the dispatchers, referenced for the job's life
        self._receiver: Any = None  # runconfig.transport: dataplane (csrun_runtime/tensorflow/remote.py)
        self._all_files: list[str] | None = None  # the training files (rule 7's whole set)
        self._view_root: str | None = None  # shard-plan data_dir views of in-process pipelines
        self._shards = False  # the training pipeline shards by the input-worker count

    def close(self) -> None:
        """Stop the chief's own input worker (it leaves on done.json, after its report) and
        remove the shard-plan views; safe to call when neither was made."""
        if self.chief_input is not None:
            self.chief_input.stop()
        if self._view_root is not None:
            shutil.rmtree(self._view_root, ignore_errors=True)

    # ------------------------------------------------------------------ the chief's input worker
    def place_chief_input(self) -> None:
        """With the chief's input CPUs ``n``, split this task's CPUs
        between training and input worker 0 (:func:`csrun_runtime.chief_input.place`)
        and, when they are disjoint, pin the chief's threads now, before TensorFlow sizes its
        thread pools from them; :meth:`start_chief_input` then starts the worker. No-op
        without the variable. Raises :class:`ParamsError` naming the variable for a bad value."""
        try:
            self.input_split = chief_input.place(self.role, os.environ)
        except ValueError as e:
            raise ParamsError(str(e)) from None
        if self.input_split is not None:
            self.ingest_info["chief_input"] = chief_input.record(self.input_split)

    def start_chief_input(self) -> None:
        """Start input worker 0 in this task (:class:`csrun_runtime.chief_input.ChiefInputWorker`)
        once the dispatchers are published, when :meth:`place_chief_input` placed one."""
        if self.input_split is not None and self.chief_input is None:
            self.chief_input = chief_input.ChiefInputWorker.start(self.role, self.input_split)

    # ------------------------------------------------------------------ the training input
    def check_position(self) -> tuple[int, int]:
        """``(index, of)`` the chief builds its training input as (checks, in-process pipeline): worker 0 of the
        job's ``W`` (:attr:`csrun_common.roles.Role.num_streamers`); with several ranks and no input worker,
        ``rank`` of ``world_size`` (each rank its own shard)."""
        if self.role.world_size > 1 and not self.num_input_workers:
            return self.role.rank, self.role.world_size
        return 0, max(1, self.role.num_streamers)

    def check_train_input(self) -> tuple[Any, Any, int]:
        """Contract checks of the training input (built as input worker 0 would build it,
        :func:`csrun_runtime.tensorflow.pipeline.build_worker_input`); with several input workers also
        rules 6 and 7 (:func:`csrun_runtime.tensorflow.contract.check_workers`). Returns
        ``(ds, spec, batch)``; ``ds`` is what the in-process pipeline trains on. Raises
        :class:`csrun_runtime.tensorflow.contract.Refused` with the violations."""

        problems = [f"train_input: {m}" for m in check_signature(self.input_fn)]
        if problems:
            raise Refused(problems)
        if self.plan is not None and self._view_root is None:
            self._view_root = tempfile.mkdtemp(prefix="csrun-views-")
        try:
            index, num = self.check_position()
            built = build_worker_input(self.input_fn, self.params, index, num,
                                       self.plan, job_key=self.role.rendezvous_key,
                                       view_root=self._view_root)
        except Exception as e:  # noqa: BLE001
            raise Refused([f"train_input: the input function raised {type(e).__name__}: {e}"]) from None
        ds = built.dataset
        rep = check_dataset(ds, "train", batch_size=built.params["train_input"].get("batch_size"))
        if rep.ok and self.num_input_workers > 1:
            rep.extend(check_workers(self.input_fn, self.params, self.plan,
                                     strict=bool(self.rc.get("strict"))))
            cov = rep.info.get("file_coverage") or {}
            log.info("input workers' files (checked as workers 0 and 1 of %s): %s%s",
                     cov.get("num_workers", "?"), cov.get("verdict", "unknown"),
                     f" ({cov['note']})" if cov.get("note") else "")
            self._all_files = rep.info.get("all_files")
            self._shards = bool(built.shards_by_worker_count)
        for w in rep.warnings:
            log.warning("%s", w)
        if not rep.ok:
            raise Refused(rep.violations)
        return ds, ds.element_spec, rep.info["train_input"]["batch_size"]

    def training_source(self, ds: Any, addresses: list[str], start: int = 0) -> BatchSource:
        """The input workers' streams (bundled as each registered, resumed at the positions of checkpoint
        ``start``: :mod:`..position`), else the in-process pipeline bundled by ``runconfig.input_bundle``;
        on a GPU prefetched to the device (:meth:`device_prefetch`); the bundling logged and kept."""
        setting = self.rc.get("input_bundle", "auto")
        prefetch = self.device_prefetch(streamed=bool(addresses))
        if addresses:
            registry = self.wait_workers()
            plans = {i: r.get("bundling") or {"batches_per_element": r.get("bundle", 1)}
                     for i, r in sorted(registry.items())}
            first = plans[min(plans)]
            same = all(p.get("batches_per_element") == first.get("batches_per_element") for p in plans.values())
            log.info("input bundling: %s", first.get("reason", "?") if same else
                     "; ".join(f"worker {i}: {p.get('reason', '?')}" for i, p in plans.items()))
            self.ingest_info["input_bundle"] = {
                "setting": setting, "batch_bytes": first.get("batch_bytes"),
                "batches_per_element": {str(i): p.get("batches_per_element") for i, p in plans.items()},
                "reason": first.get("reason")}
            self.addresses, self.registry = list(addresses), registry
            positions = InputPositions.restore(self.rc["model_dir"], start, self.rc, slots=len(addresses),
                                               rank=self.role.rank, world_size=self.role.world_size)
            streamed = self._remote_source(addresses, registry, positions)
            streamed.start_prefetch(prefetch)
            return streamed
        say_in_process_restart(start)
        plan = plan_bundle(ds.element_spec, setting)
        log.info("input bundling (in-process pipeline): %s", plan.reason)
        self.ingest_info["input_bundle"] = {
            "setting": setting, "batch_bytes": plan.batch_bytes,
            "batches_per_element": {"in-process": plan.bundle}, "reason": plan.reason}
        source = LocalSource(limit_threads(ds, self.role.cpus_per_task), plan, prefetch)
        if source.prefetch_plan is not None and source.prefetch_plan != prefetch:
            log.info("device prefetch: %s", source.prefetch_plan.reason)
            self.ingest_info["device_prefetch"] = source.prefetch_plan.describe()
        return source

    def device_prefetch(self, streamed: bool) -> PrefetchPlan:
        """The device prefetch's decision for this chief
        (:func:`csrun_runtime.tensorflow.deviceprefetch.plan_prefetch`: on when TensorFlow sees a
        GPU, ``runconfig.device_prefetch`` elements ahead; off with several trainer ranks, and
        for ``streamed`` sources under ``--autoscale``), logged (on a GPU) and kept for
        performance.json (``ingest_info["device_prefetch"]``)."""
        plan = plan_prefetch(self.rc, streamed=streamed, ranks=self.role.world_size,
                             autoscale=self.autoscale is not None)
        (log.info if plan.device is not None else log.debug)("device prefetch: %s", plan.reason)
        self.ingest_info["device_prefetch"] = plan.describe()
        return plan

    def _remote_source(self, addresses: list[str], registry: dict[int, dict[str, Any]],
                       positions: InputPositions) -> ServiceSource | remote.DataplaneSource:
        """The input workers' merged streams (tf.data service or the data plane) from ``positions``;
        with ``--autoscale`` the first ``autoscale.initial`` of them."""
        if self.autoscale is not None:
            n = self.autoscale.initial
            log.info("autoscale (%s policy, %g s windows): reading input workers 0..%d of %d slot(s), "
                     "between %d and %d at a time", self.autoscale.policy, self.autoscale.window_s, n - 1,
                     len(addresses), self.autoscale.min_workers, self.autoscale.max_workers)
            if self._receiver is not None:
                return remote.chief_source(self.rendezvous, self._receiver, registry, n, positions)
            return ServiceSource(self.rendezvous, addresses[:n], registry, queue_size=2,  # a short buffer
                                 positions=positions)
        if self._receiver is not None:
            return remote.chief_source(self.rendezvous, self._receiver, registry, positions=positions)
        return ServiceSource(self.rendezvous, addresses, registry, positions=positions)

    # ------------------------------------------------------------------ the input workers
    @property
    def rendezvous(self) -> Rendezvous:
        """The job step's rendezvous; only a chief with input workers has one."""
        if self.rdv is None:
            raise RuntimeError(f"{self.role.describe()} has no rendezvous (no input workers)")
        return self.rdv

    def start_dispatchers(self) -> list[str]:
        """One tf.data service dispatcher per input worker, published in the rendezvous;
        returns their ``host:port`` addresses (dispatcher ``i`` serves worker ``i``). With
        ``runconfig.transport: dataplane``: one data-plane receiver instead, its endpoint
        published for every worker (:func:`csrun_runtime.tensorflow.remote.start_for_chief`)."""
        if self.rc.get("transport") == remote.TRANSPORT:
            self._receiver, addresses = remote.start_for_chief(
                self.rendezvous, self.role.host, self.num_input_workers, {
                    "num_workers": self.num_input_workers, "mode": self.mode,
                    "chief": {"node": self.role.node, "host": self.role.host, "pid": os.getpid()}},
                dataplane_options(self.rc))
            return addresses
        self._servers, ports = start_dispatchers(self.num_input_workers)
        addresses = [f"{self.role.host}:{p}" for p in ports]
        self.rendezvous.publish_endpoints(addresses, {
            "num_workers": self.num_input_workers, "mode": self.mode,
            "chief": {"node": self.role.node, "host": self.role.host, "pid": os.getpid()}})
        log.info("tf.data service: %d dispatcher(s) on %s, one per input worker",
                 len(addresses), self.role.host)
        return addresses

    def wait_workers(self) -> dict[int, dict[str, Any]]:
        """Wait until every input worker registered ``status: ok`` in the rendezvous; returns
        ``{worker index: registration}``; the seconds it waited are kept in
        ``ingest_info["workers_registered_secs"]``. Raises ``Refused`` (a worker's contract
        violations) or :class:`csrun_runtime.tensorflow.service.InputStalled` after
        ``runconfig.worker_start_timeout_secs`` seconds."""

        timeout = float(self.rc["worker_start_timeout_secs"])
        t0 = time.monotonic()
        last_log = t0
        while True:
            regs = {i: self.rendezvous.worker(i) for i in range(self.num_input_workers)}
            failed = {i: r for i, r in regs.items() if r and r.get("status") == "failed"}
            if failed:
                raise Refused([f"{workernames.name(i)} on {r.get('node')}: {v}"
                               for i, r in sorted(failed.items()) for v in r.get("violations", [])])
            ok = {i: r for i, r in regs.items() if r and r.get("status") == "ok"}
            if len(ok) == self.num_input_workers:
                self.ingest_info["workers_registered_secs"] = round(time.monotonic() - t0, 3)
                log.info("all %d input worker(s) registered in %.1f s: %s", self.num_input_workers,
                         time.monotonic() - t0,
                         ", ".join(f"{i} on {r.get('node')}" for i, r in sorted(ok.items())))
                self._check_job_files(ok)
                return ok
            now = time.monotonic()
            if now - t0 > timeout:
                missing = [i for i in range(self.num_input_workers) if i not in ok]
                raise InputStalled(_not_registered(missing, timeout, ok, self.rendezvous))
            if now - last_log > 15:
                log.info("waiting for input workers: %d of %d registered", len(ok),
                         self.num_input_workers)
                last_log = now
            time.sleep(0.25)

    def _check_job_files(self, registrations: dict[int, dict[str, Any]]) -> None:
        """Rule 7 on the job's real input workers: the files each registered as read
        (``pipeline_files``) against the whole set (logged; with ``runconfig.strict`` a
        problem refuses the run)."""
        files = {i: r.get("pipeline_files") for i, r in registrations.items()}
        if self.num_input_workers < 2 or any(f is None for f in files.values()):
            return
        cov = check_job_files({i: list(f or []) for i, f in files.items()}, self.plan, self._all_files,
                              self._shards)
        log.info("the %d input workers read %d distinct training file(s): %s", self.num_input_workers,
                 len(set().union(*map(set, cov.files.values()))), cov.verdict)
        for p in cov.problems:
            log.warning("train_input: %s", p)
        if cov.problems and self.rc.get("strict"):
            raise Refused([f"train_input: {p}" for p in cov.problems])


def _not_registered(missing: list[int], timeout: float, ok: dict[int, dict[str, Any]], rdv: Rendezvous) -> str:
    """The message of :meth:`ChiefStreams.wait_workers`' timeout: the ``missing`` workers,
    their heartbeat ages (s) and those registered (``ok``)."""
    hb = {i: rdv.age(f"workers/{i}") for i in missing}
    return (f"input worker(s) {', '.join(map(str, missing))} did not register within "
            f"{timeout:.0f} s (runconfig.worker_start_timeout_secs); heartbeat ages: "
            + ", ".join(f"{i}: {'none' if a is None else f'{a:.0f} s'}" for i, a in hb.items())
            + "; registered: " + (", ".join(f"{i} on {r.get('node')}" for i, r in sorted(ok.items())) or "none"))
