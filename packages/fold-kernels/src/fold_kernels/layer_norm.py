"""LayerNorm for AlphaFold's small hidden sizes (64 to 384) over many rows (ScaleFold 3.3.1).

A row of 64-384 values is too short to keep a whole program busy, so each program normalizes
``BLOCK_R`` rows at once, held in registers: the statistics take one pass over memory (mean,
then the centered variance from the same registers), and x is read once and y written once.

Backward: ``dx = rstd * (w dy - xhat * mean(xhat w dy) - mean(w dy))``. The weight and bias
gradients are sums over all rows; instead of one atomic add per row, a fixed grid of programs
each walks a strided set of row blocks and keeps its partial sums in registers, writes them to
its own row of a ``[programs, C]`` fp32 buffer, and the programs that finish last sum that
buffer in a fixed order (:mod:`fold_kernels.one_pass`): deterministic, no atomics on the data,
one launch.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from fold_ops.autocast import lower, projection_dtype
from fold_ops.env import EnvVar

from fold_kernels import nograd, one_pass, pdl, tuning
from fold_kernels.broadcast import row_layout, row_offsets
from fold_kernels.index32 import check_rows
from fold_kernels.ints import cdiv, next_power_of_2
from fold_kernels.launch import fast
from fold_kernels.one_pass import finish_sum
from fold_kernels.reduce import sum_partials

__all__ = ["layer_norm", "layer_norm_fork", "layer_norm_pair_bias", "ln_forward",
           "ln_backward", "row_stats", "MAX_HIDDEN"]

MAX_HIDDEN = 8192


@triton.jit
def row_stats(x, rc, C, eps):
    """``(mean, xc, rstd)`` of each row of ``x [BLOCK_R, BLOCK_C]`` (fp32, zeros outside ``rc``):
    the mean, the centered rows (zero outside ``rc``) and 1/std, the variance taken from the
    centered values in registers (one pass over memory)."""
    mean = tl.sum(x, 1) / C
    xc = tl.where(rc, x - mean[:, None], 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, 1) / C + eps)
    return mean, xc, rstd


@fast
@triton.jit
def _ln_fwd(X, W, B, Y, Mean, Rstd, rows, C, eps, d1, d2, xs0, xs1, xs2, xsc,
            HAS_BIAS: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
            PDL: tl.constexpr = False):
    """Without ``HAS_BIAS`` (a gain-only LayerNorm, AF3's AdaLN of s) B is not read."""
    pdl.enter(PDL)
    offs_r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_c = tl.arange(0, BLOCK_C)
    r_valid = offs_r < rows
    c_valid = offs_c < C
    rc = r_valid[:, None] & c_valid[None, :]
    ptrs = offs_r.to(tl.int64)[:, None] * C + offs_c[None, :]  # y: contiguous
    # int64: a column stride can be large (x a transposed view); rows < 2**31 (check_rows)
    xptrs = (row_offsets(offs_r, d1, d2, xs0, xs1, xs2)[:, None]
             + offs_c.to(tl.int64)[None, :] * xsc)
    x = tl.load(X + xptrs, mask=rc, other=0.0).to(tl.float32)  # [BLOCK_R, BLOCK_C]
    mean, xc, rstd = row_stats(x, rc, C, eps)
    w = tl.load(W + offs_c, mask=c_valid, other=0.0).to(tl.float32)
    y = xc * rstd[:, None] * w[None, :]
    if HAS_BIAS:
        y += tl.load(B + offs_c, mask=c_valid, other=0.0).to(tl.float32)[None, :]
    tl.store(Y + ptrs, y.to(Y.dtype.element_ty), mask=rc)
    tl.store(Mean + offs_r, mean, mask=r_valid)
    tl.store(Rstd + offs_r, rstd, mask=r_valid)


@fast
@triton.jit
def _ln_bwd(X, W, DY, DY2, DR, Mean, Rstd, DX, DWp, DBp, DWDB, Cnt, sp, rows, C, d1, d2,
            xs0, xs1, xs2, xsc, ys0, ys1, ys2, ysc, y2s0, y2s1, y2s2, y2sc,
            rs0, rs1, rs2, rsc, ds0, ds1, ds2, dsc, G, WH, gsh,
            HAS_DY2: tl.constexpr, HAS_DR: tl.constexpr,
            BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, ONE_PASS: tl.constexpr,
            GROUP: tl.constexpr, TAIL_S: tl.constexpr, TAIL_M: tl.constexpr,
            ACC_TILE: tl.constexpr = False, DENSE: tl.constexpr = False,
            FMA: tl.constexpr = True, HAS_DY: tl.constexpr = True,
            N_HEADS: tl.constexpr = 0, PDL: tl.constexpr = False):
    """x, dy (+ dy2) (+ dr) and dx each through their own row strides (the row dims are
    shared). ``dy2``: a second reader's gradient of y, summed into dy; ``dr``: the gradient of
    x from outside the LayerNorm (the residual stream), added to dx (:func:`layer_norm_fork`).
    ``N_HEADS`` > 0: the gradient of a per-head projection of y, ``G [N_HEADS, rows]`` (heads
    ``gsh`` apart, rows in x's logical order) times its weight ``WH [N_HEADS, C]``, is added to
    dy row by row (:func:`layer_norm_pair_bias`: the projection's d(y) is never written).
    Without ``HAS_DY`` that is the whole of dy and DY is not read.
    Each program's ``[dw | db]`` partial row goes to ``DWp`` / ``DBp`` (rows ``sp`` apart);
    with ``ONE_PASS`` the last programs add them into ``DWDB [2, C]``
    (:func:`fold_kernels.one_pass.finish_sum`). ``ACC_TILE``: the partial sums are kept as
    ``[BLOCK_R, BLOCK_C]`` tiles and summed over rows once, after the loop, instead of a
    column sum across the warps (shared memory and a barrier) for every row block.
    ``DENSE``: every operand is a contiguous ``[rows, C]``, so a block's elements are one int64
    start plus one int32 in-tile offset tile shared by all operands and hoisted out of the loop,
    instead of a per-row division into the row dims and int64 offsets per element and operand
    (about 12 of the loop's 30 instructions per element at C 128, sm_90). ``FMA``: xhat as one
    FMA with no select and dx as two FMAs with the row factors scaled by rstd once (20.6 -> 18.3
    instructions per element for the 64-row tile candidate); off, the textbook form."""
    pdl.enter(PDL)
    pid = tl.program_id(0)
    n_prog = tl.num_programs(0)
    offs_c = tl.arange(0, BLOCK_C)
    c_valid = offs_c < C
    c64 = offs_c.to(tl.int64)  # times column strides, which can be large (transposed views)
    w = tl.load(W + offs_c, mask=c_valid, other=0.0).to(tl.float32)
    if ACC_TILE:
        dw_t = tl.zeros([BLOCK_R, BLOCK_C], tl.float32)
        db_t = tl.zeros([BLOCK_R, BLOCK_C], tl.float32)
    else:
        dw = tl.zeros([BLOCK_C], tl.float32)
        db = tl.zeros([BLOCK_C], tl.float32)
    n_blocks = tl.cdiv(rows, BLOCK_R)
    if DENSE:  # in-tile offsets of every operand, i32
        tile = tl.arange(0, BLOCK_R)[:, None] * C + offs_c[None, :]
    for blk in range(pid, n_blocks, n_prog):
        offs_r = blk * BLOCK_R + tl.arange(0, BLOCK_R)
        r_valid = offs_r < rows
        rc = r_valid[:, None] & c_valid[None, :]
        if DENSE:  # one row-major [rows, C] layout: pointer = start of the block + tile
            start = tl.cast(blk, tl.int64) * BLOCK_R * C  # (an int in the interpreter)
            xs_ = X + start
            ys_ = DY + start
            ds_ = DX + start
            xp = tile
            yp = tile
            dp = tile
        else:
            xs_ = X
            ys_ = DY
            ds_ = DX
            xp = row_offsets(offs_r, d1, d2, xs0, xs1, xs2)[:, None] + c64[None, :] * xsc
            yp = row_offsets(offs_r, d1, d2, ys0, ys1, ys2)[:, None] + c64[None, :] * ysc
            dp = row_offsets(offs_r, d1, d2, ds0, ds1, ds2)[:, None] + c64[None, :] * dsc
        x = tl.load(xs_ + xp, mask=rc, other=0.0).to(tl.float32)
        if HAS_DY:
            dy = tl.load(ys_ + yp, mask=rc, other=0.0).to(tl.float32)
        else:
            dy = tl.zeros([BLOCK_R, BLOCK_C], tl.float32)
        for h in tl.static_range(N_HEADS):  # dy += G^T WH: N_HEADS FMAs an element
            g = tl.load(G + tl.cast(h, tl.int64) * gsh + offs_r, mask=r_valid,
                        other=0.0).to(tl.float32)  # [BLOCK_R]
            wh = tl.load(WH + h * C + offs_c, mask=c_valid, other=0.0).to(tl.float32)
            dy += g[:, None] * wh[None, :]
        if HAS_DY2:
            if DENSE:
                dy += tl.load(DY2 + start + tile, mask=rc, other=0.0).to(tl.float32)
            else:
                y2p = (row_offsets(offs_r, d1, d2, y2s0, y2s1, y2s2)[:, None]
                       + c64[None, :] * y2sc)
                dy += tl.load(DY2 + y2p, mask=rc, other=0.0).to(tl.float32)
        mean = tl.load(Mean + offs_r, mask=r_valid, other=0.0)
        rstd = tl.load(Rstd + offs_r, mask=r_valid, other=0.0)
        wdy = dy * w[None, :]
        if FMA:
            # xhat as one FMA and no select: outside rc it reaches no sum and no store (padded
            # columns have dy = w = 0; rows past the end have mean = rstd = 0, so xhat = 0)
            xhat = x * rstd[:, None] - (mean * rstd)[:, None]
            k1 = tl.sum(xhat * wdy, 1) * (rstd / C)  # the row factors, rstd folded in once
            k2 = tl.sum(wdy, 1) * (rstd / C)
            dx = wdy * rstd[:, None] - (xhat * k1[:, None] + k2[:, None])  # two FMAs
        else:
            xhat = tl.where(rc, (x - mean[:, None]) * rstd[:, None], 0.0)
            c1 = tl.sum(xhat * wdy, 1) / C
            c2 = tl.sum(wdy, 1) / C
            dx = (wdy - xhat * c1[:, None] - c2[:, None]) * rstd[:, None]
        if HAS_DR:
            if DENSE:
                dx += tl.load(DR + start + tile, mask=rc, other=0.0).to(tl.float32)
            else:
                rp = row_offsets(offs_r, d1, d2, rs0, rs1, rs2)[:, None] + c64[None, :] * rsc
                dx += tl.load(DR + rp, mask=rc, other=0.0).to(tl.float32)
        tl.store(ds_ + dp, dx.to(DX.dtype.element_ty), mask=rc)
        if ACC_TILE:
            dw_t += dy * xhat
            db_t += dy
        else:
            dw += tl.sum(dy * xhat, 0)
            db += tl.sum(dy, 0)
    if ACC_TILE:
        dw = tl.sum(dw_t, 0)
        db = tl.sum(db_t, 0)
    tl.store(DWp + pid * sp + offs_c, dw, mask=c_valid)  # sp: stride between programs' rows
    tl.store(DBp + pid * sp + offs_c, db, mask=c_valid)
    if ONE_PASS:  # DWp's rows are [dw | db]: 2 C columns
        finish_sum(DWp, DWDB, Cnt, pid, n_prog, sp, 0, 2 * C, GROUP, TAIL_S, TAIL_M)


def _block_r(c: int) -> int:
    if tuning.interpreting():
        return 4
    # about 4K elements a program: 64 rows of 64, 16 rows of 256, 8 rows of 384 (512 padded)
    return max(1, min(64, 4096 // next_power_of_2(c)))


def _num_warps(block_r: int, block_c: int) -> int:
    return 1 if tuning.interpreting() else (8 if block_r * block_c >= 8192 else 4)


def _layout(*tensors: torch.Tensor):
    """Shared row dims ``(d0, d1, d2)`` and each tensor's ``(s0, s1, s2, sc)`` strides for
    tensors of one shape ``[*, C]`` (:func:`fold_kernels.broadcast.row_layout`: contiguous
    tensors skip the general merge)."""
    lay = row_layout(tensors[0].shape, *tensors)
    return lay.dims, lay.operands, lay.strides


def ln_forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float,
               out_dtype: torch.dtype | None = None):
    """``x [*, C]`` in any layout (read through row strides, no copy) -> ``y`` contiguous
    ``[*, C]`` (in x's dtype, or ``out_dtype``: computed in fp32, rounded once), ``mean``,
    ``rstd`` ``[rows]`` fp32 (rows in x's logical order). ``bias`` None: a gain-only
    LayerNorm."""
    c = x.shape[-1]
    rows = x.numel() // max(c, 1)
    y = torch.empty(x.shape, device=x.device, dtype=out_dtype or x.dtype)
    mean = torch.empty(rows, device=x.device, dtype=torch.float32)
    rstd = torch.empty_like(mean)
    dims, (xv,), (xs,) = _layout(x)
    block_c = next_power_of_2(c)
    block_r = _block_r(c)
    _ln_fwd[(cdiv(rows, block_r),)](
        xv, weight, weight if bias is None else bias, y, mean, rstd, rows, c, eps, dims[1],
        dims[2], *xs, HAS_BIAS=bias is not None, BLOCK_R=block_r, BLOCK_C=block_c,
        num_warps=_num_warps(block_r, block_c))
    return y, mean, rstd


# ``FOLD_KERNELS_LN_DENSE=0``: the backward reads contiguous operands through the general
# row-dims path too (for comparisons)
_DENSE = EnvVar("FOLD_KERNELS_LN_DENSE", lambda v: (v if v is not None else "1") != "0")
# ``FOLD_KERNELS_LN_TILE=0`` leaves the row-tile candidates out of the backward's tuning (for
# comparisons: benchmarks/tools/switch_ab.py)
_TILE = EnvVar("FOLD_KERNELS_LN_TILE", lambda v: (v if v is not None else "1") != "0")
# ``FOLD_KERNELS_LN_FMA=0``: the backward's loop in its textbook form (for comparisons)
_FMA = EnvVar("FOLD_KERNELS_LN_FMA", lambda v: (v if v is not None else "1") != "0")


# The backward's candidates: (rows a block as a multiple of _block_r, warps, programs per SM).
# Every one of 33 candidates was timed on an H200 (benchmarks/results/kernels/
# layer_norm_bwd_sweep_h200_occupancy.md, pair 256^2-768^2 x 128 and MSA 512 x 384 x 256): these
# were the fastest three somewhere, all with the partial sums as row tiles. Half-size blocks on
# 4 warps (16 values a thread, ~128 registers: 4 programs fit an SM, one wave) won at 384^2,
# 768^2 and the MSA, and came within 3% of the best at 256^2 (64 rows on 8 warps, one program
# an SM); the former default (32 rows of 128, 4 a multiprocessor, column sums) was 1.8-2.6x
# slower, the row tiles' 2026-11-29 pick (64 rows, 8 warps, 2 an SM) 1.1-1.2x.
_BWD_SHAPES = ((0.5, 4, 4), (2, 8, 1), (1, 8, 2), (0.5, 4, 8), (1, 4, 4), (2, 8, 2))


@functools.cache  # built on every backward, they would cost host time
def _bwd_configs_for(c: int, interpreting: bool, tiles: bool = True) -> tuple[tuning.Config, ...]:
    """Candidates for the backward: ``block_m`` rows a program, ``num_warps``, and ``block_n``
    programs per multiprocessor (each walks a strided set of row blocks); the first is the
    default (``FOLD_KERNELS_AUTOTUNE=0``, or an untuned shape met during a CUDA-graph capture).
    With ``tiles`` each keeps the weight / bias partial sums as row tiles (``ACC_TILE``) where
    their registers fit (at most 64 values a thread), else column sums per block; without, all
    take column sums (``FOLD_KERNELS_LN_TILE=0``, for comparisons). Under the interpreter: one
    small candidate."""
    block_r = _block_r(c)
    if interpreting:
        return (tuning.Config(block_m=block_r, block_n=4,
                              num_warps=_num_warps(block_r, next_power_of_2(c))),)
    out = []
    for rows_x, warps, per_sm in _BWD_SHAPES:
        rows = max(1, int(block_r * rows_x))
        fits = rows * next_power_of_2(c) // (32 * warps) <= 64
        cfg = tuning.Config(block_m=rows, block_n=per_sm, num_warps=warps,
                            acc_tile=tiles and fits)
        if cfg not in out:
            out.append(cfg)
    return tuple(out)


def ln_backward(dy, x, weight, mean, rstd, dw_dtype=torch.float32, db_dtype=torch.float32,
                dy2=None, dres=None, heads=None):
    """Gradients ``(dx, dweight [C], dbias [C])`` of LayerNorm for ``x, dy [*, C]`` in any
    layouts (dx in x's layout when x is dense). dw and db are added in one pass: the last
    programs of the kernel add the partial rows (:mod:`fold_kernels.one_pass`), writing
    ``dw_dtype`` / ``db_dtype`` directly (no separate cast); with ``FOLD_KERNELS_ONE_PASS=0``
    a second launch does (:func:`fold_kernels.reduce.sum_partials`). ``dy2`` (a second
    gradient of y, added to dy) and ``dres`` (a gradient of x from outside, added to dx) are
    read in the same pass (:func:`layer_norm_fork`). ``heads``: ``(g [H, rows], w [H, C])``,
    the gradient of a per-head projection ``w y`` of y, added to dy as ``g^T w`` in the same
    pass (:func:`layer_norm_pair_bias`); dy may then be None. The launch configuration is
    autotuned per shape and layout (:func:`fold_kernels.tuning.pick`)."""
    c = x.shape[-1]
    rows = x.numel() // max(c, 1)
    dx = torch.empty_like(x)  # keeps x's strides when x is dense: the caller's grad layout
    has_dy, has_dy2, has_dres = dy is not None, dy2 is not None, dres is not None
    n_heads = 0 if heads is None else heads[0].shape[0]
    g, wh = heads if heads is not None else (x, weight)  # stand-ins, never read
    gsh = g.stride(0) if heads is not None else 0
    # an absent gradient is stood in for by dy, or x (same layout, never read: HAS_DY2 / HAS_DR
    # / HAS_DY)
    dy = dy if has_dy else x
    dy2, dres = (dy2 if has_dy2 else dy), (dres if has_dres else dy)
    dims, (xv, dyv, dxv, dy2v, drv), (xs, ys, ds, y2s, rs) = _layout(x, dy, dx, dy2, dres)
    if dxv.data_ptr() != dx.data_ptr() or dxv.stride() != dx.stride():  # merge fell back
        dx = torch.empty(x.shape, device=x.device, dtype=x.dtype)
        dyc = dyv.contiguous()
        dims, (xv, dyv, dxv, dy2v, drv), (xs, ys, ds, y2s, rs) = _layout(
            xv.contiguous(), dyc, dx, dy2v.contiguous() if has_dy2 else dyc,
            drv.contiguous() if has_dres else dyc)
    block_c = next_power_of_2(c)
    # every operand read or written is one row-major [rows, C] (absent ones stand in as dy):
    # the strides broadcast.row_layout gives dense operands
    dense = (_DENSE.get() and dims[:2] == (1, 1)
             and all(tuple(s) == (0, 0, c, 1) for s in (xs, ys, ds, y2s, rs)))
    sms = None if tuning.interpreting() or not x.is_cuda else tuning.multiprocessors(x.device)
    # one pass: the kernel adds the partial rows itself, stored in the gradients' dtype. At
    # most 8 programs per SM: far fewer counters than one_pass.SLOTS on any GPU.
    fused = one_pass.enabled()
    out_dtype = dw_dtype if dw_dtype == db_dtype else torch.float32
    group = one_pass.group_size() if fused else 1
    tail_m = min(256, next_power_of_2(2 * c)) if fused else 1
    tiles, fma = _TILE.get(), _FMA.get()  # in the key too: each setting is tuned on its own
    state = {}

    def launch(cfg: tuning.Config):
        n_blocks = cdiv(rows, cfg.block_m)
        n_prog = min(n_blocks, 3 if sms is None else cfg.block_n * sms)
        extra = cdiv(n_prog, group) if fused else 0  # group rows after the programs' rows
        partials = torch.empty((n_prog + extra, 2, c), device=x.device,
                               dtype=torch.float32)  # dw | db
        # [2, C] in the gradients' dtype; without one pass, partials stand in (never written)
        dwdb = (torch.empty((2, c), device=x.device, dtype=out_dtype) if fused
                else partials)
        _ln_bwd[(n_prog,)](xv, weight, dyv, dy2v, drv, mean, rstd, dxv, partials,
                           partials[:, 1], dwdb, one_pass.counters(x.device) if fused else dwdb,
                           2 * c, rows, c, dims[1], dims[2], *xs, *ys, *y2s, *rs, *ds,
                           g, wh, gsh, HAS_DY2=has_dy2,
                           HAS_DR=has_dres, BLOCK_R=cfg.block_m, BLOCK_C=block_c,
                           ONE_PASS=fused, GROUP=group, TAIL_S=group, TAIL_M=tail_m,
                           ACC_TILE=cfg.acc_tile, DENSE=dense, FMA=fma, HAS_DY=has_dy,
                           N_HEADS=n_heads, num_warps=cfg.num_warps)
        state["out"] = dwdb  # the sums (one pass), or the partial rows to sum

    # Timed with the second stage where the kernel does it (one pass); otherwise the first
    # stage alone: host overhead would swamp the few microseconds of sum_partials' tree.
    key = (rows, c, x.dtype, dy.dtype, tuple(xs), tuple(ys), tuple(ds),
           tuple(y2s) if has_dy2 else None, tuple(rs) if has_dres else None, fused, tiles,
           dense, fma, has_dy, n_heads)
    candidates = _bwd_configs_for(c, tuning.interpreting(), tiles)
    launch(tuning.pick("ln_bwd", key, candidates, launch))
    dwdb = state["out"] if fused else sum_partials(state["out"], out_dtype)  # [2, C]
    if dw_dtype == db_dtype:
        return dx, dwdb[0], dwdb[1]
    return dx, dwdb[0].to(dw_dtype), dwdb[1].to(db_dtype)


def _save_forward(ctx, x, weight, bias, eps, out_dtype=None) -> torch.Tensor:
    """``y = LN(x)`` for an autograd function's forward, saving what its backward reads. x is
    read in its own layout (e.g. the transposed MSA of column attention): the transpose copy is
    fused into the normalisation, y comes out contiguous (in ``out_dtype`` if given)."""
    y, mean, rstd = ln_forward(x, weight.contiguous(),
                               None if bias is None else bias.contiguous(), eps, out_dtype)
    ctx.save_for_backward(x, weight, mean, rstd)
    ctx.bias_dtype = None if bias is None else bias.dtype  # None: no bias gradient
    return y


def _saved_backward(ctx, dy, dy2=None, dres=None):
    """``(dx, dweight, dbias)`` from what :func:`_save_forward` saved (dbias None without a
    bias: the kernel's bias sums are dropped)."""
    x, weight, mean, rstd = ctx.saved_tensors
    bias_dtype = weight.dtype if ctx.bias_dtype is None else ctx.bias_dtype
    dx, dw, db = ln_backward(dy, x, weight, mean, rstd, weight.dtype, bias_dtype, dy2=dy2,
                             dres=dres)
    return dx, dw, None if ctx.bias_dtype is None else db


class _LayerNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        return _save_forward(ctx, x, weight, bias, eps)

    @staticmethod
    def backward(ctx, dy):
        return (*_saved_backward(ctx, dy), None)


def check_layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                     bias_optional: bool = False) -> None:
    """``weight [C]`` and ``bias [C]`` (None allowed with ``bias_optional``: gain only)."""
    c = x.shape[-1]
    if (weight is None or weight.shape != (c,)
            or (bias is None and not bias_optional) or (bias is not None and bias.shape != (c,))):
        raise ValueError(f"layer_norm: weight and bias must be [C={c}], got "
                         f"{None if weight is None else tuple(weight.shape)} and "
                         f"{None if bias is None else tuple(bias.shape)}")
    if c > MAX_HIDDEN:
        raise ValueError(f"layer_norm: hidden size {c} > {MAX_HIDDEN}")
    check_rows("layer_norm", x.shape)
    tuning.require_device("layer_norm", x, "fold_ops.reference.layer_norm")


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
               eps: float = 1e-5) -> torch.Tensor:
    """LayerNorm over the last dim of ``x [*, C]``, like ``F.layer_norm``; y in x's dtype.
    ``bias`` None: gain only (AF3's AdaLN normalises s so)."""
    check_layer_norm(x, weight, bias, bias_optional=True)
    return nograd.apply(_LayerNorm, x, weight, bias, eps)


