"""TFRecord framing, read and written without TensorFlow and without parsing protos.

A TFRecord file is a sequence of frames::

    uint64 length            (little-endian)
    uint32 masked_crc32c(length bytes)
    byte   data[length]
    uint32 masked_crc32c(data)

with ``masked_crc(x) = ((crc >> 15 | crc << 17) + 0xa282ead8) mod 2**32`` of the
CRC-32C (Castagnoli) of ``x``. Counting records only walks the lengths (it seeks past
the data); reading may check the data CRCs. Compressed (GZIP/ZLIB) TFRecord files are
not supported: they are detected and refused.

CRC-32C uses the ``crc32c`` or ``google_crc32c`` package when one is installed, else a
table-driven pure-Python implementation (about 3-5 MB/s: fine for tests and small
writes; the resharder copies frames verbatim and needs no CRC).
"""
from __future__ import annotations

import io
import os
import struct
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import BinaryIO

__all__ = [
    "TFRecordError", "crc32c", "masked_crc32c", "frame", "TFRecordWriter", "write_records",
    "iter_frames", "iter_records", "read_records", "RecordCount", "count_records",
    "looks_like_tfrecord", "check_not_compressed", "HEADER_BYTES", "FOOTER_BYTES", "FRAME_OVERHEAD",
]

HEADER_BYTES = 12   # uint64 length + uint32 masked crc of the length
FOOTER_BYTES = 4    # uint32 masked crc of the data
FRAME_OVERHEAD = HEADER_BYTES + FOOTER_BYTES
_MASK_DELTA = 0xA282EAD8
_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")
_HDR = struct.Struct("<QI")


class TFRecordError(ValueError):
    """A file is not a (well-formed, uncompressed) TFRecord file; the message names the
    file and the byte offset of the bad frame."""


def _make_table() -> list[int]:
    poly = 0x82F63B78  # reflected Castagnoli polynomial
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ poly if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _make_table()


def _crc32c_py(data: bytes, crc: int = 0) -> int:
    table = _TABLE
    crc ^= 0xFFFFFFFF
    for b in bytes(data):
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _pick_crc32c():
    try:  # ICRAR's crc32c: crc32c.crc32c(data) -> int
        import crc32c as _mod

        fn = getattr(_mod, "crc32c", None)
        if fn is not None and fn(b"123456789") == 0xE3069283:
            return fn, "crc32c"
    except Exception:  # pragma: no cover - optional dependency
        pass
    try:  # google-crc32c: google_crc32c.value(data) -> int
        import google_crc32c as _g

        if _g.value(b"123456789") == 0xE3069283:
            return _g.value, "google_crc32c"
    except Exception:  # pragma: no cover - optional dependency
        pass
    return _crc32c_py, "pure-python"


_crc_impl, CRC32C_IMPLEMENTATION = _pick_crc32c()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli) of ``data``, unsigned 32-bit (``b"123456789"`` -> ``0xE3069283``)."""
    return _crc_impl(bytes(data))


def masked_crc32c(data: bytes) -> int:
    """TFRecord's masked CRC-32C of ``data`` (unsigned 32-bit int)."""
    c = crc32c(data)
    return ((((c >> 15) | (c << 17)) & 0xFFFFFFFF) + _MASK_DELTA) & 0xFFFFFFFF


def frame(data: bytes) -> bytes:
    """The complete TFRecord frame of one record: ``len(data) + 16`` bytes."""
    length = _U64.pack(len(data))
    return b"".join((length, _U32.pack(masked_crc32c(length)), data, _U32.pack(masked_crc32c(data))))


class TFRecordWriter:
    """Write records (bytes) to an uncompressed TFRecord file that
    ``tf.data.TFRecordDataset`` reads.

    Usage: ``with TFRecordWriter(path) as w: w.write(b"...")``. ``records`` and
    ``bytes_written`` count what was written (records; bytes including framing).
    """

    def __init__(self, path: os.PathLike[str] | str):
        self.path = os.fspath(path)
        self._fh: BinaryIO | None = open(self.path, "wb")
        self.records = 0
        self.bytes_written = 0

    def write(self, data: bytes) -> None:
        if self._fh is None:
            raise ValueError(f"{self.path}: writer is closed")
        f = frame(data)
        self._fh.write(f)
        self.records += 1
        self.bytes_written += len(f)

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def __enter__(self) -> TFRecordWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def write_records(path: os.PathLike[str] | str, records: Iterable[bytes]) -> tuple[int, int]:
    """Write ``records`` to a new TFRecord file at ``path``.

    Returns ``(records, bytes)``: the number of records and the file size in bytes.
    """
    with TFRecordWriter(path) as w:
        for r in records:
            w.write(r)
    return w.records, w.bytes_written


def check_not_compressed(head: bytes, path: str) -> None:
    """Raise :class:`TFRecordError` naming ``path`` when ``head`` (the file's first 2 bytes)
    is gzip's magic number: only uncompressed TFRecord files are read."""
    if head[:2] == b"\x1f\x8b":
        raise TFRecordError(f"{path}: GZIP-compressed TFRecord (or other gzip file); only "
                            f"uncompressed TFRecord files are supported")


def _bad_header(path: str, offset: int, why: str) -> TFRecordError:
    return TFRecordError(f"{path}: not a TFRecord file or corrupt at byte {offset}: {why}")


