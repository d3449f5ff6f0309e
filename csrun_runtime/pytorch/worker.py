"""The PyTorch input worker: builds its training DataLoader as streamer ``i`` of ``W`` and
streams its batches (as numpy arrays) to the chief over the data plane until the chief's
``done.json`` (docs/PYTORCH.md).

Life: tell the supervisor where to record a death (:mod:`csrun_runtime.supervise` replaces a
killed worker with ``CSRUN_WORKER_ATTEMPT`` one higher; under ``csrun_wse --survive-node-loss``
a supervisor of another node's task adopts a worker lost with its node: ``CSRUN_WORKER_INDEX``
gives the lost index, read by :func:`csrun_common.roles.resolve_role`, so the same files, seed
and stream, and ``CSRUN_WORKER_ATTEMPT`` the ordered attempt); in modes that stream nothing, wait for
``done.json``; else wait for the chief's ``endpoints.json``, build the DataLoader (contract
checked; a violation is registered as ``status: failed`` in ``workers/<i>.json`` so that the
chief names it and exits 2; so is an exception the user's Dataset, sampler or collate function
raises while it streams, with its type, message and frames: :mod:`csrun_runtime.usererror`), register, and
send pass after pass (``sampler.set_epoch``) in bundles of
about :data:`csrun_runtime.dataplane.BUNDLE_BYTES` and at most :data:`csrun_runtime.bundles.MAX_BUNDLE`
batches (under ``csrun_wse --autoscale`` :data:`csrun_runtime.bundles.AUTOSCALE_MAX_BUNDLE`), as the
TensorFlow workers' bundles. Between sends it looks at ``done.json``, at
the chief's heartbeat and at a later attempt of its index; it leaves with a report
(``workers/<i>.report.json``) and exit 0 when the chief is done.
"""
from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from csrun_common.autoscale import ENV as AUTOSCALE_ENV
from csrun_common.modes import TRAIN_MODES
from csrun_common.roles import Role

from .. import workernames
from ..bundles import AUTOSCALE_MAX_BUNDLE, MAX_BUNDLE
from ..elastic import ATTEMPT_ENV, tell_supervisor
from ..params import ParamsError, Resolved, load_shard_plan
from ..position import report_resumed, start_state, tag, wait_position
from ..rendezvous import CHIEF_LOST_SECS, Heartbeat, Rendezvous
from ..sharding import make_data_dir_view, plan_files
from ..usererror import UserCodeError, guarded
from .contract import (
    ContractError,
    batch_size_of,
    call_data_fn,
    process_params,
    seed_process,
    to_numpy,
    torch_seed,
)
from .resume import epochs_from, stateful
from .streamers import StreamerFacts, set_facts

__all__ = ["InputWorker", "POLL_SECS", "build_loader", "send_batches"]

log = logging.getLogger("csrun.runtime")

#: Seconds between looks at the rendezvous while waiting (and the longest one send may block).
POLL_SECS = 0.5


def build_loader(fn: Callable[..., Any], params: dict[str, Any], rank: int, num_streamers: int, seed_rank: int,
                 data_dir: Any = None, files: list[str] | None = None, *,
                 threads: int | None = None) -> tuple[Any, dict[str, Any], int | None]:
    """Streamer ``rank`` of ``num_streamers``'s training DataLoader as an input worker (and the analyzer's
    probes, :mod:`.input_backend`) builds it: the process's params (:func:`.contract.process_params`,
    ``train_input.num_workers`` as given), the streamer facts (:func:`.streamers.set_facts`), torch, random
    and numpy seeded with :func:`.contract.torch_seed` of ``seed_rank`` (the input worker's index), and
    ``torch.set_num_threads(threads)`` when given. Returns ``(loader, the params the data function
    received, the seed)``. Raises ``ContractError``: the data function raised or returned no DataLoader."""
    p = process_params(params, rank, num_streamers, True, data_dir, files)
    set_facts(StreamerFacts(num_streamers, rank, True))
    seed = torch_seed(params, seed_rank)
    seed_process(seed)
    if threads:
        import torch

        torch.set_num_threads(int(threads))
    return call_data_fn(fn, p, "train_input"), p, seed


class _Leave(Exception):
    def __init__(self, code: int, status: str | None):
        super().__init__(status)
        self.code, self.status = code, status


