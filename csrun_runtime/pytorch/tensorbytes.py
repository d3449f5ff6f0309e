"""Every value a ``state_dict`` can hold, as bytes: the trainer ranks' digests and the framing of
their buffers' broadcast (docs/MULTI-RANK.md "Weights and statistics").

A tensor's bytes are those of its values in row-major order on the CPU, whatever it is: 0-dim,
any dtype (bool, integers, bfloat16, float16, float8, complex), non-contiguous, a conjugate or
negative view, sparse (its dense values), quantized (its integer representation) or on CUDA.
The rule is ``t.reshape(-1).view(torch.uint8)`` of the host copy: ``Tensor.view(dtype)`` to a
smaller element size needs a last dimension (PyTorch's rule: "self.dim() cannot be 0 to view
... as Byte"), which ``reshape(-1)`` gives every tensor. A value that is not a tensor (a
module's ``get_extra_state()``) is its pickle.
"""
from __future__ import annotations

import pickle
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = ["host_tensor", "byte_view", "tensor_bytes", "entry", "entries", "pack", "unpack_into", "split_state"]


def host_tensor(t: Any) -> Any:
    """``t``'s values as a contiguous, dense, CPU tensor with no lazy conjugate or negation bit
    (a quantized tensor: its ``int_repr()``); the same shape and, but for quantized ones, dtype."""
    import torch

    x = t.detach()
    if x.is_quantized:
        x = x.int_repr()
    if x.layout != torch.strided:
        x = x.to_dense()
    return x.to("cpu").resolve_conj().resolve_neg().contiguous()


def byte_view(t: Any) -> Any:
    """``t``'s values as a flat uint8 CPU tensor (the module docstring's rule); a tensor that is
    "contiguous" with a stride other than 1 (one element, taken with a step) is copied first."""
    import torch

    flat = host_tensor(t).reshape(-1)
    if flat.numel() and flat.stride(0) != 1:
        flat = flat.clone(memory_format=torch.contiguous_format)
    return flat.view(torch.uint8)


def tensor_bytes(t: Any) -> bytes:
    """The bytes of ``t``'s values (:func:`byte_view`); ``b""`` when it has none."""
    return byte_view(t).numpy().tobytes() if t.numel() else b""


def entry(name: str, value: Any) -> tuple[str, str, tuple[int, ...], bytes]:
    """``(name, dtype, shape, bytes)`` of one ``state_dict`` value, the framing of
    :func:`csrun_runtime.rankgroup.weights_digest`: a tensor's (:func:`tensor_bytes`; a quantized
    one's dtype names its scheme), else ``("object", (), pickle)``."""
    import torch

    if isinstance(value, torch.Tensor):
        dtype = str(value.dtype) + (f"|{value.qscheme()}" if value.is_quantized else "")
        return name, dtype, tuple(value.shape), tensor_bytes(value)
    return name, "object", (), pickle.dumps(value, protocol=4)


def pack(tensors: Sequence[Any]) -> Any:
    """One flat uint8 CPU tensor holding every tensor's bytes in order (:func:`tensor_bytes`):
    the frame :func:`unpack_into` reads back (its layout is the tensors' own ``nbytes``)."""
    import torch

    parts = [byte_view(t) for t in tensors]
    return torch.cat(parts) if parts else torch.empty(0, dtype=torch.uint8)


def unpack_into(flat: Any, tensors: Sequence[Any]) -> list[int]:
    """Copy :func:`pack`'s frame ``flat`` back into ``tensors`` (strided, same dtypes and shapes as
    packed; non-contiguous and CUDA ones too), in place; returns the indices of the tensors whose
    values changed. Raises ``ValueError`` when ``flat`` has not exactly their bytes."""
    import torch

    flat = flat.to("cpu")
    sizes = [t.numel() * t.element_size() for t in tensors]
    if flat.numel() != sum(sizes):
        raise ValueError(f"a frame of {flat.numel()} bytes for {len(tensors)} tensors of {sum(sizes)} bytes")
    changed, at = [], 0
    for i, (t, n) in enumerate(zip(tensors, sizes, strict=True)):
        part = flat[at:at + n].clone()  # aligned for view(t.dtype)
        at += n
        if n and not torch.equal(part, byte_view(t)):
            with torch.no_grad():
                t.copy_(part.view(t.dtype).reshape(t.shape))
            changed.append(i)
    return changed


def split_state(module: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """``module.state_dict()`` as ``(parameters, statistics)``: its parameters' entries, and
    everything else it holds (buffers: BatchNorm's running mean, variance and
    ``num_batches_tracked``; extra state)."""
    state = module.state_dict(keep_vars=True)
    names = {n for n, _ in module.named_parameters(remove_duplicate=False)}
    return ({k: v for k, v in state.items() if k in names}, {k: v for k, v in state.items() if k not in names})


def entries(values: Mapping[str, Any]) -> Iterable[tuple[str, str, tuple[int, ...], bytes]]:
    """:func:`entry` of every item of ``values`` (a ``state_dict`` or a part of one)."""
    return (entry(name, value) for name, value in values.items())