def _join_readers(dys: list) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``(dy, dy2)`` for the backward kernel from the gradients of y's readers that were read
    (None where absent): a third reader and more (none in fold-model) are added first."""
    if len(dys) < 2:
        return (dys[0] if dys else None), None
    return dys[0], dys[1] if len(dys) == 2 else torch.stack(dys[1:]).sum(0)


class _LayerNormFork(torch.autograd.Function):
    """``(x, y, ..., y)``: x passed on (autograd makes it a view of the input) and ``branches``
    aliases of one ``y`` in ``out_dtype``; the backward sums every gradient it gets in
    LayerNorm's pass (y's gradients in y's dtype, x's in x's)."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps, branches, out_dtype):
        y = _save_forward(ctx, x, weight, bias, eps, out_dtype)
        ctx.set_materialize_grads(False)  # an unread output's gradient is None, not zeros
        # detach: an alias that is no view of y (each output gets its own gradient)
        return (x, y) + tuple(y.detach() for _ in range(branches - 1))

    @staticmethod
    def backward(ctx, dres, *dys):
        dys = [d for d in dys if d is not None]
        if not dys:  # no branch was read: the stream's gradient passes through
            return dres, None, None, None, None, None
        return (*_saved_backward(ctx, *_join_readers(dys), dres), None, None, None)


