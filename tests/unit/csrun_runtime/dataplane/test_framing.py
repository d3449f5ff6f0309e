"""csrun_runtime/dataplane/framing.py: round trips (hypothesis), and object arrays, bad keys, truncated
frames and corrupt headers refused."""
from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from csrun_runtime.dataplane import FrameError, framing

# --------------------------------------------------------------------------- helpers
DTYPES = ["?", "i1", "u1", "<i2", "<u2", "<i4", "<i8", ">i4", "<u8", "<f2", "<f4", "<f8", ">f8", "<c8", "S3", "<U2"]
arrays = hnp.arrays(st.sampled_from(DTYPES).map(np.dtype),
                    hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=4))
nests = st.recursive(arrays | st.none(),
                     lambda kids: st.lists(kids, max_size=3) | st.lists(kids, max_size=3).map(tuple)
                     | st.dictionaries(st.text(max_size=5) | st.integers(-5, 5), kids, max_size=3),
                     max_leaves=8)


def assert_same(a, b):
    """Same structure (types included) and the same arrays (dtype, shape, bytes)."""
    assert type(a) is type(b) or (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)), (type(a), type(b))
    if isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same(x, y)
    elif a is None:
        assert b is None
    else:
        assert a.dtype == b.dtype and a.shape == b.shape
        assert a.tobytes() == b.tobytes()


def wire(nest, n=0):
    """A nest through the framing as bytes on the wire: (header bytes, frames)."""
    tree, leaves = framing.flatten(nest)
    return framing.encode_header(tree, leaves, n), [a.tobytes() for a in leaves]


# --------------------------------------------------------------------------- framing
@settings(max_examples=150, deadline=None)
@given(nests)
def test_framing_round_trip(nest):
    header, frames = wire(nest)
    layout = framing.parse_header(header)
    assert_same(framing.decode(layout, frames), nest)


def test_framing_refuses_object_arrays_and_bad_keys():
    with pytest.raises(TypeError, match="object"):
        framing.flatten({"s": np.array(["a", None], dtype=object)})
    with pytest.raises(TypeError, match="key"):
        framing.flatten({(1, 2): np.zeros(2)})
    header = json.dumps({"v": 1, "n": 0, "tree": 0, "leaves": [["|O", [2]]]}).encode()
    with pytest.raises(FrameError, match="object dtype"):
        framing.parse_header(header)


@pytest.mark.parametrize("frames, match", [
    (lambda f: f[:-1], "declares 2"),
    (lambda f: [f[0], f[1][:-4]], "truncated"),
    (lambda f: [f[0], f[1] + b"\0"], "bytes, its header declares"),
])
def test_framing_refuses_truncated_frames(frames, match):
    header, good = wire((np.arange(4, dtype=np.int32), np.ones((2, 3), np.float16)))
    with pytest.raises(FrameError, match=match):
        framing.decode(framing.parse_header(header), frames(good))


@pytest.mark.parametrize("header", [b"\xff\x00garbage", b"[1,2]", b'{"v": 9}', b'{"v":1,"n":0,"tree":["t",[0]],'
                                    b'"leaves":[["<f4",[-1]]]}', b'{"v":1,"n":3,"tree":0,"leaves":[["<f4",[2]]]}'])
def test_framing_refuses_corrupt_headers(header):
    with pytest.raises(FrameError):
        framing.parse_header(header)
