"""input_fn of the images example: an ImageNet-shaped JPEG pipeline.

``input_fn(params) -> tf.data.Dataset`` of ``(images, labels)`` batches: TFRecord shards →
interleave → shuffle → parse + JPEG decode + random crop + random flip + resize + normalise
(parallel map) → batch → prefetch. The decode/crop/resize is CPU work per sample, so the
pipeline's throughput grows with the CPUs (and tasks) it is given.

``params["train_input"]`` keys (``eval_input`` for evaluation):

* ``data_dir`` — directory of ``train-*.tfrecord`` (relative paths: to this directory),
* ``data_files`` — explicit files (set per worker by a shard plan; wins over ``data_dir``),
* ``batch_size`` (int), ``image_size`` (output side, px), ``crop_size`` (random crop side),
* ``shuffle_buffer`` (elements), ``shuffle_seed`` (None: unseeded),
* ``worker_index`` / ``num_workers`` — set by the runtime; without a shard plan each worker
  reads every ``num_workers``-th file.
"""
from __future__ import annotations

import glob
import os

import tensorflow as tf

HERE = os.path.dirname(os.path.abspath(__file__))
NUM_CLASSES = 8
MEAN = (0.485 * 255, 0.456 * 255, 0.406 * 255)
STD = (0.229 * 255, 0.224 * 255, 0.225 * 255)


def _files(p: dict, pattern: str) -> list[str]:
    if p.get("data_files"):
        return list(p["data_files"])
    d = p.get("data_dir", "data")
    d = d if os.path.isabs(d) else os.path.join(HERE, d)
    files = sorted(glob.glob(os.path.join(d, pattern)))
    if not files:
        raise FileNotFoundError(f"no {pattern} in {d}: run `python prepare_data.py` first")
    return files


def _parse(crop: int, size: int, training: bool):
    features = {"image/encoded": tf.io.FixedLenFeature([], tf.string),
                "label": tf.io.FixedLenFeature([], tf.int64)}
    mean = tf.constant(MEAN, tf.float32)
    std = tf.constant(STD, tf.float32)

    def parse(record):
        ex = tf.io.parse_single_example(record, features)
        image = tf.io.decode_jpeg(ex["image/encoded"], channels=3)
        if training:
            image = tf.image.random_crop(image, [crop, crop, 3])
            image = tf.image.random_flip_left_right(image)
        else:
            image = tf.image.resize_with_crop_or_pad(image, crop, crop)
        image = tf.image.resize(image, [size, size])  # bilinear, float32
        image = (image - mean) / std
        return image, tf.cast(ex["label"], tf.int32)

    return parse


def input_fn(params: dict, mode: str = "train") -> tf.data.Dataset:
    """The input pipeline (see the module docstring)."""
    training = mode == "train"
    p = dict(params.get("train_input" if training else "eval_input") or params.get("train_input") or {})
    files = _files(p, "train-*.tfrecord" if training else "eval-*.tfrecord")
    nw, wi = int(p.get("num_workers", 1) or 1), int(p.get("worker_index", 0) or 0)
    if nw > 1 and not p.get("data_files") and len(files) >= nw:
        files = files[wi::nw]
    seed = p.get("shuffle_seed")
    ds = tf.data.Dataset.from_tensor_slices(files)
    if training:
        ds = ds.shuffle(len(files), seed=seed, reshuffle_each_iteration=True).repeat()
    ds = ds.interleave(tf.data.TFRecordDataset, cycle_length=min(4, len(files)),
                       num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
    if training:
        ds = ds.shuffle(int(p.get("shuffle_buffer", 512)), seed=seed)
    ds = ds.map(_parse(int(p.get("crop_size", 192)), int(p.get("image_size", 128)), training),
                num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
    ds = ds.batch(int(p.get("batch_size", 32)), drop_remainder=True)
    return ds.prefetch(tf.data.AUTOTUNE)
