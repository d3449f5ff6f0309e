"""csrun_common/atomic.py: atomic writes honour the umask."""
import os
import stat

import pytest

from csrun_common import atomic


@pytest.mark.parametrize("mask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_atomic_writes_honour_the_umask(tmp_path, mask, mode):
    old = os.umask(mask)
    try:
        assert atomic.current_umask() == mask
        a = atomic.write_json(tmp_path / "perf.json", {"x": 1})
        b = atomic.write_text(tmp_path / "sub" / "r.txt", "hi")
    finally:
        os.umask(old)
    assert stat.S_IMODE(a.stat().st_mode) == mode and stat.S_IMODE(b.stat().st_mode) == mode
