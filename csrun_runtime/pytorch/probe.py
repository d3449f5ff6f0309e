"""PyTorch's part of the analyzer's probes (:class:`csrun_runtime.probing.ProbeBackend`, driven
by :mod:`analyzer.probe_worker`): the input backend (:class:`.input_backend.TorchInputBackend`:
the DataLoader at the probe's ``dataloader_workers``), and the ``served`` probe: the chief's
ingest over csrun's data plane (docs/INPUT-ANALYZER.md "PyTorch"; there is no ``ingest`` kind:
no tf.data service hop). One process of a served probe (:func:`plane_role`):

* process 0 is the chief: the PyTorch chief's own :class:`.remote.RemoteSource` (one
  :class:`csrun_runtime.dataplane.Receiver`, on its bulk channel when the user's params say
  ``runconfig.dataplane_bulk``; its endpoint published as ``endpoints.json`` in a
  rendezvous directory under the probe's work directory) hands it one batch at a time, as it
  hands them to the training loop; :class:`PlaneCounter` counts them, so the probe window gives
  the delivered samples/s and the chief's CPU-seconds per sample;
* processes 1..T-1 are input workers: each builds its DataLoader through the input backend
  exactly as a pipeline probe does (:meth:`.input_backend.TorchInputBackend.build`: the
  command's ``dataloader_workers``, ``torch.set_num_threads(C)``, its worker processes pinned to
  the process's CPUs) and streams it with a :class:`csrun_runtime.dataplane.Sender` through the
  input worker's own :func:`.worker.send_batches` (bundles, ``MAX_BUNDLE``) in a thread
  (:class:`PlaneSender`); its process (DataLoader workers included) measures its own CPU, so
  what the workers spend with sending is known apart from the chief's.

torch is imported inside the functions; never TensorFlow. The analyzer's login side reads this
backend's :class:`csrun_runtime.facts.ProbeFacts` from :mod:`.facts`.
"""
from __future__ import annotations

import socket
import threading
import time
from pathlib import Path
from typing import Any

from csrun_common.roles import Role

from ..input_backend import BuiltInput, InputBackend, InputBuildError
from ..probing import InvalidPoint, Stepper
from ..rendezvous import Rendezvous

__all__ = ["prepare", "backend", "role", "file_coverage", "PlaneCounter", "PlaneSender", "plane_role"]

POLL_S = 0.05

def prepare() -> None:
    """Import torch (the probe process's load time counts it); never TensorFlow."""
    import torch  # noqa: F401


def backend(captured: Any) -> InputBackend:
    """The input backend of a captured PyTorch run.py (``input_fn``: ``train_data_fn``, ``params``)."""
    from .input_backend import TorchInputBackend

    return TorchInputBackend(captured.input_fn, captured.params)


def file_coverage(captured: Any) -> dict[str, Any]:
    """Which files streamers 0 and 1 of 2 read, the DataLoader watched while it reads
    (:func:`.coverage.check_dataloader_files`), as a dict."""
    from .coverage import check_dataloader_files

    return check_dataloader_files(captured.input_fn, captured.params).to_dict()


def role(entry: Any, cmd: dict[str, Any], index: int, workdir: Path) -> tuple[Stepper, Any, int]:
    """Process ``index``'s part in a ``served`` probe command (:func:`plane_role`): ``(stepper,
    the same object to close when the probe ends, 2)``. Raises ``ValueError`` for another kind
    (PyTorch has no ``ingest`` probe), :class:`csrun_runtime.probing.InvalidPoint` when the
    DataLoader cannot be built at the command's point."""
    kind = cmd.get("kind", "pipeline")
    if kind != "served":
        raise ValueError(f"probe kind {kind!r}: PyTorch's own kind is served (over csrun's data plane)")
    try:
        plane = plane_role(entry, cmd, index, workdir)
    except InputBuildError as e:
        raise InvalidPoint(str(e)) from None
    return plane, plane, 2


class _Stopped(Exception):
    """The probe ended: the sender thread leaves."""


class PlaneCounter:
    """The chief's side: the :class:`csrun_runtime.probing.Counter` interface over a
    :class:`.remote.RemoteSource` read through the training chief's device feed
    (:class:`.devicefeed.DeviceFeed`: on a machine with CUDA each batch lands in a pinned ring
    and on the GPU, or with ``runconfig.dataplane_bulk`` straight in the pinned blocks the feed
    lends the receiver, so the probe measures the feed into the device; on CPU it passes the
    numpy nests through). ``step`` takes one batch and counts its samples and bytes;
    ``built.info`` names the device (``feed_device``), which the report reads, and whether the
    bulk channel carried the data (``dataplane_bulk``)."""

    def __init__(self, source: Any):
        import torch

        from .devicefeed import DeviceFeed
        from .input_backend import samples_and_bytes

        device = "cuda" if torch.cuda.is_available() else "cpu"
        self.source = DeviceFeed(source, device)
        self.built = BuiltInput(batches=iter(()), measure=samples_and_bytes,
                                info={"feed_device": str(self.source.device),
                                      "dataplane_bulk": source.r.bulk_port is not None})
        self.samples = self.batches = self.bytes = self.restarts = 0

    def step(self) -> None:
        """Take the next batch from the data plane (on the device). Raises ``RuntimeError`` on
        a stop signal and :class:`csrun_runtime.streams.InputStalled` when no batch comes in time."""
        nest, _worker = self.source.next()
        if nest is None:
            raise RuntimeError("a stop signal ended the served probe")
        s, b = self.built.measure(nest)
        self.samples += s
        self.batches += 1
        self.bytes += b

    def close(self) -> None:
        """Close the receiver (the senders' next send fails)."""
        self.source.close()


