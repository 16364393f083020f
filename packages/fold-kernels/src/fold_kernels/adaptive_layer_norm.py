"""Adaptive LayerNorm (AF3 supplement Alg. 26): ``y = sigmoid(gate) * LayerNorm(a) + shift``.

The LayerNorm of ``a`` has no affine parameters; ``gate = Linear(LN(s))`` and
``shift = LinearNoBias(LN(s))`` come from the conditioning ``s`` (cuBLAS GEMMs, outside this op).
AF3's diffusion transformer runs it twice per block over ``[samples, N_token, 768]``. (The atom
transformers' AdaLN, whose conditioning broadcasts over the samples, is left to PyTorch by the
registry: see ``registration.supports_adaptive_layer_norm``.) PyTorch runs it as four passes
over ``[*, C]`` forward (LayerNorm, sigmoid, multiply, add) and about five backward; here one
each way, rows of C held in registers as in :mod:`fold_kernels.layer_norm`:

* forward: reads a, gate, shift; writes y and each row's fp32 mean and 1/std;
* backward: reads a, gate, dy and the statistics; writes da and d(gate):
  ``d(gate) = dy * xhat * sigmoid'(gate)``,
  ``da = rstd * (g - xhat * mean(g xhat) - mean(g))`` with ``g = dy * sigmoid(gate)``;
  d(shift) is dy itself. No parameter of the op, so no reduction over rows.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from fold_kernels import nograd, pdl, tuning
from fold_kernels.index32 import check_rows
from fold_kernels.ints import cdiv, next_power_of_2
from fold_kernels.launch import fast
from fold_kernels.layer_norm import MAX_HIDDEN, _block_r, _num_warps, row_stats

__all__ = ["adaptive_layer_norm"]


@triton.jit
def _rows(rows, C, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """This program's rows of contiguous ``[rows, C]`` tensors: ``(offs_r, r_valid, rc, ptrs)``,
    ``ptrs`` the element offsets of the ``[BLOCK_R, BLOCK_C]`` tile (int64: rows * C may pass
    2**31), ``rc`` its in-bounds mask."""
    offs_r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_c = tl.arange(0, BLOCK_C)
    r_valid = offs_r < rows
    rc = r_valid[:, None] & (offs_c < C)[None, :]
    ptrs = offs_r.to(tl.int64)[:, None] * C + offs_c[None, :]
    return offs_r, r_valid, rc, ptrs


@fast
@triton.jit
def _ada_ln_fwd(A, G, S, Y, Mean, Rstd, rows, C, eps,
                BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, PDL: tl.constexpr = False):
    """Rows [BLOCK_R] of contiguous ``[rows, C]`` a, gate, shift -> y, mean, rstd."""
    pdl.enter(PDL)
    offs_r, r_valid, rc, ptrs = _rows(rows, C, BLOCK_R, BLOCK_C)
    x = tl.load(A + ptrs, mask=rc, other=0.0).to(tl.float32)  # [BLOCK_R, BLOCK_C]
    mean, xc, rstd = row_stats(x, rc, C, eps)
    g = tl.load(G + ptrs, mask=rc, other=0.0).to(tl.float32)
    shift = tl.load(S + ptrs, mask=rc, other=0.0).to(tl.float32)
    y = tl.sigmoid(g) * (xc * rstd[:, None]) + shift
    tl.store(Y + ptrs, y.to(Y.dtype.element_ty), mask=rc)
    tl.store(Mean + offs_r, mean, mask=r_valid)
    tl.store(Rstd + offs_r, rstd, mask=r_valid)


@fast
@triton.jit
def _ada_ln_bwd(A, G, DY, Mean, Rstd, DA, DG, rows, C,
                BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, PDL: tl.constexpr = False):
    """Rows [BLOCK_R]: da and d(gate) from a, gate, dy and the forward's statistics."""
    pdl.enter(PDL)
    offs_r, r_valid, rc, ptrs = _rows(rows, C, BLOCK_R, BLOCK_C)
    x = tl.load(A + ptrs, mask=rc, other=0.0).to(tl.float32)
    g = tl.load(G + ptrs, mask=rc, other=0.0).to(tl.float32)
    dy = tl.load(DY + ptrs, mask=rc, other=0.0).to(tl.float32)
    mean = tl.load(Mean + offs_r, mask=r_valid, other=0.0)
    rstd = tl.load(Rstd + offs_r, mask=r_valid, other=0.0)
    xhat = tl.where(rc, (x - mean[:, None]) * rstd[:, None], 0.0)
    sig = tl.sigmoid(g)
    tl.store(DG + ptrs, (dy * xhat * sig * (1.0 - sig)).to(DG.dtype.element_ty), mask=rc)
    gdy = dy * sig  # the gradient of xhat
    c1 = tl.sum(gdy * xhat, 1) / C
    c2 = tl.sum(gdy, 1) / C
    da = (gdy - xhat * c1[:, None] - c2[:, None]) * rstd[:, None]
    tl.store(DA + ptrs, da.to(DA.dtype.element_ty), mask=rc)