class InputWorker:
    """One PyTorch input-worker task; :meth:`run` returns its exit code (0: the chief is done;
    1: no chief within ``runconfig.worker_start_timeout_secs`` or its heartbeat older than
    :data:`csrun_runtime.rendezvous.CHIEF_LOST_SECS`). A contract violation or a bad shard plan
    is registered for the chief to name (it exits 2) and the worker leaves with 0."""

    def __init__(self, role: Role, resolved: Resolved, train_data_fn: Callable[..., Any]):
        if role.worker_index is None or role.rendezvous_key is None:
            raise ValueError(f"{role.describe()} is not an input worker of a Slurm job step")
        self.role, self.resolved, self.fn = role, resolved, train_data_fn
        self.index = int(role.worker_index)
        self.rc = resolved.params["runconfig"]
        self.rdv = Rendezvous(self.rc["model_dir"], role.rendezvous_key)
        self.attempt = int(os.environ.get(ATTEMPT_ENV) or 0)
        self.t0 = time.monotonic()
        self.heartbeat = Heartbeat(self.rdv, f"workers/{self.index}")
        self.me: dict[str, Any] = {"index": self.index, "node": role.node, "host": role.host, "pid": os.getpid(),
                                   "attempt": self.attempt, "framework": "pytorch",
                                   "component": role.component,  # "chief-input": in the chief's task
                                   "cpu_affinity": sorted(os.sched_getaffinity(0))}
        self.batches = self.samples = 0
        self.info: dict[str, Any] = {}

    def run(self) -> int:
        tell_supervisor(str(self.rdv.dir), self.index)
        try:
            if self.resolved.mode not in TRAIN_MODES:
                self.heartbeat.start()
                log.info("mode %s streams no training input; waiting for the chief", self.resolved.mode)
                while True:
                    self._check()
                    time.sleep(POLL_SECS)
            endpoint = self._wait_endpoint()
            self.heartbeat.start()
            loader = self._build()
            self._stream(endpoint, loader)
            raise _Leave(0, None)  # not reached: the stream is endless
        except _Leave as e:
            self.heartbeat.stop()
            if e.status != "superseded":
                self.rdv.write_report(self.index, {**self.me, **self.info, "served": self.batches > 0,
                                                   "batches": self.batches, "samples": self.samples,
                                                   "chief_status": e.status,
                                                   "seconds": round(time.monotonic() - self.t0, 3)})
            log.info("sent %d batch(es) (%d samples); chief status %s; leaving", self.batches, self.samples,
                     e.status)
            return e.code

    def _check(self) -> None:
        """Raise :class:`_Leave` when the chief is done or lost, or a later attempt registered."""
        d = self.rdv.done()
        if d is not None:
            raise _Leave(0, d.get("status"))
        age = self.rdv.age("chief")
        if age is not None and age > CHIEF_LOST_SECS:
            log.error("leaving: the chief's heartbeat is %.0f s old", age)
            raise _Leave(1, None)
        if age is None and time.monotonic() - self.t0 > float(self.rc["worker_start_timeout_secs"]):
            log.error("no chief heartbeat in %s after %.0f s", self.rdv.dir,
                      float(self.rc["worker_start_timeout_secs"]))
            raise _Leave(1, None)
        reg = self.rdv.worker(self.index)
        if reg and int(reg.get("attempt") or 0) > self.attempt:
            log.warning("leaving: %s was replaced by attempt %s", workernames.name(self.index), reg.get("attempt"))
            raise _Leave(0, "superseded")

    def _wait_endpoint(self) -> str:
        while True:
            d = self.rdv.endpoints()
            if d is not None:
                return str(d["endpoints"][self.index])
            self._check()
            time.sleep(0.25)

    def _fail(self, violations: list[str]) -> None:
        """Register the violations (``status: failed``: the chief names them and exits 2) and
        leave with 0: a worker's own bad exit would end the job step before the chief could
        say why (srun ``--kill-on-bad-exit``)."""
        self.rdv.register_worker(self.index, {**self.me, "status": "failed", "violations": violations})
        for v in violations:
            log.error("%s", v)
        raise _Leave(0, "failed")

    def _build(self) -> Any:
        """The DataLoader as streamer ``g`` of ``W`` (or 0 of 1 over a shard plan's view): the
        job-wide position (``role.streamer_index`` of ``role.num_streamers``; with several
        trainer ranks not the slot among its rank's workers, docs/MULTI-RANK.md)."""
        g, n = int(self.role.streamer_index or 0), max(1, self.role.num_streamers)
        w, rank, data_dir, files = n, g, None, None
        if self.role.shard_plan:
            try:
                plan = load_shard_plan(self.role.shard_plan, n)
            except ParamsError as e:
                self._fail(e.problems)
            own, others = plan_files(plan, g)
            files = list(plan["workers"][g]["files"])
            ti = self.resolved.params.get("train_input") or {}
            if ti.get("data_dir") is not None:
                view = make_data_dir_view(ti["data_dir"], own, others, self.rdv.dir / "data_views" / str(self.index))
                data_dir = view.data_dir
            w, rank = 1, 0
        threads = self.role.cpus_per_task if self.role.chief_input else None  # the chief's input CPUs N: N threads
        try:
            loader, params, seed = build_loader(self.fn, self.resolved.params, rank, w, g, data_dir, files,
                                                threads=threads)
        except ContractError as e:
            self._fail([str(e)])
        ti = params.get("train_input") or {}
        self.info = {"streaming_rank": rank, "num_streamers": w, "torch_seed": seed,
                     "shuffle_seed": ti.get("shuffle_seed"), "dataloader_workers": loader.num_workers,
                     "batch_size": loader.batch_size, "data_files": files, "data_dir": data_dir}
        self.rdv.register_worker(self.index, {**self.me, **self.info, "status": "ok", "registered": time.time()})
        log.info("streaming the DataLoader to the chief as streamer %d of %d (batch_size %s, DataLoader workers %d, "
                 "shuffle_seed %s, torch seed %s)", rank, w, loader.batch_size, loader.num_workers,
                 ti.get("shuffle_seed"), seed)
        return loader

    def _stream(self, endpoint: str, loader: Any) -> None:
        from ..dataplane import NotAuthenticated, ReceiverGone, Sender

        sender = Sender(endpoint, self.index, self.attempt)
        # --autoscale: AUTOSCALE_MAX_BUNDLE (the chief's buffers hold whole bundles, and its
        # windows must see a paused worker)
        cap = AUTOSCALE_MAX_BUNDLE if os.environ.get(AUTOSCALE_ENV) else MAX_BUNDLE
        stream = None
        try:
            # where its stream resumes: the chief's positions (a restored checkpoint's), or for a
            # replacement what the chief took from its predecessor (csrun_runtime/position.py)
            start = wait_position(self.rdv, self.index, self.attempt, self._check,
                                  float(self.rc["worker_start_timeout_secs"]))
            stream = epochs_from(loader, start, self._resumed, start_state(self.rdv, self.index, self.attempt))
            # what the user's Dataset, sampler or collate function raises: named with its frames
            # (csrun_runtime.usererror.describe), registered for the chief to show once and exit 2
            batches = guarded(stream, "train_input: the DataLoader", passes=lambda e: isinstance(e, ContractError))
            send_batches(sender, batches, cap=cap, check=self._check, sent=self._sent, first=start,
                         state_of=loader.dataset.state_dict if stateful(loader) else None)
        except NotAuthenticated as e:  # a foreign listener: one line, and nothing sent there
            log.error("%s", e)
            raise _Leave(0, "refused the endpoint") from None
        except ReceiverGone:
            self._check()
            raise _Leave(0, "chief closed") from None
        except (ContractError, UserCodeError, TimeoutError) as e:
            self._fail([str(e)])
        finally:
            sender.close(timeout=1.0)
            if stream is not None:  # the DataLoader's worker processes end now, before the report: the
                stream.close()      # chief's exit follows the reports, and srun ends a task still running

    def _resumed(self, info: dict[str, Any]) -> None:
        """Where the stream resumed (:func:`.resume.epochs_from`): told to the chief, logged."""
        report_resumed(self.rdv, self.index, self.attempt, info["batches"], info["seconds"], info["how"],
                       info.get("pass"), info.get("batch_in_pass"))
        self.info["resumed"] = info
        log.info("streaming from batch %d of this worker's stream (pass %s, batch %s): %s in %.3f s",
                 info["batches"], info.get("pass"), info.get("batch_in_pass"), info["how"], info["seconds"])

    def _sent(self, batch: Any) -> None:
        self.batches += 1
        self.samples += batch_size_of(batch) or 0


