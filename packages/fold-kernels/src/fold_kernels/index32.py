"""Which index arithmetic the kernels keep in 32 bits, and the host checks that keep it safe.

Triton types an integer kernel argument below 2**31 as i32, and ``program_id`` and
``tl.arange`` are i32, so ``index * stride`` overflows silently once it reaches 2**31 (a pair
tensor ``[N, N, 128]`` has 2**31 elements at N = 4096). The kernels therefore compute every
offset that grows with the tensor (a row's start, a batch entry's or a head's matrix) in
int64, and keep two kinds of index 32-bit, for speed, behind the checks here:

* a **row index** (a program's rows of a ``[rows, C]`` walk): at most ``rows``, which the ops
  check is below 2**31 (:func:`check_rows`; ``rows = numel / C``, so on a GPU of 141 GB this
  can only trip for C < 32);
* an **in-tile offset**, a column or key index times its stride (``cols * stride``,
  ``offs_n * stride_n``): bounded by ``(n - 1) * stride``, which the ops check before the
  launch (:func:`span_fits`) and, where it does not fit, copy the operand to a dense layout
  in which it does.

CUDA also limits the grid's y and z dimensions to 65535 programs (:func:`check_grid`).
The ``supports`` predicates of :mod:`fold_kernels.registration` ask :func:`rows_fit` and
:func:`grid_fits` first, so that the registry's ``auto`` falls back to the PyTorch path
instead of raising.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["INT32_LIMIT", "GRID_YZ_LIMIT", "rows_fit", "check_rows", "span_fits",
           "pair_bias_fits", "grid_fits", "check_grid"]

INT32_LIMIT = 2**31  # indices must stay below this
GRID_YZ_LIMIT = 65535  # CUDA's largest grid y and z dimension


def rows_fit(shape: Sequence[int]) -> bool:
    """The row index of a ``[*, C]`` walk over ``shape`` (rows: every dim but the last) fits in
    int32."""
    return math.prod(shape[:-1]) < INT32_LIMIT


def check_rows(op: str, shape: Sequence[int]) -> None:
    """Refuse a ``[*, C]`` walk over ``shape`` whose row index would not fit in int32."""
    if not rows_fit(shape):
        raise ValueError(f"{op}: {math.prod(shape[:-1])} rows of {shape[-1]} (shape "
                         f"{tuple(shape)}) is more than the kernel's 32-bit row index allows "
                         f"({INT32_LIMIT - 1}); split the input or use the torch reference")


def span_fits(n: int, stride: int, extra: int = 0) -> bool:
    """``(n - 1) * |stride| + extra`` fits in int32: the largest in-tile offset of an index
    ``< n`` times ``stride``, plus ``extra`` (e.g. the head dim added to it)."""
    return max(n - 1, 0) * abs(stride) + extra < INT32_LIMIT


def pair_bias_fits(n: int) -> bool:
    """A contiguous ``[N, N]`` pair-bias matrix's in-tile offsets ``i * N + j`` fit in int32
    (N <= 46340)."""
    return span_fits(n, n, n - 1)


def grid_fits(programs: int) -> bool:
    """``programs`` fit in one grid y or z dimension."""
    return programs <= GRID_YZ_LIMIT


def check_grid(op: str, what: str, programs: int) -> None:
    """Refuse a launch whose grid y or z dimension (``programs``) exceeds CUDA's limit."""
    if not grid_fits(programs):
        raise ValueError(f"{op}: {what} needs {programs} programs in one grid dimension; "
                         f"CUDA allows {GRID_YZ_LIMIT} in y and z; split the input")
