"""Deterministic reductions over the first dim: fp32 accumulation in a fixed order, the result
stored directly in the wanted dtype.

``sum_partials``: the second stage of the two-stage reductions. The LayerNorm backward (weight
and bias gradients) and EvoAttention's bias gradient (split over rows) write one fp32 partial sum
per program; ``torch.sum(0)`` then ``.to(dtype)`` would be two more launches per gradient.

``column_sum``: ``x [M, C] -> x.sum(0)``, the bias gradient of a linear layer (``dy`` summed over
its rows). PyTorch's reduction over the outer dim of a ``[65536, 128]`` bf16 tensor runs near
0.3 TB/s on an H100 (55 us, 27 of them per Evoformer block); here a fixed grid of programs each
walks a strided set of ``[BLOCK_M, BLOCK_C]`` tiles, keeps fp32 sums in registers and writes one
partial row, and the programs that finish last add the rows in order, in the same launch
(:mod:`fold_kernels.one_pass`; with ``FOLD_KERNELS_ONE_PASS=0``, ``sum_partials`` does).

Both stages read tiles of many rows at once: a loop that adds one row per iteration is bound by
load latency (a single program summing 528 partial rows of 512 took 60 us).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from fold_kernels import one_pass, pdl, tuning
from fold_kernels.index32 import check_grid, check_rows, grid_fits, rows_fit
from fold_kernels.ints import cdiv, next_power_of_2
from fold_kernels.launch import fast
from fold_kernels.one_pass import finish_sum

__all__ = ["sum_partials", "column_sum", "column_sum_fits"]


@fast
@triton.jit
def _sum_partials(P, Out, S, M, rows_per_group, BLOCK_S: tl.constexpr, BLOCK_M: tl.constexpr,
                  PDL: tl.constexpr = False):
    """Program (j, g) sums rows [g * rows_per_group, (g + 1) * rows_per_group) of column block j
    of ``P [S, M]`` into row g of ``Out [groups, M]``."""
    pdl.enter(PDL)
    # int64: M (the partials' row length, e.g. a [B, H, N, N] bias gradient) can pass 2**31
    offs_m = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    g = tl.program_id(1)
    m_valid = offs_m < M
    offs_s = tl.arange(0, BLOCK_S)
    acc = tl.zeros([BLOCK_S, BLOCK_M], tl.float32)
    s_end = tl.minimum(S, (g + 1) * rows_per_group)
    for s0 in range(g * rows_per_group, s_end, BLOCK_S):  # fixed order: deterministic
        rows = s0 + offs_s
        mask = (rows < s_end)[:, None] & m_valid[None, :]
        # 64-bit row offsets: no overflow for S * M >= 2**31
        acc += tl.load(P + rows.to(tl.int64)[:, None] * M + offs_m[None, :], mask=mask,
                       other=0.0)
    out = Out + g.to(tl.int64) * M + offs_m
    tl.store(out, tl.sum(acc, 0).to(Out.dtype.element_ty), mask=m_valid)


def _partial_blocks(s: int, m: int) -> tuple[int, int]:
    """(BLOCK_S, BLOCK_M) with about 4K fp32 values a tile: many rows per load when there are
    many partial rows (the LayerNorm's 4 x SMs), wide tiles when there are few (EvoAttention)."""
    if tuning.interpreting():
        return 4, 64
    block_s = min(64, next_power_of_2(max(s, 1)))
    block_m = max(64, min(1024, 4096 // block_s))
    return block_s, block_m


def _group_rows() -> int:
    """Partial rows one program adds before a further level: a single program walking
    thousands of rows is bound by load latency (2112 rows of 256 took ~40 us on an H100)."""
    return 8 if tuning.interpreting() else 256


def sum_partials(partials: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``partials [S, *shape]`` fp32 (contiguous) -> ``sum(0)`` of shape ``shape`` in ``dtype``.

    Many rows are added in a tree of fixed groups (each level one launch whose programs add
    ``_group_rows()`` rows each, in order): deterministic for a given S."""
    if partials.shape[0] == 1 and partials.dtype == dtype:
        return partials[0]
    s = partials.shape[0]
    m = partials[0].numel()
    flat = partials
    group = _group_rows()
    warps = 1 if tuning.interpreting() else 4
    while s > group:  # one level: [S, M] -> [ceil(S / group), M] fp32
        n_groups = cdiv(s, group)
        level = torch.empty((n_groups, m), device=partials.device, dtype=torch.float32)
        block_s, block_m = _partial_blocks(group, m)
        _sum_partials[(cdiv(m, block_m), n_groups)](
            flat, level, s, m, group, BLOCK_S=block_s, BLOCK_M=block_m, num_warps=warps)
        flat, s = level, n_groups
    out = torch.empty(partials.shape[1:], device=partials.device, dtype=dtype)
    block_s, block_m = _partial_blocks(s, m)
    _sum_partials[(cdiv(m, block_m), 1)](flat, out, s, m, s, BLOCK_S=block_s,
                                         BLOCK_M=block_m, num_warps=warps)
    return out


@fast
@triton.jit
def _column_partials(X, P, Out, Cnt, M, C, sxm, sxc, BLOCK_M: tl.constexpr,
                     BLOCK_C: tl.constexpr, ONE_PASS: tl.constexpr, GROUP: tl.constexpr,
                     TAIL_S: tl.constexpr, PDL: tl.constexpr = False):
    """Program (p, j) sums row blocks p, p + P, p + 2P, ... of columns block j into P[p, cols];
    with ``ONE_PASS`` the last programs of column block j add P's rows into ``Out[cols]``
    (:func:`fold_kernels.one_pass.finish_sum`, counters ``Cnt[j * slots:]``)."""
    pdl.enter(PDL)
    pid = tl.program_id(0)
    n_prog = tl.num_programs(0)
    offs_c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    c_valid = offs_c < C
    c_off = offs_c.to(tl.int64)[None, :] * sxc  # int64: x may be a transposed view
    acc = tl.zeros([BLOCK_M, BLOCK_C], tl.float32)
    for blk in range(pid, tl.cdiv(M, BLOCK_M), n_prog):  # fixed order per program
        offs_m = blk * BLOCK_M + tl.arange(0, BLOCK_M)
        mask = (offs_m < M)[:, None] & c_valid[None, :]
        ptrs = X + offs_m.to(tl.int64)[:, None] * sxm + c_off
        acc += tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
    tl.store(P + pid * C + offs_c, tl.sum(acc, 0), mask=c_valid)
    if ONE_PASS:
        col0 = tl.program_id(1) * BLOCK_C
        finish_sum(P, Out, Cnt + tl.program_id(1) * (1 + tl.cdiv(n_prog, GROUP)), pid, n_prog,
                   C, col0, tl.minimum(BLOCK_C, C - col0), GROUP, TAIL_S, BLOCK_C)


def _block_c(c: int) -> int:
    """Columns a program: compiled, 128 (32 rows of them: an 8 KB bf16 tile); interpreter, 16."""
    return min(16 if tuning.interpreting() else 128, next_power_of_2(c))


def column_sum_fits(m: int, c: int) -> bool:
    """:func:`column_sum` takes an ``[m, c]`` input: its row index fits in int32 and its column
    blocks in one grid dimension."""
    return rows_fit((m, c)) and grid_fits(cdiv(c, _block_c(c)))


def column_sum(x: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``x [M, C]`` (any strides) -> ``x.sum(0)`` ``[C]`` accumulated in fp32, stored in ``dtype``
    (default x's). Deterministic: the same bits on every call."""
    if x.dim() != 2:
        raise ValueError(f"column_sum: x must be [M, C], got shape {tuple(x.shape)}")
    tuning.require_device("column_sum", x)
    check_rows("column_sum", x.shape)
    dtype = x.dtype if dtype is None else dtype
    m, c = x.shape
    if m == 0:
        return torch.zeros(c, device=x.device, dtype=dtype)
    interpreting = tuning.interpreting()
    block_c = _block_c(c)
    block_m = 4 if interpreting else max(8, 4096 // block_c)
    n_cblk = cdiv(c, block_c)
    check_grid("column_sum", f"{c} columns", n_cblk)
    # programs per column block: 3 in the interpreter (the strided loop and several partial
    # rows are exercised), else about 4 programs per SM in all
    per_cblk = 3 if interpreting else max(1, 4 * tuning.multiprocessors(x.device) // n_cblk)
    n_prog = min(cdiv(m, block_m), per_cblk)
    warps = 1 if interpreting else 4
    if n_prog > 1 and one_pass.fits(n_cblk, n_prog):
        group = one_pass.group_size()
        partials = one_pass.partials(n_prog, c, x.device)
        out = torch.empty(c, device=x.device, dtype=dtype)
        _column_partials[(n_prog, n_cblk)](x, partials, out, one_pass.counters(x.device), m, c,
                                           x.stride(0), x.stride(1), BLOCK_M=block_m,
                                           BLOCK_C=block_c, ONE_PASS=True, GROUP=group,
                                           TAIL_S=group, num_warps=warps)
        return out
    partials = torch.empty((n_prog, c), device=x.device, dtype=torch.float32)
    _column_partials[(n_prog, n_cblk)](x, partials, partials, partials, m, c, x.stride(0),
                                       x.stride(1), BLOCK_M=block_m, BLOCK_C=block_c,
                                       ONE_PASS=False, GROUP=1, TAIL_S=1, num_warps=warps)
    return sum_partials(partials, dtype)
