"""Issue 41's judge of exactly-once input, shared by the cluster tests: the trained sequence
(each trainer rank's ``trained.<rank>.log``: ``<global step> <id>,<id>,...`` per step, appended by
the model; the last write of a step wins, so steps trained again after a restore count once)
must hold every step, and every trained batch must be the next unread batch of its input
worker's uninterrupted stream: 0 repeated, 0 skipped.

Each worker's uninterrupted stream is computed here, in the test process, the way the worker
builds it (csrun's own ``build_loader`` / ``build_worker_input`` as streamer ``g`` of ``W``), and
a trained batch is found in it by its ids.
"""
from __future__ import annotations

import importlib.util
import itertools
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "exactly_once"

Batch = tuple[int, ...]
#: One line of a trained log: the step and the batch's ids (quoted by tf.print).
_LINE = re.compile(r'^(\d+) "?(\d+(?:,\d+)*)"?$')
#: What the chiefs log when they save a checkpoint (PyTorch's, TensorFlow's).
SAVED = "INFO:csrun:saved |Saving checkpoint at global step "


def trained(trained_dir: Path) -> dict[int, dict[int, Batch]]:
    """Every rank's trained batches by global step (the last write of a step wins)."""
    out: dict[int, dict[int, Batch]] = {}
    for f in sorted(trained_dir.glob("trained.*.log")):
        rank = int(f.name.split(".")[1])
        steps = out.setdefault(rank, {})
        for line in f.read_text().splitlines():
            m = _LINE.match(line)  # a line a SIGKILL cut (and the next run's first, on it) is not one
            if m:
                steps[int(m.group(1))] = tuple(int(i) for i in m.group(2).split(","))
    return out


def judge(steps: Mapping[int, Batch], streams: Mapping[int, Sequence[Batch]], last: int) -> dict[int, int]:
    """Assert the exactly-once rule on one rank's ``steps`` (global step -> ids) against its
    workers' ``streams`` (worker -> its uninterrupted batches): steps ``1..last`` all trained, and
    each the next unread batch of some worker's stream. Returns the batches each worker gave."""
    missing = sorted(set(range(1, last + 1)) - set(steps))
    assert not missing, f"{len(missing)} step(s) never trained: {missing[:10]}"
    where: dict[Batch, list[tuple[int, int]]] = {}
    for g, batches in streams.items():
        for j, b in enumerate(batches):
            where.setdefault(b, []).append((g, j))
    nxt = {g: 0 for g in streams}
    for s in range(1, last + 1):
        found = where.get(steps[s])
        assert found, f"step {s}: batch {steps[s][:6]}... is in no worker's stream"
        ok = [(g, j) for g, j in found if nxt[g] == j]
        assert ok, (f"step {s}: batch {steps[s][:6]}... is batch {found[0][1]} of worker {found[0][0]}'s stream, "
                    f"whose next unread batch was {nxt[found[0][0]]} "
                    f"({'repeated' if found[0][1] < nxt[found[0][0]] else 'skipped ahead'})")
        nxt[ok[0][0]] += 1
    return nxt


def first(batches: Iterable[Batch], n: int) -> list[Batch]:
    return list(itertools.islice(batches, n))


