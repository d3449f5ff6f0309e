"""csrun_common/shardplan_schema.py: the plan file's loader/validator (stdlib only), the
worker-count check the job runs, and the input-worker formula of docs/CONTRACT.md."""
from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from csrun_common import shardplan_schema as schema

GOOD = {
    "schema": "csrun.shard_plan", "version": 1, "num_workers": 2, "mode": "shard",
    "balance_by": "bytes", "base_seed": 0,
    "workers": [
        {"index": 0, "files": ["/d/a", "/d/b"], "bytes": 30, "records": None, "seed": 0},
        {"index": 1, "files": ["/d/c"], "bytes": 25, "records": None, "seed": 11},
    ],
}


def _write(tmp_path, obj, name="plan.json"):
    p = tmp_path / name
    p.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return p


def test_load_good_plan(tmp_path):
    plan = schema.load_plan(_write(tmp_path, GOOD))
    assert plan == GOOD
    assert schema.worker_assignment(plan, 1) == {"index": 1, "files": ["/d/c"], "seed": 11,
                                                 "bytes": 25, "records": None}
    with pytest.raises(ValueError, match="input worker index 2: outside the shard plan's 0..1"):
        schema.worker_assignment(plan, 2)


def _mutate(path, value):
    bad = copy.deepcopy(GOOD)
    cur = bad
    for k in path[:-1]:
        cur = cur[k]
    if value is KeyError:
        del cur[path[-1]]
    else:
        cur[path[-1]] = value
    return bad


@pytest.mark.parametrize("path,value,needle", [
    (("schema",), "other", "schema: expected 'csrun.shard_plan', got 'other'"),
    (("version",), 2, "version: expected 1, got 2"),
    (("num_workers",), 0, "num_workers: expected an integer >= 1, got 0"),
    (("num_workers",), True, "num_workers: expected an integer >= 1, got True"),
    (("num_workers",), 3, "workers: expected 3 entries (num_workers), got '2 entries'"),
    (("mode",), "mirror", "mode: expected one of shard, replicate, got 'mirror'"),
    (("balance_by",), "lines", "balance_by: expected one of bytes, records, got 'lines'"),
    (("workers",), KeyError, "workers: expected a list, got 'NoneType'"),
    (("workers", 1, "index"), 5, "workers[1].index: expected 1 (its position), got 5"),
    (("workers", 1, "files"), [], "workers[1].files: expected a non-empty list"),
    (("workers", 1, "files"), ["/d/c", 3], "workers[1].files[1]: expected a non-empty path string, got 3"),
    (("workers", 1, "files"), ["/d/a"], "workers[1].files[0]: already assigned to workers[0]"),
    (("workers", 0, "bytes"), -1, "workers[0].bytes: expected an integer >= 0, got -1"),
    (("workers", 0, "records"), "7", "workers[0].records: expected an integer >= 0 or null, got '7'"),
    (("workers", 1, "seed"), 0, "workers[1].seed: same as workers[0].seed"),
    (("workers", 1, "seed"), 2 ** 63, "workers[1].seed: expected an integer in [0, 2**63)"),
])
def test_errors_name_field_and_value(tmp_path, path, value, needle):
    p = _write(tmp_path, _mutate(path, value))
    with pytest.raises(ValueError) as exc:
        schema.load_plan(p)
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith(f"shard plan {p}: ")
    assert needle in msg


def test_file_errors(tmp_path):
    with pytest.raises(ValueError, match="no such file"):
        schema.load_plan(tmp_path / "missing.json")
    with pytest.raises(ValueError, match="not valid JSON"):
        schema.load_plan(_write(tmp_path, "{nope"))
    with pytest.raises(ValueError, match="is a directory"):
        schema.load_plan(tmp_path)


def test_replicate_mode_rules(tmp_path):
    rep = copy.deepcopy(GOOD)
    rep["mode"] = "replicate"
    with pytest.raises(ValueError, match=r"workers\[1\].files: differs from workers\[0\].files"):
        schema.validate_plan(rep)
    rep["workers"][1]["files"] = ["/d/b", "/d/a"]
    assert schema.validate_plan(rep) is rep


def test_check_plan_workers_message():
    schema.check_plan_workers(GOOD, 2)
    with pytest.raises(ValueError) as exc:
        schema.check_plan_workers(GOOD, 7, source="/x/plan.json")
    assert str(exc.value).startswith("shard plan /x/plan.json is for 2 workers but the job has 7 input workers")
    with pytest.raises(ValueError, match="is for 2 workers but the job has 1 input workers"):
        schema.check_plan_workers(GOOD, 1)


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 40), st.integers(1, 16), st.integers(0, 39))
def test_input_worker_count_matches_launcher_layout(n, t, s):
    layout = pytest.importorskip("launcher.layout")
    if s and s >= n:
        with pytest.raises(ValueError, match="--single-task-nodes"):
            schema.input_worker_count(n, t, s)
        return
    expected = layout.plan_layout(n, t, None, single_task_nodes=s, node_cpus=64).num_input_workers
    assert schema.input_worker_count(n, t, s) == expected


def test_input_worker_count_contract_examples():
    assert schema.input_worker_count(1, 1) == 0
    assert schema.input_worker_count(1, 4) == 3
    assert schema.input_worker_count(3, 4) == 11
    assert schema.input_worker_count(5, 4, 2) == 1 + 3 * 4
    with pytest.raises(ValueError, match="--total-nodes 0"):
        schema.input_worker_count(0, 1)


def test_schema_module_is_stdlib_only():
    code = ("import sys, csrun_common.shardplan_schema as s; "
            "bad = [m for m in ('numpy', 'analyzer', 'tensorflow') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