_END = object()


def send_batches(sender: Any, batches: Iterable[Any], *, cap: int = MAX_BUNDLE,
                 check: Callable[[], None] = lambda: None, sent: Callable[[Any], None] = lambda b: None,
                 first: int | None = None, state_of: Callable[[], Any] | None = None) -> None:
    """Send ``batches`` (nests of tensors/arrays, normally endless: :func:`.chief.epochs`) with ``sender`` (a
    :class:`csrun_runtime.dataplane.Sender`, not closed here), as an input worker streams its DataLoader: each
    batch made numpy (:func:`.contract.to_numpy`), batches of one structure stacked into bundles of about
    :data:`csrun_runtime.dataplane.BUNDLE_BYTES` and at most ``cap`` batches, what is pending sent at least
    every :data:`POLL_SECS` s. A batch that fills a bundle alone is sent as views of its arrays, without a
    copy: it must not be modified after it is yielded (a loader refilling its buffers must yield copies).
    ``check()`` runs every :data:`POLL_SECS` s and after a send timed out (the bundle is then sent again);
    what it raises ends the stream. ``sent(batch)`` is called for each batch taken.

    Under the receiver's batch window (``sender.window_batches``: ``runconfig.input_read_ahead_batches``)
    a batch is taken only while :meth:`~csrun_runtime.dataplane.Sender.room` allows, and a bundle holds at
    most half the window. With ``first`` (the stream index of the first batch) each bundle carries its
    batches' stream indices (:func:`csrun_runtime.position.tag`) and, with ``state_of``, the stream's state
    before its first batch (``state_of()``, called before that batch is taken; not for the first bundle).

    Raises:
        csrun_runtime.dataplane.ReceiverGone: the receiver closed.
        ContractError: a batch is not a nest of tensors/arrays.
    """
    bundler = _Bundler(sender, cap, check, first)
    room = getattr(sender, "room", None)
    it = iter(batches)
    last_check = time.monotonic()
    taken = False
    while True:
        if room is not None:
            bundler.wait_for_room(room)
        if state_of is not None and not bundler.pending and taken:  # (before the first batch a
            bundler.state = state_of()  # resumed stream is not restored yet) its state before the bundle
        batch = next(it, _END)
        taken = True
        if batch is _END:
            break
        bundler.add(batch)
        sent(batch)
        if time.monotonic() - last_check >= POLL_SECS:
            last_check = time.monotonic()
            bundler.flush()
            check()
    bundler.flush()