def _blocks(c: int) -> tuple[int, int, int]:
    """(BLOCK_R, BLOCK_C, num_warps): the LayerNorm's (about 4K elements a program)."""
    block_c = next_power_of_2(c)
    block_r = _block_r(c)
    return block_r, block_c, _num_warps(block_r, block_c)


def _forward(a, gate, shift, eps):
    """``(y, stats)``: y like a, stats ``[2, rows]`` fp32 (each row's mean, then 1/std)."""
    c = a.shape[-1]
    rows = a.numel() // c
    y = torch.empty(a.shape, device=a.device, dtype=a.dtype)
    stats = torch.empty((2, rows), device=a.device, dtype=torch.float32)
    block_r, block_c, warps = _blocks(c)
    _ada_ln_fwd[(cdiv(rows, block_r),)](a, gate, shift, y, stats, stats[1], rows, c, eps,
                                        BLOCK_R=block_r, BLOCK_C=block_c, num_warps=warps)
    return y, stats


class _AdaptiveLayerNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, gate, shift, eps):
        a, gate, shift = a.contiguous(), gate.contiguous(), shift.contiguous()
        y, stats = _forward(a, gate, shift, eps)
        ctx.save_for_backward(a, gate, stats)
        return y

    @staticmethod
    def backward(ctx, dy):
        a, gate, stats = ctx.saved_tensors
        dy = dy.contiguous()
        c = a.shape[-1]
        rows = a.numel() // c
        da = torch.empty_like(a)
        dg = torch.empty_like(gate)
        block_r, block_c, warps = _blocks(c)
        _ada_ln_bwd[(cdiv(rows, block_r),)](a, gate, dy, stats, stats[1], da, dg, rows, c,
                                            BLOCK_R=block_r, BLOCK_C=block_c, num_warps=warps)
        return da, dg, dy, None  # d(shift) = dy


def adaptive_layer_norm(a: torch.Tensor, gate: torch.Tensor, shift: torch.Tensor,
                        eps: float = 1e-5) -> torch.Tensor:
    """``sigmoid(gate) * LayerNorm(a) + shift`` (LayerNorm over the last dim, no affine
    parameters) for ``a, gate, shift [*, C]`` of one shape and dtype; y in a's dtype."""
    if gate.shape != a.shape or shift.shape != a.shape:
        raise ValueError(f"adaptive_layer_norm: gate and shift must have a's shape "
                         f"{tuple(a.shape)}, got {tuple(gate.shape)} and {tuple(shift.shape)}")
    if gate.dtype != a.dtype or shift.dtype != a.dtype:
        raise ValueError(f"adaptive_layer_norm: a, gate and shift must share a dtype, got "
                         f"{a.dtype}, {gate.dtype}, {shift.dtype}")
    if a.dim() == 0 or a.shape[-1] == 0 or a.shape[-1] > MAX_HIDDEN:
        raise ValueError(f"adaptive_layer_norm: hidden size must be 1..{MAX_HIDDEN}, got "
                         f"shape {tuple(a.shape)}")
    check_rows("adaptive_layer_norm", a.shape)
    tuning.require_device("adaptive_layer_norm", a, "fold_ops.reference.adaptive_layer_norm")
    if a.numel() == 0:
        return a + gate + shift  # no rows: an empty result, and gradients for all three
    return nograd.apply(_AdaptiveLayerNorm, a, gate, shift, eps)  # inference: no autograd node
