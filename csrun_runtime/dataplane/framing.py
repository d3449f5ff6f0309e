"""Framing of nests of numpy arrays: a small header plus one raw buffer per array.

A *nest* is a numpy array (or anything ``np.asarray`` takes: Python scalars, 0-d values), or
a ``dict`` (``str``/``int`` keys), ``tuple`` or ``list`` of nests, or ``None``. The header
records the structure and each leaf's dtype and shape; the buffers are the arrays' bytes in C
order, moved without a copy on both ends (the sender hands them to zmq with ``copy=False``,
the receiver wraps the received frames with ``np.frombuffer``).

Wire form of one header (UTF-8 JSON, cached by the sender per structure and shapes and by the
receiver per header bytes, so a steady stream encodes and parses nothing)::

    {"v": 1, "n": <batches in the bundle>, "tree": <structure>, "leaves": [[dtype.str, [dims]], ...]}

``tree`` is ``0`` for a leaf, ``["t", [..]]`` a tuple, ``["l", [..]]`` a list,
``["d", [keys], [..]]`` a dict, ``["N"]`` None. Namedtuples travel as tuples.

Object arrays (``dtype.hasobject``) are refused on both ends: their bytes are pointers.
"""
from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

#: Wire version carried in every header; a receiver refuses any other.
VERSION = 1
#: Most dimensions of a leaf and most leaves of a message a receiver accepts (a bound on what a
#: corrupt header can make it allocate or loop over).
MAX_NDIM = 32
MAX_LEAVES = 1 << 16


class FrameError(ValueError):
    """A message that cannot be decoded: truncated, corrupt, or not of this protocol.

    ``str(err)`` names the sender (``input worker <index> (attempt <a>)``) and what is wrong;
    ``err.worker`` is the worker index (``None`` when the sender is unknown)."""

    def __init__(self, message: str, worker: int | None = None):
        super().__init__(message)
        self.worker = worker


def flatten(nest: Any) -> tuple[Any, list[np.ndarray]]:
    """Split ``nest`` into its structure (JSON-able, see the module docstring) and its leaves
    as C-contiguous arrays (a view when the array already is one, else a copy).

    Raises:
        TypeError: a dict key that is not ``str``/``int``, or an object array (e.g. of Python
            strings: use a fixed-width ``S``/``U`` dtype).
    """
    leaves: list[np.ndarray] = []

    def walk(x: Any) -> Any:
        if isinstance(x, dict):
            keys = list(x)
            for k in keys:
                if not isinstance(k, (str, int)) or isinstance(k, bool):
                    raise TypeError(f"dict key {k!r} is {type(k).__name__}: the data plane carries str or int keys")
            return ["d", keys, [walk(x[k]) for k in keys]]
        if isinstance(x, tuple):
            return ["t", [walk(v) for v in x]]
        if isinstance(x, list):
            return ["l", [walk(v) for v in x]]
        if x is None:
            return ["N"]
        a = np.asarray(x)
        if not a.flags.c_contiguous:
            a = np.array(a, order="C")  # (np.ascontiguousarray would make a 0-d array 1-d)
        if a.dtype.hasobject:
            raise TypeError(f"leaf {len(leaves)} has dtype {a.dtype} (object): its bytes are pointers; "
                            "use a numeric or fixed-width S/U dtype")
        leaves.append(a)
        return 0

    return walk(nest), leaves


def stack(batches: Sequence[Sequence[np.ndarray]]) -> list[np.ndarray]:
    """The leaves of one bundle of ``batches`` (each :func:`flatten`'s leaves of one batch), with a leading axis of
    ``len(batches)``: for one batch views of its arrays (no copy: leave them unmodified until sent), for several
    ``np.stack`` of each leaf (new arrays). Raises ``ValueError`` (numpy's) when the batches' leaf shapes differ."""
    if len(batches) == 1:
        return [a[np.newaxis] for a in batches[0]]
    return [np.stack(col) for col in zip(*batches, strict=True)]


def unflatten(tree: Any, leaves: Sequence[Any]) -> Any:
    """Rebuild the nest of structure ``tree`` (from :func:`flatten`) around ``leaves`` (in
    order). Raises :class:`FrameError` when ``tree`` is malformed or the counts differ."""
    it = iter(leaves)

    def build(t: Any) -> Any:
        if t == 0:
            try:
                return next(it)
            except StopIteration:
                raise FrameError("the structure holds more leaves than the message") from None
        if not isinstance(t, list) or not t:
            raise FrameError(f"malformed structure node {t!r}")
        tag = t[0]
        if tag == "t" and len(t) == 2 and isinstance(t[1], list):
            return tuple(build(c) for c in t[1])
        if tag == "l" and len(t) == 2 and isinstance(t[1], list):
            return [build(c) for c in t[1]]
        if tag == "d" and len(t) == 3 and isinstance(t[1], list) and isinstance(t[2], list) \
                and len(t[1]) == len(t[2]):
            return {k: build(c) for k, c in zip(t[1], t[2], strict=True)}
        if tag == "N" and len(t) == 1:
            return None
        raise FrameError(f"malformed structure node {str(t)[:80]}")

    out = build(tree)
    if next(it, None) is not None:
        raise FrameError("the message holds more leaves than its structure")
    return out


