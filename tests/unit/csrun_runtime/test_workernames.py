"""One numbering of the input workers (csrun_runtime/workernames.py, issue 44): with several
trainer ranks every message and performance.json name a worker by its job-wide index, its rank's
slot beside it; with one rank nothing changes."""
from __future__ import annotations

import pytest

from csrun_runtime import workernames


@pytest.fixture()
def rank_one_of_four():
    workernames.set_rank(1, 4)
    yield
    workernames.set_rank(0, 1)


def test_one_rank_names_the_slot_as_it_is():
    workernames.set_rank(0, 1)
    assert workernames.name(3) == "input worker 3" and workernames.job_index(3) == 3
    desc = {"batches_per_worker": {"0": 5}, "workers_lost": [{"index": 0}]}
    assert workernames.renumber(desc) == desc


def test_a_ranks_slot_is_named_by_its_job_wide_index(rank_one_of_four):
    # 8 workers, 4 ranks: rank 1's slots 0 and 1 are workers 1 and 5 (csrun_common.ranks.worker_rank)
    assert [workernames.job_index(s) for s in (0, 1)] == [1, 5]
    assert workernames.name(1) == "input worker 5 (rank 1's slot 1)"


def test_a_ranks_record_is_renumbered_job_wide(rank_one_of_four):
    desc = {"num_workers": 2, "batches_per_worker": {"0": 5, "1": 7}, "worker_nodes": {"0": "n3", "1": "n4"},
            "workers_paused": [1], "workers_lost": [{"index": 1, "node": "n4", "pid": 9}],
            "workers_replaced": [{"index": 1, "attempt": 1}], "workers_given_up": [],
            "data_plane": {"endpoint": "tcp://x", "bytes_per_worker": {"0": 10, "1": 20}},
            "in_process": {"in-process": 3}}
    out = workernames.renumber(desc)
    assert out["batches_per_worker"] == {"1": 5, "5": 7} and out["worker_nodes"] == {"1": "n3", "5": "n4"}
    assert out["workers_paused"] == [5] and out["num_workers"] == 2
    assert out["workers_lost"] == [{"index": 5, "rank": 1, "slot": 1, "node": "n4", "pid": 9}]
    assert out["workers_replaced"] == [{"index": 5, "rank": 1, "slot": 1, "attempt": 1}]
    assert out["data_plane"] == {"endpoint": "tcp://x", "bytes_per_worker": {"1": 10, "5": 20}}
    assert out["in_process"] == {"in-process": 3}  # not a worker mapping: left alone
    assert desc["batches_per_worker"] == {"0": 5, "1": 7}  # the source's own record is not changed