def layer_norm_fork(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                    eps: float = 1e-5, branches: int = 1) -> tuple[torch.Tensor, ...]:
    """``(x, y_1, ..., y_branches)`` with ``y = layer_norm(x)`` (:func:`fold_ops.reference.
    layer_norm_fork`): the backward adds the gradients of x and of every y while it computes
    LayerNorm's dx, one pass over ``[*, C]`` where autograd would add each pair in a pass of
    three. Without autograd (inference) it is ``layer_norm`` and x. Under autocast y is in the
    autocast dtype (:func:`fold_ops.autocast.projection_dtype`), x's stays as it is."""
    if branches < 1:
        raise ValueError(f"layer_norm_fork: branches must be >= 1, got {branches}")
    check_layer_norm(x, weight, bias)
    out_dtype = projection_dtype(x)
    if not nograd.records(x, weight, bias):
        y, _, _ = ln_forward(x, weight.contiguous(), bias.contiguous(), eps, out_dtype)
        return (x,) + (y,) * branches
    return _LayerNormFork.apply(x, weight, bias, eps, branches, out_dtype)


class _LayerNormPairBias(torch.autograd.Function):
    """``(x, y, ..., y, bias)``: :class:`_LayerNormFork`'s outputs and the per-head projection
    ``bias [*, H, I, J] = W y^T`` (one cuBLAS GEMM writing the heads-first layout, as
    :func:`fold_kernels.channel_first.linear_channel_first`). The backward adds the bias's
    gradient times W to dy inside LayerNorm's pass, instead of a GEMM writing d(y) of the
    projection ``[*, C]`` and LayerNorm reading it back."""

    @staticmethod
    def forward(ctx, x, weight, bias, bias_weight, eps, branches):
        # y in bias_weight's dtype: x's, or the autocast dtype (the caller cast bias_weight)
        y, mean, rstd = ln_forward(x, weight.contiguous(), bias.contiguous(), eps,
                                   bias_weight.dtype)
        rows = y.view(-1, y.shape[-1])  # [M, C]: y is contiguous
        pb = bias_weight.mm(rows.t())  # [H, M]
        ctx.save_for_backward(x, weight, mean, rstd, rows, bias_weight)
        ctx.bias_dtype = bias.dtype  # the LayerNorm's bias itself is not read in backward
        ctx.branches = branches
        ctx.set_materialize_grads(False)  # an unread output's gradient is None, not zeros
        # [H, *batch, I, J] -> [*batch, H, I, J] (contiguous for one batch entry)
        pb = pb.view(bias_weight.shape[0], *x.shape[:-1]).movedim(0, -3)
        return (x,) + tuple(y if i == 0 else y.detach() for i in range(branches)) + (pb,)

    @staticmethod
    def backward(ctx, dres, *grads):
        x, weight, mean, rstd, rows, bias_weight = ctx.saved_tensors
        dys = [d for d in grads[:ctx.branches] if d is not None]
        dpb = grads[ctx.branches]
        dwh = heads = None
        if dpb is not None:
            # [*batch, H, I, J] -> [H, M]: a view when dpb has the layout the forward made
            g = dpb.movedim(-3, 0).reshape(bias_weight.shape[0], -1)
            if g.stride(1) != 1:
                g = g.contiguous()
            if ctx.needs_input_grad[3]:
                dwh = g.to(rows.dtype).mm(rows)  # [H, C]
            heads = (g, bias_weight)
        if not dys and heads is None:  # nothing read but the stream: its gradient passes
            return dres, None, None, None, None, None
        dy, dy2 = _join_readers(dys)
        dx, dw, db = ln_backward(dy, x, weight, mean, rstd, weight.dtype, ctx.bias_dtype,
                                 dy2=dy2, dres=dres, heads=heads)
        return dx, dw, db, dwh, None, None


