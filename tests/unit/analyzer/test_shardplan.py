"""analyzer/shardplan.py: sizes given on the command line."""
from __future__ import annotations

import pytest

from analyzer.shardplan import parse_size


def test_parse_size():
    assert parse_size("4096") == 4096
    assert parse_size("64G") == 64 * 2 ** 30
    assert parse_size("1.5M") == int(1.5 * 2 ** 20)
    assert parse_size("2GB") == 2 * 10 ** 9
    for bad in ("x", "12Q", "-1", ""):
        with pytest.raises(ValueError):
            parse_size(bad)
