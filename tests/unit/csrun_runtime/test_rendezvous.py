"""csrun_runtime.rendezvous: owner-only (issue 45, docs/SECURITY.md): its directories 0700, its
files 0600, also a .csrun/ an older csrun left 0755; csrun_common.atomic's private files."""
import os
import stat

from csrun_common.atomic import write_json
from csrun_runtime.rendezvous import Heartbeat, Rendezvous


def _mode(p) -> int:
    return stat.S_IMODE(os.stat(p).st_mode)


def test_directories_are_0700_and_files_0600(tmp_path):
    (tmp_path / ".csrun").mkdir(mode=0o755)
    rdv = Rendezvous(tmp_path, "7.0")
    rdv.reset()
    assert [_mode(p) for p in (tmp_path / ".csrun", rdv.dir, rdv.workers_dir)] == [0o700] * 3
    rdv.publish_dispatchers(["tcp://h:1"], {"transport": "dataplane"})
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
