"""analyzer/probe_worker.py: the CPUs a probe's processes are pinned to (no processes started)."""
from __future__ import annotations

from analyzer.probe_worker import cpus_for


def test_served_probe_pins_workers_apart_from_the_chief():
    from analyzer.probe_worker import probe_cpus

    assert probe_cpus("served", 1, 2, 1, [0, 1, 2, 3]) == [0]
    assert probe_cpus("served", 0, 2, 1, [0, 1, 2, 3]) == [1, 2, 3]
    assert probe_cpus("served", 0, 2, 1, [5]) == [5] and probe_cpus("served", 1, 2, 1, [5]) == [5]
    assert probe_cpus("ingest", 1, 3, 2, [0, 1]) == [0, 1]
    assert probe_cpus("pipeline", 1, 2, 1, [0, 1]) == [1]


def test_cpus_for_wraps_when_oversubscribed():
    allowed = [0, 1, 2, 3]
    assert cpus_for(0, 2, allowed) == [0, 1]
    assert cpus_for(1, 2, allowed) == [2, 3]
    assert cpus_for(2, 2, allowed) == [0, 1]
    assert cpus_for(5, 1, allowed) == [1]
    assert cpus_for(0, 8, allowed) == allowed
