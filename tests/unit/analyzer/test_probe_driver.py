"""analyzer/probe_driver.py: probe processes per node (the driver's loop runs in
tests/integration/test_analyzer_*)."""
from __future__ import annotations

from analyzer.probe_driver import max_workers


def test_probe_processes_per_node_oversubscribe_twice_capped():
    assert max_workers(1) in (1, 2) and 1 <= max_workers(2) <= 4
    assert all(1 <= max_workers(n) <= min(2 * n, 32) for n in (1, 3, 16, 64))
