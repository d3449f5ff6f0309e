"""A TensorFlow input worker's stream from its position on the tf.data service
(csrun_runtime/tensorflow/resume.py): the registered graph reads the position the chief
published when the chief's iterator is made, skips there and tags each bundle; the chief's
ServiceSource hands out the batches from that position on."""
from __future__ import annotations

import pytest

tf = pytest.importorskip("tensorflow")

from csrun_runtime.position import InputPositions, wait_position  # noqa: E402
from csrun_runtime.rendezvous import Rendezvous  # noqa: E402
from csrun_runtime.tensorflow.bundling import BundlePlan  # noqa: E402
from csrun_runtime.tensorflow.resume import positioned  # noqa: E402
from csrun_runtime.tensorflow.service import (  # noqa: E402
    ServiceSource,
    register_stream,
    start_dispatchers,
    start_worker_server,
)
from tests.fixtures.runtime import helpers  # noqa: E402


def test_a_service_stream_starts_at_the_published_position_and_says_where(tmp_path):
    servers, ports = start_dispatchers(1)
    address = f"localhost:{ports[0]}"
    rdv = Rendezvous(tmp_path, "1.0")
    rdv.reset()
    ds = tf.data.Dataset.range(1000).batch(4, drop_remainder=True).map(lambda x: ({"id": x}, x)).repeat()
    told: list[dict] = []
    register_stream(address, ds, BundlePlan(3, 64, "auto", ""), [0], positioned=lambda d, b: positioned(
        d, b, lambda: wait_position(rdv, 0, 0, lambda: None, 30.0), told.append))
    helpers.keep_alive(*servers, start_worker_server(address, "localhost"))
    source = ServiceSource(rdv, [address], {0: {"node": "n0", "pid": 1, "bundle": 3}},
                           positions=InputPositions(1, {0: 10}))  # published before the stream is read
    got = [source.get(20.0)[1][0]["id"].numpy().tolist() for _ in range(5)]
    source.close()
    assert got == [[4 * k, 4 * k + 1, 4 * k + 2, 4 * k + 3] for k in range(10, 15)]
    assert told[0]["batches"] == 10 and told[0]["how"].startswith("read and discarded 10 batch(es) (Dataset.skip")
    assert source.positions is not None and source.positions.next_index(0) == 16  # 2 bundles of 3 handed out
