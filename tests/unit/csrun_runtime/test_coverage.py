"""csrun_runtime/coverage.py's pure verdicts: sharded, replicated, overlap; a worker without files;
plan files outside the entry."""
from __future__ import annotations

import pytest

from csrun_runtime.coverage import check_job_files, coverage_of_files

COUNTS = range(1, 65)


@pytest.mark.parametrize("workers", COUNTS)
def test_coverage_verdicts(workers):
    files = [f"/d/f{k:03d}" for k in range(80)]
    sharded = {i: files[i::workers] for i in range(workers)}
    expected = "replicated" if workers == 1 else "sharded"  # one worker reads the whole set
    assert coverage_of_files(sharded, files).verdict == expected
    if workers >= 2:
        replicated = {i: list(reversed(files)) if i % 2 else files for i in range(workers)}
        assert coverage_of_files(replicated, files).verdict == "replicated"
        overlap = dict(sharded)
        overlap[1] = sharded[1] + sharded[0][:1]
        cov = coverage_of_files(overlap, files, shards=True)
        assert cov.verdict == "overlap" and "read by more than one" in cov.problems[0]
        assert "tf.data.Dataset.list_files" in cov.problems[0]
        unread = dict(sharded)
        unread[0] = sharded[0][1:]
        cov = coverage_of_files(unread, files)
        assert cov.verdict == "overlap" and "read by none" in cov.problems[0]
        assert "shard-plan" in cov.problems[0]


def test_a_worker_without_files_is_a_problem():
    cov = coverage_of_files({0: ["/a"], 1: ["/b"], 2: []}, ["/a", "/b"])
    assert cov.verdict == "overlap" and "read no file" in cov.problems[0]


def test_plan_coverage_names_files_outside_the_entry():
    plan = {"num_workers": 2, "workers": [{"index": 0, "files": ["/d/a"], "seed": 0},
                                          {"index": 1, "files": ["/d/b"], "seed": 1}]}
    assert check_job_files({0: ["/d/a"], 1: ["/d/b"]}, plan, None).verdict == "planned"
    cov = check_job_files({0: ["/d/a", "/d/b"], 1: ["/d/b"]}, plan, None)
    assert cov.verdict == "overlap" and "outside its shard-plan entry" in cov.problems[0]
