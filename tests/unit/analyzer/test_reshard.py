"""Resharding: the record multiset is preserved, shards are balanced, the output
appears all at once, never overwrites, and an interrupted run (exception, SIGKILL)
leaves nothing behind and the input untouched."""
from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analyzer import reshard as rs
from csrun_common import tfrecord as tfr
from tests.unit.paths import REPO


def make_sources(root: Path, files: list[list[bytes]]) -> list[str]:
    src = root / "src"
    src.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, recs in enumerate(files):
        p = src / f"in-{i:03d}.tfrecord"
        tfr.write_records(p, recs)
        paths.append(str(p))
    return paths


def tree_hashes(d: Path) -> dict:
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(d.rglob("*")) if p.is_file()}


def leftovers(parent: Path, name: str) -> list[str]:
    return [n for n in os.listdir(parent) if n.startswith(f".{name}.reshard-")]


records_st = st.lists(st.lists(st.binary(max_size=64), max_size=12), min_size=1, max_size=6)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records_st, st.integers(1, 12))
def test_reshard_preserves_multiset_and_balances(files, n):
    total = sum(len(f) for f in files)
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        srcs = make_sources(root, files)
        before = tree_hashes(root / "src")
        out = root / "parent" / "out"
        if total < n:
            with pytest.raises(ValueError, match=f"--num-shards {n}: the sources hold only {total}"):
                rs.reshard(srcs, n, str(out))
            assert not out.exists() and leftovers(out.parent, "out") == []
            return
        res = rs.reshard(srcs, n, str(out))
        assert res.verified and res.records == total and res.num_shards == n
        names = sorted(os.listdir(out))
        assert names == [rs.shard_name("shard", i, n) for i in range(n)]
        got = Counter(r for p in res.shard_paths for r in tfr.read_records(p, verify_crc=True))
        assert got == Counter(r for f in files for r in f)
        sizes = [os.path.getsize(p) for p in res.shard_paths]
        assert sizes == res.shard_bytes
        largest = max(len(r) + 16 for f in files for r in f)
        assert max(sizes) - min(sizes) <= largest          # greedy least-loaded bound
        assert all(c >= 1 for c in res.shard_records)
        assert leftovers(out.parent, "out") == []
        assert tree_hashes(root / "src") == before


def test_checksum_is_order_independent():
    a, b = rs.MultisetDigest(), rs.MultisetDigest()
    recs = [b"x", b"y", b"", b"x"]
    for r in recs:
        a.add(r)
    for r in reversed(recs):
        b.add(r)
    assert a == b
    c = rs.MultisetDigest()
    for r in (b"x", b"y", b"", b"y"):
        c.add(r)
    assert c != a and c.count == a.count and c.data_bytes == a.data_bytes


def test_refuses_to_overwrite(tmp_path):
    srcs = make_sources(tmp_path, [[b"a", b"b"]])
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep").write_text("mine")
    with pytest.raises(ValueError, match="already exists; reshard never overwrites"):
        rs.reshard(srcs, 2, str(out))
    assert os.listdir(out) == ["keep"]
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="already exists"):
        rs.reshard(srcs, 2, str(empty))


def test_rename_noreplace_refuses_existing_dir(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()  # an empty dir: plain rename(2) would replace it
    with pytest.raises(FileExistsError):
        rs._rename_noreplace(str(tmp_path / "a"), str(tmp_path / "b"))
    assert (tmp_path / "a").is_dir()


@pytest.mark.parametrize("exc", [RuntimeError("disk on fire"), KeyboardInterrupt()])
def test_exception_mid_write_leaves_nothing(tmp_path, exc):
    srcs = make_sources(tmp_path, [[bytes([i]) * 50 for i in range(40)], [b"z" * 10] * 30])
    before = tree_hashes(tmp_path / "src")
    out = tmp_path / "dst" / "shards"

    def boom(n):
        if n == 25:
            raise exc

    with pytest.raises(type(exc)):
        rs.reshard(srcs, 4, str(out), on_record=boom)
    assert not out.exists()
    assert leftovers(out.parent, "shards") == []
    assert tree_hashes(tmp_path / "src") == before


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records_st, st.integers(1, 8), st.data())
def test_interrupted_at_any_record_leaves_nothing(files, n, data):
    total = sum(len(f) for f in files)
    if total == 0:
        return
    stop = data.draw(st.integers(1, total), label="interrupt after record")
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        srcs = make_sources(root, files)
        before = tree_hashes(root / "src")
        out = root / "o" / "out"

        def boom(k):
            if k == stop:
                raise RuntimeError("injected")

        with pytest.raises(RuntimeError, match="injected"):
            rs.reshard(srcs, n, str(out), on_record=boom)
        assert not out.exists() and os.listdir(out.parent) == []
        assert tree_hashes(root / "src") == before


