"""csrun_runtime/facts.py: the value checks a backend's ``runconfig`` keys are declared with — an
integer with a minimum, ``auto`` or an integer >= 1 — each saying what it takes in its message and
its doc."""
from __future__ import annotations

import pytest

from csrun_runtime.facts import Key, auto_or_int, int_min


@pytest.mark.parametrize("value", [-1, 1.5, "3", True, None])
def test_int_min_refuses_what_is_not_an_integer_at_least_its_minimum(value):
    with pytest.raises(ValueError, match=r"^must be an integer >= 0$"):
        int_min(0)(value)


def test_int_min_and_auto_or_int_take_their_values_and_say_so():
    assert int_min(0)(0) == 0 and int_min(1).__doc__ == "integer >= 1"
    assert auto_or_int("auto") == "auto" and auto_or_int(4) == 4
    for bad in (0, True, "4", 2.0):
        with pytest.raises(ValueError, match=r"^must be auto or an integer >= 1$"):
            auto_or_int(bad)
    key = Key(int_min(1), 32, "batches")
    assert key.check(key.default) == 32
