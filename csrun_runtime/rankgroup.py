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
  directory aside);
* **gathers the ranks' figures** at the end (:meth:`RankGroup.gather` of :func:`rank_record`,
  each with the digest of the rank's final weights, :meth:`RankGroup.digest`): rank 0's
  performance.json gets ``ranks`` and the world's figures (:func:`world_figures`) and its
  verdict the per-rank lines (:func:`rank_lines`): each rank's input wait, the slowest rank
  and its slowest input worker.

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
           "INPUT_ENDED", "stop_code", "decode_stop", "rank_record", "world_figures", "rank_lines", "job_worker"]

log = logging.getLogger("csrun.runtime")

#: :func:`stop_code` of a rank whose input ended (no stop signal).
INPUT_ENDED = 1


class RankLost(RuntimeError):
    """A collective with the other trainer ranks failed or timed out (a rank died, hangs or
    never joined); the message is one line naming this rank and the cause."""


class RankGroup(Protocol):
    """The trainer ranks of a job, as the core's training loop uses them (a framework's
    process group; one object per rank).

    Attributes:
        rank: this rank, ``0 <= rank < world_size``; ``world_size``: the ranks (> 1).
    """

    rank: int
    world_size: int

    def agree(self, code: int, /) -> int:
        """The maximum of every rank's ``code`` (an int >= 0), the same on every rank: a
        collective all ranks call at the same point of the loop. Raises :class:`RankLost`
        when it fails or times out."""
        ...

    def gather(self, obj: Any, /) -> list[Any]:
        """Every rank's ``obj`` (picklable / JSON-able), in rank order, on every rank. Raises
        :class:`RankLost`."""
        ...

    def digest(self) -> str:
        """``sha256:<hex>`` of this rank's model weights as they are now (the unwrapped
        model's; names sorted, each tensor's bytes), so identical weights give identical
        digests."""
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
    """A rank's stop code for :meth:`RankGroup.agree`: ``2 + 2 × signum + requeue`` when a stop
    signal ``signum`` (> 0) arrived (``requeue``: one of ``--requeue``'s), else
    :data:`INPUT_ENDED` when the rank's input ended, else 0 (go on). A signal outranks an
    input end, and of two signals the higher number wins (the same on every rank)."""
    if signum > 0:
        return 2 + 2 * int(signum) + int(bool(requeue))
    return INPUT_ENDED if input_ended else 0


def decode_stop(code: int) -> tuple[bool, int, bool]:
    """``(stop, signum, requeue)`` of an agreed :func:`stop_code` (``signum`` 0: the input ended
    or nothing)."""
    if code >= 2:
        return True, (code - 2) // 2, bool((code - 2) % 2)
    return code == INPUT_ENDED, 0, False


def job_worker(slot: Any, rank: int, world_size: int) -> Any:
    """The job-wide index ``g = slot × world_size + rank`` of a rank's input worker ``slot``
    (:func:`csrun_common.ranks.worker_rank`'s inverse), as a string when ``slot`` was one;
    other keys (``"in-process"``) unchanged."""
    text = str(slot)
    if not text.isdigit():
        return slot
    g = int(text) * world_size + rank
    return str(g) if isinstance(slot, str) else g


def rank_record(rank: int, world_size: int, node: str | None, rec: Mapping[str, Any], digest: str) -> dict[str, Any]:
    """What rank ``rank`` tells rank 0 at the end (pure): from its performance record ``rec``
    (:func:`csrun_runtime.artifacts.performance_record` with its verdict): ``steps``,
    ``samples_per_sec`` (steps × batch_size / total_time, samples/s), ``steady_samples_per_sec``,
    ``input_wait_fraction`` (0..1: the rank's wait for its *own* input; its waits for the other
    ranks in the stop agreement are :class:`LoopRanks`'s ``rank_wait_fraction``),
    ``slowest_input_worker`` (its verdict's, the worker named by its job-wide index) and
    ``weights_sha256`` (``digest``)."""
    v = rec.get("verdict") or {}
    slow = v.get("slowest_input_worker")
    if slow:
        slow = {**slow, "worker": job_worker(slow.get("worker"), rank, world_size)}
    return {"rank": int(rank), "node": node, "steps": rec.get("steps"), "global_step_end": rec.get("global_step_end"),
            "samples_per_sec": rec.get("samples_per_sec"), "steady_samples_per_sec": rec.get("steady_samples_per_sec"),
            "input_wait_fraction": rec.get("input_wait_fraction"), "slowest_input_worker": slow,
            "weights_sha256": digest}


