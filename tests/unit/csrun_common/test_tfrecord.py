"""TFRecord framing without TensorFlow: CRC, write/read round trip, counting by walking
the length prefixes, corrupt/compressed files, and interop with tf.data (marked tf)."""
from __future__ import annotations

import gzip
import os
import struct
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from csrun_common import tfrecord as tfr


def test_crc32c_check_value():
    # The CRC-32C check value (RFC 3720 / iSCSI) and the all-zero 32-byte vector.
    assert tfr.crc32c(b"123456789") == 0xE3069283
    assert tfr.crc32c(bytes(32)) == 0x8A9136AA
    assert tfr._crc32c_py(b"123456789") == 0xE3069283


def test_masked_crc_formula():
    c = tfr.crc32c(b"abc")
    assert tfr.masked_crc32c(b"abc") == ((((c >> 15) | (c << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def test_frame_layout():
    f = tfr.frame(b"hello")
    assert len(f) == 5 + tfr.FRAME_OVERHEAD
    length, lcrc = struct.unpack("<QI", f[:12])
    assert length == 5 and lcrc == tfr.masked_crc32c(f[:8])
    assert f[12:17] == b"hello"
    assert struct.unpack("<I", f[17:])[0] == tfr.masked_crc32c(b"hello")


@settings(max_examples=40, deadline=None)
@given(st.lists(st.binary(max_size=300), max_size=30))
def test_write_read_count_roundtrip(tmp_path_factory, records):
    path = tmp_path_factory.mktemp("rt") / "a.tfrecord"
    n, size = tfr.write_records(path, records)
    assert n == len(records) and size == os.path.getsize(path)
    assert size == sum(len(r) + 16 for r in records)
    assert tfr.read_records(path) == records
    rc = tfr.count_records(path, check_length_crc="all")
    assert rc == tfr.RecordCount(len(records), sum(map(len, records)), size)
    offsets = [off for _, off in tfr.iter_frames(path)]
    expected, pos = [], 0
    for r in records:
        expected.append(pos)
        pos += len(r) + 16
    assert offsets == expected


def test_count_does_not_read_data(tmp_path, monkeypatch):
    """Counting walks headers only: the data CRC is never computed."""
    path = tmp_path / "a.tfrecord"
    tfr.write_records(path, [b"x" * 1000] * 50)
    calls = []
    real = tfr.masked_crc32c
    monkeypatch.setattr(tfr, "masked_crc32c", lambda d: calls.append(len(d)) or real(d))
    assert tfr.count_records(path).records == 50
    assert calls == [8]  # the first length CRC only


def test_truncated_file_names_offset(tmp_path):
    path = tmp_path / "t.tfrecord"
    tfr.write_records(path, [b"a" * 10, b"b" * 20, b"c" * 30])
    data = path.read_bytes()
    path.write_bytes(data[:-5])
    second = 26 + 36  # offset of the third frame
    with pytest.raises(tfr.TFRecordError, match=f"byte {second}"):
        tfr.count_records(path)
    with pytest.raises(tfr.TFRecordError, match="truncated"):
        list(tfr.iter_records(path))


def test_corrupt_data_crc_detected_only_when_verifying(tmp_path):
    path = tmp_path / "c.tfrecord"
    tfr.write_records(path, [b"hello world"])
    data = bytearray(path.read_bytes())
    data[14] ^= 0xFF
    path.write_bytes(bytes(data))
    assert len(list(tfr.iter_records(path, verify_crc=False))) == 1
    with pytest.raises(tfr.TFRecordError, match="data CRC"):
        list(tfr.iter_records(path, verify_crc=True))


def test_not_tfrecord_and_gzip(tmp_path):
    text = tmp_path / "x.csv"
    text.write_text("a,b,c\n1,2,3\n" * 10)
    assert not tfr.looks_like_tfrecord(text)
    with pytest.raises(tfr.TFRecordError, match="length CRC"):
        tfr.count_records(text)
    gz = tmp_path / "x.tfrecord.gz"
    with gzip.open(gz, "wb") as fh:
        fh.write(tfr.frame(b"abc"))
    with pytest.raises(tfr.TFRecordError, match="GZIP"):
        tfr.count_records(gz)
    empty = tmp_path / "e.tfrecord"
    empty.write_bytes(b"")
    assert tfr.looks_like_tfrecord(empty)
    assert tfr.count_records(empty) == tfr.RecordCount(0, 0, 0)


def test_count_deadline(tmp_path):
    path = tmp_path / "big.tfrecord"
    tfr.write_records(path, [b"r"] * 5000)
    assert tfr.count_records(path, deadline=time.monotonic() - 1) is None
    assert tfr.count_records(path, deadline=time.monotonic() + 60).records == 5000


@pytest.mark.tf
def test_interop_with_tensorflow(tmp_path):
    tf = pytest.importorskip("tensorflow")
    records = [os.urandom(n) for n in (0, 1, 7, 100, 5000)]
    ours = tmp_path / "ours.tfrecord"
    tfr.write_records(ours, records)
    got = [bytes(x.numpy()) for x in tf.data.TFRecordDataset(str(ours))]
    assert got == records
    theirs = tmp_path / "theirs.tfrecord"
    with tf.io.TFRecordWriter(str(theirs)) as w:
        for r in records:
            w.write(r)
    assert theirs.read_bytes() == ours.read_bytes()
    assert tfr.read_records(theirs, verify_crc=True) == records
    assert tfr.count_records(theirs, check_length_crc="all").records == len(records)
