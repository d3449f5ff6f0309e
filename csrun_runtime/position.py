"""The position of every input stream, kept across faults (docs/RESILIENCE.md "The input
position"; issue 41): exactly-once input through requeues, lost workers and restarts.

A *stream* is input worker ``g``'s sequence of batches (its job-wide index, its files and seeds:
the same sequence from any process that serves it). Its *position* is the number of its batches
the model has trained since the stream began (passes included: a DataLoader's pass is
``position // len(loader)``). What the chief keeps, per slot of this chief (slot ``s`` of trainer
rank ``r`` is stream ``s × world_size + r``: :func:`csrun_runtime.workernames.job_worker`):

- ``base``: the position restored at the start of this allocation (the checkpoint's);
- ``next``: the stream index of the next batch the merge hands to training: every bundle an
  input worker sends carries the stream index of each of its batches (:func:`tag`), and the
  merge hands out only the next one (:meth:`InputPositions.accept`: a duplicate is dropped, a
  gap is counted and said); a replacement starts at ``next`` (:meth:`InputPositions.answer`);
- ``trained``: batches trained this allocation (the training loop's count):
  ``base + trained`` is what a checkpoint commits (:func:`write_sidecar`, beside the model's
  checkpoint, written before it). Batches received but not trained are not counted, so after a
  restore they are produced again.

Files: ``<model_dir>/model-ckpt-<step>.input.json`` (the committed positions of checkpoint
``step``, by job-wide stream index); in the rendezvous ``positions.json`` (the chief's starting
position of each slot, written before any batch is read), ``workers/<i>.resume.json`` (a
replacement's starting position, ``{"attempt", "batches"}``) and ``workers/<i>.resumed.json``
(what the worker did to get there: the chief logs it). Pure Python and numpy.
"""
from __future__ import annotations

import json
import logging
import re
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from csrun_common.atomic import read_json, write_json

from .workernames import job_worker

if TYPE_CHECKING:
    from .rendezvous import Rendezvous

__all__ = ["TAG", "STATE", "FORMAT", "POSITIONS_FILE", "RESUME_FILE", "RESUMED_FILE", "InputPositions",
           "sidecar_path", "write_sidecar", "read_sidecar", "prune_sidecars", "tag", "untag", "untag_bundle",
           "state_of", "wait_position", "start_state", "report_resumed", "where_text", "commit", "checkpoint",
           "IN_PROCESS_RESTART", "say_in_process_restart"]

log = logging.getLogger("csrun.runtime")

#: The key of a bundle's stream indices in the nest an input worker sends (``int64[n]``).
TAG = "csrun.stream_index"
#: The key of the state its stream had before the bundle's first batch (a dataset's
#: ``state_dict()`` as JSON bytes, ``uint8[n, length]``, the same in every row), when it has one.
STATE = "csrun.stream_state"
#: ``format`` of a checkpoint's input-position file.
FORMAT = "csrun.input_positions/1"
#: The chief's starting positions in the rendezvous (``{"streams": {slot: batches}, ...}``).
POSITIONS_FILE = "positions.json"
#: A replacement's starting position, under the rendezvous' ``workers/``.
RESUME_FILE = "{index}.resume.json"
#: What a worker did to reach its position, under ``workers/``.
RESUMED_FILE = "{index}.resumed.json"
_SIDECAR = re.compile(r"^model-ckpt-(\d+)\.input\.json$")
_CHECKPOINT = re.compile(r"^model-ckpt-(\d+)\.(pt|index)$")


# --------------------------------------------------------------------------- checkpoint files
def sidecar_path(model_dir: str | Path, step: int) -> Path:
    """``<model_dir>/model-ckpt-<step>.input.json``."""
    return Path(model_dir) / f"model-ckpt-{int(step)}.input.json"


