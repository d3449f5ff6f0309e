"""The input streams' positions (csrun_runtime/position.py, issue 41): the merge's stream order
(duplicates dropped, gaps counted), the checkpoint's position file, the restore's rules, the
rendezvous hand-over to a replacement, and the merge over a real receiver and sender."""
from __future__ import annotations

import logging
import threading
import time

import numpy as np
import pytest

from csrun_runtime import position
from csrun_runtime.position import InputPositions
from csrun_runtime.rendezvous import Rendezvous


def test_the_merge_hands_out_each_batch_of_a_stream_once_in_order():
    p = InputPositions(2, {0: 10})
    assert p.accept(0, 10, 4) == 0 and p.next_index(0) == 14
    assert p.accept(0, 10, 4) == 4  # a duplicate (an old attempt's bundle after its replacement's)
    assert p.accept(0, 12, 4) == 2 and p.next_index(0) == 16  # overlap: its tail only
    assert p.accept(1, None, 3) == 0 and p.next_index(1) == 3  # untagged: taken as the next
    assert p.accept(1, 5, 1) == 0 and p.next_index(1) == 6  # a gap of 2: counted, the bundle taken
    rec = p.describe()
    assert rec["duplicates_dropped"] == {"0": 6, "1": 0} and rec["batches_missing"] == {"0": 0, "1": 2}


def test_trained_batches_move_the_committed_position_and_other_keys_are_ignored():
    p = InputPositions(3, {1: 7}, rank=1, world_size=2)
    p.trained(1, 5)
    p.trained("in-process", 3)
    p.trained(None, 1)
    # slot s of rank 1 of 2 is stream 2 s + 1
    assert p.committed() == {1: 0, 3: 12, 5: 0} and p.started() == {1: 0, 3: 7, 5: 0}


def test_the_position_file_is_read_back_and_pruned_with_its_checkpoint(tmp_path):
    position.write_sidecar(tmp_path, 100, {0: 40, 1: 38}, 2)
    assert position.read_sidecar(tmp_path, 100)["streams"] == {"0": 40, "1": 38}
    assert position.read_sidecar(tmp_path, 200) is None
    (tmp_path / "model-ckpt-200.pt").write_text("x")
    position.write_sidecar(tmp_path, 200, {0: 80, 1: 75}, 2)
    position.write_sidecar(tmp_path, 300, {0: 1, 1: 1}, 2)  # its checkpoint not written yet: kept
    position.prune_sidecars(tmp_path)
    assert sorted(p.name for p in tmp_path.glob("*.input.json")) == ["model-ckpt-200.input.json",
                                                                     "model-ckpt-300.input.json"]


def test_restore_takes_the_checkpoints_positions_for_this_ranks_slots(tmp_path):
    position.write_sidecar(tmp_path, 50, {0: 5, 1: 6, 2: 7, 3: 8}, 4)
    p = InputPositions.restore(tmp_path, 50, {}, slots=2, rank=1, world_size=2)
    assert p.restored_step == 50 and p.next_index(0) == 6 and p.next_index(1) == 8 and p.note == ""


@pytest.mark.parametrize("step, rc, slots, says", [
    (0, {}, 2, ""),
    (60, {}, 2, "has no input positions"),
    (50, {}, 3, "written by 2 input workers, this run has 3"),
    (50, {"checkpoint_path": "/elsewhere"}, 2, "checkpoint of another run"),
])
def test_restore_starts_every_stream_at_its_beginning_and_says_why(tmp_path, caplog, step, rc, slots, says):
    position.write_sidecar(tmp_path, 50, {0: 5, 1: 6}, 2)
    p = InputPositions.restore(tmp_path, step, rc, slots=slots)
    assert p.restored_step is None and [p.next_index(i) for i in range(slots)] == [0] * slots
    assert says in p.note and (says in caplog.text if says else "input positions" not in caplog.text)


def test_a_replacement_is_told_the_next_index_and_attempt_zero_the_published_one(tmp_path):
    rdv = Rendezvous(tmp_path, "7.0")
    rdv.reset()
    p = InputPositions(2, {0: 3, 1: 9})
    p.publish(rdv)
    assert position.wait_position(rdv, 1, 0, lambda: None, 1.0) == 9
    p.accept(1, 9, 4)
    done = threading.Timer(0.3, lambda: p.answer(rdv, 1, 2))
    done.start()
    assert position.wait_position(rdv, 1, 2, lambda: None, 5.0) == 13  # waited for its own attempt
    with pytest.raises(TimeoutError, match="input worker 0 \\(attempt 1\\)"):
        position.wait_position(rdv, 0, 1, lambda: None, 0.3)


