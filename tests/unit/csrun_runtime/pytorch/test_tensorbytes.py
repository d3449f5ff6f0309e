"""Every value a state_dict can hold as bytes (csrun_runtime/pytorch/tensorbytes.py; issues 40
and 44: ``x.view(torch.uint8)`` of a 0-dim tensor failed every multi-rank run at its end):
hypothesis over generated state dicts (0-dim, empty, every dtype the digest reads,
non-contiguous, conjugate views) for the digest's framing and the buffers' broadcast frame."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from csrun_runtime.pytorch.tensorbytes import (  # noqa: E402
    entries,
    entry,
    host_tensor,
    pack,
    tensor_bytes,
    unpack_into,
)
from csrun_runtime.rankgroup import weights_digest as digest_of  # noqa: E402

#: The dtypes a state_dict holds in practice (BatchNorm's int64 counter, masks, mixed precision,
#: complex layers, float8 weights).
DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
          torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.complex128, torch.float8_e4m3fn]


@st.composite
def tensors(draw):
    dtype = draw(st.sampled_from(DTYPES))
    shape = tuple(draw(st.lists(st.integers(0, 3), max_size=4)))
    n = 1
    for d in shape:
        n *= d
    size = torch.empty((), dtype=dtype).element_size()
    raw = bytearray(draw(st.binary(min_size=n * size, max_size=n * size)))
    if dtype == torch.bool:
        raw = bytearray(b & 1 for b in raw)
    t = torch.frombuffer(raw, dtype=torch.uint8).clone().view(dtype).reshape(shape) if n else torch.zeros(
        shape, dtype=dtype)
    view = draw(st.sampled_from(["plain", "transpose", "strided", "conj"]))
    if view == "transpose" and t.dim() >= 2:
        t = t.transpose(0, -1).contiguous().transpose(0, -1)  # same values, non-contiguous strides
    elif view == "strided" and t.dim() >= 1:
        t = torch.cat([t, t], dim=0)[:: 2] if t.shape[0] else t  # a view with a step of 2
    elif view == "conj" and t.is_complex():
        t = t.conj().conj().resolve_conj().conj()  # a lazy conjugate view: its values are the conjugates
    return t


state_dicts = st.dictionaries(st.text("abcdefgh.", min_size=1, max_size=6), tensors(), min_size=1, max_size=5)


def _digest(state):
    return digest_of(entries(state))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(state_dicts)
def test_the_digest_reads_every_tensor_and_not_its_layout(state):
    """Any shape (0-dim too), dtype and layout is read; a contiguous copy, a copy in another
    order of insertion and (where CUDA is) a copy on the GPU give the same digest."""
    d = _digest(state)
    assert d.startswith("sha256:")
    copies = {k: host_tensor(v).clone() for k, v in reversed(list(state.items()))}
    assert all(c.is_contiguous() and not c.is_conj() for c in copies.values())
    assert _digest(copies) == d
    if torch.cuda.is_available():
        assert _digest({k: v.to("cuda") for k, v in state.items()}) == d
    for name, t in state.items():
        e = entry(name, t)
        assert e[1] == str(t.dtype) and e[2] == tuple(t.shape) and len(e[3]) == t.numel() * t.element_size()


@settings(max_examples=150, deadline=None)
@given(state_dicts, st.data())
def test_one_changed_byte_changes_the_digest(state, data):
    full = [k for k, v in state.items() if v.numel()]
    if not full:
        return
    name = data.draw(st.sampled_from(full))
    raw = bytearray(tensor_bytes(state[name]))
    at = data.draw(st.integers(0, len(raw) - 1))
    raw[at] ^= 0x01  # bool stays 0/1
    t = state[name]
    changed = torch.frombuffer(raw, dtype=torch.uint8).clone().view(t.dtype).reshape(t.shape)
    assert _digest({**state, name: changed}) != _digest(state)


@settings(max_examples=150, deadline=None)
@given(st.lists(tensors(), min_size=1, max_size=5))
def test_the_broadcast_frame_restores_every_tensor_in_place(values):
    """pack() then unpack_into() targets of the same dtypes, shapes and strides (zeroed):
    bit-identical values, the changed ones named; a frame of the wrong size is refused."""
    targets = [torch.zeros_like(v.resolve_conj()).as_strided(v.shape, v.stride()) if v.is_contiguous()
               else torch.zeros_like(v.resolve_conj()) for v in values]
    flat = pack(values)
    assert flat.dtype == torch.uint8 and flat.numel() == sum(v.numel() * v.element_size() for v in values)
    changed = unpack_into(flat, targets)
    assert [tensor_bytes(t) for t in targets] == [tensor_bytes(v) for v in values]
    assert changed == [i for i, v in enumerate(values) if any(tensor_bytes(v))]
    assert unpack_into(flat, targets) == []  # the same values again: nothing changes
    with pytest.raises(ValueError, match="a frame of"):
        unpack_into(flat[:-1] if flat.numel() else torch.zeros(1, dtype=torch.uint8), targets)
