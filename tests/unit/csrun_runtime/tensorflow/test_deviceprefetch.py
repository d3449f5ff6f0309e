"""The TensorFlow chief's prefetch to the device (csrun_runtime/tensorflow/deviceprefetch.py), with real
TensorFlow on CPU.

This host has no GPU (and the project's GPU machine has no TensorFlow), so the decision is checked as
it falls here (off: the dataset and the source untouched) and the mechanism with its device forced to
``/CPU:0``: the thread, the copies (``tf.identity`` under ``tf.device``), the order, the bound, the end,
errors and stop are the real code path; only the device is not a GPU.
"""
from __future__ import annotations

import json
import queue
import time
from typing import Any

import numpy as np
import pytest

from csrun_common.roles import Role
from csrun_runtime.rendezvous import Rendezvous
from csrun_runtime.streams import InputStalled
from csrun_runtime.tensorflow.bundling import plan_bundle
from csrun_runtime.tensorflow.chief_streams import ChiefStreams
from csrun_runtime.tensorflow.deviceprefetch import (
    DevicePrefetch,
    plan_prefetch,
    prefetch_dataset,
    to_device,
)
from csrun_runtime.tensorflow.remote import STREAM_ERROR, DataplaneSource
from csrun_runtime.tensorflow.service import ServiceSource
from csrun_runtime.tensorflow.sources import LocalSource
from tests.unit.csrun_runtime.tensorflow.test_remote import BUNDLE, _batches, plane  # noqa: F401 - the real senders' fixture

tf = pytest.importorskip("tensorflow")

CPU = "/CPU:0"


def _dataset(n: int = 12) -> Any:
    x = np.arange(n * 4, dtype=np.float32).reshape(n, 2, 2)
    return tf.data.Dataset.from_tensor_slices((x, np.arange(n, dtype=np.int32))).batch(2, drop_remainder=True)


# ---------------------------------------------------------------------------- the decision
def test_without_a_gpu_the_prefetch_is_off_and_nothing_changes():
    assert tf.config.list_logical_devices("GPU") == []  # this host: the CPU path
    plan = plan_prefetch({"device_prefetch": 3}, streamed=False)
    assert (plan.on, plan.device, plan.depth, plan.how) == (False, None, 3, "off")
    assert "sees no GPU" in plan.reason
    ds = _dataset()
    assert prefetch_dataset(ds, plan) is ds
    streams = ChiefStreams(Role("chief", None, 0), {"runconfig": {"input_bundle": 1, "device_prefetch": 3}},
                           "train", lambda params: ds)
    source = streams.training_source(ds, [])
    assert isinstance(source, LocalSource) and source.prefetch is None
    assert streams.ingest_info["device_prefetch"] == {"on": False, "device": None, "depth": 3, "how": "off",
                                                      "reason": plan.reason}
    assert "device_prefetch_stats" not in source.describe()
    _, (x, y) = source.get(1.0)
    assert x.device.endswith("CPU:0") and y.numpy().tolist() == [0, 1]
    streamed = plan_prefetch({}, streamed=True)
    stand_in = LocalSource(ds)
    stand_in.start_prefetch(streamed)  # off: no thread (a LocalSource could not pull for one)
    assert not streamed.on and stand_in.prefetch is None and streamed.depth == 2


def test_the_decision_with_a_device_leaves_ranks_and_autoscale_off():
    on = plan_prefetch({"device_prefetch": 4}, streamed=True, device=CPU)
    assert (on.on, on.device, on.depth, on.how) == (True, CPU, 4, "thread")
    local = plan_prefetch({}, streamed=False, autoscale=True, device=CPU)
    assert (local.on, local.how, local.depth) == (True, "prefetch_to_device", 2)
    ranks = plan_prefetch({}, streamed=True, ranks=2, device=CPU)
    assert not ranks.on and "2 trainer ranks" in ranks.reason and ranks.device == CPU
    auto = plan_prefetch({}, streamed=True, autoscale=True, device=CPU)
    assert not auto.on and "--autoscale" in auto.reason
    assert on.describe()["on"] is True and on.describe()["depth"] == 4


