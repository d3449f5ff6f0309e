"""examples/digits_pt ships its data (``digits.npz``): the same split as examples/digits makes
with scikit-learn, so that a PyTorch-only install needs no scikit-learn (issue 33, item 2)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from tests.unit.paths import REPO


def _module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_shipped_digits_are_examples_digits_split():
    pytest.importorskip("sklearn")
    pytest.importorskip("torch")  # data.py builds DataLoaders
    want = _module(REPO / "examples/digits/prepare_data.py", "digits_prepare").split()
    got = _module(REPO / "examples/digits_pt/data.py", "digits_pt_data")._split()
    assert [a.shape for a in got] == [(1437, 64), (1437,), (360, 64), (360,)]
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and np.array_equal(g, w)
