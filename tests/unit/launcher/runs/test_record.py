"""launcher/runs/record.py: where the record lives (the index under the state directory, and
beside the model_dir), run ids a person can type, finding a run by run id, job id or model_dir,
and the one-line error naming the closest ids."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from csrun_common.errors import CsrunError
from launcher.runs.record import ALPHABET, RunRecord, RunStore, new_run_id, state_dir

from .conftest import make_run


def test_state_dir_configured_xdg_or_home():
    assert state_dir("", {"XDG_STATE_HOME": "/x/state", "HOME": "/h"}) == Path("/x/state/csrun")
    assert state_dir("", {"HOME": "/h"}) == Path("/h/.local/state/csrun")
    assert state_dir("~/runs", {"XDG_STATE_HOME": "/x"}) == Path("~/runs").expanduser()


def test_run_ids_are_typable_and_unique():
    taken = {"wse-1128-aaaa"}
    rid = new_run_id("csrun_wse", lambda r: r in taken)
    assert re.fullmatch(rf"wse-\d{{4}}-[{ALPHABET}]{{4}}", rid) and rid not in taken
    assert new_run_id("csrun_cpu", lambda r: False).startswith("cpu-")


def test_both_copies_and_the_lock(store, tmp_path):
    rec = make_run(store, tmp_path)
    beside = RunStore.model_dir_path(rec.model_dir, rec.run_id)
    assert not beside.exists() and not Path(rec.model_dir).exists()  # a launch makes no model_dir
    Path(rec.model_dir).mkdir(parents=True)  # the run made it
    store.save(rec)
    assert json.loads(beside.read_text()) == json.loads(store.index_path(rec.run_id).read_text())
    store.update(rec.run_id, lambda r: r.jobs.append("58"))
    assert store.load(rec.run_id).jobs == ["57", "58"]
    assert json.loads(beside.read_text())["jobs"] == ["57", "58"]
    store.index_path(rec.run_id).unlink()  # another user's index: the model_dir's copy still answers
    assert store.load(rec.run_id, rec.model_dir).jobs == ["57", "58"]


def test_a_later_versions_unknown_keys_are_ignored():
    data = {"run_id": "r", "kind": "csrun_wse", "argv": [], "command": [], "submit_dir": "/", "path": "sbatch",
            "submitted_at": 1.0, "job_name": "csrun_wse", "log_root": "/l", "something_new": 1}
    assert RunRecord.from_json(data).run_id == "r"


def test_find_by_run_id_job_id_and_model_dir(store, tmp_path):
    old = make_run(store, tmp_path, "wse-1127-aaaa", jobs=("40",))
    new = make_run(store, tmp_path, "wse-1128-bbbb", jobs=("41",))
    assert store.find("wse-1127-aaaa").run_id == old.run_id
    assert store.find("41").run_id == new.run_id and store.find("41+1").run_id == new.run_id
    assert store.find(new.model_dir).run_id == new.run_id  # from the index: the model_dir does not exist
    assert [r.run_id for r in store.all()] == [new.run_id, old.run_id]  # newest first
    Path(old.model_dir).mkdir(parents=True)
    store.save(old)
    store.index_path(old.run_id).unlink()
    assert store.find(old.model_dir).run_id == old.run_id  # from the copy beside it


def test_an_unknown_run_names_the_closest(store, tmp_path):
    make_run(store, tmp_path, "wse-1128-k3m9")
    make_run(store, tmp_path, "wse-1128-zzzz")
    with pytest.raises(CsrunError) as e:
        store.find("wse-1128-k3m8")
    assert str(e.value).startswith("RUN 'wse-1128-k3m8': no such run id, job id or model_dir (closest: wse-1128-k3m9")
    assert "\n" not in str(e.value) and e.value.exit_code == 2
    with pytest.raises(CsrunError, match=r"no run recorded in this model_dir"):
        (tmp_path / "empty" / ".csrun-runs").mkdir(parents=True)
        store.find(str(tmp_path / "empty"))


def test_nothing_recorded_says_where_it_looked(store):
    with pytest.raises(CsrunError, match=r"no runs recorded in .*state/csrun/runs"):
        store.find("wse-1128-k3m9")
