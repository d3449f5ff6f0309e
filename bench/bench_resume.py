"""Benchmark: resuming an input stream at a position (issue 41; docs/RESILIENCE.md "The input
position"), side by side in one run (rotating order, medians):

* ``restore``: seconds from making a worker's stream at a position to its first batch, at
  1k, 100k and 1M samples into a pass, on a map-style dataset of 1.1M samples that takes 1 ms to
  load each (batches of 32, ``DistributedSampler``), DataLoader ``num_workers`` 0 and 2:
  csrun's skip at the sampler (:func:`csrun_runtime.pytorch.resume.epochs_from`) against reading
  the batches up to it (measured at 1k and 10k samples; it grows with the position). Targets: at
  most 2 s at 1M, and at most 1.2x the 1k figure.
* ``tensorflow``: the same positions on a tf.data pipeline (``range`` -> a map -> ``batch(32)``,
  with and without a 1,000-element shuffle buffer): ``Dataset.skip`` (what csrun's TensorFlow
  workers do) against restoring an iterator checkpoint (``tf.train.Checkpoint(iterator=...)``,
  ``experimental_symbolic_checkpoint`` where it applies) taken at the position, and the
  checkpoint's size (state per worker: target at most 1 KiB for a symbolic one).
* ``tracking``: what keeping the position costs a steady stream: the worker's tag and the
  chief's untag, order check and count per bundle and step (µs, timed here on bundles of the
  examples' batches), as a share of the examples' training rates (digits and images: their
  TensorFlow train steps' compute-only rate on bundles of their shapes, an upper bound of any
  steady rate; digits_pt: trained by the real chief fed by one input worker, local processes,
  its ``steady_samples_per_sec``). Target: at most 1 %. And the state a position adds to a
  checkpoint per worker (bytes of ``model-ckpt-N.input.json`` per stream).

Run: ``python bench/bench_resume.py [--quick] [--out bench/results/resume.json]`` (~6 minutes on
the 2-core host; ``--quick``: small positions, one repetition).
"""
from __future__ import annotations

import argparse
import itertools
import json
import tempfile
import time
from pathlib import Path

import common  # bench/ is on sys.path: these modules run as scripts from it
import numpy as np

POSITIONS = (1_000, 100_000, 1_000_000)
QUICK_POSITIONS = (1_000, 10_000)
READ_POSITIONS = (1_000, 10_000)
SAMPLES, BATCH, LOAD_S = 1_100_000, 32, 0.001


# --------------------------------------------------------------------------- PyTorch map-style
def _loader(workers: int):
    import torch
    from torch.utils.data import DataLoader, Dataset, DistributedSampler

    class Slow(Dataset):
        def __len__(self):
            return SAMPLES

        def __getitem__(self, i):
            time.sleep(LOAD_S)
            return torch.tensor(i)

    ds = Slow()
    return DataLoader(ds, batch_size=BATCH, drop_last=True, num_workers=workers,
                      sampler=DistributedSampler(ds, num_replicas=1, rank=0, seed=1))


def _first_batch(make) -> float:
    it = None
    t0 = time.monotonic()
    try:
        it = make()
        next(it)
        return time.monotonic() - t0
    finally:
        if it is not None and hasattr(it, "close"):
            it.close()