def iter_frames(path: os.PathLike[str] | str, *, verify_crc: bool = False,
                buffer_size: int = 1 << 20) -> Iterator[tuple[bytes, int]]:
    """Yield ``(frame, offset)`` for each record of the TFRecord file ``path``.

    ``frame`` is the complete raw frame (header + data + footer, ``len(data) + 16``
    bytes) and ``offset`` its position in the file (bytes); the data is
    ``frame[12:-4]``. The length CRC of every frame is checked (cheap: 8 bytes); with
    ``verify_crc`` the data CRC too (slow without a crc32c package). Raises
    :class:`TFRecordError` for a truncated or corrupt frame or a compressed file.
    """
    p = os.fspath(path)
    with open(p, "rb", buffering=buffer_size) as fh:
        offset = 0
        while True:
            hdr = fh.read(HEADER_BYTES)
            if not hdr:
                return
            if offset == 0:
                check_not_compressed(hdr, p)
            if len(hdr) < HEADER_BYTES:
                raise _bad_header(p, offset, f"truncated header ({len(hdr)} of 12 bytes)")
            length, lcrc = _HDR.unpack(hdr)
            if masked_crc32c(hdr[:8]) != lcrc:
                raise _bad_header(p, offset, "length CRC mismatch")
            body = fh.read(length + FOOTER_BYTES)
            if len(body) < length + FOOTER_BYTES:
                raise _bad_header(p, offset, f"truncated record (length {length}, "
                                             f"{len(body)} of {length + 4} bytes present)")
            if verify_crc and masked_crc32c(body[:length]) != _U32.unpack_from(body, length)[0]:
                raise _bad_header(p, offset, "data CRC mismatch")
            yield hdr + body, offset
            offset += HEADER_BYTES + len(body)


def iter_records(path: os.PathLike[str] | str, *, verify_crc: bool = False) -> Iterator[bytes]:
    """Yield the data (bytes) of each record of the TFRecord file ``path``, in order.
    Raises :class:`TFRecordError` as :func:`iter_frames`."""
    for f, _ in iter_frames(path, verify_crc=verify_crc):
        yield f[HEADER_BYTES:-FOOTER_BYTES]


def read_records(path: os.PathLike[str] | str, *, verify_crc: bool = True) -> list[bytes]:
    """All records of ``path`` as a list of bytes (data CRCs checked by default)."""
    return list(iter_records(path, verify_crc=verify_crc))


@dataclass(frozen=True)
class RecordCount:
    """Result of :func:`count_records`: ``records`` (count), ``data_bytes`` (sum of the
    record lengths, bytes, framing excluded) and ``file_bytes`` (file size, bytes)."""

    records: int
    data_bytes: int
    file_bytes: int


def count_records(path: os.PathLike[str] | str, *, deadline: float | None = None,
                  check_length_crc: str = "first") -> RecordCount | None:
    """Count the records of a TFRecord file by walking its length-prefixed framing.

    Reads each 12-byte header and seeks past ``length + 4`` bytes: no proto is parsed,
    no data CRC computed. ``check_length_crc``: ``"first"`` (default) checks the length
    CRC of the first frame only (tells a TFRecord from another file), ``"all"`` of every
    frame, ``"none"`` of none. ``deadline`` is a ``time.monotonic()`` value: past it the
    count stops and ``None`` is returned (the time budget for huge sets).

    Returns a :class:`RecordCount` (0 records for an empty file). Raises
    :class:`TFRecordError` for a compressed file, a bad length CRC, or framing that does
    not end exactly at the end of the file (truncated or not a TFRecord file).
    """
    p = os.fspath(path)
    size = os.path.getsize(p)
    records = 0
    data = 0
    offset = 0
    read_hdr = _HDR.unpack
    with open(p, "rb", buffering=1 << 16) as fh:
        read = fh.read
        seek = fh.seek
        while offset < size:
            hdr = read(HEADER_BYTES)
            if len(hdr) < HEADER_BYTES:
                raise _bad_header(p, offset, f"truncated header ({len(hdr)} of 12 bytes)")
            if offset == 0:
                check_not_compressed(hdr, p)
            length, lcrc = read_hdr(hdr)
            if (check_length_crc == "all" or (offset == 0 and check_length_crc == "first")) \
                    and masked_crc32c(hdr[:8]) != lcrc:
                raise _bad_header(p, offset, "length CRC mismatch")
            nxt = offset + HEADER_BYTES + length + FOOTER_BYTES
            if nxt > size:
                raise _bad_header(p, offset, f"record of length {length} runs past the end of "
                                             f"the file ({size} bytes)")
            seek(nxt, io.SEEK_SET)
            offset = nxt
            records += 1
            data += length
            if deadline is not None and not records & 0x3FF and time.monotonic() > deadline:
                return None
    return RecordCount(records, data, size)


def looks_like_tfrecord(path: os.PathLike[str] | str) -> bool:
    """True when ``path`` is empty or starts with a TFRecord header whose length CRC is
    right and whose first record fits in the file (reads 12 bytes)."""
    p = os.fspath(path)
    try:
        size = os.path.getsize(p)
        if size == 0:
            return True
        with open(p, "rb") as fh:
            hdr = fh.read(HEADER_BYTES)
    except OSError:
        return False
    if len(hdr) < HEADER_BYTES:
        return False
    length, lcrc = _HDR.unpack(hdr)
    return masked_crc32c(hdr[:8]) == lcrc and HEADER_BYTES + length + FOOTER_BYTES <= size
