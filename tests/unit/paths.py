"""Paths the unit tests read, the same from any folder of the mirrored layout."""
from __future__ import annotations

from pathlib import Path

#: The repository's root.
REPO = Path(__file__).resolve().parents[2]
#: tests/fixtures: recorded probe tables, run.py files, srun recordings.
FIXTURES = REPO / "tests" / "fixtures"
