"""The rendezvous of one job step: files under ``<model_dir>/.csrun/<SLURM_JOB_ID>.<SLURM_STEP_ID>/``
on the shared file system, through which the chief and its input workers find each other,
watch each other's heartbeats and agree that the job is done.

- The chief publishes where each input worker sends or is read from in ``endpoints.json`` (one
  call for every backend: tf.data service dispatchers, a data-plane receiver); input worker ``i``
  registers in ``workers/<i>.json`` once it is ready (its dataset registered with its dispatcher,
  or its stream opened).
- Heartbeats: every task touches ``<name>.alive`` every :data:`HEARTBEAT_SECS`; the chief names
  workers whose heartbeat is older than :data:`STALE_SECS` as stopped; a worker leaves (exit 1)
  when the chief's heartbeat is older than :data:`CHIEF_LOST_SECS`.
- A worker lost with its node under ``--survive-node-loss``: the chief writes
  ``workers/<i>.orphan.json``; one supervisor of the input workers' job claims it
  (``workers/<i>.adopt-<attempt>``) and starts the replacement (:mod:`csrun_runtime.supervise`).
- End: the chief writes ``done.json`` (``{"status": "ok"|"failed"|"stopped", ...}``,
  :mod:`csrun_runtime.lifecycle`); workers write
  ``workers/<i>.report.json`` (files, elements produced) and exit 0.

Two jobs or two steps never share a directory (job and step ids name it). Every directory here
is 0700 and every file 0600 (only the job's user may read or rewrite where a worker connects:
docs/SECURITY.md). Pure Python.
"""
from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from csrun_common.atomic import read_json, write_json

__all__ = ["Rendezvous", "Heartbeat", "HEARTBEAT_SECS", "STALE_SECS", "CHIEF_LOST_SECS", "ENDPOINTS", "private_dir"]

#: seconds between heartbeat touches (and between the chief's looks at them).
HEARTBEAT_SECS = 1.0
#: a worker heartbeat older than this (seconds) marks the worker as stopped. Last touched up to
#: HEARTBEAT_SECS before the loss and looked at every HEARTBEAT_SECS (and within the chief's
#: 0.5 s queue wait), a silent worker is noticed 7 to 9.5 s after it fell silent: inside the
#: 10 s docs/RESILIENCE.md promises for a lost node ("A lost node").
STALE_SECS = 8.0
#: a worker exits 1 when the chief's heartbeat is older than this (seconds).
CHIEF_LOST_SECS = 90.0
#: The status (in its report) of an input worker that left because a later attempt of its
#: index registered.
SUPERSEDED = "superseded"
#: The chief's published endpoints, under the rendezvous directory.
ENDPOINTS = "endpoints.json"


def private_dir(path: Path) -> None:
    """Create ``path`` and its missing parents owner-only (0700), and make ``path`` 0700 if it
    exists already with more (an older csrun's); a directory of another user is left as it is."""
    missing = []
    p = path
    while not p.exists() and p != p.parent:
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        try:
            d.mkdir(mode=0o700)
        except FileExistsError:
            pass
    try:
        if path.stat().st_mode & 0o077:
            path.chmod(0o700)
    except OSError:
        pass