def test_prefetch_to_device_ends_the_in_process_dataset_and_keeps_its_elements():
    plan = plan_prefetch({"device_prefetch": 2}, streamed=False, device=CPU)
    ds = _dataset()
    bundle = plan_bundle(ds.element_spec, 2)
    plain, staged = LocalSource(ds, bundle), LocalSource(ds, bundle, plan)
    for _ in range(3):
        a, b = plain.get_chunk(8, 1.0), staged.get_chunk(8, 1.0)
        assert (a.offset, a.steps) == (b.offset, b.steps) == (0, 2)
        np.testing.assert_array_equal(a.batches[0].numpy(), b.batches[0].numpy())
        assert b.batches[0].device.endswith("CPU:0")


def test_a_dataset_prefetch_to_device_refuses_is_prefetched_by_the_thread_to_its_end():
    ds = _dataset(8).map(lambda x, y: (x, None))  # a None label: prefetch_to_device's iterator refuses it
    plan = plan_prefetch({"device_prefetch": 2}, streamed=False, device=CPU)
    source = LocalSource(ds, plan_bundle(ds.element_spec, 2), plan)
    assert source.prefetch_plan.how == "thread" and "refused" in source.prefetch_plan.reason
    assert source.prefetch is not None
    firsts = []
    with pytest.raises(StopIteration):  # the finite dataset's end, as without the prefetch
        for _ in range(10):
            c = source.get_chunk(8, 1.0)
            assert c.batches[1] is None and c.batches[0].device.endswith("CPU:0") and c.steps == 2
            firsts.append(float(c.batches[0][0, 0, 0, 0]))
    assert firsts == [0.0, 16.0]  # 8 samples, 2 per batch, 2 batches per element
    assert source.describe()["device_prefetch_stats"]["elements"] == 2
    source.close()
    assert not source.prefetch.alive()


# ---------------------------------------------------------------------------- the mechanism
class _Counted:
    """A source of numbered numpy elements: ``pull(wait)`` as a DevicePrefetch asks, counting pulls;
    after ``n`` elements it raises ``end`` (StopIteration: the input's end) or never ends (None)."""

    def __init__(self, n: int | None, end: BaseException | None = None):
        self.n, self.end, self.pulled = n, end, 0

    def pull(self, wait: float) -> Any:
        if self.n is not None and self.pulled >= self.n:
            if self.end is None:
                time.sleep(wait)
                raise queue.Empty
            raise self.end
        self.pulled += 1
        return (self.pulled - 1, np.full((3,), self.pulled - 1, np.float32))


def _stage(item: Any) -> Any:
    i, x = item
    return i, to_device(x, CPU)


def test_the_thread_keeps_order_stays_within_depth_and_passes_the_end_through():
    src = _Counted(10, StopIteration())
    feed = DevicePrefetch(src.pull, _stage, depth=3)
    i, x = feed.get(5.0)
    assert i == 0 and isinstance(x, tf.Tensor) and x.device.endswith("CPU:0")
    time.sleep(0.3)  # the thread fills its queue and waits for room
    assert src.pulled <= 1 + 3 + 1  # taken + depth queued + one held while it waits
    got = [feed.get(5.0) for _ in range(9)]
    assert [i for i, _ in got] == list(range(1, 10))
    assert [float(x[0]) for _, x in got] == [float(k) for k in range(1, 10)]
    with pytest.raises(StopIteration):
        feed.get(5.0)
    with pytest.raises(StopIteration):  # again: the end is kept
        feed.get(0.1)
    feed._thread.join(1.0)
    assert not feed.alive()
    assert feed.stats.elements == 10 and feed.stats.bytes == 10 * 3 * 4 and feed.stats.wait_s >= 0


def test_an_error_comes_after_the_items_before_it_and_a_copy_error_too():
    feed = DevicePrefetch(_Counted(3, ValueError("boom")).pull, _stage, depth=1)
    assert [feed.get(5.0)[0] for _ in range(3)] == [0, 1, 2]
    with pytest.raises(ValueError, match="boom"):
        feed.get(5.0)
    with pytest.raises(ValueError, match="boom"):
        feed.get(0.1)

    def bad_stage(item: Any) -> Any:
        if item[0] == 1:
            raise RuntimeError("copy failed")
        return _stage(item)

    feed = DevicePrefetch(_Counted(None).pull, bad_stage, depth=2)
    assert feed.get(5.0)[0] == 0
    with pytest.raises(RuntimeError, match="copy failed"):
        feed.get(5.0)


