"""analyzer/datafiles.py: the data files a params YAML names, and the rules that expand its sources
("Performance Optimization Practices", "Shard your input data")."""
from __future__ import annotations

import os

import pytest

from analyzer.datafiles import expand_sources, read_params


def test_expand_sources_rules(tmp_path):
    d = tmp_path / "data"
    d.mkdir()
    for n in ("b.tfrecord", "a.tfrecord", "meta.json", ".hidden.tfrecord"):
        (d / n).write_bytes(b"x")
    paths, dups = expand_sources([str(d), str(d / "a.tfrecord")])
    assert [os.path.basename(p) for p in paths] == ["a.tfrecord", "b.tfrecord"] and dups == 1
    assert len(expand_sources([str(d)], pattern="*.json")[0]) == 1
    with pytest.raises(ValueError, match="'.*nope\\*': matched no files"):
        expand_sources([str(d / "nope*")], what="SOURCES")
    with pytest.raises(ValueError, match="no such file"):
        expand_sources([str(tmp_path / "missing")])
    other = tmp_path / "other"
    other.mkdir()
    (other / "x.bin").write_bytes(b"1")
    assert [os.path.basename(p) for p in expand_sources([str(other)])[0]] == ["x.bin"]


def test_read_params(tmp_path, monkeypatch):
    (tmp_path / "d1").mkdir()
    y = tmp_path / "params.yaml"
    y.write_text("train_input:\n  data_dir: ./d1\n  batch_size: 32\n  shuffle_seed: 9\n")
    monkeypatch.chdir("/")
    p = read_params(str(y))
    assert p.data_dirs == [str(tmp_path / "d1")] and p.shuffle_buffer == 320 and p.shuffle_seed == 9
    y.write_text("train_input:\n  data_dir: [/a, /b]\n  shuffle_buffer: 7\n")
    assert read_params(str(y)).data_dirs == ["/a", "/b"] and read_params(str(y)).shuffle_buffer == 7
    y.write_text("train_input:\n  data_dir: 3\n")
    with pytest.raises(ValueError, match="train_input.data_dir: expected a path or a list of paths, got 3"):
        read_params(str(y))
    y.write_text("model: {}\n")
    with pytest.raises(ValueError, match="train_input: missing"):
        read_params(str(y))
    with pytest.raises(ValueError, match="no such file"):
        read_params(str(tmp_path / "nope.yaml"))
