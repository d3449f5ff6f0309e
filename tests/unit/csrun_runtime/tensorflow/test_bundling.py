"""csrun_runtime/tensorflow/bundling.py with real TensorFlow: how many batches an element carries
(``runconfig.input_bundle``: auto by bytes, a number, off without static shapes), the stacking
itself, and the pipeline held to a task's cores unless input_fn set its own threading."""
from __future__ import annotations

import pytest

from csrun_runtime.bundles import MAX_BUNDLE
from csrun_runtime.tensorflow.bundling import batch_nbytes, bundle_dataset, limit_threads, plan_bundle

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


def test_a_plan_describes_itself_and_strings_and_none_labels_count_as_they_should():
    plan = plan_bundle(numbered(width=256).element_spec, 4)
    assert plan.describe() == {"batches_per_element": 4, "batch_bytes": 2 * 256 * 4 + 2 * 8,
                               "element_bytes": 4 * (2 * 256 * 4 + 2 * 8), "setting": 4,
                               "reason": "runconfig.input_bundle = 4"}
    unlabelled = tf.data.Dataset.range(8).map(lambda i: (tf.zeros([3], tf.float64), None)).batch(2, drop_remainder=True)
    assert batch_nbytes(unlabelled.element_spec) == 2 * 3 * 8
    strings = tf.data.Dataset.from_tensors(tf.constant(["a", "b"]))
    assert batch_nbytes(strings.element_spec) is None


def test_bundle_dataset_stacks_consecutive_batches_and_one_leaves_the_dataset_alone():
    ds = numbered()
    assert bundle_dataset(ds, 1) is ds
    x, y = next(iter(bundle_dataset(ds, 3)))
    assert x.shape == (3, 2, 1024) and y.numpy().tolist() == [[0, 1], [2, 3], [4, 5]]


def test_limit_threads_holds_the_pipeline_to_the_tasks_cores_unless_input_fn_set_its_own():
    ds = numbered()
    assert limit_threads(ds, None) is ds
    held = limit_threads(ds, 3).options().threading
    assert (held.private_threadpool_size, held.max_intra_op_parallelism) == (3, 1)
    own = tf.data.Options()
    own.threading.private_threadpool_size = 7
    own.threading.max_intra_op_parallelism = 2
    mine = ds.with_options(own)
    assert limit_threads(mine, 3) is mine  # both set by input_fn: unchanged
