"""csrun_runtime/tensorflow/sources.py with real TensorFlow: the in-process pipeline's source
handing out chunks of consecutive batches in order and counting them, single batches out of a
bundle, and how many batches the next chunk can hold. The tf.data service merge runs in
test_service.py and test_deviceprefetch.py; the data plane's source in test_remote.py."""
from __future__ import annotations

import pytest

from csrun_runtime.tensorflow.bundling import bundle_dataset, plan_bundle
from csrun_runtime.tensorflow.sources import LocalSource, map_structure, steps_in

pytestmark = pytest.mark.tf
tf = pytest.importorskip("tensorflow")


def numbered(batch: int = 2, width: int = 1024):
    """Batches ``(x float32[batch, width], y int64[batch])``, y the sample's number: order is visible."""
    return tf.data.Dataset.range(1 << 20).map(
        lambda i: (tf.fill([width], tf.cast(i, tf.float32)), i)).batch(batch, drop_remainder=True)


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


def test_single_batches_come_out_of_a_bundle_in_order_and_available_says_what_is_left():
    src = LocalSource(numbered(batch=1, width=4), plan_bundle(numbered(batch=1, width=4).element_spec, 3))
    assert src.available(1.0) == 3
    assert [int(src.get(1.0)[1][1][0]) for _ in range(2)] == [0, 1]
    assert src.available(1.0) == 1  # the rest of the element being handed out
    c = src.get_chunk(5, 1.0)
    assert (c.offset, c.steps) == (2, 1) and int(c.batches[1][2][0]) == 2
    unbundled = LocalSource(numbered(batch=1, width=4))
    c = unbundled.get_chunk(4, 1.0)  # an unbundled element is one batch with a leading axis of 1
    assert c.steps == 1 and c.batches[0].shape == (1, 1, 4)
    assert unbundled.describe() == {"num_workers": 0, "batches_per_worker": {"in-process": 1},
                                    "batches_per_element": {"in-process": 1}}
    unbundled.close()


def test_map_structure_keeps_none_leaves_and_steps_in_reads_the_leading_axis():
    element = (tf.zeros([5, 2]), None)
    firsts = map_structure(lambda t: t[0], element)
    assert firsts[0].shape == (2,) and firsts[1] is None
    assert steps_in(element) == 5
    with pytest.raises(ValueError, match="without tensors"):
        steps_in((None, None))
