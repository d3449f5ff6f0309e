"""analyzer/probe_session.py: a probe session's timing (the real sessions run in tests/integration/test_analyzer_*)."""
from __future__ import annotations

from analyzer.probe_session import Timing


def test_timing_scales_with_budget():
    small, big = Timing.for_budget(30), Timing.for_budget(120)
    assert small.measure_s <= big.measure_s
    assert small.measure_s >= 1.5 and big.measure_s <= 10
    assert small.first_probe_timeout_s <= 60 + small.warmup_s + small.measure_s