def world_figures(ranks: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """performance.json's keys of the world (pure), from every rank's :func:`rank_record`:
    ``world_size``, ``ranks``, ``world_samples_per_sec`` and ``world_steady_samples_per_sec``
    (sums over the ranks, samples/s; ``None`` when a rank has none), ``slowest_rank`` (the
    rank that waited longest for its own input -- in lockstep every rank trains at the same
    rate, and the others wait for that one in the stop agreement: ``{"rank", "node",
    "input_wait_fraction", "steady_samples_per_sec", "slowest_input_worker"}``) and
    ``weights_identical`` (every rank's digest the same)."""
    def total(key: str) -> float | None:
        values = [r.get(key) for r in ranks]
        return None if None in values else round(sum(float(x or 0.0) for x in values), 2)

    slowest = None
    if ranks:
        slow = max(ranks, key=lambda r: (float(r.get("input_wait_fraction") or 0.0),
                                         -float(r.get("steady_samples_per_sec") or 0.0)))
        slowest = {k: slow.get(k) for k in ("rank", "node", "input_wait_fraction", "steady_samples_per_sec",
                                            "slowest_input_worker")}
    digests = {r.get("weights_sha256") for r in ranks}
    return {"world_size": len(ranks), "ranks": [dict(r) for r in ranks],
            "world_samples_per_sec": total("samples_per_sec"),
            "world_steady_samples_per_sec": total("steady_samples_per_sec"),
            "slowest_rank": slowest, "weights_identical": len(digests) == 1 and None not in digests}


def _worker_text(w: Mapping[str, Any] | None) -> str:
    if not w:
        return "no input worker measured"
    where = f" on {w['node']}" if w.get("node") else ""
    return f"slowest input worker {w.get('worker')}{where} {float(w.get('samples_per_sec') or 0):.1f} samples/s"


def rank_lines(world: Mapping[str, Any]) -> list[str]:
    """The verdict's lines of the ranks (pure), from :func:`world_figures`: the world's rate,
    one line per rank (its input wait, steady rate and slowest input worker), then the
    slowest rank. Each line under 250 characters (srun splits longer ones)."""
    ranks = world.get("ranks") or []
    rate = world.get("world_steady_samples_per_sec")
    out = [f"  ranks: {len(ranks)} trainer ranks, world steady state "
           + (f"{float(rate):.1f} samples/s (the ranks' sum)" if rate is not None else "none")
           + ("; weights identical on every rank" if world.get("weights_identical") else
              "; WEIGHTS DIFFER between ranks")]
    for r in ranks:
        steady = r.get("steady_samples_per_sec")
        out.append(f"  rank {r.get('rank')}" + (f" ({r['node']})" if r.get("node") else "")
                   + f": input wait {100.0 * float(r.get('input_wait_fraction') or 0.0):.1f} %, "
                   + (f"waits for the other ranks {100.0 * float(r['rank_wait_fraction']):.1f} %, "
                      if r.get("rank_wait_fraction") is not None else "")
                   + (f"{float(steady):.1f} samples/s" if steady is not None else "no steady state")
                   + f", {_worker_text(r.get('slowest_input_worker'))}")
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

    def gather(self, rec: Mapping[str, Any]) -> dict[str, Any] | None:
        """At the end of training, on every rank: gather each rank's :func:`rank_record` (this
        one from ``rec``, with the digest of its weights); returns :func:`world_figures` on
        rank 0, ``None`` on the others. Raises :class:`RankLost`."""
        g = self.group
        mine = rank_record(g.rank, g.world_size, self.node, rec, g.digest())
        steady = float(rec.get("steady_time") or 0.0)
        mine["rank_wait_fraction"] = round(min(1.0, self.sync_time / steady), 4) if steady > 0 else 0.0
        records = g.gather(mine)
        return world_figures(records) if self.writes else None