def layer_norm_pair_bias(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                         bias_weight: torch.Tensor, eps: float = 1e-5, branches: int = 1
                         ) -> tuple[torch.Tensor, ...]:
    """``(x, y_1, ..., y_branches, pair_bias)`` with ``y = layer_norm(x)`` and ``pair_bias
    [*, H, I, J] = sum_c bias_weight[h, c] y[..., i, j, c]`` (:func:`fold_ops.reference.
    layer_norm_pair_bias`): triangle attention's and AF3's attention-with-pair-bias
    LayerNorm, its readers and the heads' bias projection. In backward the bias's gradient
    ``[H, rows]`` times ``bias_weight`` joins dy in LayerNorm's pass: the projection's
    ``d(y) [*, C]`` (a GEMM's output) is never written nor read back. ``branches`` may be 0
    (the bias is y's only reader). Without autograd: ``layer_norm`` and one GEMM. Under
    autocast y and the bias are in the autocast dtype (``bias_weight`` is cast to it, as
    autocast casts a projection's weight)."""
    if not isinstance(branches, int) or branches < 0:
        raise ValueError(f"layer_norm_pair_bias: branches must be an int >= 0, got {branches}")
    check_layer_norm(x, weight, bias)
    if x.dim() < 3:
        raise ValueError(f"layer_norm_pair_bias: x must be [*, I, J, C], got "
                         f"{tuple(x.shape)}")
    out_dtype = projection_dtype(x)
    (bias_weight,), _ = lower((bias_weight,), {})  # the projection's weight, as autocast casts it
    if (bias_weight.dim() != 2 or bias_weight.shape[1] != x.shape[-1]
            or bias_weight.dtype != out_dtype):
        raise ValueError(f"layer_norm_pair_bias: bias_weight must be [H, C={x.shape[-1]}] in "
                         f"{out_dtype}, got {tuple(bias_weight.shape)} in {bias_weight.dtype}")
    return _LayerNormPairBias.apply(x, weight, bias, bias_weight.contiguous(), eps, branches)
