"""Adaptive LayerNorm (AF3 supplement Alg. 26): ``y = sigmoid(gate + gate_bias) * LN(a) + shift``.

The LayerNorm of ``a`` has no affine parameters. ``gate`` and ``shift`` are the two halves of
one projection of the conditioning, ``cond = LN(s) [W_gate; W_shift]^T`` (``[*, 2C]``: one
cuBLAS GEMM, outside this op, instead of a ``Linear`` and a ``LinearNoBias``); the gate's bias
is added here. AF3's diffusion transformer runs it twice per block over
``[samples, N_token, 768]``; the atom transformers three times per block over ``[samples,
N_atom, 128]`` with a conditioning ``[1, N_atom, 256]`` shared by the samples: cond may
broadcast over one run of a's batch dims (read in place; its gradient is summed over them).
PyTorch runs it as five passes over ``[*, C]``
forward (LayerNorm, bias, sigmoid, multiply, add) and more backward; here one each way, rows of
C held in registers as in :mod:`fold_kernels.layer_norm`:

* forward: reads a, cond (and the gate bias); writes y, each row's fp32 mean and 1/std and,
  for the backward, ``gate + gate_bias`` in a's dtype (``[*, C]``: cond itself is not kept, so
  the activation memory is the separate projections' ``[*, C]`` gate, not ``[*, 2C]``; the
  backward sees the biased gate rounded to a's dtype, as the separate ``Linear``'s output was);
* backward: reads a, the saved gate, dy and the statistics; writes da and
  ``d(cond) = [d(gate) | dy]`` into one ``[*, 2C]`` gradient (what the GEMM's backward reads:
  no concatenation):
  ``d(gate) = dy * xhat * sigmoid'(gate)``,
  ``da = rstd * (g - xhat * mean(g xhat) - mean(g))`` with ``g = dy * sigmoid(gate)``.
  With a gate bias, its gradient (the column sum of d(gate)) is added in the same launch: each
  program of a fixed grid walks a strided set of row blocks, keeps its fp32 partial sums in
  registers, and the programs that finish last add the partial rows in a fixed order
  (:mod:`fold_kernels.one_pass`; deterministic, no atomics on the data).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from fold_ops.autocast import projection_dtype

from fold_kernels import nograd, one_pass, pdl, tuning
from fold_kernels.index32 import check_rows
from fold_kernels.ints import cdiv, next_power_of_2
from fold_kernels.launch import fast
from fold_kernels.layer_norm import MAX_HIDDEN, _block_r, _num_warps, row_stats
from fold_kernels.one_pass import finish_sum
from fold_kernels.reduce import sum_partials

__all__ = ["adaptive_layer_norm"]


@triton.jit
def _tile(blk, rows, C, S, inner, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
          BCAST: tl.constexpr = False):
    """Row block ``blk`` of contiguous ``[rows, C]`` tensors and of the ``[rows, 2C]``
    conditioning: ``(offs_r, r_valid, rc, ptrs, cptrs)``, ``ptrs`` / ``cptrs`` the element
    offsets of the ``[BLOCK_R, BLOCK_C]`` tile in each (int64: rows * 2C may pass 2**31; the
    shift half is ``cptrs + C``), ``rc`` its in-bounds mask. With ``BCAST`` the rows are
    ``[outer, S, inner]`` and the conditioning's ``[outer, 1, inner]``: row r reads cond row
    ``(r // (S inner)) inner + r % inner``."""
    offs_r = blk * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_c = tl.arange(0, BLOCK_C)
    r_valid = offs_r < rows
    rc = r_valid[:, None] & (offs_c < C)[None, :]
    r64 = offs_r.to(tl.int64)[:, None]
    if BCAST:
        c64 = (offs_r // (S * inner) * inner + offs_r % inner).to(tl.int64)[:, None]
    else:
        c64 = r64
    return offs_r, r_valid, rc, r64 * C + offs_c[None, :], c64 * (2 * C) + offs_c[None, :]


@fast
@triton.jit
def _ada_ln_fwd(A, Cond, GB, Y, G, Mean, Rstd, rows, C, S, inner, eps, HAS_GB: tl.constexpr,
                SAVE_G: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
                BCAST: tl.constexpr, PDL: tl.constexpr = False):
    """Rows [BLOCK_R] of a ``[rows, C]`` and cond ``[rows, 2C]`` (with ``BCAST``: ``[outer, 1,
    inner, 2C]`` against rows ``[outer, S, inner]``) -> y, mean, rstd and, with ``SAVE_G``, the
    biased gate ``G [rows, C]``. Without ``HAS_GB`` GB is not read."""
    pdl.enter(PDL)
    offs_r, r_valid, rc, ptrs, cptrs = _tile(tl.program_id(0), rows, C, S, inner, BLOCK_R,
                                             BLOCK_C, BCAST)
    x = tl.load(A + ptrs, mask=rc, other=0.0).to(tl.float32)  # [BLOCK_R, BLOCK_C]
    mean, xc, rstd = row_stats(x, rc, C, eps)
    g = tl.load(Cond + cptrs, mask=rc, other=0.0).to(tl.float32)
    if HAS_GB:
        offs_c = tl.arange(0, BLOCK_C)
        g += tl.load(GB + offs_c, mask=offs_c < C, other=0.0).to(tl.float32)[None, :]
    if SAVE_G:
        tl.store(G + ptrs, g.to(G.dtype.element_ty), mask=rc)
    shift = tl.load(Cond + cptrs + C, mask=rc, other=0.0).to(tl.float32)
    y = tl.sigmoid(g) * (xc * rstd[:, None]) + shift
    tl.store(Y + ptrs, y.to(Y.dtype.element_ty), mask=rc)
    tl.store(Mean + offs_r, mean, mask=r_valid)
    tl.store(Rstd + offs_r, rstd, mask=r_valid)


@fast
@triton.jit
def _ada_ln_bwd(A, G, DY, Mean, Rstd, DA, DCond, DGBp, DGB, Cnt, rows, C,
                HAS_GB: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
                ONE_PASS: tl.constexpr, GROUP: tl.constexpr, TAIL_S: tl.constexpr,
                TAIL_M: tl.constexpr, PDL: tl.constexpr = False):
    """da and ``d(cond) = [d(gate) | dy]`` of the row blocks ``pid, pid + n_prog, ...`` from the
    saved biased gate ``G [rows, C]``. With ``HAS_GB`` each program's d(gate bias) partial row
    goes to ``DGBp`` (rows C apart) and, with ``ONE_PASS``, the last programs add the rows into
    ``DGB [C]``."""
    pdl.enter(PDL)
    pid = tl.program_id(0)
    n_prog = tl.num_programs(0)
    offs_c = tl.arange(0, BLOCK_C)
    c_valid = offs_c < C
    dgb = tl.zeros([BLOCK_C], tl.float32)
    for blk in range(pid, tl.cdiv(rows, BLOCK_R), n_prog):
        offs_r, r_valid, rc, ptrs, cptrs = _tile(blk, rows, C, 1, 1, BLOCK_R, BLOCK_C)
        x = tl.load(A + ptrs, mask=rc, other=0.0).to(tl.float32)
        g = tl.load(G + ptrs, mask=rc, other=0.0).to(tl.float32)
        dy = tl.load(DY + ptrs, mask=rc, other=0.0).to(tl.float32)
        mean = tl.load(Mean + offs_r, mask=r_valid, other=0.0)
        rstd = tl.load(Rstd + offs_r, mask=r_valid, other=0.0)
        xhat = tl.where(rc, (x - mean[:, None]) * rstd[:, None], 0.0)
        sig = tl.sigmoid(g)
        dg = dy * xhat * sig * (1.0 - sig)  # 0 outside rc: dy and xhat are
        tl.store(DCond + cptrs, dg.to(DCond.dtype.element_ty), mask=rc)
        tl.store(DCond + cptrs + C, dy.to(DCond.dtype.element_ty), mask=rc)  # d(shift) = dy
        gdy = dy * sig  # the gradient of xhat
        c1 = tl.sum(gdy * xhat, 1) / C
        c2 = tl.sum(gdy, 1) / C
        da = (gdy - xhat * c1[:, None] - c2[:, None]) * rstd[:, None]
        tl.store(DA + ptrs, da.to(DA.dtype.element_ty), mask=rc)
        if HAS_GB:  # no column sum without a bias to take it
            dgb += tl.sum(dg, 0)
    if HAS_GB:
        tl.store(DGBp + pid * C + offs_c, dgb, mask=c_valid)
        if ONE_PASS:
            finish_sum(DGBp, DGB, Cnt, pid, n_prog, C, 0, C, GROUP, TAIL_S, TAIL_M)


def _blocks(c: int) -> tuple[int, int, int]:
    """(BLOCK_R, BLOCK_C, num_warps): the LayerNorm's (about 4K elements a program)."""
    block_c = next_power_of_2(c)
    block_r = _block_r(c)
    return block_r, block_c, _num_warps(block_r, block_c)


def broadcast_layout(a_shape: tuple[int, ...], cond_shape: tuple[int, ...]
                     ) -> tuple[int, int, int] | None:
    """``(outer, S, inner)`` when ``cond [*, 2C]`` has a's batch dims but for one run of dims
    that are 1 in cond (a's ``S`` rows of each ``[outer, ., inner]`` read the same cond row);
    ``(rows, 1, 1)`` when they match; None when cond is neither."""
    batch, cb = tuple(a_shape[:-1]), tuple(cond_shape[:-1])
    if len(cb) != len(batch) or cond_shape[-1] != 2 * a_shape[-1]:
        return None
    differ = [i for i, (x, y) in enumerate(zip(batch, cb)) if x != y]
    if not differ:
        return math.prod(batch), 1, 1
    lo, hi = differ[0], differ[-1]
    if any(cb[i] != 1 for i in range(lo, hi + 1)):
        return None
    return math.prod(batch[:lo]), math.prod(batch[lo:hi + 1]), math.prod(batch[hi + 1:])


def _forward(a, cond, gate_bias, eps, save_gate: bool, out_dtype: torch.dtype,
             layout: tuple[int, int, int]):
    """``(y, gate, stats)``: y like a in ``out_dtype``, the biased gate like a (None without
    ``save_gate``), stats ``[2, rows]`` fp32 (each row's mean, then 1/std). ``layout``:
    :func:`broadcast_layout` of a and cond."""
    c = a.shape[-1]
    rows = a.numel() // c
    _, s_bcast, inner = layout
    y = torch.empty(a.shape, device=a.device, dtype=out_dtype)
    gate = torch.empty(a.shape, device=a.device, dtype=a.dtype) if save_gate else None
    stats = torch.empty((2, rows), device=a.device, dtype=torch.float32)
    block_r, block_c, warps = _blocks(c)
    has_gb = gate_bias is not None
    _ada_ln_fwd[(cdiv(rows, block_r),)](a, cond, gate_bias if has_gb else cond, y,
                                        gate if save_gate else y, stats, stats[1], rows, c,
                                        s_bcast, inner, eps, HAS_GB=has_gb, SAVE_G=save_gate,
                                        BLOCK_R=block_r, BLOCK_C=block_c,
                                        BCAST=s_bcast > 1, num_warps=warps)
    return y, gate, stats


def _backward(dy, a, gate, gate_bias, stats, cond_dtype):
    """``(da, d(cond), d(gate_bias) or None)``; one launch (two with
    ``FOLD_KERNELS_ONE_PASS=0`` and a gate bias)."""
    c = a.shape[-1]
    rows = a.numel() // c
    da = torch.empty_like(a)
    dcond = torch.empty((*a.shape[:-1], 2 * c), device=a.device, dtype=cond_dtype)
    block_r, block_c, warps = _blocks(c)
    n_blocks = cdiv(rows, block_r)
    has_gb = gate_bias is not None
    if not has_gb:  # no reduction: one row block a program
        _ada_ln_bwd[(n_blocks,)](a, gate, dy, stats, stats[1], da, dcond, da, da, da,
                                 rows, c, HAS_GB=False, BLOCK_R=block_r, BLOCK_C=block_c,
                                 ONE_PASS=False, GROUP=1, TAIL_S=1, TAIL_M=1, num_warps=warps)
        return da, dcond, None
    # a fixed grid (4 programs a multiprocessor, as the LayerNorm backward's default) whose
    # programs each keep one partial row of the bias gradient
    per_sm = 3 if tuning.interpreting() or not a.is_cuda else 4 * tuning.multiprocessors(a.device)
    n_prog = min(n_blocks, per_sm)
    fused = one_pass.enabled()
    group = one_pass.group_size() if fused else 1
    extra = cdiv(n_prog, group) if fused else 0  # group rows after the programs' rows
    partials = torch.empty((n_prog + extra, c), device=a.device, dtype=torch.float32)
    dgb = torch.empty(c, device=a.device, dtype=gate_bias.dtype) if fused else partials
    _ada_ln_bwd[(n_prog,)](a, gate, dy, stats, stats[1], da, dcond, partials, dgb,
                           one_pass.counters(a.device) if fused else dgb, rows, c,
                           HAS_GB=True, BLOCK_R=block_r, BLOCK_C=block_c, ONE_PASS=fused,
                           GROUP=group, TAIL_S=group,
                           TAIL_M=min(256, next_power_of_2(c)) if fused else 1,
                           num_warps=warps)
    if not fused:
        dgb = sum_partials(partials[:n_prog], gate_bias.dtype)
    return da, dcond, dgb


class _AdaptiveLayerNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, cond, gate_bias, eps, out_dtype, layout):
        a, cond = a.contiguous(), cond.contiguous()
        gate_bias = None if gate_bias is None else gate_bias.contiguous()
        save = nograd.saves(ctx)
        y, gate, stats = _forward(a, cond, gate_bias, eps, save, out_dtype, layout)
        # the gate bias for its dtype and shape only: the gate is saved with it added
        ctx.save_for_backward(a, gate, gate_bias, stats)
        ctx.cond_dtype, ctx.cond_shape, ctx.layout = cond.dtype, cond.shape, layout
        return y

    @staticmethod
    def backward(ctx, dy):
        a, gate, gate_bias, stats = ctx.saved_tensors
        da, dcond, dgb = _backward(dy.contiguous(), a, gate, gate_bias, stats, ctx.cond_dtype)
        outer, s_bcast, inner = ctx.layout
        if s_bcast > 1:  # each row's d(cond), summed over the rows that shared it
            dcond = dcond.view(outer, s_bcast, inner, -1).sum(1).view(ctx.cond_shape)
        return da, dcond, dgb, None, None, None


def adaptive_layer_norm(a: torch.Tensor, cond: torch.Tensor,
                        gate_bias: torch.Tensor | None = None,
                        eps: float = 1e-5) -> torch.Tensor:
    """``sigmoid(gate + gate_bias) * LayerNorm(a) + shift`` (LayerNorm over the last dim, no
    affine parameters) for ``a [*, C]`` and ``cond [*, 2C] = gate | shift`` of one dtype,
    ``gate_bias [C]`` (any float dtype; its gradient comes in that dtype); y in a's dtype. cond
    may broadcast over one run of a's batch dims (``a [B, S, A, C]``, ``cond [B, 1, A, 2C]``). Under
    autocast (fold_ops.autocast) cond may be in the autocast dtype with a in fp32, and y is in
    the autocast dtype."""
    c = a.shape[-1] if a.dim() else 0
    layout = broadcast_layout(tuple(a.shape), tuple(cond.shape)) if a.dim() else None
    if layout is None:
        raise ValueError(f"adaptive_layer_norm: cond must be [*, 2C] = gate | shift with a's "
                         f"batch dims (or 1 over one run of them) for a of shape "
                         f"{tuple(a.shape)}, got {tuple(cond.shape)}")
    out_dtype = projection_dtype(a)
    if cond.dtype not in (a.dtype, out_dtype):
        raise ValueError(f"adaptive_layer_norm: cond must be in a's dtype (or the autocast "
                         f"dtype), got {a.dtype} and {cond.dtype}")
    if gate_bias is not None and (gate_bias.shape != (c,) or not gate_bias.is_floating_point()):
        raise ValueError(f"adaptive_layer_norm: gate_bias must be a float [C={c}], got "
                         f"{tuple(gate_bias.shape)} {gate_bias.dtype}")
    if c == 0 or c > MAX_HIDDEN:
        raise ValueError(f"adaptive_layer_norm: hidden size must be 1..{MAX_HIDDEN}, got "
                         f"shape {tuple(a.shape)}")
    check_rows("adaptive_layer_norm", (*a.shape[:-1], 2 * c))
    tuning.require_device("adaptive_layer_norm", a, "fold_ops.reference.adaptive_layer_norm")
    if a.numel() == 0:  # no rows: an empty result, and gradients for every input
        gate, shift = cond.chunk(2, -1)
        y = a + gate + shift + (0.0 if gate_bias is None else gate_bias.to(a.dtype))
        return y.to(out_dtype)
    return nograd.apply(_AdaptiveLayerNorm, a, cond, gate_bias, eps,  # inference: no node
                        out_dtype, layout)
