"""TensorBoard event files of scalars, written without TensorFlow or the ``tensorboard`` package.

An event file is a TFRecord file (each record: ``uint64`` length, ``uint32`` masked CRC-32C of
the length, the bytes, ``uint32`` masked CRC-32C of the bytes; little endian) of ``Event``
protocol buffers (``tensorboard/compat/proto/event.proto``: ``wall_time`` = 1 double,
``step`` = 2 int64, ``file_version`` = 3 string, ``summary`` = 5 ``Summary``, whose ``value`` = 1
holds ``tag`` = 1 string and ``simple_value`` = 2 float). The first record carries
``file_version: "brain.Event:2"``. TensorBoard and ``tf.compat.v1.train.summary_iterator`` read
these files; :func:`read_scalars` reads them back here (tests). The TFRecord framing is
:mod:`csrun_common.tfrecord`'s (the analyzer's sharding uses the same). Pure Python.
"""
from __future__ import annotations

import os
import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from csrun_common import tfrecord
from csrun_common.tfrecord import crc32c

__all__ = ["EventWriter", "read_scalars", "crc32c"]


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _field(tag: int, payload: bytes) -> bytes:
    return _varint(tag) + _varint(len(payload)) + payload


def _event(wall_time: float, step: int, *, version: str | None = None,
           scalars: dict[str, float] | None = None) -> bytes:
    msg = b"\x09" + struct.pack("<d", wall_time) + b"\x10" + _varint(int(step))
    if version is not None:
        msg += _field(0x1A, version.encode())
    if scalars:
        summary = b"".join(_field(0x0A, _field(0x0A, tag.encode()) + b"\x15" + struct.pack("<f", float(v)))
                           for tag, v in scalars.items())
        msg += _field(0x2A, summary)
    return msg


class EventWriter:
    """Append scalar summaries to ``<logdir>/events.out.tfevents.<time>.<host>.<pid>.pt``.

    ``scalar(tag, value, step)`` writes one record; :meth:`flush` / :meth:`close` flush the file.
    Raises ``OSError`` when ``logdir`` cannot be created or written.
    """

    def __init__(self, logdir: str | os.PathLike):
        d = Path(logdir)
        d.mkdir(parents=True, exist_ok=True)
        self.path = d / f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}.{os.getpid()}.pt"
        self._f = open(self.path, "ab")  # noqa: SIM115 - closed by close()
        self._write(_event(time.time(), 0, version="brain.Event:2"))

    def _write(self, data: bytes) -> None:
        self._f.write(tfrecord.frame(data))

    def scalars(self, values: dict[str, float], step: int) -> None:
        """One event with the scalars ``values`` (tag -> number) at global step ``step``."""
        self._write(_event(time.time(), step, scalars=values))

    def scalar(self, tag: str, value: float, step: int) -> None:
        """One scalar ``tag`` = ``value`` at global step ``step``."""
        self.scalars({tag: value}, step)

    def flush(self) -> None:
        self._f.flush()

    def close(self) -> None:
        if not self._f.closed:
            self._f.close()


def _read_varint(b: bytes, i: int) -> tuple[int, int]:
    n = shift = 0
    while True:
        c = b[i]
        i += 1
        n |= (c & 0x7F) << shift
        shift += 7
        if not c & 0x80:
            return n, i


def _fields(b: bytes) -> Iterator[tuple[int, int, Any]]:
    i = 0
    while i < len(b):
        key, i = _read_varint(b, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, i = _read_varint(b, i)
            yield num, wt, v
        elif wt == 1:
            yield num, wt, b[i:i + 8]
            i += 8
        elif wt == 5:
            yield num, wt, b[i:i + 4]
            i += 4
        elif wt == 2:
            n, i = _read_varint(b, i)
            yield num, wt, b[i:i + n]
            i += n
        else:
            raise ValueError(f"unsupported protobuf wire type {wt}")


def read_scalars(path: str | os.PathLike) -> list[tuple[int, str, float]]:
    """Every scalar of an event file as ``(step, tag, value)``, checking each record's CRCs.

    Raises:
        ValueError: a truncated record or a CRC mismatch (:class:`csrun_common.tfrecord.TFRecordError`,
            naming the byte offset).
    """
    out: list[tuple[int, str, float]] = []
    for frame, _offset in tfrecord.iter_frames(path, verify_crc=True):
        body = frame[tfrecord.HEADER_BYTES:-tfrecord.FOOTER_BYTES]
        step = 0
        for num, _wt, v in _fields(body):
            if num == 2:
                step = int(v)
            elif num == 5:
                for _n, _w, val in _fields(v):
                    tag, x = "", float("nan")
                    for fn, _w2, fv in _fields(val):
                        if fn == 1:
                            tag = bytes(fv).decode()
                        elif fn == 2:
                            x = struct.unpack("<f", fv)[0]
                    out.append((step, tag, x))
    return out
