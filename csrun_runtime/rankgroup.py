"""Several trainer ranks in the core's training loop: the stop agreement and the per-rank figures.

Framework-neutral (imports neither TensorFlow nor PyTorch). A job of several trainer ranks
(``CSRUN_WORLD_SIZE > 1``, docs/MULTI-RANK.md) trains the same number of steps on every rank,
in lockstep; :class:`csrun_runtime.loop.TrainingDriver` takes the framework's
:class:`RankGroup` (``LoopSetup.ranks``) and then:

* **agrees on every stop**: before each chunk is trained, every rank gives its stop code
  (:func:`stop_code`: 0 go on, :data:`INPUT_ENDED`, or a stop signal's) to
  :meth:`RankGroup.agree` (an all-reduce of the maximum over the ranks), so a stop signal
  (``--requeue``'s, SIGTERM) or an input end seen by one rank stops all ranks before the same
  step; a rank that did not receive the signal takes it as its own
  (:func:`csrun_runtime.preemption.adopt_stop`), so every rank's exit status and
  ``stopped_by`` are the same;
* **writes once**: only rank 0 writes checkpoints, events, performance.json, the allocation
  record and evaluates; the others write nothing into the model_dir (their rendezvous
  directory aside); before each of rank 0's saves every rank makes the per-replica statistics
  the same (:meth:`LoopRanks.before_save`, :meth:`RankGroup.sync_statistics`);
* **gathers the ranks' figures** at the end (:meth:`RankGroup.gather` of :func:`rank_record`,
  each with the digests of the rank's final trainable weights and statistics,
  :meth:`RankGroup.digest`, and its input workers by job-wide index): rank 0's
  performance.json gets ``ranks``, the world's figures and every rank's input workers
  (:func:`world_figures`), its verdict the per-rank lines (:func:`rank_lines`).

A framework implements :class:`RankGroup` (PyTorch: :class:`csrun_runtime.pytorch.ranks.TorchRanks`
over ``torch.distributed``); its collectives must time out (a rank that died or hangs must not
block the others forever) and raise :class:`RankLost` then.
"""
from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from csrun_common import exits

__all__ = ["RankGroup", "RankLost", "LoopRanks", "leave", "weights_digest", "STOP_CODES", "EXIT_GRACE_SECS",
           "INPUT_ENDED", "stop_code", "decode_stop", "rank_record", "world_figures", "rank_lines", "RANK_WORKER_KEYS"]

log = logging.getLogger("csrun.runtime")

#: :func:`stop_code` of a rank whose input ended (no stop signal).
INPUT_ENDED = 1


class RankLost(RuntimeError):
    """A collective with the other trainer ranks failed or timed out (a rank died, hangs or
    never joined); the message is one line naming this rank and the cause."""


class RankGroup(Protocol):
    """The trainer ranks of a job, as the core's training loop uses them (a framework's
    process group; one object per rank). ``agree``, ``gather`` and ``sync_statistics`` are
    collectives every rank calls at the same point of the loop (``sync_statistics`` before rank 0
    saves a checkpoint); each raises :class:`RankLost` when it fails or times out. Weights and
    statistics are docs/MULTI-RANK.md's ("Weights and statistics").

    Attributes:
        rank: this rank, ``0 <= rank < world_size``; ``world_size``: the ranks (> 1).
    """

    rank: int
    world_size: int

    def agree(self, code: int, /) -> int:
        """The maximum of every rank's ``code`` (an int >= 0), the same on every rank."""
        ...

    def gather(self, obj: Any, /) -> list[Any]:
        """Every rank's ``obj`` (picklable / JSON-able), in rank order, on every rank."""
        ...

    def digest(self) -> tuple[str, str]:
        """``(weights, statistics)`` of this rank's model now, each ``sha256:<hex>`` (:func:`weights_digest`)."""
        ...

    def sync_statistics(self) -> list[str]:
        """Make the statistics the same on every rank, as the framework would save them; returns the names changed."""
        ...

    @property
    def statistics_kept(self) -> str:
        """What the checkpoint holds of the statistics, in the verdict's words."""
        ...

    def close(self) -> None:
        """Release the group (leave the process group); errors are only logged."""
        ...


def weights_digest(weights: Iterable[tuple[str, str, tuple[int, ...], bytes]]) -> str:
    """``sha256:<hex>`` of a model's weights, each ``(name, dtype, shape, bytes)`` (a backend's
    :meth:`RankGroup.digest` gives its tensors' host bytes), names sorted: identical weights
    give identical digests on every rank, in either framework's framing."""
    h = hashlib.sha256()
    for name, dtype, shape, data in sorted(weights, key=lambda w: w[0]):
        h.update(f"{name}|{dtype}|{tuple(shape)}|".encode())
        h.update(data)
    return "sha256:" + h.hexdigest()