def encode_header(tree: Any, leaves: Sequence[np.ndarray], n: int) -> bytes:
    """The header of one message: structure ``tree``, each leaf's dtype and shape, ``n`` the
    batches in it (the leading axis of every leaf; 0: not a bundle, leaves as given)."""
    return json.dumps({"v": VERSION, "n": n, "tree": tree,
                       "leaves": [[a.dtype.str, list(a.shape)] for a in leaves]},
                      separators=(",", ":")).encode()


class Layout:
    """A parsed header: the structure, each leaf's dtype, shape and byte count, and ``n``."""

    __slots__ = ("tree", "dtypes", "shapes", "nbytes", "n")

    def __init__(self, tree: Any, dtypes: list[np.dtype], shapes: list[tuple[int, ...]], n: int):
        self.tree, self.dtypes, self.shapes, self.n = tree, dtypes, shapes, n
        # Python ints: a hostile header's dimensions cannot overflow into a small count
        self.nbytes = [math.prod(s) * d.itemsize for d, s in zip(dtypes, shapes, strict=True)]


def parse_header(raw: bytes | memoryview) -> Layout:
    """Parse and check a header (:func:`encode_header`). Raises :class:`FrameError` (without
    the worker: the caller adds it) on anything malformed."""
    try:
        h = json.loads(bytes(raw))
    except (ValueError, UnicodeDecodeError) as e:
        raise FrameError(f"header is not JSON ({len(raw)} bytes: {bytes(raw[:40])!r}...): {e}") from None
    if not isinstance(h, dict) or h.get("v") != VERSION:
        raise FrameError(f"header version {h.get('v') if isinstance(h, dict) else h!r}, expected {VERSION}")
    n, leaves = h.get("n"), h.get("leaves")
    if not isinstance(n, int) or n < 0 or not isinstance(leaves, list) or len(leaves) > MAX_LEAVES:
        raise FrameError(f"header fields n={n!r} / leaves malformed")
    dtypes, shapes = [], []
    for j, leaf in enumerate(leaves):
        try:
            ds, shape = leaf
            dt = np.dtype(ds)
            shape = tuple(int(d) for d in shape)
        except (TypeError, ValueError) as e:
            raise FrameError(f"leaf {j}: malformed dtype/shape {str(leaf)[:80]}: {e}") from None
        if dt.hasobject:
            raise FrameError(f"leaf {j}: object dtype {ds!r} refused (its bytes would be pointers)")
        if len(shape) > MAX_NDIM or any(d < 0 for d in shape):
            raise FrameError(f"leaf {j}: bad shape {shape}")
        if n and (not shape or shape[0] != n):
            raise FrameError(f"leaf {j}: shape {shape} lacks the bundle's leading axis {n}")
        dtypes.append(dt)
        shapes.append(shape)
    return Layout(h.get("tree"), dtypes, shapes, n)


def parse_header_cached(cache: dict[bytes, Layout], raw: bytes, max_bytes: int | None = None) -> Layout:
    """The parsed header ``raw`` (:func:`parse_header`), from ``cache`` when seen (at most 257
    kept: a receiver's steady stream parses nothing). Raises :class:`FrameError` for a bad header,
    and for one declaring more than ``max_bytes`` bytes of leaves (a receiver's bound: checked
    before anything is allocated for them)."""
    layout = cache.get(raw)
    if layout is None:
        layout = parse_header(raw)
        if max_bytes is not None and sum(layout.nbytes) > max_bytes:
            raise FrameError(f"header declares {sum(layout.nbytes)} bytes, more than the receiver's bound of "
                             f"{max_bytes}")
        if len(cache) > 256:
            cache.clear()
        cache[raw] = layout
    return layout


def decode(layout: Layout, frames: Sequence[Any]) -> Any:
    """The nest of one message (:func:`decode_leaves` rebuilt into its structure)."""
    return unflatten(layout.tree, decode_leaves(layout, frames))


def decode_leaves(layout: Layout, frames: Sequence[Any]) -> list[np.ndarray]:
    """The leaves of one message: each frame (a buffer: ``zmq.Frame.buffer``, ``bytes``,
    ``memoryview``) wrapped as an array by ``np.frombuffer`` — no copy, unless the frame's
    address is not aligned for its dtype (then one copy, so consumers such as
    ``torch.from_numpy`` get aligned memory). Raises :class:`FrameError` when the frame count
    or a frame's size differs from the header's."""
    if len(frames) != len(layout.dtypes):
        raise FrameError(f"message holds {len(frames)} array frame(s), its header declares "
                         f"{len(layout.dtypes)} (truncated?)")
    arrays = []
    for j, (buf, dt, shape, nb) in enumerate(zip(frames, layout.dtypes, layout.shapes, layout.nbytes, strict=True)):
        size = memoryview(buf).nbytes
        if size != nb:
            raise FrameError(f"leaf {j} ({dt}{list(shape)}) is {size} bytes, its header declares {nb} (truncated?)")
        a = np.frombuffer(buf, dtype=dt, count=nb // dt.itemsize if dt.itemsize else 0).reshape(shape) \
            if nb else np.empty(shape, dt)
        if not a.flags.aligned:
            a = a.copy()
        arrays.append(a)
    return arrays
