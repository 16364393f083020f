"""Broadcast operands as strided views over a ``[d0, d1, d2, C]`` row layout.

The elementwise and softmax kernels walk a contiguous tensor of shape ``[*, C]`` as rows of C.
An operand that broadcasts to it (a ``[C]`` bias, AF2's dropout mask ``[*, 1, N, C]`` shared by
the rows of a dimension, a ``[*, 1, 1, N]`` attention mask) is read in place through four strides
(0 along broadcast dims) instead of being expanded into a full copy. The row index is split
into (i0, i1, i2) once per row, not per element.
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl

from fold_kernels.reduce import column_sum, column_sum_fits

__all__ = ["RowLayout", "row_layout", "row_offsets", "broadcast_shape", "reduce_to",
           "is_dense"]


def broadcast_shape(*shapes: tuple[int, ...]) -> tuple[int, ...] | None:
    """The broadcast of ``shapes`` (plain ints), or None if they do not broadcast.

    ``torch.broadcast_shapes`` in plain Python: it costs a few microseconds per call through
    torch._refs and the symbolic-shape guards, and the ops call it on every dispatch.
    """
    if shapes and all(shape == shapes[0] for shape in shapes):
        return tuple(shapes[0])  # the blocks' usual call: no broadcasting at all
    return _broadcast(tuple(map(tuple, shapes)))


@functools.lru_cache(maxsize=4096)  # a model calls a handful of shape combinations per crop
def _broadcast(shapes: tuple[tuple[int, ...], ...]) -> tuple[int, ...] | None:
    out: list[int] = []
    for shape in shapes:
        if len(shape) > len(out):
            out[:0] = [1] * (len(shape) - len(out))
        off = len(out) - len(shape)
        for i, n in enumerate(shape):
            m = out[off + i]
            if n == m or n == 1:
                continue
            if m == 1:
                out[off + i] = n
            else:
                return None
    return tuple(out)


def is_dense(t: torch.Tensor) -> bool:
    """t's elements fill its storage span without gaps or overlaps and its last dim is
    contiguous: a contiguous tensor or a permutation of one's dims (e.g. a transposed view)."""
    if t.dim() == 0 or t.stride(-1) != 1:
        return False
    expected = 1
    for size, stride in sorted(zip(t.shape, t.stride()), key=lambda p: p[1]):
        if size == 1:
            continue
        if stride != expected:
            return False
        expected *= size
    return True


class RowLayout:
    """Sizes ``(d0, d1, d2)`` of the row dims and each operand's ``(s0, s1, s2, sc)`` strides."""

    def __init__(self, dims: tuple[int, int, int], operands: list[torch.Tensor],
                 strides: list[tuple[int, int, int, int]]):
        self.dims = dims
        self.operands = operands
        self.strides = strides


def _mergeable(strides: list[list[int]], sizes: list[int], i: int) -> bool:
    return all(s[i] == s[i + 1] * sizes[i + 1] for s in strides)


def row_layout(shape: torch.Size, *operands: torch.Tensor | None) -> RowLayout:
    """Views of ``operands`` (each broadcastable to ``shape = [*, C]``) as 3 row dims + C.

    None operands stay None (their strides are zeros).
    """
    for t in operands:
        if t is not None and (t.shape != shape or not t.is_contiguous()):
            return _strided_layout(shape, operands)
    return _dense_layout(shape, operands)


def _dense_layout(shape: torch.Size, operands) -> RowLayout:
    """:func:`row_layout` when every operand is a contiguous ``shape`` (the blocks' usual call):
    one row dim, what the general merge arrives at, without its expands and stride lists."""
    rows = math.prod(shape[:-1])
    dense = (0, 0, 0 if rows == 1 else shape[-1], 1)  # the general path drops a single row's dim
    return RowLayout((1, 1, rows), list(operands),
                     [(0, 0, 0, 0) if t is None else dense for t in operands])


# (shape, each operand's shape and strides) -> (dims, strides): the merge below costs about 15 us
# of Python per call, and an eager step repeats a few dozen layouts (row-shared dropout masks,
# [C] biases, masks) on every call. Bounded: cleared when it outgrows _MAX_LAYOUTS.
_LAYOUTS: dict[tuple, tuple] = {}
_MAX_LAYOUTS = 4096