def test_failure_while_publishing_leaves_nothing(tmp_path, monkeypatch):
    srcs = make_sources(tmp_path, [[b"a", b"b", b"c"]])
    out = tmp_path / "out"

    def fail(src, dst):
        raise OSError(5, "I/O error", dst)

    monkeypatch.setattr(rs, "_rename_noreplace", fail)
    with pytest.raises(OSError, match="I/O error"):
        rs.reshard(srcs, 2, str(out))
    assert not out.exists() and leftovers(tmp_path, "out") == []


def test_verification_failure_leaves_nothing(tmp_path, monkeypatch):
    srcs = make_sources(tmp_path, [[b"a" * 5, b"b" * 6, b"c" * 7]])
    out = tmp_path / "out"
    real = tfr.iter_frames

    def lossy(path, **kw):  # reading back a shard loses its first record
        it = real(path, **kw)
        if ".reshard-" in str(path):
            next(it, None)
        return it

    monkeypatch.setattr(rs.tfrecord, "iter_frames", lossy)
    with pytest.raises(rs.ReshardVerificationError):
        rs.reshard(srcs, 1, str(out))
    assert not out.exists() and leftovers(tmp_path, "out") == []


def test_bad_sources(tmp_path):
    (tmp_path / "a.csv").write_text("x,y\n" * 20)
    with pytest.raises(ValueError, match="not an uncompressed TFRecord"):
        rs.reshard([str(tmp_path / "a.csv")], 2, str(tmp_path / "o" / "out"))
    assert not (tmp_path / "o").exists()  # nothing created before the inputs are checked
    with pytest.raises(ValueError, match="--num-shards 0"):
        rs.reshard([str(tmp_path / "a.csv")], 0, str(tmp_path / "out"))
    with pytest.raises(ValueError, match="matched no files"):
        rs.reshard([str(tmp_path / "*.tfrecord")], 2, str(tmp_path / "out"))


def test_stale_temp_of_dead_process_is_removed(tmp_path):
    srcs = make_sources(tmp_path, [[b"a", b"b", b"c"]])
    out = tmp_path / "out"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f"{rs.temp_prefix(str(out))}{dead.pid}-abc123"
    stale.mkdir()
    (stale / "shard-00000-of-00002.tfrecord").write_bytes(b"partial")
    res = rs.reshard(srcs, 2, str(out))
    assert str(stale) in res.removed_stale and not stale.exists()
    assert leftovers(tmp_path, "out") == []


KILL_SCRIPT = textwrap.dedent("""
    import sys, time
    from analyzer.reshard import reshard
    def hook(n):
        if n == 50:
            print("READY", flush=True)
            time.sleep(600)
    reshard(sys.argv[1:-1], 3, sys.argv[-1], on_record=hook)
""")


def test_sigkill_mid_write_leaves_nothing(tmp_path):
    srcs = make_sources(tmp_path, [[os.urandom(100) for _ in range(80)] for _ in range(2)])
    before = tree_hashes(tmp_path / "src")
    out = tmp_path / "dst" / "shards"
    proc = subprocess.Popen([sys.executable, "-c", KILL_SCRIPT, *srcs, str(out)],
                            stdout=subprocess.PIPE, text=True, cwd=str(REPO))
    try:
        assert proc.stdout.readline().strip() == "READY"
        assert leftovers(out.parent, "shards"), "the temporary directory should exist mid-write"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL
    deadline = time.monotonic() + 15  # the watchdog removes the directory asynchronously
    while leftovers(out.parent, "shards") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert leftovers(out.parent, "shards") == []
    assert not out.exists()
    assert tree_hashes(tmp_path / "src") == before


def test_sigterm_cleans_up_synchronously(tmp_path):
    srcs = make_sources(tmp_path, [[os.urandom(100) for _ in range(80)]])
    out = tmp_path / "shards"
    proc = subprocess.Popen([sys.executable, "-c", KILL_SCRIPT, *srcs, str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(REPO))
    try:
        assert proc.stdout.readline().strip() == "READY"
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM
    assert leftovers(tmp_path, "shards") == [] and not out.exists()