def pt_restore(positions, workers: int, rounds: int) -> dict:
    from csrun_runtime.pytorch.contract import epochs
    from csrun_runtime.pytorch.resume import epochs_from

    _first_batch(lambda: epochs_from(_loader(workers), 0))  # imports and the first DataLoader: not timed
    fns = {}
    for n in positions:
        fns[f"sampler {n}"] = (lambda n=n: _first_batch(lambda: epochs_from(_loader(workers), n // BATCH)))
    for n in READ_POSITIONS:
        fns[f"reading {n}"] = (lambda n=n: _first_batch(
            lambda: itertools.islice(epochs(_loader(workers)), n // BATCH, None)))
    got = common.round_robin(fns, rounds, warmup=0)
    med = {k: common.median(v) for k, v in got.items()}
    first = med[f"sampler {positions[0]}"]
    return {"seconds": {k: common.spread(v) for k, v in got.items()},
            "ratio_to_first_position": {str(n): round(med[f"sampler {n}"] / first, 3) for n in positions},
            "reading_seconds_per_1k_samples": round((med[f"reading {READ_POSITIONS[1]}"]
                                                     - med[f"reading {READ_POSITIONS[0]}"])
                                                    / ((READ_POSITIONS[1] - READ_POSITIONS[0]) / 1000), 4)}


# --------------------------------------------------------------------------- TensorFlow
def _tf_ds(shuffle: bool):
    import tensorflow as tf

    ds = tf.data.Dataset.range(SAMPLES)
    if shuffle:
        ds = ds.shuffle(1000, seed=1)
    ds = ds.map(lambda x: tf.reduce_sum(tf.math.sin(tf.cast(x, tf.float32) + tf.range(64, dtype=tf.float32))))
    ds = ds.batch(BATCH, drop_remainder=True)
    opts = tf.data.Options()
    opts.experimental_symbolic_checkpoint = True  # kept only where the pipeline allows it
    return ds.with_options(opts)


def _restored(shuffle: bool, prefix: str) -> float:
    """Seconds to restore an iterator from the checkpoint ``prefix`` and take its next batch."""
    import tensorflow as tf

    it = iter(_tf_ds(shuffle))
    t0 = time.monotonic()
    tf.train.Checkpoint(iterator=it).read(prefix).expect_partial()
    next(it)
    return time.monotonic() - t0


def _skipped(shuffle: bool, n: int) -> float:
    """Seconds to the first batch after ``Dataset.skip`` of ``n`` samples' batches."""
    t0 = time.monotonic()
    next(iter(_tf_ds(shuffle).skip(n // BATCH)))
    return time.monotonic() - t0


def tf_restore(positions, rounds: int, wd: Path) -> dict:
    import tensorflow as tf

    out: dict = {}
    for shuffle in (False, True):
        name = "shuffle 1000" if shuffle else "no shuffle"
        prefixes, sizes = {}, {}
        for n in positions:  # the checkpoints, taken once (not timed)
            it = iter(_tf_ds(shuffle))
            for _ in range(n // BATCH):
                next(it)
            prefixes[n] = tf.train.Checkpoint(iterator=it).write(str(wd / f"{name}-{n}".replace(" ", "_")))
            sizes[n] = sum(p.stat().st_size for p in wd.glob(Path(prefixes[n]).name + "*"))

        fns = {**{f"skip {n}": (lambda n=n, sh=shuffle: _skipped(sh, n)) for n in positions},
               **{f"checkpoint {n}": (lambda n=n, sh=shuffle, pr=prefixes[n]: _restored(sh, pr))
                  for n in positions}}
        got = common.round_robin(fns, rounds, warmup=0)
        out[name] = {"seconds": {k: common.spread(v) for k, v in got.items()},
                     "checkpoint_bytes": {str(n): sizes[n] for n in positions}}
    return out


# --------------------------------------------------------------------------- tracking
def _bundle(shapes: dict, n: int):
    from csrun_runtime.dataplane import Bundle, flatten
    from csrun_runtime.position import tag

    nest = tag({k: np.zeros((n, *s), dtype=np.float32) for k, s in shapes.items()}, 1000, n)
    tree, leaves = flatten(nest)
    return Bundle(worker=0, attempt=0, n=n, nbytes=sum(a.nbytes for a in leaves), nest=nest, _tree=tree,
                  _leaves=leaves)


def per_bundle_us(shapes: dict, n: int, reps: int = 2000) -> float:
    """µs the position costs one bundle of ``n`` batches: the worker's tag, the chief's untag,
    order check, cut and the loop's count of its steps."""
    from csrun_runtime.position import InputPositions, state_of, tag, untag, untag_bundle

    b = _bundle(shapes, n)
    inner = {k: np.zeros((n, *s), dtype=np.float32) for k, s in shapes.items()}
    p = InputPositions(1)
    t0 = time.perf_counter()
    for k in range(reps):
        tag(inner, k * n, n)
        first = untag(b.nest)[0]
        p.snapshot(0, first, state_of(b.nest))
        p.accept(0, k * n, n)
        untag_bundle(b)
        p.trained(0, n)
    return (time.perf_counter() - t0) / reps * 1e6


def tf_step_rate(example: str, shapes: dict, batch: int, n: int) -> float:
    """The example's TensorFlow train step, compute only, samples/s on bundles of ``n``."""
    import sys

    import tensorflow as tf
    import yaml

    from csrun_runtime.tensorflow.steps import TrainSteps

    sys.path.insert(0, str(common.REPO / "examples" / example))
    try:
        model_mod = __import__("model")
        params = yaml.safe_load((common.REPO / "examples" / example / "configs" / "params.yaml").read_text())
        model = model_mod.model_fn(params)
    finally:
        sys.path.pop(0)
        sys.modules.pop("model", None)
    x = {k: tf.zeros((n, batch, *s)) for k, s in shapes.items() if k != "y"}
    x = x["x"] if list(x) == ["x"] else x
    el = (x, tf.zeros((n, batch), tf.int32))
    model(tf.nest.map_structure(lambda t: t[0], el[0]))
    steps = TrainSteps(model)
    float(steps(el, 0, n)[1][-1])
    t0 = time.monotonic()
    for _ in range(5):
        float(steps(el, 0, n)[1][-1])
    return 5 * n * batch / (time.monotonic() - t0)


def pt_steady_rate(wd: Path) -> float:
    import bench_read_ahead

    return float(bench_read_ahead.train(1, 32, wd)["samples_per_sec"])


def tracking(wd: Path, quick: bool) -> dict:
    out = {}
    digits = {"x": (64,)}
    for name, shapes, batch, n, rate in (
            ("digits", digits, 64, 63, lambda: tf_step_rate("digits", {"x": (64,)}, 64, 63)),
            ("images", {"x": (128, 128, 3)}, 32, 1, lambda: tf_step_rate("images", {"x": (128, 128, 3)}, 32, 1)),
            ("digits_pt", digits, 64, 16, lambda: pt_steady_rate(wd / "pt"))):
        us = per_bundle_us({k: (batch, *s) for k, s in shapes.items()}, n, 300 if quick else 2000)
        r = rate()
        out[name] = {"us_per_bundle": round(us, 2), "batches_per_bundle": n, "samples_per_sec": round(r, 1),
                     "share": round(us * 1e-6 / (n * batch) * r, 5)}
    streams = {str(g): 1_000_000 + g for g in range(64)}
    out["checkpoint_bytes_per_stream"] = round(len(json.dumps({"streams": streams})) / len(streams), 1)
    return out


def run(quick: bool) -> dict:
    """The benchmark's figures (see the module docstring)."""
    common.ensure_example_data(["digits_pt"])
    positions, rounds = (QUICK_POSITIONS, 1) if quick else (POSITIONS, 3)
    with tempfile.TemporaryDirectory(prefix="bench-resume-") as d:
        wd = Path(d)
        res = {"positions_samples": list(positions), "batch_size": BATCH, "load_s_per_sample": LOAD_S,
               "pytorch": {f"num_workers {w}": pt_restore(positions, w, rounds) for w in (0, 2)},
               "tensorflow": tf_restore(positions, rounds, wd),
               "tracking": tracking(wd, quick)}
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=str(common.BENCH / "results" / "resume.json"))
    args = ap.parse_args()
    res = {**run(args.quick), "meta": common.metadata(args.quick)}
    common.write_json(Path(args.out), res)
    print(json.dumps(res, indent=1, default=str)[:6000])


if __name__ == "__main__":
    main()