def test_stop_ends_the_thread_whether_it_waits_for_room_or_for_an_element():
    full = DevicePrefetch(_Counted(None).pull, _stage, depth=1)  # never-ending: waits for room
    idle = DevicePrefetch(_Counted(0).pull, _stage, depth=1)  # nothing comes: waits in pull
    time.sleep(0.2)
    t = time.monotonic()
    for feed in (full, idle):
        feed.stop(2.0)
        assert not feed.alive()
    assert time.monotonic() - t < 1.0
    with pytest.raises(RuntimeError, match="stopped"):
        idle.get(0.2)
    with pytest.raises(queue.Empty):
        DevicePrefetch(_Counted(0).pull, _stage).get(0.2)  # nothing yet: the watchdog's cue


# ---------------------------------------------------------------------------- the chief's sources
def test_a_dataplane_source_prefetched_hands_out_the_same_batches_in_order(plane):  # noqa: F811
    rdv, receiver, sender, register = plane
    registry = {i: register(i, pid=sender(i).pid) for i in range(2)}
    source = DataplaneSource(rdv, receiver, registry)
    source.start_prefetch(plan_prefetch({"device_prefetch": 2}, streamed=True, device=CPU))
    assert source.prefetch is not None and source.prefetch.alive()
    got = _batches(source, max_steps=3)  # ends with InputStalled: every input worker stopped
    assert len(got) == 2 * 5 * BUNDLE
    for i in range(2):
        assert [s for w, s, _ in got if w == i] == list(range(5 * BUNDLE))
    d = source.describe()
    assert not source.prefetch.alive()
    assert d["device_prefetch_stats"]["elements"] == 10 and d["batches_per_worker"] == {"0": 20, "1": 20}
    assert d["device_prefetch_stats"]["bytes"] == 10 * (BUNDLE * 8 * 3 * 4 + BUNDLE * 8 * 4)
    source.close()


def test_a_dataplane_source_prefetched_stalls_and_fails_as_without(plane):  # noqa: F811
    rdv, receiver, sender, register = plane
    registry = {0: register(0, pid=sender(0, bundles=1).pid), 1: register(1, pid=4242)}
    source = DataplaneSource(rdv, receiver, registry)
    source.start_prefetch(plan_prefetch({}, streamed=True, device=CPU))
    assert [source.get(10.0)[0] for _ in range(BUNDLE)] == [0] * BUNDLE
    t = time.monotonic()
    with pytest.raises(InputStalled, match=r"no batch from any input worker for \d+ s .*input worker 1 on node2 "
                                           r"\(pid 4242\).*no batch yet"):
        source.get(1.5, "runconfig.input_timeout_secs")  # the watchdog, on this thread, while the thread receives
    assert time.monotonic() - t < 6
    (rdv.workers_dir / STREAM_ERROR.format(index=1)).write_text(json.dumps({"error": "InvalidArgumentError: bad"}))
    with pytest.raises(InputStalled, match=r"input worker 1 on node2 \(pid 4242\): its input pipeline failed"):
        source.get(30.0)  # raised on the prefetch thread by the watch, passed through
    source.close()
    assert not source.prefetch.alive()


def test_a_service_source_prefetched_keeps_each_workers_order(tmp_path):
    from csrun_runtime.tensorflow.service import start_dispatchers, start_worker_server

    servers, ports = start_dispatchers(1)
    address = f"localhost:{ports[0]}"
    worker = start_worker_server(address, "localhost")
    ds = tf.data.Dataset.range(40).map(lambda i: (tf.fill([2], tf.cast(i, tf.float32)), i))
    tf.data.experimental.service.register_dataset(service=f"grpc://{address}", dataset=ds,
                                                  dataset_id="csrun-train")
    rdv = Rendezvous(tmp_path, "1.0")
    rdv.reset()
    source = ServiceSource(rdv, [address], {0: {"node": "n0", "pid": 1}})
    source.start_prefetch(plan_prefetch({"device_prefetch": 2}, streamed=True, device=CPU))
    seen = []
    for _ in range(40):
        w, (x, y) = source.get(20.0)
        assert w == 0 and x.device.endswith("CPU:0")
        seen.append(int(y))
    assert seen == list(range(40))
    with pytest.raises(InputStalled):  # the stream's end: its error item came through, in order
        source.get(3.0)
    d = source.describe()
    assert d["device_prefetch_stats"]["elements"] >= 40 and d["batches_per_worker"] == {"0": 40}
    source.close()
    assert not source.prefetch.alive()
    del worker, servers
