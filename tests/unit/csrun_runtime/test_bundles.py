"""csrun_runtime/bundles.py: ``map_nest`` on every leaf of a batch's nest (tuples, lists, dicts;
``None`` kept), and the bundling bounds' order."""
from __future__ import annotations

import numpy as np

from csrun_runtime.bundles import AUTOSCALE_MAX_BUNDLE, BUNDLE_TARGET_BYTES, MAX_BUNDLE, map_nest


def test_map_nest_keeps_the_structure_and_none():
    batch = ({"image": np.zeros((2, 3)), "mask": [np.ones(2), None]}, np.arange(2), None)
    out = map_nest(lambda a: a[None], batch)
    assert isinstance(out, tuple) and isinstance(out[0], dict) and isinstance(out[0]["mask"], list)
    assert out[0]["image"].shape == (1, 2, 3) and out[0]["mask"][0].shape == (1, 2)
    assert out[0]["mask"][1] is None and out[2] is None and out[1].tolist() == [[0, 1]]


def test_the_bounds_keep_an_autoscaled_bundle_smaller():
    assert 1 < AUTOSCALE_MAX_BUNDLE < MAX_BUNDLE and BUNDLE_TARGET_BYTES == 1 << 20