class Rendezvous:
    """Files of one job step under ``<model_dir>/.csrun/<job>.<step>/`` (shared file system).

    Files: ``endpoints.json`` (chief), ``chief.alive``, ``workers/<i>.json`` (registration),
    ``workers/<i>.alive``, ``workers/<i>.report.json``, ``done.json``, ``chief.json`` (the
    chief's summary: batches received per worker).
    """

    def __init__(self, model_dir: str | os.PathLike, key: str):
        self.dir = Path(model_dir) / ".csrun" / key
        self.workers_dir = self.dir / "workers"

    def reset(self) -> None:
        """Chief, at start: move a stale directory of the same key aside, create a fresh one
        (``.csrun/``, the key's directory and ``workers/`` 0700: :func:`private_dir`)."""
        if self.dir.exists():
            stale = self.dir.with_name(f"{self.dir.name}.stale-{int(time.time() * 1000)}")
            try:
                self.dir.rename(stale)
            except OSError:
                shutil.rmtree(self.dir, ignore_errors=True)
        private_dir(self.dir.parent)
        private_dir(self.workers_dir)

    def publish_endpoints(self, addresses: Sequence[str], info: Mapping[str, Any]) -> None:
        """Chief: write :data:`ENDPOINTS`: worker ``i``'s ``host:port`` or ``tcp://host:port`` at ``[i]``, ``info``."""
        self.write(ENDPOINTS, {"endpoints": list(addresses), "created": time.time(), **dict(info)})

    def write(self, name: str, record: Mapping[str, Any]) -> None:
        """Write ``<dir>/<name>`` (e.g. ``chief.json``, ``workers/3.json``) atomically, 0600."""
        write_json(self.dir / name, dict(record), private=True)

    def endpoints(self) -> dict[str, Any] | None:
        """The published endpoints record (:meth:`publish_endpoints`), or ``None`` while absent."""
        return read_json(self.dir / ENDPOINTS)

    def register_worker(self, index: int, info: Mapping[str, Any]) -> None:
        """Worker: write ``workers/<index>.json``."""
        self.write(f"workers/{index}.json", dict(info))

    def worker(self, index: int) -> dict[str, Any] | None:
        """A worker's registration, or ``None``."""
        return read_json(self.workers_dir / f"{index}.json")

    def mark_lost(self, index: int, info: Mapping[str, Any]) -> None:
        """Supervisor of a worker's task (:mod:`csrun_runtime.supervise`): append one death of
        input worker ``index`` to ``workers/<index>.lost.json`` (``{"deaths": [...]}``)."""
        path = self.workers_dir / f"{index}.lost.json"
        prev = read_json(path) or {}
        self.write(f"workers/{index}.lost.json", {"deaths": [*prev.get("deaths", []), dict(info)]})

    def lost(self, index: int) -> list[dict[str, Any]]:
        """The deaths of input worker ``index`` its task's supervisor recorded (oldest first)."""
        rec = read_json(self.workers_dir / f"{index}.lost.json") or {}
        return list(rec.get("deaths", []))

    def order_adoption(self, index: int, info: Mapping[str, Any]) -> None:
        """Chief, ``--survive-node-loss``: write ``workers/<index>.orphan.json`` (``info``: with ``attempt``)."""
        self.write(f"workers/{index}.orphan.json", dict(info))

    def adoption_orders(self) -> dict[int, dict[str, Any]]:
        """Every adoption order present, by worker index."""
        return self._by_index("orphan")

    def claim_adoption(self, index: int, attempt: int, claimant: Mapping[str, Any]) -> bool:
        """Supervisor of a worker task: claim the order for ``index``'s replacement ``attempt``.
        Exactly one claimant wins (``O_CREAT | O_EXCL`` of ``workers/<index>.adopt-<attempt>``,
        atomic on a local file system and on NFSv3+); returns whether this one did."""
        path = self.workers_dir / f"{index}.adopt-{int(attempt)}"
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        except OSError:  # FileExistsError: another claimant won
            return False
        with os.fdopen(fd, "w") as f:
            f.write(repr(dict(claimant)))
        return True

    def write_report(self, index: int, report: Mapping[str, Any]) -> None:
        """Worker: write ``workers/<index>.report.json`` (files read, elements produced)."""
        self.write(f"workers/{index}.report.json", dict(report))

    def reports(self) -> dict[int, dict[str, Any]]:
        """Every worker report present, by worker index."""
        return self._by_index("report")

    def _by_index(self, kind: str) -> dict[int, dict[str, Any]]:
        """Every readable ``workers/<i>.<kind>.json``, by worker index ``i``."""
        out = {}
        for p in sorted(self.workers_dir.glob(f"*.{kind}.json")):
            rec = read_json(p)
            if rec is not None:
                out[int(p.name.split(".")[0])] = rec
        return out

    def touch(self, name: str) -> None:
        """Touch the heartbeat file ``<name>.alive`` (``name`` like ``chief`` or ``workers/3``)."""
        p = self.dir / f"{name}.alive"
        try:
            if not p.parent.is_dir():
                private_dir(p.parent)
            os.close(os.open(p, os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o600))
            os.utime(p, None)
        except OSError:
            pass

    def age(self, name: str) -> float | None:
        """Seconds since ``<name>.alive`` was touched, ``None`` when it does not exist."""
        try:
            return max(0.0, time.time() - (self.dir / f"{name}.alive").stat().st_mtime)
        except OSError:
            return None

    def mark_done(self, status: str, reason: str = "", **extra: Any) -> None:
        """Chief: write ``done.json``; workers leave when they see it."""
        self.write("done.json",
                   {"status": status, "reason": reason, "time": time.time(), **extra})

    def done(self) -> dict[str, Any] | None:
        """``done.json`` or ``None``."""
        return read_json(self.dir / "done.json")


class Heartbeat:
    """Background thread touching ``<name>.alive`` every :data:`HEARTBEAT_SECS` (daemon)."""

    def __init__(self, rdv: Rendezvous, name: str):
        self.rdv, self.name = rdv, name
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"heartbeat-{name}", daemon=True)

    def start(self) -> Heartbeat:
        self.rdv.touch(self.name)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(HEARTBEAT_SECS):
            self.rdv.touch(self.name)

    def stop(self) -> None:
        self._stop.set()
