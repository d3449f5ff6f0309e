"""Prepare the images example's data: real photographs cut into JPEG crops in TFRecord shards.

The photographs ship inside scikit-learn (``sklearn.datasets.load_sample_images``: china.jpg
and flower.jpg, 427 × 640 RGB; reading them needs Pillow), so nothing is downloaded. Each
photograph is cut, at two scales (1.0 and 0.8), into ``--crop`` × ``--crop`` crops every
``--stride`` pixels; each crop is re-encoded as JPEG (``--quality``) and written as a
``tf.train.Example`` with

* ``image/encoded`` (bytes, JPEG), ``image/height``, ``image/width`` (int64),
* ``label`` (int64): ``4 × photo + quadrant`` — which photograph (0 china, 1 flower) and in
  which quadrant of it the crop's centre lies (0 top-left, 1 top-right, 2 bottom-left,
  3 bottom-right): 8 classes,
* ``photo`` and ``quadrant`` (int64) separately.

The crops are shuffled (``--seed``) and dealt round-robin into ``--shards`` files
``<out>/train-00000-of-000NN.tfrecord`` (and 1 eval shard of every 10th crop), so the
input workers can each read their own files.

Usage: ``python prepare_data.py [--out data] [--shards 16] [--crop 224] [--stride 16]``.
"""
from __future__ import annotations

import argparse
import io
import os
import random
import sys


def crops(image, crop: int, stride: int):
    """Yield ``(crop_array, quadrant)`` for every crop of ``image`` (H × W × 3 uint8)."""
    h, w = image.shape[:2]
    for y in range(0, h - crop + 1, stride):
        for x in range(0, w - crop + 1, stride):
            cy, cx = y + crop / 2, x + crop / 2
            quadrant = (2 if cy >= h / 2 else 0) + (1 if cx >= w / 2 else 0)
            yield image[y:y + crop, x:x + crop], quadrant


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "data"),
                    help="output directory [default: data/ beside this script]")
    ap.add_argument("--shards", type=int, default=16, help="training shards [16]")
    ap.add_argument("--crop", type=int, default=224, help="crop size in pixels [224]")
    ap.add_argument("--stride", type=int, default=16, help="crop stride in pixels [16]")
    ap.add_argument("--quality", type=int, default=90, help="JPEG quality [90]")
    ap.add_argument("--seed", type=int, default=0, help="shuffle seed [0]")
    args = ap.parse_args(argv)
    if args.shards < 1 or args.crop < 16 or args.stride < 1 or not 1 <= args.quality <= 100:
        ap.error("--shards >= 1, --crop >= 16, --stride >= 1, 1 <= --quality <= 100")

    import numpy as np
    from PIL import Image
    from sklearn.datasets import load_sample_images

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    photos = load_sample_images()
    records = []
    for photo, image in enumerate(photos.images):
        for scale in (1.0, 0.8):
            img = image
            if scale != 1.0:
                h, w = image.shape[:2]
                img = np.asarray(Image.fromarray(image).resize((int(w * scale), int(h * scale)), Image.BILINEAR))
            for arr, quadrant in crops(img, args.crop, args.stride):
                buf = io.BytesIO()
                Image.fromarray(arr).save(buf, format="JPEG", quality=args.quality)
                records.append((buf.getvalue(), photo, quadrant))
    random.Random(args.seed).shuffle(records)
    os.makedirs(args.out, exist_ok=True)

    def example(jpeg: bytes, photo: int, quadrant: int) -> bytes:
        i64 = lambda v: tf.train.Feature(int64_list=tf.train.Int64List(value=[v]))  # noqa: E731
        return tf.train.Example(features=tf.train.Features(feature={
            "image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(value=[jpeg])),
            "image/height": i64(args.crop), "image/width": i64(args.crop),
            "label": i64(4 * photo + quadrant), "photo": i64(photo), "quadrant": i64(quadrant),
        })).SerializeToString()

    train = [r for i, r in enumerate(records) if i % 10 != 9]
    evals = [r for i, r in enumerate(records) if i % 10 == 9]
    writers = [tf.io.TFRecordWriter(os.path.join(args.out, f"train-{s:05d}-of-{args.shards:05d}.tfrecord"))
               for s in range(args.shards)]
    for i, r in enumerate(train):
        writers[i % args.shards].write(example(*r))
    for w in writers:
        w.close()
    with tf.io.TFRecordWriter(os.path.join(args.out, "eval-00000-of-00001.tfrecord")) as w:
        for r in evals:
            w.write(example(*r))
    total = sum(len(r[0]) for r in records)
    print(f"wrote {len(train)} training crops in {args.shards} shards and {len(evals)} eval crops "
          f"({total / 1e6:.1f} MB of JPEG) to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
