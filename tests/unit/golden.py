"""Golden-file comparison with a readable unified diff (set CSRUN_UPDATE_GOLDEN=1 to rewrite)."""
from __future__ import annotations

import difflib
import os
from pathlib import Path

GOLDEN = Path(__file__).resolve().parent.parent / "golden"


def assert_golden(name: str, actual: str) -> None:
    path = GOLDEN / name
    if os.environ.get("CSRUN_UPDATE_GOLDEN") == "1":
        path.write_text(actual)
    expected = path.read_text() if path.exists() else ""
    if actual != expected:
        diff = "".join(difflib.unified_diff(
            expected.splitlines(keepends=True), actual.splitlines(keepends=True),
            fromfile=f"golden/{name}", tofile="actual"))
        raise AssertionError(f"{name} differs from the golden file (CSRUN_UPDATE_GOLDEN=1 rewrites it):\n{diff}")
