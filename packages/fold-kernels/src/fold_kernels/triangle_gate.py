"""The gated projections of triangle multiplication (AF2 Alg. 11/12, AF3 Alg. 12/13), fused.

``a = (p_a + bias_pa) * sigmoid(g_a + bias_ga) * mask`` and ``b`` likewise, from the four
projections of the normalized pair computed channel-first in one GEMM,
``proj = [p_a; g_a; p_b; g_b] = W z^T``, ``[*, 4c, I, J]``. In PyTorch this is two bias adds,
two gates and two mask products per operand, each a pass over ``[*, c, I, J]`` (the broadcast
ones in non-vectorized kernels), and the backward concatenates the four projection gradients;
here the forward reads ``proj`` once and writes a and b, and the backward writes the gradient of
``proj`` directly (one ``[*, 4c, I, J]`` tensor: no concatenation). The bias gradient is the
sum of that gradient over the batch and (I, J): each backward program also writes the fp32 sums
over its tile (before the gradient is rounded to proj's dtype) as one partial row, and
:func:`fold_kernels.reduce.sum_partials` adds the rows in a fixed order (deterministic; a PyTorch
reduction would read the whole ``[*, 4c, I, J]`` gradient again, ~62 us at N=384 on an H100).
The rows are not added by the kernel's last programs (:mod:`one_pass`): with one program per
channel and tile, every program's arrival at the counters cost more than the second launch
(H200, bf16 c 128: 55.9 vs 49.8 us per backward at 256^2, 221.5 vs 190.6 at 512^2).

Each program handles one channel of a and b (the same channel of the four projections) on an
``[BLOCK_I, BLOCK_J]`` tile, every tensor read through its strides (the incoming update's
gradients arrive transposed).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from fold_kernels import nograd, pdl, tuning
from fold_kernels.index32 import check_grid
from fold_kernels.ints import cdiv
from fold_kernels.launch import fast
from fold_kernels.reduce import sum_partials

__all__ = ["triangle_projection_gate"]


@triton.jit
def _tile(I, J, BLOCK_I: tl.constexpr, BLOCK_J: tl.constexpr):
    n_j = tl.cdiv(J, BLOCK_J)
    offs_i = (tl.program_id(0) // n_j) * BLOCK_I + tl.arange(0, BLOCK_I)
    offs_j = (tl.program_id(0) % n_j) * BLOCK_J + tl.arange(0, BLOCK_J)
    valid = (offs_i < I)[:, None] & (offs_j < J)[None, :]
    return offs_i, offs_j, valid


@triton.jit
def _at(base, offs_i, offs_j, si, sj):
    return base + offs_i.to(tl.int64)[:, None] * si + offs_j.to(tl.int64)[None, :] * sj


@fast
@triton.jit
def _tri_gate_fwd(P, Bias, Mask, A, B, C, I, J,
         spb, spc, spi, spj, smb, smi, smj,
         BLOCK_I: tl.constexpr, BLOCK_J: tl.constexpr, PDL: tl.constexpr = False):
    pdl.enter(PDL)
    offs_i, offs_j, valid = _tile(I, J, BLOCK_I, BLOCK_J)
    ch = tl.program_id(1)
    bt = tl.program_id(2).to(tl.int64)
    p0 = P + bt * spb + ch.to(tl.int64) * spc
    cstride = C.to(tl.int64) * spc  # from one projection to the next
    pa = tl.load(_at(p0, offs_i, offs_j, spi, spj), mask=valid, other=0.0).to(tl.float32)
    ga = tl.load(_at(p0 + cstride, offs_i, offs_j, spi, spj), mask=valid, other=0.0)
    pb = tl.load(_at(p0 + 2 * cstride, offs_i, offs_j, spi, spj), mask=valid, other=0.0)
    gb = tl.load(_at(p0 + 3 * cstride, offs_i, offs_j, spi, spj), mask=valid, other=0.0)
    keep = tl.load(_at(Mask + bt * smb, offs_i, offs_j, smi, smj), mask=valid, other=0.0)
    keep = keep.to(tl.float32)
    a = (pa + tl.load(Bias + ch).to(tl.float32)) * keep
    a *= tl.sigmoid(ga.to(tl.float32) + tl.load(Bias + C + ch).to(tl.float32))
    b = (pb.to(tl.float32) + tl.load(Bias + 2 * C + ch).to(tl.float32)) * keep
    b *= tl.sigmoid(gb.to(tl.float32) + tl.load(Bias + 3 * C + ch).to(tl.float32))
    out = (bt * C + ch) * I * J  # a, b: contiguous [Bt, C, I, J]
    tl.store(_at(A + out, offs_i, offs_j, J, 1), a.to(A.dtype.element_ty), mask=valid)
    tl.store(_at(B + out, offs_i, offs_j, J, 1), b.to(B.dtype.element_ty), mask=valid)


@triton.jit
def _gate_grads(dy, p, g, bias_p, bias_g, keep):
    """d(p) and d(g) of ``(p + bias_p) * sigmoid(g + bias_g) * keep``, fp32."""
    sig = tl.sigmoid(g.to(tl.float32) + bias_g)
    dy = dy.to(tl.float32) * keep
    dp = dy * sig
    dg = dy * (p.to(tl.float32) + bias_p) * sig * (1.0 - sig)
    return dp, dg


@triton.jit
def _tile_sum(x, valid):
    """Sum of the valid entries of an ``[BLOCK_I, BLOCK_J]`` fp32 tile."""
    return tl.sum(tl.sum(tl.where(valid, x, 0.0), 1), 0)


@triton.jit
def _store_bias_partials(Partials, bt, C, ch, dpa, dga, dpb, dgb, valid):
    """The fp32 sums over the tile of the four projection gradients into the partial row
    ``bt * n_tiles + tile`` of ``Partials [Bt * n_tiles, 4C]``, columns ``k * C + ch``."""
    row = bt * tl.num_programs(0) + tl.program_id(0)
    out = Partials + row * 4 * C + ch
    tl.store(out, _tile_sum(dpa, valid))
    tl.store(out + C, _tile_sum(dga, valid))
    tl.store(out + 2 * C, _tile_sum(dpb, valid))
    tl.store(out + 3 * C, _tile_sum(dgb, valid))


@fast
@triton.jit
def _tri_gate_bwd(P, Bias, Mask, DA, DB, DP, Partials, C, I, J,
         spb, spc, spi, spj, smb, smi, smj, sab, sac, sai, saj, sbb, sbc, sbi, sbj,
         BLOCK_I: tl.constexpr, BLOCK_J: tl.constexpr, BIAS_GRAD: tl.constexpr,
                  PDL: tl.constexpr = False):
    pdl.enter(PDL)
    offs_i, offs_j, valid = _tile(I, J, BLOCK_I, BLOCK_J)
    ch = tl.program_id(1)
    bt = tl.program_id(2).to(tl.int64)
    ch64 = ch.to(tl.int64)
    p0 = P + bt * spb + ch64 * spc
    cstride = C.to(tl.int64) * spc
    pa = tl.load(_at(p0, offs_i, offs_j, spi, spj), mask=valid, other=0.0)
    ga = tl.load(_at(p0 + cstride, offs_i, offs_j, spi, spj), mask=valid, other=0.0)
    pb = tl.load(_at(p0 + 2 * cstride, offs_i, offs_j, spi, spj), mask=valid, other=0.0)
    gb = tl.load(_at(p0 + 3 * cstride, offs_i, offs_j, spi, spj), mask=valid, other=0.0)
    keep = tl.load(_at(Mask + bt * smb, offs_i, offs_j, smi, smj), mask=valid, other=0.0)
    keep = keep.to(tl.float32)
    da = tl.load(_at(DA + bt * sab + ch64 * sac, offs_i, offs_j, sai, saj), mask=valid,
                 other=0.0)
    db = tl.load(_at(DB + bt * sbb + ch64 * sbc, offs_i, offs_j, sbi, sbj), mask=valid,
                 other=0.0)
    dpa, dga = _gate_grads(da, pa, ga, tl.load(Bias + ch).to(tl.float32),
                           tl.load(Bias + C + ch).to(tl.float32), keep)
    dpb, dgb = _gate_grads(db, pb, gb, tl.load(Bias + 2 * C + ch).to(tl.float32),
                           tl.load(Bias + 3 * C + ch).to(tl.float32), keep)
    ij = I.to(tl.int64) * J
    out = DP + (bt * 4 * C + ch64) * ij  # DP: contiguous [Bt, 4C, I, J]
    ty = DP.dtype.element_ty
    tl.store(_at(out, offs_i, offs_j, J, 1), dpa.to(ty), mask=valid)
    tl.store(_at(out + C * ij, offs_i, offs_j, J, 1), dga.to(ty), mask=valid)
    tl.store(_at(out + 2 * C * ij, offs_i, offs_j, J, 1), dpb.to(ty), mask=valid)
    tl.store(_at(out + 3 * C * ij, offs_i, offs_j, J, 1), dgb.to(ty), mask=valid)
    if BIAS_GRAD:  # the fp32 values, not the rounded stored ones
        _store_bias_partials(Partials, bt, C, ch64, dpa, dga, dpb, dgb, valid)


def _blocks() -> tuple[int, int, int]:
    """(BLOCK_I, BLOCK_J, num_warps)."""
    return (4, 8, 1) if tuning.interpreting() else (16, 128, 4)


def _flat(x: torch.Tensor, lead: tuple[int, ...]) -> torch.Tensor:
    """``x [*lead, ...]`` as ``[prod(lead), ...]`` (a view when the batch dims merge)."""
    return x.reshape(math.prod(lead), *x.shape[len(lead):])


class _TriangleProjectionGate(torch.autograd.Function):
    @staticmethod
    def forward(ctx, proj, bias, mask):
        *lead, c4, n_i, n_j = proj.shape
        lead = tuple(lead)
        c = c4 // 4
        p = _flat(proj, lead)  # [Bt, 4c, I, J]
        m = mask.view(torch.uint8) if mask.dtype == torch.bool else mask
        m = _flat(m.expand(*lead, n_i, n_j), lead)  # [Bt, I, J], broadcast dims stride 0
        a = torch.empty((*lead, c, n_i, n_j), device=proj.device, dtype=proj.dtype)
        b = torch.empty_like(a)
        bi, bj, warps = _blocks()
        grid = (cdiv(n_i, bi) * cdiv(n_j, bj), c, p.shape[0])
        _tri_gate_fwd[grid](p, bias, m, a, b, c, n_i, n_j, *p.stride(), *m.stride(),
                   BLOCK_I=bi, BLOCK_J=bj, num_warps=warps)
        ctx.save_for_backward(p, bias, m)
        ctx.shape = proj.shape
        return a, b

    @staticmethod
    def backward(ctx, da, db):
        p, bias, m = ctx.saved_tensors
        bt, c4, n_i, n_j = p.shape
        c = c4 // 4
        lead = tuple(ctx.shape[:-3])
        # autograd materializes the gradient of an unused output as zeros: never None here
        da, db = _flat(da, lead), _flat(db, lead)  # read through their strides
        dp = torch.empty((bt, c4, n_i, n_j), device=p.device, dtype=p.dtype)
        bi, bj, warps = _blocks()
        n_tiles = cdiv(n_i, bi) * cdiv(n_j, bj)
        bias_grad = ctx.needs_input_grad[1]
        # one fp32 partial row per (batch entry, tile), every entry written by the kernel
        partials = (torch.empty((bt * n_tiles, c4), device=p.device, dtype=torch.float32)
                    if bias_grad else dp)  # unused without BIAS_GRAD
        _tri_gate_bwd[(n_tiles, c, bt)](p, bias, m, da, db, dp, partials, c, n_i, n_j,
                   *p.stride(), *m.stride(), *da.stride(), *db.stride(), BLOCK_I=bi,
                   BLOCK_J=bj, BIAS_GRAD=bias_grad, num_warps=warps)
        dbias = sum_partials(partials, bias.dtype) if bias_grad else None  # [4c]
        return dp.reshape(ctx.shape), dbias, None


def grid_sizes(shape: tuple[int, ...]) -> dict[str, int]:
    """The launch's grid y (the c channels) and z (the batch) of a ``[*, 4c, I, J]`` proj."""
    return {"c channels": shape[-3] // 4, "the batch": math.prod(shape[:-3])}


def triangle_projection_gate(proj: torch.Tensor, bias: torch.Tensor,
                             mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated, masked operands of triangle multiplication from channel-first projections.

    Args:
        proj: ``[*, 4c, I, J]``, the rows ``(p_a, g_a, p_b, g_b)`` of ``W z^T`` (any strides).
        bias: ``[4c]``, the four projections' biases (fp32 or proj's dtype).
        mask: ``[*, I, J]`` (broadcasts to proj's batch dims), bool or float; no gradient.

    Returns:
        ``a, b`` contiguous ``[*, c, I, J]`` in proj's dtype, ``a = (p_a + bias_pa) *
        sigmoid(g_a + bias_ga) * mask``. Differentiable in proj and bias.
    """
    if proj.dim() < 3 or proj.shape[-3] % 4:
        raise ValueError(f"triangle_projection_gate: proj must be [*, 4c, I, J], got "
                         f"{tuple(proj.shape)}")
    if bias.shape != (proj.shape[-3],):
        raise ValueError(f"triangle_projection_gate: bias must be [{proj.shape[-3]}], got "
                         f"{tuple(bias.shape)}")
    if tuple(mask.shape[-2:]) != tuple(proj.shape[-2:]) or mask.dim() > proj.dim() - 1:
        raise ValueError(f"triangle_projection_gate: mask must be [*, I, J] = "
                         f"[*, {proj.shape[-2]}, {proj.shape[-1]}], got {tuple(mask.shape)}")
    tuning.require_device("triangle_projection_gate", proj,
                          "fold_ops.reference.triangle_projection_gate")
    for what, programs in grid_sizes(proj.shape).items():
        check_grid("triangle_projection_gate", what, programs)
    return nograd.apply(_TriangleProjectionGate, proj, bias, mask)