class _Bundler:
    """:func:`send_batches`' pending bundle: batches of one structure made numpy and stacked
    into one data-plane bundle when it is full (:data:`csrun_runtime.dataplane.BUNDLE_BYTES`,
    ``cap`` batches) or flushed."""

    def __init__(self, sender: Any, cap: int, check: Callable[[], None], first: int | None = None):
        self.sender, self.cap, self.check = sender, cap, check
        self.first = first  # the stream index of the next bundle's first batch (None: untagged)
        self.state: Any = None  # the stream's state before that batch (a stateful dataset's)
        self.pending: list[list[np.ndarray]] = []
        self.key: Any = None
        self.tree: Any = None
        self.nbytes = 0

    def wait_for_room(self, room: Callable[[int, float], bool]) -> None:
        """Wait until the receiver's batch window has room for one more batch (the read-ahead
        bound), sending what is pending meanwhile; bundles then hold at most half the window."""
        while not room(len(self.pending), POLL_SECS):
            if self.pending:
                self.flush()
            else:
                self.check()
        wb = self.sender.window_batches
        if wb:
            self.cap = min(self.cap, max(1, wb // 2))

    def add(self, batch: Any) -> None:
        """Take one batch (a nest of tensors/arrays; :class:`ContractError` otherwise): a batch
        of another structure than the pending ones sends those first; a full bundle is sent."""
        from ..dataplane import BUNDLE_BYTES, flatten

        t, leaves = flatten(to_numpy(batch))
        k = (repr(t), tuple((a.dtype.str, a.shape) for a in leaves))
        if self.pending and k != self.key:
            self.flush()
            self.state = None  # taken before the flushed bundle: not this one's
        self.key, self.tree = k, t
        self.pending.append(leaves)
        self.nbytes += sum(a.nbytes for a in leaves)
        if self.nbytes >= BUNDLE_BYTES or len(self.pending) >= self.cap:
            self.flush()

    def flush(self) -> None:
        """Send the pending batches as one bundle (nothing when none is pending); a send that
        times out runs ``check()`` and sends the same bundle again."""
        from ..dataplane import stack, unflatten

        if not self.pending:
            return
        n = len(self.pending)
        leaves = stack(self.pending)  # one batch: views of it, no copy
        nest = unflatten(self.tree, leaves)
        if self.first is not None:
            nest = tag(nest, self.first, n, self.state)
        while True:  # send_bundle sends nothing when it times out: retry the same bundle
            try:
                self.sender.send_bundle(nest, n, timeout=POLL_SECS)
                break
            except TimeoutError:
                self.check()
        self.pending, self.nbytes, self.state = [], 0, None
        if self.first is not None:
            self.first += n