def write_sidecar(model_dir: str | Path, step: int, streams: Mapping[Any, int], num_streams: int,
                  states: Mapping[Any, Any] | None = None) -> Path:
    """Commit the positions ``streams`` (job-wide stream index -> batches trained) of checkpoint
    ``step`` for a job of ``num_streams`` streams, and the ``states`` known at or before them (a
    stateful dataset's: ``{"at": index, "state": ...}`` by stream); call it before the model's
    checkpoint is written, so that a checkpoint on disk always has its positions. Atomic;
    returns the path."""
    path = sidecar_path(model_dir, step)
    write_json(path, {"format": FORMAT, "global_step": int(step), "num_streams": int(num_streams),
                      "streams": {str(k): int(v) for k, v in sorted(streams.items(), key=lambda kv: str(kv[0]))},
                      "states": {str(k): v for k, v in (states or {}).items()}, "time": round(time.time(), 3)})
    return path


def read_sidecar(model_dir: str | Path, step: int) -> dict[str, Any] | None:
    """The positions committed with checkpoint ``step`` (:func:`write_sidecar`'s record), or
    None when there are none (a checkpoint of an earlier csrun, or none at all)."""
    rec = read_json(sidecar_path(model_dir, step))
    return rec if isinstance(rec, dict) and rec.get("format") == FORMAT else None


def prune_sidecars(model_dir: str | Path) -> None:
    """Delete the position files whose checkpoint is gone (``model-ckpt-<N>.pt`` or ``.index``
    removed by ``keep_checkpoint_max``); ones newer than every checkpoint stay (being written)."""
    d = Path(model_dir)
    if not d.is_dir():
        return
    names = [p.name for p in d.iterdir()]
    kept = {int(m.group(1)) for n in names if (m := _CHECKPOINT.match(n))}
    newest = max(kept, default=-1)
    for n in names:
        m = _SIDECAR.match(n)
        if m and int(m.group(1)) not in kept and int(m.group(1)) < newest:
            (d / n).unlink(missing_ok=True)


