"""csrun_runtime/pytorch/events.py: a TensorBoard event file read back with its CRCs."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


from csrun_runtime.pytorch.events import EventWriter, crc32c, read_scalars  # noqa: E402


def test_event_file_is_read_back_with_its_crcs(tmp_path):
    assert crc32c(b"123456789") == 0xE3069283
    w = EventWriter(tmp_path)
    w.scalars({"loss": 0.5, "samples_per_sec": 1000.0}, 7)
    w.close()
    assert read_scalars(w.path) == [(7, "loss", 0.5), (7, "samples_per_sec", 1000.0)]
    data = bytearray(w.path.read_bytes())
    data[-6] ^= 0xFF
    w.path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="CRC mismatch"):
        read_scalars(w.path)