#: Exit statuses of a stop (``--requeue``'s 75, SIGINT's 130, SIGTERM's 143).
STOP_CODES = (exits.REQUEUE, 130, 143)
#: Seconds rank 0 waits after the last agreement before it exits with a stop's status, so that
#: the other ranks (status 0) have left and srun reports rank 0's.
EXIT_GRACE_SECS = 1.0


def leave(group: RankGroup | None, code: int, together: bool) -> int:
    """A chief's exit with several trainer ranks: when every rank ended its mode
    (``together``), one last agreement, so that no rank exits before rank 0 has written
    everything (srun ``--kill-on-bad-exit`` would end it); then :meth:`RankGroup.close`. A
    stop's exit status (:data:`STOP_CODES`) is rank 0's, which leaves :data:`EXIT_GRACE_SECS`
    after the others: theirs is 0, so srun's status is rank 0's. Returns the exit code
    (``code`` unchanged with one rank, ``group`` None); a failed last agreement is logged and
    gives 1 when ``code`` was 0."""
    if group is None:
        return code
    if together:
        try:
            group.agree(0)
        except RankLost as e:
            log.error("%s", e)
            together, code = False, code or 1
    group.close()
    if group.rank != 0 and code in STOP_CODES and together:
        log.info("trainer rank %d stopped with the other ranks; rank 0 exits with status %d", group.rank, code)
        return 0
    if group.rank == 0 and code in STOP_CODES and together:
        time.sleep(EXIT_GRACE_SECS)
    return code


def stop_code(input_ended: bool, signum: int, requeue: bool) -> int:
    """A rank's stop code for :meth:`RankGroup.agree`: ``2 + 2 × signum + requeue`` after stop signal ``signum``
    (> 0; ``requeue``: one of ``--requeue``'s), else :data:`INPUT_ENDED` when its input ended, else 0 (go on)."""
    if signum > 0:
        return 2 + 2 * int(signum) + int(bool(requeue))
    return INPUT_ENDED if input_ended else 0


def decode_stop(code: int) -> tuple[bool, int, bool]:
    """``(stop, signum, requeue)`` of an agreed :func:`stop_code` (``signum`` 0: the input ended
    or nothing)."""
    if code >= 2:
        return True, (code - 2) // 2, bool((code - 2) % 2)
    return code == INPUT_ENDED, 0, False


#: performance.json's keys of a rank's input workers (job-wide indices: :func:`csrun_runtime.workernames.renumber`)
#: that each rank's record carries and :func:`world_figures` joins over the ranks.
RANK_WORKER_KEYS = ("num_workers", "batches_per_worker", "worker_nodes", "worker_samples_per_sec", "workers_lost",
                    "workers_replaced", "workers_given_up", "workers_paused")


def rank_record(rank: int, node: str | None, rec: Mapping[str, Any], digests: tuple[str, str],
                synced: Sequence[str] = ()) -> dict[str, Any]:
    """What rank ``rank`` tells rank 0 at the end (pure): from its performance record ``rec``
    (:func:`csrun_runtime.artifacts.performance_record` with its verdict, its workers numbered
    job-wide): ``steps``, ``samples_per_sec`` (steps × batch_size / total_time, samples/s),
    ``steady_samples_per_sec``, ``input_wait_fraction`` (0..1: the rank's wait for its *own*
    input), ``slowest_input_worker``, its input workers (:data:`RANK_WORKER_KEYS`),
    ``weights_sha256`` and ``statistics_sha256`` (``digests``) and ``statistics_synchronized``
    (``synced``: the statistics whose values this rank's :meth:`RankGroup.sync_statistics` changed)."""
    v = rec.get("verdict") or {}
    return {"rank": int(rank), "node": node, "steps": rec.get("steps"), "global_step_end": rec.get("global_step_end"),
            "samples_per_sec": rec.get("samples_per_sec"), "steady_samples_per_sec": rec.get("steady_samples_per_sec"),
            "input_wait_fraction": rec.get("input_wait_fraction"),
            "slowest_input_worker": v.get("slowest_input_worker"),
            **{k: rec[k] for k in RANK_WORKER_KEYS if k in rec},
            "weights_sha256": digests[0], "statistics_sha256": digests[1],
            "statistics_synchronized": sorted(set(synced))}


def _by_index(item: tuple[Any, Any]) -> tuple[bool, int]:
    text = str(item[0])
    return not text.isdigit(), int(text) if text.isdigit() else 0


