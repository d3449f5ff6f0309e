"""csrun_runtime/rendezvous.py: the files of one job step through which the chief and its input
workers find each other — endpoints, registrations, reports, the deaths a supervisor records, an
adoption order claimed by exactly one claimant, heartbeats and their age, ``done.json`` — and a
chief's reset moving a stale directory of the same key aside; all of it owner-only (issue 45,
docs/SECURITY.md): directories 0700, files 0600, also a .csrun/ an older csrun left 0755."""
from __future__ import annotations

import os
import stat
import threading
import time

from csrun_common.atomic import write_json
from csrun_runtime import rendezvous
from csrun_runtime.rendezvous import Heartbeat, Rendezvous


def test_the_chief_and_its_workers_meet_in_the_files_of_their_step(tmp_path):
    rdv = Rendezvous(tmp_path, "41.0")
    rdv.reset()
    assert rdv.dir == tmp_path / ".csrun" / "41.0" and rdv.endpoints() is None and rdv.done() is None
    rdv.publish_endpoints(["tcp://node1:5000", "tcp://node1:5000"], {"transport": "dataplane", "num_workers": 2})
    got = rdv.endpoints()
    assert got["endpoints"] == ["tcp://node1:5000"] * 2 and got["transport"] == "dataplane" and got["created"] > 0
    rdv.register_worker(1, {"node": "node3", "pid": 7, "attempt": 0})
    assert rdv.worker(1) == {"node": "node3", "pid": 7, "attempt": 0} and rdv.worker(0) is None
    rdv.write_report(1, {"status": "ok", "elements": 12})
    rdv.write_report(0, {"status": "ok", "elements": 10})
    assert rdv.reports() == {0: {"status": "ok", "elements": 10}, 1: {"status": "ok", "elements": 12}}
    rdv.mark_done("stopped", "SIGTERM", steps=5)
    done = rdv.done()
    assert (done["status"], done["reason"], done["steps"]) == ("stopped", "SIGTERM", 5)


def test_deaths_accumulate_and_one_claimant_wins_an_adoption(tmp_path):
    rdv = Rendezvous(tmp_path, "42.0")
    rdv.reset()
    assert rdv.lost(2) == []
    rdv.mark_lost(2, {"rc": -9})
    rdv.mark_lost(2, {"rc": 1})
    assert rdv.lost(2) == [{"rc": -9}, {"rc": 1}]
    rdv.order_adoption(2, {"attempt": 3})
    assert rdv.adoption_orders() == {2: {"attempt": 3}}
    wins: list[bool] = []
    threads = [threading.Thread(target=lambda k=k: wins.append(rdv.claim_adoption(2, 3, {"task": k})))
               for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(wins) == [False] * 7 + [True]
    assert rdv.claim_adoption(2, 4, {"task": 0})  # the next attempt is a new order


def test_heartbeats_and_their_age(tmp_path, monkeypatch):
    rdv = Rendezvous(tmp_path, "43.0")
    assert rdv.age("workers/0") is None
    monkeypatch.setattr(rendezvous, "HEARTBEAT_SECS", 0.05)
    beat = Heartbeat(rdv, "workers/0").start()
    path = rdv.dir / "workers" / "0.alive"
    old = time.time() - 60
    os.utime(path, (old, old))
    deadline = time.monotonic() + 5
    while rdv.age("workers/0") > 30 and time.monotonic() < deadline:
        time.sleep(0.02)
    beat.stop()
    assert rdv.age("workers/0") < 30  # touched again by the thread


def test_a_reset_moves_a_stale_directory_of_the_same_key_aside(tmp_path):
    first = Rendezvous(tmp_path, "44.0")
    first.reset()
    first.mark_done("ok")
    again = Rendezvous(tmp_path, "44.0")
    again.reset()
    assert again.done() is None and again.workers_dir.is_dir()
    stale = [p.name for p in (tmp_path / ".csrun").iterdir() if p.name.startswith("44.0.stale-")]
    assert len(stale) == 1 and (tmp_path / ".csrun" / stale[0] / "done.json").is_file()


def _mode(p) -> int:
    return stat.S_IMODE(os.stat(p).st_mode)


def test_directories_are_0700_and_files_0600(tmp_path):
    (tmp_path / ".csrun").mkdir(mode=0o755)
    rdv = Rendezvous(tmp_path, "7.0")
    rdv.reset()
    assert [_mode(p) for p in (tmp_path / ".csrun", rdv.dir, rdv.workers_dir)] == [0o700] * 3
    rdv.publish_endpoints(["tcp://h:1"], {"transport": "dataplane"})
    rdv.register_worker(0, {"pid": 1})
    rdv.mark_done("ok")
    rdv.write("chief.json", {"steps": 1})
    assert rdv.claim_adoption(0, 1, {"pid": 2})
    Heartbeat(rdv, "workers/0").start().stop()
    files = [p for p in rdv.dir.rglob("*") if p.is_file()]
    assert len(files) == 6 and all(_mode(p) == 0o600 for p in files), {p.name: oct(_mode(p)) for p in files}


def test_a_worker_touching_first_creates_owner_only_directories(tmp_path):
    Rendezvous(tmp_path, "8.0").touch("workers/3")
    assert _mode(tmp_path / ".csrun" / "8.0" / "workers") == 0o700 and _mode(tmp_path / ".csrun") == 0o700
    assert _mode(tmp_path / ".csrun" / "8.0" / "workers" / "3.alive") == 0o600


def test_a_private_file_is_0600_whatever_the_umask(tmp_path):
    old = os.umask(0o002)
    try:
        write_json(tmp_path / "a.json", {})
        write_json(tmp_path / "b.json", {}, private=True)
        assert _mode(tmp_path / "a.json") == 0o664 and _mode(tmp_path / "b.json") == 0o600
    finally:
        os.umask(old)
