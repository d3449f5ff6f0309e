"""analyzer/analyze.py: the report's target for several trainer ranks (the main command's steps run in
tests/integration/test_analyzer_*)."""
from __future__ import annotations

from analyzer import analyze as A


def test_the_target_is_the_per_rank_rate_times_the_world_size():
    assert A.world_target(1000.0, "--target-samples-per-sec", 1) == \
        {"samples_per_sec": 1000.0, "source": "--target-samples-per-sec"}
    world = A.world_target(1000.0, "--target-samples-per-sec", 4)
    assert world["samples_per_sec"] == 4000.0
    assert world["per_rank_samples_per_sec"] == 1000.0 and world["world_size"] == 4
    assert A.world_target(None, "none", 4)["samples_per_sec"] is None