def _joined_workers(ranks: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The job's input workers from every rank's record: the mappings merged (job-wide keys are
    disjoint), the lists concatenated, ``num_workers`` summed."""
    out: dict[str, Any] = {}
    for key in RANK_WORKER_KEYS:
        values = [r[key] for r in ranks if key in r]
        if not values:
            continue
        if key == "num_workers":
            out[key] = sum(int(x or 0) for x in values)
        elif all(isinstance(x, Mapping) for x in values):
            out[key] = dict(sorted(((k, x) for m in values for k, x in m.items()), key=_by_index))
        elif all(isinstance(x, list) for x in values):
            out[key] = [e for x in values for e in x]
    return out


def world_figures(ranks: Sequence[Mapping[str, Any]], statistics_kept: str = "") -> dict[str, Any]:
    """performance.json's keys of the world (pure), from every rank's :func:`rank_record`:
    ``world_size``, ``ranks``, ``world_samples_per_sec`` and ``world_steady_samples_per_sec``
    (sums over the ranks, samples/s; ``None`` when a rank has none), ``slowest_rank`` (the
    rank that waited longest for its own input: ``{"rank", "node", "input_wait_fraction",
    "steady_samples_per_sec", "slowest_input_worker"}``), ``weights_identical`` (every rank's
    trainable weights the same), ``statistics_identical`` (the statistics, at the end),
    ``statistics_synchronized`` (the statistics any rank's values differed in before a save),
    ``statistics_kept`` and the job's input workers (:data:`RANK_WORKER_KEYS`, every rank's)."""
    def total(key: str) -> float | None:
        values = [r.get(key) for r in ranks]
        return None if None in values else round(sum(float(x or 0.0) for x in values), 2)

    def same(key: str) -> bool:
        values = {r.get(key) for r in ranks}
        return len(values) == 1 and None not in values

    slowest = None
    if ranks:
        slow = max(ranks, key=lambda r: (float(r.get("input_wait_fraction") or 0.0),
                                         -float(r.get("steady_samples_per_sec") or 0.0)))
        slowest = {k: slow.get(k) for k in ("rank", "node", "input_wait_fraction", "steady_samples_per_sec",
                                            "slowest_input_worker")}
    synced = sorted({n for r in ranks for n in r.get("statistics_synchronized") or []})
    return {"world_size": len(ranks), "ranks": [dict(r) for r in ranks],
            "world_samples_per_sec": total("samples_per_sec"),
            "world_steady_samples_per_sec": total("steady_samples_per_sec"),
            "slowest_rank": slowest, "weights_identical": same("weights_sha256"),
            "statistics_identical": same("statistics_sha256"), "statistics_synchronized": synced,
            "statistics_kept": statistics_kept, **_joined_workers(ranks)}


def _worker_text(w: Mapping[str, Any] | None) -> str:
    if not w:
        return "no input worker measured"
    where = f" on {w['node']}" if w.get("node") else ""
    return f"slowest input worker {w.get('worker')}{where} {float(w.get('samples_per_sec') or 0):.1f} samples/s"


def _lost_text(r: Mapping[str, Any]) -> str:
    """``; input workers lost 5 (replaced), paused 3`` of a rank's record (job-wide indices)."""
    replaced = {e.get("index") for e in r.get("workers_replaced") or []}
    lost = [f"{e.get('index')}" + (" (replaced)" if e.get("index") in replaced else "")
            for e in r.get("workers_lost") or []]
    parts = ([f"lost {', '.join(lost[:6])}"] if lost else []) + (
        [f"paused {', '.join(map(str, (r.get('workers_paused') or [])[:6]))}"] if r.get("workers_paused") else [])
    return f"; input workers {', '.join(parts)}" if parts else ""


def _statistics_lines(world: Mapping[str, Any]) -> list[str]:
    """The verdict's line on the per-replica statistics (none when they never differed)."""
    synced, kept = world.get("statistics_synchronized") or [], world.get("statistics_kept") or "rank 0's"
    names = ", ".join(synced[:4]) + (f" and {len(synced) - 4} more" if len(synced) > 4 else "")
    if not world.get("statistics_identical", True):
        return [f"  statistics (buffers, moving averages) differ between ranks at the end, as per-replica "
                f"statistics may: the checkpoint holds {kept}"]
    if synced:
        return [f"  statistics: {len(synced)} per-replica statistic(s) differed between ranks (each rank's own "
                f"batches: {names}), not an error; the checkpoint holds {kept}"]
    return []


def rank_lines(world: Mapping[str, Any]) -> list[str]:
    """The verdict's lines of the ranks (pure), from :func:`world_figures`: the world's rate and
    whether the trainable weights are identical, the statistics' line, one line per rank (its
    input wait, steady rate, slowest input worker, lost and paused workers), then the slowest
    rank. Each line under 250 characters (srun splits longer ones)."""
    ranks = world.get("ranks") or []
    rate = world.get("world_steady_samples_per_sec")
    out = [f"  ranks: {len(ranks)} trainer ranks, world steady state "
           + (f"{float(rate):.1f} samples/s (the ranks' sum)" if rate is not None else "none")
           + ("; trainable weights identical on every rank" if world.get("weights_identical") else
              "; TRAINABLE WEIGHTS DIFFER between ranks"), *_statistics_lines(world)]
    for r in ranks:
        steady = r.get("steady_samples_per_sec")
        out.append((f"  rank {r.get('rank')}" + (f" ({r['node']})" if r.get("node") else "")
                    + f": input wait {100.0 * float(r.get('input_wait_fraction') or 0.0):.1f} %, "
                    + (f"waits for the other ranks {100.0 * float(r['rank_wait_fraction']):.1f} %, "
                       if r.get("rank_wait_fraction") is not None else "")
                    + (f"{float(steady):.1f} samples/s" if steady is not None else "no steady state")
                    + f", {_worker_text(r.get('slowest_input_worker'))}{_lost_text(r)}")[:249])
    slow = world.get("slowest_rank")
    if slow and len(ranks) > 1:
        out.append(f"  slowest rank: {slow.get('rank')}" + (f" ({slow['node']})" if slow.get("node") else "")
                   + f", input wait {100.0 * float(slow.get('input_wait_fraction') or 0.0):.1f} %, "
                   + _worker_text(slow.get("slowest_input_worker")))
    return out


class LoopRanks:
    """The training loop's side of a :class:`RankGroup` (:class:`csrun_runtime.loop.TrainingDriver`
    holds one with several ranks): the stop agreement before each chunk and the ranks' figures
    at the end.

    Args:
        group: the framework's :class:`RankGroup`; ``node``: this rank's node (for its record).
    """

    def __init__(self, group: RankGroup, node: str | None = None):
        self.group, self.node = group, node
        self.agreements = 0  # agree() calls made (one per chunk)
        self.last_sync = 0.0  # seconds the last agreement took (waiting for the other ranks)
        self.sync_time = 0.0  # seconds of every agreement after the first (the steady state's)
        self.synced: set[str] = set()  # statistics whose values a sync_statistics() changed here

    @property
    def writes(self) -> bool:
        """True on rank 0, the rank that writes the job's artifacts."""
        return self.group.rank == 0

    def go_on(self, input_ended: bool) -> bool:
        """Agree with the other ranks whether to train the next chunk (every rank calls it once
        per chunk, after taking its chunk or seeing its input end or a stop signal): False when
        any rank stops; a stop signal of another rank is then adopted
        (:func:`csrun_runtime.preemption.adopt_stop`). Raises :class:`RankLost`."""
        from . import preemption

        code = stop_code(input_ended, preemption.stop_signum(), preemption.requeue_requested())
        t0 = time.monotonic()
        agreed = self.group.agree(code)
        self.last_sync = time.monotonic() - t0
        self.sync_time += self.last_sync if self.agreements else 0.0
        self.agreements += 1
        stop, signum, requeue = decode_stop(agreed)
        if signum and not preemption.stop_requested():
            preemption.adopt_stop(signum, requeue)
        return not stop

    def before_save(self) -> None:
        """Every rank, where rank 0 saves a checkpoint: :meth:`RankGroup.sync_statistics`,
        the statistics it changed remembered for the record. Raises :class:`RankLost`."""
        changed = self.group.sync_statistics()
        if changed:
            log.info("statistics that differed from the checkpoint's on this rank (per-replica): %s",
                     ", ".join(changed[:8]) + (f" and {len(changed) - 8} more" if len(changed) > 8 else ""))
        self.synced.update(changed)

    def rank_wait_fraction(self, steady_time: float) -> float:
        """The share (0..1) of ``steady_time`` (s) this rank waited in the stop agreements after the first."""
        return round(min(1.0, self.sync_time / steady_time), 4) if steady_time > 0 else 0.0

    def gather(self, rec: Mapping[str, Any]) -> dict[str, Any] | None:
        """At the end of training, on every rank: gather each rank's :func:`rank_record` (this
        one from ``rec``, with the digests of its weights and statistics); returns
        :func:`world_figures` on rank 0, ``None`` on the others. Raises :class:`RankLost`."""
        g = self.group
        mine = rank_record(g.rank, self.node, rec, g.digest(), sorted(self.synced))
        mine["rank_wait_fraction"] = self.rank_wait_fraction(float(rec.get("steady_time") or 0.0))
        records = g.gather(mine)
        return world_figures(records, g.statistics_kept) if self.writes else None
