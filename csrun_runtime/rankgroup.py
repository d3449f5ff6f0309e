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

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

__all__ = ["RankGroup", "RankLost", "LoopRanks", "INPUT_ENDED", "stop_code", "decode_stop", "rank_record",
           "world_figures", "rank_lines", "job_worker"]

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
    ``input_wait_fraction`` (0..1), ``slowest_input_worker`` (its verdict's, the worker named by
    its job-wide index) and ``weights_sha256`` (``digest``)."""
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
    rank of the lowest steady rate, else the highest input wait: ``{"rank", "node",
    "input_wait_fraction", "steady_samples_per_sec", "slowest_input_worker"}``) and
    ``weights_identical`` (every rank's digest the same)."""
    def total(key: str) -> float | None:
        values = [r.get(key) for r in ranks]
        return None if None in values else round(sum(float(x or 0.0) for x in values), 2)

    slowest = None
    if ranks:
        slow = min(ranks, key=lambda r: (float(r.get("steady_samples_per_sec") or 0.0),
                                         -float(r.get("input_wait_fraction") or 0.0)))
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
        self.agreements = 0  # agree() calls made (one per chunk, and one at the end)

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
        agreed = self.group.agree(code)
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
        records = g.gather(rank_record(g.rank, g.world_size, self.node, rec, g.digest()))
        return world_figures(records) if self.writes else None