# --------------------------------------------------------------------------- the tag
def tag(nest: Any, first: int, n: int, state: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The nest an input worker sends for a bundle of ``n`` batches whose first is batch
    ``first`` of its stream: ``{TAG: int64[n], "batch": nest}``, and ``STATE`` when the stream
    has a ``state`` (JSON-able: its dataset's ``state_dict()`` before that batch)."""
    out = {TAG: np.arange(first, first + n, dtype=np.int64), "batch": nest}
    if state is not None:
        row = np.frombuffer(json.dumps(state, separators=(",", ":")).encode(), dtype=np.uint8)
        out[STATE] = np.ascontiguousarray(np.broadcast_to(row, (n, row.size)))
    return out


def untag(nest: Any) -> tuple[int | None, Any]:
    """``(stream index of the first batch, the batches)`` of a received nest; ``(None, nest)``
    for one without :data:`TAG`."""
    if isinstance(nest, dict) and TAG in nest and "batch" in nest and set(nest) <= {TAG, "batch", STATE}:
        idx = np.asarray(nest[TAG]).reshape(-1)
        return (int(idx[0]) if idx.size else None), nest["batch"]
    return None, nest


def state_of(nest: Any) -> Any:
    """The stream state a received nest carries (:func:`tag`'s ``state``), or None."""
    if isinstance(nest, dict) and STATE in nest and TAG in nest:
        rows = np.asarray(nest[STATE])
        return json.loads(rows.reshape(rows.shape[0], -1)[0].tobytes()) if rows.size else None
    return None


def untag_bundle(b: Any, drop: int = 0) -> Any:
    """A received :class:`csrun_runtime.dataplane.Bundle` without its :data:`TAG` and without its
    first ``drop`` batches (views, no copy); ``b`` itself when it has no tag and ``drop`` is 0."""
    first, inner = untag(b.nest)
    if first is None and not drop:
        return b
    from .dataplane import flatten, unflatten

    tree, leaves = flatten(inner)
    if drop:
        leaves = [a[drop:] for a in leaves]
        inner = unflatten(tree, leaves)
    return replace(b, n=b.n - drop, nest=inner, nbytes=sum(a.nbytes for a in leaves), _tree=tree,
                   _leaves=list(leaves))


# --------------------------------------------------------------------------- the chief's record
@dataclass
class _Stream:
    base: int = 0         # position restored at this allocation's start
    next: int = 0         # stream index of the next batch to hand out
    trained: int = 0      # batches trained this allocation
    duplicates: int = 0   # batches dropped: already handed out
    skipped: int = 0      # batches that never came (a gap)
    # the stream's states (a stateful dataset's) before some of its batches: (index, state)
    states: deque[tuple[int, Any]] = field(default_factory=lambda: deque(maxlen=256))

    def state_at(self, n: int) -> dict[str, Any] | None:
        """The last state known at or before stream index ``n``: ``{"at": index, "state": ...}``."""
        best = max((s for s in self.states if s[0] <= n), key=lambda s: s[0], default=None)
        return None if best is None else {"at": best[0], "state": best[1]}


@dataclass
class InputPositions:
    """Every slot's position on this chief (see the module docstring).

    Args:
        slots: this chief's input-worker slots (``0 .. slots-1``).
        base: the restored position of each slot (missing: 0).
        rank, world_size: this trainer rank and the ranks (slot -> stream :func:`stream_of`).
        num_streams: the job's streams ``W`` (all ranks).
        restored_step: the checkpoint's global step the positions come from (None: none).
        states: the restored state of a slot's stateful dataset (``{"at", "state"}``), if any.
    """

    slots: int
    base: Mapping[int, int] = field(default_factory=dict)
    states: Mapping[int, Any] = field(default_factory=dict)
    rank: int = 0
    world_size: int = 1
    num_streams: int = 0
    restored_step: int | None = None
    note: str = ""
    resumes: list[dict[str, Any]] = field(default_factory=list)
    _s: dict[int, _Stream] = field(default_factory=dict, repr=False)
    _reported: set[tuple[int, int]] = field(default_factory=set, repr=False)
    _start_line: bool = False
    job_started: dict[int, int] | None = None  # every rank's started(), once gathered (commit)

    def __post_init__(self) -> None:
        self.num_streams = self.num_streams or self.slots * self.world_size
        for i in range(self.slots):
            b = int(self.base.get(i, 0))
            self._s[i] = _Stream(base=b, next=b)
            if self.states.get(i):
                self._s[i].states.append((int(self.states[i]["at"]), self.states[i]["state"]))

    def stream_of(self, slot: int) -> int:
        """The job-wide stream index of this chief's ``slot``."""
        return int(job_worker(int(slot), self.rank, self.world_size))

    def _st(self, slot: int) -> _Stream:
        return self._s.setdefault(int(slot), _Stream())

    @classmethod
    def restore(cls, model_dir: str | Path, step: int, rc: Mapping[str, Any], *, slots: int, rank: int = 0,
                world_size: int = 1) -> InputPositions:
        """The positions of checkpoint ``step`` of ``model_dir`` for this chief's ``slots``:
        every slot at 0 for a fresh run (``step`` 0); the committed positions when the model was
        restored from the run's own checkpoint (``runconfig.checkpoint_path`` names another
        run's: not restored); a checkpoint without positions, or of another stream count,
        restores none and says so (:attr:`note`, logged)."""
        num = slots * world_size
        if step <= 0:
            return cls(slots, {}, rank=rank, world_size=world_size, num_streams=num)
        rec = None if rc.get("checkpoint_path") else read_sidecar(model_dir, step)
        why = ("runconfig.checkpoint_path names a checkpoint of another run" if rc.get("checkpoint_path")
               else f"checkpoint model-ckpt-{step} has no input positions (written by an earlier csrun)"
               if rec is None else f"checkpoint model-ckpt-{step} was written by {rec.get('num_streams')} "
               f"input workers, this run has {num}" if int(rec.get("num_streams") or 0) != num else "")
        if why:
            note = f"{why}: every input stream starts at its beginning"
            log.warning("input positions: %s", note)
            return cls(slots, {}, rank=rank, world_size=world_size, num_streams=num, restored_step=None, note=note)
        streams = {int(k): int(v) for k, v in (rec or {}).get("streams", {}).items()}
        states = {int(k): v for k, v in (rec or {}).get("states", {}).items()}
        g = {s: int(job_worker(s, rank, world_size)) for s in range(slots)}
        return cls(slots, {s: streams.get(g[s], 0) for s in g}, {s: states.get(g[s]) for s in g}, rank=rank,
                   world_size=world_size, num_streams=num, restored_step=step)

    # ------------------------------------------------------------------ the merge's side
    def accept(self, slot: int, first: int | None, n: int) -> int:
        """A bundle of ``n`` batches of ``slot`` whose first is stream index ``first`` (None:
        untagged, taken as the next) arrives to be handed out: returns how many of its leading
        batches to drop (``n``: all, a duplicate). A bundle past the next index is a gap: its
        missing batches are counted and logged (they were lost), and it is taken."""
        st = self._st(slot)
        if first is None:
            first = st.next
        if first > st.next:
            st.skipped += first - st.next
            log.warning("input worker %d: %d batch(es) of its stream never came (stream index %d..%d): "
                        "training goes on from batch %d", slot, first - st.next, st.next, first - 1, first)
            st.next = first
        drop = min(n, st.next - first)
        st.duplicates += drop
        st.next = max(st.next, first + n)
        return drop

    def next_index(self, slot: int) -> int:
        """The stream index of ``slot``'s next batch to hand out (where a replacement starts)."""
        return self._st(slot).next

    def answer(self, rdv: Rendezvous, slot: int, attempt: int) -> int:
        """Tell ``slot``'s replacement ``attempt`` where to start: ``workers/<slot>.resume.json``
        with :meth:`next_index` (what it sent before and the merge took is not sent again; what
        it had in flight is dropped by the receiver and sent again). Returns that index."""
        at = self.next_index(slot)
        rdv.write("workers/" + RESUME_FILE.format(index=slot),
                  {"attempt": int(attempt), "batches": at, "state": self._st(slot).state_at(at),
                   "time": round(time.time(), 3)})
        return at

    def snapshot(self, slot: int, first: int | None, state: Any) -> None:
        """A received bundle of ``slot`` carried its stream's ``state`` before batch ``first``."""
        if state is not None and first is not None:
            self._st(slot).states.append((int(first), state))

    def publish(self, rdv: Rendezvous) -> None:
        """The starting position of every slot, ``positions.json``: write it before any batch
        is read (attempt 0 of every worker waits for it)."""
        rdv.write(POSITIONS_FILE, {"streams": {str(i): s.base for i, s in sorted(self._s.items())},
                                   "states": {str(i): s.state_at(s.base) for i, s in self._s.items()},
                                   "restored_step": self.restored_step, "time": round(time.time(), 3)})

    # ------------------------------------------------------------------ the loop's side
    def trained(self, slot: Any, steps: int) -> None:
        """The loop trained ``steps`` batches of ``slot`` (an int; other keys are ignored)."""
        if isinstance(slot, int) and not isinstance(slot, bool):
            self._st(slot).trained += int(steps)

    def committed(self) -> dict[int, int]:
        """This chief's positions now, by job-wide stream index: ``base + trained``."""
        return {self.stream_of(i): s.base + s.trained for i, s in sorted(self._s.items())}

    def committed_states(self) -> dict[int, Any]:
        """The last state known at or before each committed position (stateful datasets only)."""
        out = {self.stream_of(i): s.state_at(s.base + s.trained) for i, s in sorted(self._s.items())}
        return {g: st for g, st in out.items() if st is not None}

    def started(self) -> dict[int, int]:
        """This chief's positions at the allocation's start, by job-wide stream index."""
        return {self.stream_of(i): s.base for i, s in sorted(self._s.items())}

    # ------------------------------------------------------------------ what the workers did
    def poll_resumed(self, rdv: Rendezvous, slots: Iterable[int]) -> None:
        """Read the workers' ``resumed.json`` reports not read yet: one line per replacement's
        resume; at the allocation's start one line for every slot once all reported."""
        for i in slots:
            rec = read_json(rdv.workers_dir / RESUMED_FILE.format(index=i))
            if not rec or (i, int(rec.get("attempt") or 0)) in self._reported:
                continue
            self._reported.add((i, int(rec.get("attempt") or 0)))
            rec = {**rec, "worker": i, "stream": self.stream_of(i)}
            self.resumes.append(rec)
            if int(rec.get("attempt") or 0) > 0:
                log.info("input worker %d (replacement %s) resumed its stream at %s", i, rec.get("attempt"),
                         where_text(rec))
        first = [r for r in self.resumes if not int(r.get("attempt") or 0)]
        if not self._start_line and self.restored_step is not None and len(first) >= self.slots:
            self._start_line = True
            slowest = max(float(r.get("seconds") or 0.0) for r in first)
            log.info("input resumed at the positions of checkpoint model-ckpt-%d: %s; fast-forward %.2f s at most",
                     self.restored_step, "; ".join(f"worker {r['worker']} at {where_text(r, short=True)}"
                                                   for r in sorted(first, key=lambda r: r["worker"])), slowest)

    def describe(self, end: Mapping[int, int] | None = None) -> dict[str, Any]:
        """performance.json's ``input_positions``: ``start`` and ``end`` (job-wide stream ->
        batches trained since its beginning; ``end`` given with several ranks: all of theirs),
        the checkpoint restored, each slot's dropped duplicates and missing batches, the workers'
        resume reports."""
        return {"start": {str(k): v for k, v in (self.job_started or self.started()).items()},
                "end": {str(k): v for k, v in (end if end is not None else self.committed()).items()},
                "restored_step": self.restored_step, "note": self.note,
                "duplicates_dropped": {str(self.stream_of(i)): s.duplicates for i, s in sorted(self._s.items())},
                "batches_missing": {str(self.stream_of(i)): s.skipped for i, s in sorted(self._s.items())},
                "resumes": list(self.resumes)}


#: What a chief without input workers says after a restore: its own pipeline keeps no position
#: (docs/RESILIENCE.md "What the guarantee needs, and what it does not cover").
IN_PROCESS_RESTART = ("input position: the chief's own pipeline (no input workers) starts at its beginning after "
                      "restoring global step {step}: its position is not kept, so batches trained before the "
                      "checkpoint are trained again (input workers keep theirs)")


def say_in_process_restart(step: int) -> bool:
    """Warn :data:`IN_PROCESS_RESTART` if a chief reading no input worker restored ``step`` > 0; True if so."""
    if step > 0:
        log.warning(IN_PROCESS_RESTART.format(step=step))
    return step > 0


def where_text(rec: Mapping[str, Any], short: bool = False) -> str:
    """``batch 1041 (pass 3, batch 41) in 0.02 s (skipped at the sampler, no sample read)`` of a
    worker's ``resumed.json`` record (``short``: without the how)."""
    p, k = rec.get("pass"), rec.get("batch_in_pass")
    text = f"batch {rec.get('batches')}" + (f" (pass {p}, batch {k})" if p is not None else "")
    if short:
        return f"{text}, {float(rec.get('seconds') or 0):.2f} s"
    return f"{text} in {float(rec.get('seconds') or 0):.2f} s ({rec.get('how')})"


# --------------------------------------------------------------------------- the worker's side
def wait_position(rdv: Rendezvous, index: int, attempt: int, check: Callable[[], None],
                  timeout: float) -> int:
    """Input worker ``index`` (``attempt``): the stream index to start at: attempt 0 reads the
    chief's ``positions.json``, a replacement its ``workers/<index>.resume.json`` of its attempt
    (written when the chief saw its registration). Waits, running ``check()`` (which raises to
    leave) every 0.2 s. Raises TimeoutError after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        if attempt <= 0:
            rec = read_json(rdv.dir / POSITIONS_FILE)
            if rec is not None:
                return int((rec.get("streams") or {}).get(str(index), 0))
        else:
            rec = read_json(rdv.workers_dir / RESUME_FILE.format(index=index))
            if rec is not None and int(rec.get("attempt") or 0) == attempt:
                return int(rec.get("batches") or 0)
        check()
        if time.monotonic() > deadline:
            raise TimeoutError(f"input worker {index} (attempt {attempt}): no starting position from the chief "
                               f"in {timeout:.0f} s")
        time.sleep(0.2)


def start_state(rdv: Rendezvous, index: int, attempt: int) -> dict[str, Any] | None:
    """The stream state :func:`wait_position`'s answer carried (``{"at", "state"}``: a stateful
    dataset's, at or before the position), or None."""
    rec = read_json(rdv.dir / POSITIONS_FILE) if attempt <= 0 else read_json(
        rdv.workers_dir / RESUME_FILE.format(index=index))
    if not rec:
        return None
    return (rec.get("states") or {}).get(str(index)) if attempt <= 0 else rec.get("state")


def report_resumed(rdv: Rendezvous, index: int, attempt: int, batches: int, seconds: float, how: str,
                   pass_index: int | None = None, batch_in_pass: int | None = None) -> None:
    """Input worker: say where its stream resumed (``batches`` into it; ``pass_index`` /
    ``batch_in_pass`` where the pipeline has passes), how (``how``) and in how many seconds
    (``workers/<index>.resumed.json``; the chief logs it)."""
    rdv.write("workers/" + RESUMED_FILE.format(index=index),
              {"attempt": int(attempt), "batches": int(batches), "pass": pass_index, "batch_in_pass": batch_in_pass,
               "seconds": round(float(seconds), 4), "how": how, "time": round(time.time(), 3)})


def commit(positions: InputPositions, model_dir: str | Path, step: int, ranks: Any, writes: bool) -> dict[int, int]:
    """The job's positions at checkpoint ``step``: this chief's, with several trainer ranks every
    rank's (``ranks``: the loop's :class:`csrun_runtime.rankgroup.LoopRanks`, whose gather every
    rank calls at the same step); written to the checkpoint's position file when ``writes`` (rank
    0), before the model's checkpoint. Returns them (job-wide stream -> batches trained)."""
    mine, states = positions.committed(), positions.committed_states()
    if ranks is not None:
        parts = ranks.group.gather({"streams": {str(k): v for k, v in mine.items()},
                                    "states": {str(k): v for k, v in states.items()},
                                    "started": {str(k): v for k, v in positions.started().items()}})
        mine = {int(k): int(v) for part in parts for k, v in part["streams"].items()}
        states = {int(k): v for part in parts for k, v in part["states"].items()}
        positions.job_started = {int(k): int(v) for part in parts for k, v in part["started"].items()}
    if writes:
        write_sidecar(model_dir, step, mine, positions.num_streams, states)
    return mine


def checkpoint(positions: InputPositions | None, model_dir: str | Path, step: int, ranks: Any, writes: bool,
               save: Callable[[int], None]) -> dict[int, int] | None:
    """A checkpoint at global ``step`` (every trainer rank calls it at the same steps): the input
    positions committed first (:func:`commit`; none without ``positions``), then ``save(step)``
    on the rank that ``writes`` and the position files of deleted checkpoints pruned. Returns
    the committed positions (None without ``positions``)."""
    committed = commit(positions, model_dir, step, ranks, writes) if positions is not None else None
    if writes:
        save(step)
        if positions is not None:
            prune_sidecars(model_dir)
    return committed
