"""csrun_runtime/streams.py, the chief's merge of its input workers' streams, with a real
receiver bound on loopback (no sender: what the slots and the stall watch decide from what they
were told): bundles of a slot not opened yet held and handed out first once it is opened, the
autoscaler's pauses, the batches the chief may hold ahead, and :class:`InputStalled` naming each
worker when every one stopped or none sent for longer than the timeout."""
from __future__ import annotations

import re
import time
from types import SimpleNamespace

import pytest

from csrun_runtime.dataplane import Receiver
from csrun_runtime.rendezvous import Rendezvous
from csrun_runtime.streams import InputStalled, StreamMerge, StreamSlots, announce_stopped, raise_if_stalled


@pytest.fixture()
def receiver():
    r = Receiver("tcp://127.0.0.1:0", window_bytes=1000, window_batches=5)
    yield r
    r.close()


def bundle(worker: int, n: int = 4, nbytes: int = 400) -> SimpleNamespace:
    """What the slots read of a received bundle: its worker, batches and bytes."""
    return SimpleNamespace(worker=worker, n=n, nbytes=nbytes)


def test_a_slot_not_opened_is_held_then_handed_out_first_in_order(receiver):
    slots = StreamSlots(receiver, opened=1)
    assert slots.admit(bundle(0)) and slots.bundle_n == {0: 4}
    early = [bundle(2, n=1), bundle(2, n=2)]
    assert [slots.admit(b) for b in early] == [False, False] and slots.held() is None
    slots.open(2)
    assert [slots.held(), slots.held(), slots.held()] == [*early, None] and slots.opened == {0, 2}


def test_pauses_and_the_batches_held_ahead(receiver):
    slots = StreamSlots(receiver, opened=2)
    slots.admit(bundle(0, n=4, nbytes=400))  # 100 bytes a batch: 10 in the byte window, 5 in the batch window
    slots.pause(1)
    assert slots.paused == {1}
    slots.resume(1)
    assert slots.paused == set()
    assert slots.buffered_batches({0}) == 5 + 4  # the batch window, then one bundle
    assert slots.buffered_batches({0, 1}) == 9 + 1 + 1  # worker 1, nothing seen yet: one bundle of one batch


def test_input_stalled_names_every_worker(tmp_path, receiver):
    rdv = Rendezvous(tmp_path, "9.0")
    rdv.reset()
    merge = StreamMerge(rdv, receiver, {0: {"node": "node2", "pid": 11}, 1: {"node": "node3", "pid": 12}}, 2)
    for i in (0, 1):
        rdv.touch(f"workers/{i}")
    raise_if_stalled(merge, time.monotonic(), 60.0, "runconfig.input_timeout_secs")  # nothing to say yet
    with pytest.raises(InputStalled) as e:
        raise_if_stalled(merge, time.monotonic() - 5, 2.0, "runconfig.input_timeout_secs")
    assert re.fullmatch(r"no batch from any input worker for 5 s \(runconfig.input_timeout_secs = 2\): "
                        r"input worker 0 on node2 \(pid 11\): heartbeat 0 s ago, 0 batches, no batch yet; "
                        r"input worker 1 on node3 \(pid 12\): heartbeat 0 s ago, 0 batches, no batch yet", str(e.value))
    announce_stopped(merge, 0, ": no heartbeat for 9 s")
    announce_stopped(merge, 1, ": its stream ended")
    assert merge.stopped() == {0, 1} and merge.streaming() == set()
    with pytest.raises(InputStalled, match=r"^every input worker stopped and no batch is left: input worker 0 on "
                                           r"node2 \(pid 11\) \(stopped\): "):
        raise_if_stalled(merge, time.monotonic() - 2, 60.0, "runconfig.input_timeout_secs")
