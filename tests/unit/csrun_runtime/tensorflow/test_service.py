"""csrun_runtime/tensorflow/service.py with real tf.data service servers in this process: an
input worker's stream registered as the runtime's workers register it (bundled, each element
counted), the chief's merge pausing and resuming one stream, a stream that ends reported as a
stopped worker while the others go on, and an error of a worker's pipeline failing the chief
naming the worker. Bundled and unbundled streams merged in each worker's order, and a stream
added while training: tests/integration/test_runtime_ingest.py."""
from __future__ import annotations

import pytest

tf = pytest.importorskip("tensorflow")

from csrun_runtime.rendezvous import Rendezvous  # noqa: E402
from csrun_runtime.streams import InputStalled  # noqa: E402
from csrun_runtime.tensorflow.bundling import plan_bundle  # noqa: E402
from csrun_runtime.tensorflow.service import (  # noqa: E402
    ServiceSource,
    register_stream,
    start_dispatchers,
    start_worker_server,
)
from tests.fixtures.runtime import helpers  # noqa: E402

pytestmark = pytest.mark.tf


def numbered(first: int, count: int | None = None):
    """Batches ``(x float32[2, 3], y int64[2])`` of seq ``first, first + 1, ...`` (``count`` of them, or endless)."""
    last = first + count if count is not None else 1 << 40
    return tf.data.Dataset.range(first, last).map(lambda i: (tf.fill([2, 3], tf.cast(i, tf.float32)), tf.fill([2], i)))


def serve(datasets, bundles, tmp_path):
    """One dispatcher and worker per dataset, each registered with its bundle; the chief's
    ServiceSource over them and each worker's element counter."""
    servers, ports = start_dispatchers(len(datasets))
    addresses = [f"localhost:{p}" for p in ports]
    helpers.keep_alive(servers, [start_worker_server(a, "localhost") for a in addresses])
    counters, registry = [], {}
    for i, (address, ds, bundle) in enumerate(zip(addresses, datasets, bundles, strict=True)):
        counters.append([0])
        plan = plan_bundle(ds.element_spec, bundle)
        register_stream(address, ds, plan, counters[i])
        registry[i] = {"node": f"node{i + 2}", "pid": 40 + i, "bundle": plan.bundle}
    rdv = Rendezvous(tmp_path, "1.0")
    rdv.reset()
    return ServiceSource(rdv, addresses, registry), counters


def seq(batch) -> int:
    return int(batch[1][0])


def test_a_paused_stream_stops_and_resumes_and_an_ended_one_is_reported_while_the_other_goes_on(tmp_path):
    source, counters = serve([numbered(0), numbered(1000, count=12)], [1, 2], tmp_path)
    assert source.streaming() == {0, 1} and source.buffered_batches() == (4 + 2) * 2
    source.pause(0)
    assert source.streaming() == {1} and source.describe()["workers_paused"] == [0]
    took = [source.get(20.0) for _ in range(12)]  # what worker 0 had in flight, then only worker 1
    assert [seq(b) for i, b in took if i == 1] == list(range(1000, 1000 + sum(i == 1 for i, _ in took)))
    source.resume(0)
    got: dict[int, list[int]] = {0: [], 1: [seq(b) for i, b in took if i == 1]}
    got[0] = [seq(b) for i, b in took if i == 0]
    while 1 not in source.stopped():  # worker 1's 12 batches, then its stream's end
        i, b = source.get(20.0)
        got[i].append(seq(b))
    assert got[1] == list(range(1000, 1012)) and got[0] == list(range(len(got[0])))
    assert source.failed[1].startswith("StopIteration") and source.streaming() == {0}
    assert {source.get(20.0)[0] for _ in range(10)} == {0}  # training goes on with worker 0
    d = source.describe()
    assert d["workers_stopped"] == [1] and d["batches_per_element"] == {"0": 1, "1": 2}
    assert d["batches_per_worker"]["1"] == 12 and counters[1][0] == 6  # 6 service elements of 2 batches
    source.close()


def test_an_error_of_a_workers_pipeline_fails_the_chief_naming_the_worker(tmp_path):
    bad = numbered(0).map(lambda x, y: (x, tf.cond(y[0] < 5, lambda: y, lambda: tf.strings.to_number(
        tf.fill([2], "x"), tf.int64))))
    source, _ = serve([bad], [1], tmp_path)
    got = []
    with pytest.raises(InputStalled, match=r"input worker 0 on node2 \(pid 40\): its input pipeline failed: "
                                           r"InvalidArgumentError"):
        for _ in range(6):
            got.append(seq(source.get(20.0)[1]))
    assert got == list(range(len(got))) and len(got) <= 5  # the good batches the worker sent first, if any
    source.close()