def test_the_chief_says_where_every_stream_resumed_once(tmp_path, caplog):
    rdv = Rendezvous(tmp_path, "7.0")
    rdv.reset()
    p = InputPositions(2, {0: 30, 1: 31}, restored_step=400)
    caplog.set_level("INFO", "csrun.runtime")
    position.report_resumed(rdv, 0, 0, 30, 0.01, "skipped at the sampler, no sample read", 1, 4)
    p.poll_resumed(rdv, range(2))
    assert "input resumed" not in caplog.text  # worker 1 has not said yet
    position.report_resumed(rdv, 1, 0, 31, 0.02, "skipped at the sampler, no sample read", 1, 5)
    p.poll_resumed(rdv, range(2))
    p.poll_resumed(rdv, range(2))
    assert caplog.text.count("input resumed at the positions of checkpoint model-ckpt-400: worker 0 at batch 30 "
                             "(pass 1, batch 4), 0.01 s; worker 1 at batch 31 (pass 1, batch 5), 0.02 s; "
                             "fast-forward 0.02 s at most") == 1
    position.report_resumed(rdv, 1, 1, 45, 0.5, "read and discarded 45 batch(es): an IterableDataset", None, None)
    p.poll_resumed(rdv, range(2))
    p.poll_resumed(rdv, range(2))
    assert caplog.text.count("input worker 1 (replacement 1) resumed its stream at batch 45 in 0.50 s "
                             "(read and discarded 45 batch(es)") == 1
    assert [(r["worker"], r["attempt"]) for r in p.describe()["resumes"]] == [(0, 0), (1, 0), (1, 1)]


def test_a_bundle_loses_its_tag_and_leading_duplicates_without_a_copy():
    from csrun_runtime.dataplane import Bundle, flatten

    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    nest = position.tag({"x": x, "y": np.arange(4)}, 20, 4)
    tree, leaves = flatten(nest)
    b = Bundle(worker=1, attempt=0, n=4, nbytes=sum(a.nbytes for a in leaves), nest=nest, _tree=tree, _leaves=leaves)
    assert position.untag(b.nest)[0] == 20
    c = position.untag_bundle(b, 1)
    assert c.n == 3 and list(c.nest["y"]) == [1, 2, 3] and np.shares_memory(c.nest["x"], x)
    assert [list(bt["y"].reshape(-1)) for bt in c.batches()] == [[1], [2], [3]]
    assert position.untag_bundle(Bundle(worker=1, attempt=0, n=1, nbytes=4, nest=x)).nest is x


def test_the_merge_over_a_real_receiver_drops_an_old_attempts_duplicates(tmp_path):
    """A worker's bundles 0..3 arrive, then its replacement (attempt 1) restarts at 2: the
    merge hands out 0, 1, 2, 3 (attempt 0) and then 4, 5 of attempt 1, dropping its 2, 3."""
    from csrun_runtime.dataplane import Receiver, Sender
    from csrun_runtime.streams import StreamMerge

    rdv = Rendezvous(tmp_path, "1.0")
    rdv.reset()
    receiver = Receiver("tcp://127.0.0.1:0")
    merge = StreamMerge(rdv, receiver, {}, 1, positions=InputPositions(1))

    def send(attempt: int, first: int, n: int) -> None:
        with Sender(receiver.endpoint, 0, attempt, bundle=1) as s:
            for k in range(first, first + n):
                s.send_bundle(position.tag(np.full((1, 2), k), k, 1), 1, timeout=10)

    t = threading.Thread(target=send, args=(0, 0, 4))
    t.start()
    got = [int(merge.next_bundle(10).nest[0, 0]) for _ in range(4)]
    t.join()
    time.sleep(0.2)
    assert merge.positions is not None and merge.positions.answer(rdv, 0, 1) == 4
    t = threading.Thread(target=send, args=(1, 2, 4))
    t.start()
    got += [int(merge.next_bundle(10).nest[0, 0]) for _ in range(2)]
    t.join()
    receiver.close()
    assert got == [0, 1, 2, 3, 4, 5] and merge.positions.describe()["duplicates_dropped"] == {"0": 2}
    assert position.wait_position(rdv, 0, 1, lambda: None, 1.0) == 4


def test_a_stateful_streams_last_state_at_its_position_is_committed_and_handed_on(tmp_path):
    rdv = Rendezvous(tmp_path, "7.0")
    rdv.reset()
    p = InputPositions(1, {0: 4}, {0: {"at": 2, "state": {"pos": 20}}})
    p.publish(rdv)
    assert position.start_state(rdv, 0, 0) == {"at": 2, "state": {"pos": 20}}
    for first, pos in ((4, 40), (8, 80), (12, 120)):
        p.snapshot(0, first, {"pos": pos})
        p.accept(0, first, 4)
    p.trained(0, 7)  # position 11: the state before batch 8 is the last at or before it
    assert p.committed() == {0: 11} and p.committed_states() == {0: {"at": 8, "state": {"pos": 80}}}
    position.commit(p, tmp_path, 30, None, True)
    assert position.read_sidecar(tmp_path, 30)["states"] == {"0": {"at": 8, "state": {"pos": 80}}}
    assert InputPositions.restore(tmp_path, 30, {}, slots=1).committed_states() == {0: {"at": 8, "state": {"pos": 80}}}
    p.answer(rdv, 0, 1)  # a replacement starts at 16, the handed-out end: its state is the one before 12
    assert position.start_state(rdv, 0, 1) == {"at": 12, "state": {"pos": 120}}
    nest = position.tag({"x": np.zeros((2, 1))}, 5, 2, {"pos": 50})
    assert position.state_of(nest) == {"pos": 50} and position.untag(nest)[0] == 5


def test_a_chief_without_input_workers_says_its_own_pipeline_restarts_after_a_restore(caplog):
    caplog.set_level(logging.INFO, logger="csrun.runtime")
    assert position.say_in_process_restart(0) is False and not caplog.records  # a fresh run: nothing to say
    assert position.say_in_process_restart(400) is True
    (rec,) = caplog.records
    assert rec.levelno == logging.WARNING and "starts at its beginning after restoring global step 400" in rec.message
