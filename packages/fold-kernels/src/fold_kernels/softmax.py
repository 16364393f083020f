"""Fused softmax with mask and bias (FastFold 5.2), for paths that still materialize logits.

``p = softmax(logits + bias, masked)`` over the last dim in one pass: each program holds
``BLOCK_R`` whole rows in registers (rows up to a few thousand long), reads logits, bias and mask
once and writes p once; eager PyTorch writes and re-reads ``logits + bias`` and the masked copy.
Bias and mask broadcast (``[*, H, N, N]`` pair bias against ``[*, S, H, N, N]`` logits,
``[*, S, 1, 1, N]`` key mask) and are read through strides.

Masked entries are replaced by a large negative constant, so a fully masked row gets uniform
weights (as the attention op) and masked entries get no gradient.
Backward: ``dz = p * (dp - sum(p * dp))``, zeroed on masked entries; the bias gradient is dz
summed to the bias's shape.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from fold_kernels import nograd, pdl, tuning
from fold_kernels.broadcast import broadcast_shape, reduce_to, row_layout, row_offsets
from fold_kernels.index32 import check_rows
from fold_kernels.ints import cdiv, next_power_of_2
from fold_kernels.launch import fast

__all__ = ["softmax_mask_bias", "MAX_ROW"]

MAX_ROW = 16384


@fast
@triton.jit
def _softmax_fwd(Z, Bias, Mask, P, d0, d1, d2, L,
                 zs0, zs1, zs2, zsc, bs0, bs1, bs2, bsc, ms0, ms1, ms2, msc,
                 HAS_BIAS: tl.constexpr, HAS_MASK: tl.constexpr,
                 BLOCK_R: tl.constexpr, BLOCK_L: tl.constexpr, PDL: tl.constexpr = False):
    pdl.enter(PDL)
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_L)
    c_valid = cols < L
    valid = (rows < d0 * d1 * d2)[:, None] & c_valid[None, :]
    cols64 = cols.to(tl.int64)  # times a column stride: a transposed view's can be large
    zp = Z + row_offsets(rows, d1, d2, zs0, zs1, zs2)[:, None] + cols64[None, :] * zsc
    z = tl.load(zp, mask=valid, other=0.0).to(tl.float32)
    if HAS_BIAS:
        bp = Bias + row_offsets(rows, d1, d2, bs0, bs1, bs2)[:, None] + cols64[None, :] * bsc
        z += tl.load(bp, mask=valid, other=0.0).to(tl.float32)
    if HAS_MASK:
        mp = Mask + row_offsets(rows, d1, d2, ms0, ms1, ms2)[:, None] + cols64[None, :] * msc
        keep = tl.load(mp, mask=valid, other=0) != 0
        z = tl.where(keep, z, -1.0e30)
    z = tl.where(c_valid[None, :], z, float("-inf"))  # [BLOCK_R, BLOCK_L]
    e = tl.exp(z - tl.max(z, 1)[:, None])
    p = e / tl.sum(e, 1)[:, None]
    out = rows.to(tl.int64)[:, None] * L + cols[None, :]
    tl.store(P + out, p.to(P.dtype.element_ty), mask=valid)


@fast
@triton.jit
def _softmax_bwd(P, DP, Mask, DZ, d0, d1, d2, L, ms0, ms1, ms2, msc,
                 HAS_MASK: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_L: tl.constexpr,
                 PDL: tl.constexpr = False):
    pdl.enter(PDL)
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_L)
    valid = (rows < d0 * d1 * d2)[:, None] & (cols < L)[None, :]
    out = rows.to(tl.int64)[:, None] * L + cols[None, :]
    p = tl.load(P + out, mask=valid, other=0.0).to(tl.float32)
    dp = tl.load(DP + out, mask=valid, other=0.0).to(tl.float32)
    dz = p * (dp - tl.sum(p * dp, 1)[:, None])
    if HAS_MASK:
        mp = (Mask + row_offsets(rows, d1, d2, ms0, ms1, ms2)[:, None]
              + cols.to(tl.int64)[None, :] * msc)
        dz = tl.where(tl.load(mp, mask=valid, other=0) != 0, dz, 0.0)
    tl.store(DZ + out, dz.to(DZ.dtype.element_ty), mask=valid)


def _blocks(length: int) -> tuple[int, int, int]:
    block_l = next_power_of_2(length)
    if tuning.interpreting():
        return 2, block_l, 1
    block_r = max(1, min(16, 2048 // block_l))
    return block_r, block_l, (4 if block_r * block_l <= 2048 else 8)


def _mask_u8(mask: torch.Tensor | None) -> torch.Tensor | None:
    """The mask read in place (the kernels test ``!= 0``): bool reinterpreted as uint8 (a free
    view), any other dtype as it is; never a converted copy per call."""
    if mask is None:
        return None
    return mask.view(torch.uint8) if mask.dtype == torch.bool else mask


class _SoftmaxMaskBias(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, mask, bias):
        shapes = [tuple(t.shape) for t in (logits, mask, bias) if t is not None]
        shape = broadcast_shape(*shapes)
        if shape is None:
            raise ValueError(f"softmax_mask_bias: shapes {shapes} do not broadcast")
        m8 = _mask_u8(mask)
        lay = row_layout(shape, logits, bias, m8)
        length = shape[-1]
        p = torch.empty(shape, device=logits.device, dtype=logits.dtype)
        block_r, block_l, warps = _blocks(length)
        rows = lay.dims[0] * lay.dims[1] * lay.dims[2]
        zv, bv, mv = lay.operands
        _softmax_fwd[(cdiv(rows, block_r),)](
            zv, bv if bv is not None else zv, mv if mv is not None else zv, p, *lay.dims,
            length, *lay.strides[0], *lay.strides[1], *lay.strides[2],
            HAS_BIAS=bias is not None, HAS_MASK=mask is not None,
            BLOCK_R=block_r, BLOCK_L=block_l, num_warps=warps)
        ctx.save_for_backward(p, m8)
        ctx.logits_shape, ctx.logits_dtype = logits.shape, logits.dtype
        ctx.bias_meta = None if bias is None else (bias.shape, bias.dtype)
        return p

    @staticmethod
    def backward(ctx, dp):
        p, m8 = ctx.saved_tensors
        shape = p.shape
        lay = row_layout(shape, m8)
        length = shape[-1]
        dz = torch.empty(shape, device=p.device, dtype=torch.float32)
        block_r, block_l, warps = _blocks(length)
        rows = lay.dims[0] * lay.dims[1] * lay.dims[2]
        mv = lay.operands[0]
        _softmax_bwd[(cdiv(rows, block_r),)](
            p, dp.contiguous(), mv if mv is not None else p, dz, *lay.dims, length,
            *lay.strides[0], HAS_MASK=m8 is not None, BLOCK_R=block_r, BLOCK_L=block_l,
            num_warps=warps)
        dlogits = reduce_to(dz, ctx.logits_shape, ctx.logits_dtype)
        dbias = None
        if ctx.bias_meta is not None:
            dbias = reduce_to(dz, ctx.bias_meta[0], ctx.bias_meta[1])
        return dlogits, None, dbias


def softmax_mask_bias(logits: torch.Tensor, mask: torch.Tensor | None = None,
                      bias: torch.Tensor | None = None) -> torch.Tensor:
    """Softmax over the last dim of ``logits + bias`` with masked entries (mask 0/False) removed.

    mask and bias broadcast against logits; p is in logits' dtype. A fully masked row is uniform.
    """
    if logits.shape[-1] > MAX_ROW:
        raise ValueError(f"softmax_mask_bias: rows longer than {MAX_ROW} are not supported, "
                         f"got {logits.shape[-1]}")
    tuning.require_device("softmax_mask_bias", logits, "fold_ops.reference.softmax_mask_bias")
    check_rows("softmax_mask_bias", logits.shape)
    return nograd.apply(_SoftmaxMaskBias, logits, mask, bias)