class PlaneSender:
    """An input worker's side: its DataLoader (``built``) streamed to ``endpoint`` as input
    worker ``worker_index`` in a daemon thread, until :meth:`close`. The
    :class:`csrun_runtime.probing.Counter` interface: ``step`` waits 10 ms (nothing is consumed
    here) and raises what ended the thread early."""

    def __init__(self, built: BuiltInput, endpoint: str, worker_index: int):
        from ..dataplane import Sender

        self.built = built
        self.sender = Sender(endpoint, worker_index, 0)
        self.samples = self.bytes = self.restarts = self.batches = 0
        self.sent = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="probe-sender", daemon=True)
        self._thread.start()

    def _check(self) -> None:
        if self._stop.is_set():
            raise _Stopped()

    def _count(self, batch: Any) -> None:
        self.sent += 1

    def _run(self) -> None:
        from ..dataplane import NotAuthenticated, ReceiverGone
        from .worker import send_batches

        try:
            send_batches(self.sender, self.built.batches, check=self._check, sent=self._count)
        except NotAuthenticated as e:  # reported by step(): the probe's chief is not this session's
            self.error = e
        except (_Stopped, ReceiverGone):
            pass
        except BaseException as e:  # noqa: BLE001 - reported by step()
            self.error = e

    def step(self) -> None:
        """Wait 10 ms; raise ``RuntimeError`` naming the sender's error if it stopped with one."""
        if self.error is not None:
            raise RuntimeError(f"the served probe's input worker stopped sending: {self.error}")
        time.sleep(0.01)
        self.batches += 1

    def close(self) -> None:
        """Stop the thread (within about a send timeout), close the sender and the DataLoader
        (its worker processes joined); the DataLoader is left to the process's exit when the
        thread does not stop within 5 s."""
        self._stop.set()
        self._thread.join(timeout=5.0)
        self.sender.close(timeout=1.0)
        if not self._thread.is_alive():
            self.built.close()


def plane_role(entry: Any, cmd: dict[str, Any], index: int, workdir: Path) -> PlaneCounter | PlaneSender:
    """Process ``index``'s part in the PyTorch ``served`` probe ``cmd`` (``seq``, ``tasks`` T ≥ 2,
    ``cpus_per_task`` C, ``dataloader_workers``, ``prefetch_factor``, ``barrier_timeout_s``,
    ``chief_apart``): the chief (index 0) or input worker ``index - 1`` (module docstring).
    ``entry``: the harness's probed pipeline (its ``backend``). Each returned object has
    ``step()`` and ``close()``.

    Raises:
        ValueError: fewer than two tasks (no input worker to drain).
        TimeoutError: the chief did not publish its endpoint within ``barrier_timeout_s``.
        csrun_runtime.input_backend.InputBuildError: the DataLoader cannot be built at the command's point.
    """
    from .remote import RemoteSource

    T, C = int(cmd["tasks"]), int(cmd["cpus_per_task"])
    if T < 2:
        raise ValueError(f"a served probe needs 2 tasks or more (the chief and an input worker), not {T}")
    timeout = float(cmd.get("barrier_timeout_s", 30.0))
    rdv = Rendezvous(workdir / "plane", f"probe{int(cmd['seq'])}")
    if index == 0:
        host = socket.gethostname() if cmd.get("chief_apart") else "localhost"
        rdv.reset()
        chief = Role(kind="chief", worker_index=None, num_input_workers=T - 1, node=socket.gethostname(), host=host)
        # the user's runconfig.dataplane_bulk: the probe's chief receives as the training chief would
        user_rc = (getattr(entry, "params", None) or {}).get("runconfig") or {}
        # no shared-memory ring: the probe measures the TCP path of input workers on other nodes
        rc = {"input_timeout_secs": max(timeout, 60.0), "worker_start_timeout_secs": max(timeout, 60.0),
              "dataplane_bulk": bool(user_rc.get("dataplane_bulk", False)), "dataplane_shm_bytes": 0}
        return PlaneCounter(RemoteSource(rdv, chief, rc, adopt=False))
    deadline = time.monotonic() + timeout
    while (rec := rdv.endpoints()) is None:
        if time.monotonic() > deadline:
            raise TimeoutError("the served probe's chief did not publish its data-plane endpoint")
        time.sleep(POLL_S)
    built = entry.backend.build(0, 1, C, dataloader_workers=cmd.get("dataloader_workers"),
                                prefetch_factor=cmd.get("prefetch_factor"))
    return PlaneSender(built, str(rec["endpoints"][index - 1]), index - 1)
