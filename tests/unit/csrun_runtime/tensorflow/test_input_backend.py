"""csrun_runtime/tensorflow/input_backend.py: the samples and bytes of a probe's batches."""
from __future__ import annotations

from csrun_runtime.tensorflow.input_backend import tf_samples_and_bytes as samples_and_bytes


class _T:
    def __init__(self, shape, size=4):
        self.shape = _S(shape)
        self.dtype = type("D", (), {"size": size})()


class _S(tuple):
    def num_elements(self):
        n = 1
        for d in self:
            n *= d
        return n


def test_samples_and_bytes():
    el = (_T((32, 8)), _T((32,), 8))
    s, b = samples_and_bytes(el, lambda e: list(e))
    assert s == 32 and b == 32 * 8 * 4 + 32 * 8
    assert samples_and_bytes((_T(()),), lambda e: list(e))[0] == 1