def _strided_layout(shape: torch.Size, operands) -> RowLayout:
    """:func:`row_layout` for any operands: broadcast views, size-1 dims dropped, neighbouring
    dims that every operand walks linearly merged. The operands are returned as given (the
    kernels read them through the strides; an expanded view has the same data pointer)."""
    key = (tuple(shape), *[None if t is None else (tuple(t.shape), t.stride())
                           for t in operands])
    hit = _LAYOUTS.get(key)
    if hit is not None:
        return RowLayout(hit[0], list(operands), hit[1])
    lay = _merge(shape, operands)
    if all(a is b for a, b in zip(lay.operands, operands)):  # no operand had to be copied
        if len(_LAYOUTS) >= _MAX_LAYOUTS:
            _LAYOUTS.clear()
        _LAYOUTS[key] = (lay.dims, lay.strides)
    return lay


def _merge(shape: torch.Size, operands) -> RowLayout:
    sizes = list(shape[:-1])
    views = [None if t is None else t.expand(shape) for t in operands]
    strides = [[0] * len(shape) if v is None else list(v.stride()) for v in views]
    # drop row dims of size 1, then merge neighbours that every operand walks linearly
    keep = [i for i, n in enumerate(sizes) if n != 1]
    sizes = [sizes[i] for i in keep]
    row_strides = [[s[i] for i in keep] for s in strides]
    i = 0
    while i < len(sizes) - 1:
        if _mergeable(row_strides, sizes, i):
            sizes[i] *= sizes[i + 1]
            del sizes[i + 1]
            for s in row_strides:
                s[i] = s[i + 1]
                del s[i + 1]
        else:
            i += 1
    if len(sizes) > 3:  # rare layouts: copy the operands that block merging, then retry
        dense = [None if v is None else v.contiguous() for v in views]
        return _merge(shape, dense)
    pad = 3 - len(sizes)
    dims = tuple([1] * pad + sizes)
    out_strides = [tuple([0] * pad + rs + [s[-1]]) for rs, s in zip(row_strides, strides)]
    return RowLayout(dims, list(operands), out_strides)  # type: ignore[arg-type]


@triton.jit
def row_offsets(rows, d1, d2, s0, s1, s2):
    """Element offset of the start of each row index in ``rows`` for one operand."""
    i2 = rows % d2
    i1 = (rows // d2) % d1
    i0 = rows // (d1 * d2)
    return i0.to(tl.int64) * s0 + i1.to(tl.int64) * s1 + i2.to(tl.int64) * s2



def reduce_to(grad: torch.Tensor, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
    """Sum a full-shape gradient over the dims a broadcast operand of ``shape`` was expanded
    along, accumulating in fp32 without an fp32 copy of ``grad``; result in ``dtype``.

    The common case, a ``[C]`` bias or a mask shared along the leading dims (``[1, N, C]``),
    sums over a prefix of grad's dims: that is a column sum of the ``[M, rest]`` view, done by
    :func:`fold_kernels.reduce.column_sum` (deterministic, one pass near bandwidth, the result
    stored in ``dtype``). PyTorch's sum over outer dims runs far below bandwidth on a GPU and
    its cast is one more launch; it stays the path for other patterns (a ``[*, 1, 1, N]``
    mask)."""
    if grad.shape == shape:
        return grad.to(dtype)
    lead = grad.dim() - len(shape)
    dims = list(range(lead)) + [lead + i for i, n in enumerate(shape)
                                if n == 1 and grad.shape[lead + i] != 1]
    k = len(dims)
    if dims == list(range(k)) and k < grad.dim():  # a prefix: [M, rest] columns
        rest = math.prod(grad.shape[k:])
        flat = _view_2d(grad, rest)
        if flat is not None and column_sum_fits(flat.shape[0], rest):
            return column_sum(flat, dtype).reshape(shape)
    return grad.sum(dim=dims, dtype=torch.float32).reshape(shape).to(dtype)


def _view_2d(grad: torch.Tensor, rest: int) -> torch.Tensor | None:
    """``grad`` as a ``[M, rest]`` view (no copy), or None when its strides do not allow one.
    A dense tensor whose leading dims are permuted (a transposed pair) and whose trailing
    ``rest`` elements are contiguous is viewed as its storage's rows: the same rows in another
    order, which a column sum does not see."""
    try:
        return grad.view(-1, rest)
    except RuntimeError:
        pass
    if not is_dense(grad):
        return None
    span = 1  # the trailing dims' row-major strides, up to rest elements
    for size, stride in zip(reversed(grad.shape), reversed(grad.stride())):
        if span == rest:
            break
        if size != 1 and stride != span:
            return None
        span *= size
    if span != rest:
        return None
    return grad.as_strided((grad.numel() // rest, rest), (rest, 1))
