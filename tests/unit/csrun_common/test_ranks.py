"""Several trainer ranks (csrun_common/ranks.py): the worker -> rank split, the ports and each
rank's variables."""
from __future__ import annotations

import json

import pytest

from csrun_common.ranks import BASE_PORT, PORT_SPAN, master_port, rank_key, trainer_env, worker_rank


def test_each_rank_gets_every_world_th_worker_and_the_split_covers_the_job():
    world, w = 4, 8
    by_rank: dict[int, list[int]] = {}
    for g in range(w):
        rank, slot = worker_rank(g, world)
        by_rank.setdefault(rank, []).append(g)
        assert slot == g // world
    assert by_rank == {0: [0, 4], 1: [1, 5], 2: [2, 6], 3: [3, 7]}
    assert worker_rank(5, 1) == (0, 5)
    with pytest.raises(ValueError):
        worker_rank(-1, 4)


def test_rank_keys_and_ports():
    assert rank_key("42.0", 3, 1) == "42.0" and rank_key("42.0", 3, 4) == "42.0.rank3"
    assert master_port("1234") == BASE_PORT + 1234 % PORT_SPAN
    assert master_port("77+1") == BASE_PORT + 77 and master_port(None) == BASE_PORT
    assert master_port("1234", 31000) == 31000


def test_trainer_env_is_torchruns_and_tf_configs():
    env = trainer_env(3, 1, 4, 2, ["10.0.0.1", "10.0.0.2"], 29600)
    assert {k: env[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                                "MASTER_PORT")} == {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4",
                                                    "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.1",
                                                    "MASTER_PORT": "29600"}
    assert json.loads(env["TF_CONFIG"]) == {
        "cluster": {"worker": ["10.0.0.1:29601", "10.0.0.1:29602", "10.0.0.2:29603", "10.0.0.2:29604"]},
        "task": {"type": "worker", "index": 3}}
    with pytest.raises(ValueError, match="need 2 node"):
        trainer_env(0, 0, 4, 2, ["10.0.0.1"], 29600)
    with pytest.raises(ValueError, match="outside"):
        trainer_env(4, 0, 4, 2, ["a", "b"], 29600)