def _module(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def pt_streams(params: dict, workers: Iterable[int], num_streams: int, n: int) -> dict[int, list[Batch]]:
    """The first ``n`` batches' ids of PyTorch input workers ``workers`` (job-wide, of
    ``num_streams``), built as the worker builds them (tests/fixtures/exactly_once/pt_run.py's
    data function; DataLoader worker processes make no difference to the order)."""
    from csrun_runtime.pytorch.contract import epochs
    from csrun_runtime.pytorch.worker import build_loader

    fn: Callable = _module("exactly_once_pt_run", FIXTURES / "pt_run.py").train_data_fn
    p = {**params, "train_input": {**params["train_input"], "num_workers": 0}}
    out = {}
    for g in workers:
        loader, _, _ = build_loader(fn, p, g, num_streams, g)
        out[g] = first((tuple(int(i) for i in b["id"].reshape(-1)) for b in epochs(loader)), n)
    return out


def tf_streams(params: dict, workers: Iterable[int], num_streams: int, n: int,
               files_listed: bool) -> dict[int, list[Batch]]:
    """The first ``n`` batches' ids of TensorFlow input workers ``workers`` (job-wide, of
    ``num_streams``), built as the worker builds them (tests/fixtures/exactly_once/tf_run.py's
    input function as streamer ``g``: its seeds and TF_CONFIG). ``files_listed``: the worker
    listed its pipeline's files before iterating it in-process (the data plane's worker does:
    listing advances the seeded file shuffle of the dataset object it iterates afterwards)."""
    from csrun_runtime.tensorflow.pipeline import build_worker_input, pipeline_files

    fn: Callable = _module("exactly_once_tf_run", FIXTURES / "tf_run.py").train_input_fn
    out = {}
    for g in workers:
        ds = build_worker_input(fn, params, g, num_streams).dataset
        if files_listed:
            pipeline_files(ds)
        out[g] = first((tuple(int(i) for i in f["id"]) for f, _ in ds.as_numpy_iterator()), n)
    return out


# --------------------------------------------------------------------------- the faults
def wait_for(what: str, ok: Callable[[], object], proc, log: Path, timeout: float = 240.0) -> object:
    import time

    deadline = time.monotonic() + timeout
    while True:
        got = ok()
        if got:
            return got
        assert proc.poll() is None, f"csrun_wse ended ({proc.returncode}) before {what}:\n{log.read_text()[-4000:]}"
        assert time.monotonic() < deadline, f"no {what} in {timeout:.0f} s:\n{log.read_text()[-4000:]}"
        time.sleep(0.2)


def _step_seen(log: Path, step: int, after: int = 0) -> bool:
    return f"global_step = {step}," in log.read_text()[after:]


def logged_after(log: Path, text: str, after: int) -> int | None:
    """The offset just past the first ``text`` (alternatives apart by ``|``) after offset
    ``after`` of the log, or None."""
    out = log.read_text()
    ends = [at + len(t) for t in text.split("|") if (at := out.find(t, after)) >= 0]
    return min(ends) if ends else None


def _newest_rdv(md: Path, rank: int | None) -> Path | None:
    dirs = [d for d in md.glob(".csrun/*" if rank is None else f".csrun/*.rank{rank}")
            if d.is_dir() and ".stale-" not in d.name]
    return max(dirs, key=lambda d: d.stat().st_mtime) if dirs else None


def _worker_pid(md: Path, index: int, rank: int | None) -> int | None:
    import json

    d = _newest_rdv(md, rank)
    f = d / "workers" / f"{index}.json" if d else None
    try:
        reg = json.loads(f.read_text()) if f else None
    except (OSError, ValueError):
        return None
    return int(reg["pid"]) if reg and reg.get("status") == "ok" else None


def run_with_faults(argv: list[str], env: dict, cwd: Path, log: Path, md: Path, trained_dir: Path, *,
                    kill_worker_at: int, worker: int = 1, rank: int | None = None,
                    speed_up: Callable[[], None] = lambda: None) -> list[int]:
    """Run ``csrun_wse --requeue ...`` (``argv``) with the three faults of issue 41, in one run: at
    global step ``kill_worker_at`` input worker ``worker`` (of trainer ``rank``, with several) is
    SIGKILLed (its task replaces it); once the replacement resumed its stream and a step more was
    logged, the job gets ``--requeue``'s signal (USR2: the chief saves and exits 75, csrun_wse
    launches again); once the second allocation resumed, saved a periodic checkpoint and logged a
    step more, its chief (rank 0's) is SIGKILLed (csrun_wse fails) and the same command is run
    again (it resumes from that checkpoint). ``speed_up()`` is called before the signal (e.g. to
    pace the later allocations' steps faster: they read the params again). Returns each
    csrun_wse's exit status."""
    import os
    import signal
    import subprocess

    codes = []
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd)
    try:
        wait_for(f"global step {kill_worker_at}", lambda: _step_seen(log, kill_worker_at), proc, log)
        os.kill(int(wait_for(f"worker {worker}'s pid", lambda: _worker_pid(md, worker, rank), proc, log)),
                signal.SIGKILL)
        resumed = f"input worker {worker} (replacement 1) resumed its stream at "
        at = wait_for("the replacement's resumed stream", lambda: logged_after(log, resumed, 0), proc, log)
        wait_for("a step after it", lambda: logged_after(log, "global_step = ", at), proc, log)
        speed_up()
        jobs = subprocess.run(["squeue", "--noheader", "--format=%i", "--name=csrun_wse"], env=env,
                              capture_output=True, text=True).stdout.split()
        subprocess.run(["scancel", "--signal=USR2", *sorted({j.split("+")[0] for j in jobs})], env=env, check=True,
                       capture_output=True)
        at = wait_for("the second allocation", lambda: logged_after(log, "launching again (requeue 1 of", 0), proc, log)
        at = wait_for("its resume", lambda: logged_after(log, "input resumed at the positions of checkpoint", at),
                   proc, log)
        at = wait_for("its first checkpoint", lambda: logged_after(log, SAVED, at), proc, log)
        wait_for("a step after it", lambda: logged_after(log, "global_step = ", at), proc, log)
        os.kill(int((trained_dir / "chief.0.pid").read_text()), signal.SIGKILL)
        codes.append(proc.wait(timeout=120))
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=60)
    with open(log, "a") as out:
        out.write("\n=== the run resubmitted ===\n")
        out.flush()
        codes.append(subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                    timeout=400).returncode)
    return codes
