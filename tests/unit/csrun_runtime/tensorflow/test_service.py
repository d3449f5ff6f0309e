"""csrun_runtime/tensorflow/service.py's in-process parts with real TensorFlow: how many batches an
element carries (``runconfig.input_bundle``: auto by bytes, a number, off without static shapes)
and the in-process pipeline's source handing out chunks of consecutive batches in order and
counting them. The tf.data service merge runs in tests/unit/csrun_runtime/tensorflow/
test_deviceprefetch.py and on the test cluster."""
from __future__ import annotations

import pytest

from csrun_runtime.bundles import MAX_BUNDLE
from csrun_runtime.tensorflow.service import LocalSource, batch_nbytes, bundle_dataset, plan_bundle

pytestmark = pytest.mark.tf
tf = pytest.importorskip("tensorflow")


def numbered(batch: int = 2, width: int = 1024):
    """Batches ``(x float32[batch, width], y int64[batch])``, y the sample's number: order is visible."""
    return tf.data.Dataset.range(1 << 20).map(
        lambda i: (tf.fill([width], tf.cast(i, tf.float32)), i)).batch(batch, drop_remainder=True)


def test_auto_bundles_about_a_mebibyte_a_number_is_kept_and_dynamic_shapes_are_not_bundled():
    spec = numbered().element_spec
    assert batch_nbytes(spec) == 2 * 1024 * 4 + 2 * 8
    auto = plan_bundle(spec)
    assert auto.bundle == (1 << 20) // batch_nbytes(spec) <= MAX_BUNDLE and auto.reason.startswith("auto: ")
    assert plan_bundle(spec, "auto", max_batches=3).bundle == 3
    assert (plan_bundle(spec, 1).bundle, plan_bundle(spec, 1).reason) == (1, "off (runconfig.input_bundle = 1)")
    ragged = tf.data.Dataset.range(4).map(lambda i: tf.zeros([i])).batch(2)
    off = plan_bundle(ragged.element_spec, 8)
    assert off.bundle == 1 and off.batch_bytes is None and off.reason.startswith("off: the batch has a tensor")
    assert off.describe()["element_bytes"] is None


def test_the_in_process_source_hands_out_consecutive_batches_in_chunks(tmp_path):
    ds = numbered()
    src = LocalSource(ds, plan_bundle(ds.element_spec, 3))
    got = []
    for limit in (2, 5, 4):
        c = src.get_chunk(limit, 0.0, "x")
        assert c.worker == 0 and 1 <= c.steps <= limit
        got += [int(v) for k in range(c.offset, c.offset + c.steps) for v in c.batches[1][k]]
    assert got == list(range(len(got))) and src.counts == {0: len(got) // 2}
    assert src.describe()["batches_per_element"] == {"in-process": 3}
    assert bundle_dataset(ds, 1) is ds
