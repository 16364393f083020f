"""Fused LayerNorm + Linear and SwiGLU (MegaFold DeepFusion, for the AF3 transition).

``layer_norm_linear``: a small kernel computes each row's mean and 1/std (one pass over x, the
row held in registers), then the GEMM's prologue normalizes each ``[BLOCK_M, BLOCK_K]`` tile of x
as it is loaded, so the normalized activations are never written to memory in the forward.
Backward recomputes the normalized x with the LayerNorm kernel, lets cuBLAS do the two matrix
products and runs the LayerNorm backward kernel.

``swiglu``: one GEMM program computes the tile of both halves ``a = x W_a^T`` and
``b = x W_b^T`` and writes only ``silu(a) * b``: the ``[M, 2 H]`` projection never reaches memory
in the forward. Backward recomputes the projection tile by tile in the same GEMM program and
writes only ``d[a, b]`` from it (the projection never reaches memory there either); cuBLAS does
``dx`` and ``dW``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from fold_ops.autocast import lower, projection_dtype

from fold_kernels import nograd, pdl, tuning
from fold_kernels.dot import mm as _mm
from fold_kernels.dot import precision as _precision
from fold_kernels.index32 import check_rows
from fold_kernels.ints import cdiv, next_power_of_2
from fold_kernels.launch import fast
from fold_kernels.layer_norm import check_layer_norm, ln_backward, ln_forward
from fold_kernels.reduce import column_sum

__all__ = ["layer_norm_linear", "swiglu"]



@fast
@triton.jit
def _row_stats(X, Mean, Rstd, M, K, eps, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr,
               PDL: tl.constexpr = False):
    """Mean and 1/std of each row of x [M, K], rows held whole in registers (K <= 8192)."""
    pdl.enter(PDL)
    offs_r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_k = tl.arange(0, BLOCK_K)
    r_valid = offs_r < M
    rk = r_valid[:, None] & (offs_k < K)[None, :]
    x = tl.load(X + offs_r.to(tl.int64)[:, None] * K + offs_k[None, :], mask=rk, other=0.0)
    x = x.to(tl.float32)
    mean = tl.sum(x, 1) / K
    xc = tl.where(rk, x - mean[:, None], 0.0)
    tl.store(Mean + offs_r, mean, mask=r_valid)
    tl.store(Rstd + offs_r, 1.0 / tl.sqrt(tl.sum(xc * xc, 1) / K + eps), mask=r_valid)


@fast
@triton.jit
def _ln_linear_fwd(X, LW, LB, W, Bias, Y, Mean, Rstd, M, K, NOUT,
                   HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_K: tl.constexpr, PRECISION: tl.constexpr, PDL: tl.constexpr = False):
    pdl.enter(PDL)
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_valid = offs_m < M
    n_valid = offs_n < NOUT
    xrow = offs_m.to(tl.int64)[:, None] * K
    mean = tl.load(Mean + offs_m, mask=m_valid, other=0.0)  # from _row_stats
    rstd = tl.load(Rstd + offs_m, mask=m_valid, other=0.0)

    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_valid = offs_k < K
        mk = m_valid[:, None] & k_valid[None, :]
        x = tl.load(X + xrow + offs_k[None, :], mask=mk, other=0.0).to(tl.float32)
        lw = tl.load(LW + offs_k, mask=k_valid, other=0.0).to(tl.float32)
        lb = tl.load(LB + offs_k, mask=k_valid, other=0.0).to(tl.float32)
        xn = (x - mean[:, None]) * rstd[:, None] * lw[None, :] + lb[None, :]
        xn = tl.where(mk, xn, 0.0).to(W.dtype.element_ty)  # [BLOCK_M, BLOCK_K]
        w = tl.load(W + offs_n[:, None] * K + offs_k[None, :],
                    mask=n_valid[:, None] & k_valid[None, :], other=0.0)  # [BLOCK_N, BLOCK_K]
        acc += _mm(xn, tl.trans(w), PRECISION)
    if HAS_BIAS:
        acc += tl.load(Bias + offs_n, mask=n_valid, other=0.0).to(tl.float32)[None, :]
    tl.store(Y + offs_m.to(tl.int64)[:, None] * NOUT + offs_n[None, :],
             acc.to(Y.dtype.element_ty), mask=m_valid[:, None] & n_valid[None, :])


@triton.jit
def _swiglu_projection(X, W, Bias, M, K, NH, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr,
                       BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr):
    """This program's ``[BLOCK_M, BLOCK_N]`` tiles of ``a = x W_a^T + b_a`` and
    ``b = x W_b^T + b_b`` (fp32 accumulators) for x ``[M, K]`` and W ``[2 NH, K]`` (W_a its first
    NH rows), with the tile's rows ``[BLOCK_M, 1]`` (int64), columns ``[1, BLOCK_N]`` and mask."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    m_valid = offs_m < M
    n_valid = offs_n < NH
    acc_a = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    acc_b = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_valid = offs_k < K
        x = tl.load(X + offs_m.to(tl.int64)[:, None] * K + offs_k[None, :],
                    mask=m_valid[:, None] & k_valid[None, :], other=0.0)
        nk = n_valid[:, None] & k_valid[None, :]
        wa = tl.load(W + offs_n[:, None] * K + offs_k[None, :], mask=nk, other=0.0)
        wb = tl.load(W + (offs_n + NH)[:, None] * K + offs_k[None, :], mask=nk, other=0.0)
        acc_a += _mm(x, tl.trans(wa), PRECISION)
        acc_b += _mm(x, tl.trans(wb), PRECISION)
    if HAS_BIAS:
        acc_a += tl.load(Bias + offs_n, mask=n_valid, other=0.0).to(tl.float32)[None, :]
        acc_b += tl.load(Bias + NH + offs_n, mask=n_valid, other=0.0).to(tl.float32)[None, :]
    return (acc_a, acc_b, offs_m.to(tl.int64)[:, None], offs_n[None, :],
            m_valid[:, None] & n_valid[None, :])


@fast
@triton.jit
def _swiglu_fwd(X, W, Bias, Y, M, K, NH,
                HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_K: tl.constexpr, PRECISION: tl.constexpr, PDL: tl.constexpr = False):
    pdl.enter(PDL)
    a, b, row, col, mn = _swiglu_projection(X, W, Bias, M, K, NH, HAS_BIAS, BLOCK_M, BLOCK_N,
                                            BLOCK_K, PRECISION)
    y = a * tl.sigmoid(a) * b
    tl.store(Y + row * NH + col, y.to(Y.dtype.element_ty), mask=mn)


@fast
@triton.jit
def _swiglu_bwd(X, W, Bias, DY, DH, M, K, NH,
                HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_K: tl.constexpr, PRECISION: tl.constexpr, PDL: tl.constexpr = False):
    """Recomputes the projection tile as the forward does and writes ``d[a, b]`` from it:
    ``da = dY b silu'(a)``, ``db = dY silu(a)``. The ``[M, 2 NH]`` projection is never written
    (recomputing it with cuBLAS and reading it back cost a third of the transition's backward)."""
    pdl.enter(PDL)
    a, b, row, col, mn = _swiglu_projection(X, W, Bias, M, K, NH, HAS_BIAS, BLOCK_M, BLOCK_N,
                                            BLOCK_K, PRECISION)
    dy = tl.load(DY + row * NH + col, mask=mn, other=0.0).to(tl.float32)
    sig = tl.sigmoid(a)
    da = dy * b * sig * (1.0 + a * (1.0 - sig))
    db = dy * a * sig
    tl.store(DH + row * 2 * NH + col, da.to(DH.dtype.element_ty), mask=mn)
    tl.store(DH + row * 2 * NH + NH + col, db.to(DH.dtype.element_ty), mask=mn)



def _gemm_cfg(kernel: str, key: tuple, launch) -> tuning.Config:
    return tuning.pick(kernel, key, tuning._gemm_configs(tuning.arch()), launch)  # memoised


class _LayerNormLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, ln_weight, ln_bias, weight, bias, eps):
        k = x.shape[-1]
        nout = weight.shape[0]
        x2 = x.reshape(-1, k).contiguous()  # [M, K]
        m = x2.shape[0]
        w = weight.contiguous()
        y = torch.empty((m, nout), device=x.device, dtype=w.dtype)  # x's, or autocast's
        mean = torch.empty(m, device=x.device, dtype=torch.float32)
        rstd = torch.empty_like(mean)
        block_k = next_power_of_2(k)
        block_r = 4 if tuning.interpreting() else max(1, min(64, 4096 // block_k))
        _row_stats[(cdiv(m, block_r),)](x2, mean, rstd, m, k, eps, BLOCK_R=block_r,
                                        BLOCK_K=block_k, num_warps=1 if
                                        tuning.interpreting() else 4)

        def launch(cfg: tuning.Config):
            grid = (cdiv(m, cfg.block_m), cdiv(nout, cfg.block_n))
            _ln_linear_fwd[grid](x2, ln_weight, ln_bias, w, bias if bias is not None else w,
                                 y, mean, rstd, m, k, nout, HAS_BIAS=bias is not None,
                                 BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
                                 PRECISION=_precision(w.dtype), num_warps=cfg.num_warps,
                                 num_stages=cfg.num_stages)

        launch(_gemm_cfg("ln_linear", (m // 4096, k, nout, x.dtype, w.dtype, bias is not None),
                         launch))
        ctx.save_for_backward(x2, ln_weight, ln_bias, w)
        ctx.eps = eps
        ctx.bias_dtype = bias.dtype if bias is not None else None  # None: no bias
        return y.reshape(*x.shape[:-1], nout)

    @staticmethod
    def backward(ctx, dy):
        x2, ln_weight, ln_bias, w = ctx.saved_tensors
        dy2 = dy.reshape(-1, w.shape[0])  # [M, N_out]
        # recomputed, not stored; in the product's dtype (w's), as the forward's prologue
        xn, mean, rstd = ln_forward(x2, ln_weight, ln_bias, ctx.eps, w.dtype)
        dw = dy2.t().mm(xn)
        dbias = column_sum(dy2, ctx.bias_dtype) if ctx.bias_dtype is not None else None
        dxn = dy2.mm(w)
        dx, dlw, dlb = ln_backward(dxn, x2, ln_weight, mean, rstd, ln_weight.dtype,
                                   ln_bias.dtype)
        return (dx.reshape(*dy.shape[:-1], x2.shape[1]), dlw, dlb, dw, dbias, None)


def layer_norm_linear(x: torch.Tensor, ln_weight: torch.Tensor, ln_bias: torch.Tensor,
                      weight: torch.Tensor, bias: torch.Tensor | None = None,
                      eps: float = 1e-5) -> torch.Tensor:
    """``F.linear(F.layer_norm(x), weight, bias)`` in one kernel.

    x ``[*, K]``; ln_weight, ln_bias ``[K]``; weight ``[N_out, K]`` in x's dtype; bias
    ``[N_out]``. Returns ``[*, N_out]`` in x's dtype. Under autocast, as autocast runs the
    reference: the LayerNorm in fp32 from x as it is, the product and y in the autocast dtype
    (weight and bias cast to it).
    """
    check_layer_norm(x, ln_weight, ln_bias)
    out_dtype = projection_dtype(x)
    (weight, bias), _ = lower((weight, bias), {})  # the projection's, as autocast casts them
    if weight.dim() != 2 or weight.shape[1] != x.shape[-1] or weight.dtype != out_dtype:
        raise ValueError(f"layer_norm_linear: weight must be [N_out, K={x.shape[-1]}] in "
                         f"{out_dtype}, got {tuple(weight.shape)} {weight.dtype}")
    if bias is not None and bias.shape != (weight.shape[0],):
        raise ValueError(f"layer_norm_linear: bias must be [{weight.shape[0]}], "
                         f"got {tuple(bias.shape)}")
    return nograd.apply(_LayerNormLinear, x, ln_weight, ln_bias, weight, bias, eps)


def _run_swiglu(kernel, name: str, x2: torch.Tensor, w: torch.Tensor,
                bias: torch.Tensor | None, *io: torch.Tensor) -> None:
    """Launch ``kernel`` (``_swiglu_fwd`` or ``_swiglu_bwd``: x ``[M, K]``, w ``[2 NH, K]``, then
    ``io``) over the ``[M, NH]`` tiles with the autotuned GEMM configuration for ``name``."""
    (m, k), nh = x2.shape, w.shape[0] // 2

    def launch(cfg: tuning.Config):
        grid = (cdiv(m, cfg.block_m), cdiv(nh, cfg.block_n))
        kernel[grid](x2, w, bias if bias is not None else w, *io, m, k, nh,
                     HAS_BIAS=bias is not None, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
                     BLOCK_K=cfg.block_k, PRECISION=_precision(x2.dtype),
                     num_warps=cfg.num_warps, num_stages=cfg.num_stages)

    launch(_gemm_cfg(name, (m // 4096, k, nh, x2.dtype, bias is not None), launch))


class _SwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias):
        k = x.shape[-1]
        nh = weight.shape[0] // 2
        x2 = x.reshape(-1, k).contiguous()  # [M, K]
        m = x2.shape[0]
        w = weight.contiguous()
        y = torch.empty((m, nh), device=x.device, dtype=x.dtype)
        _run_swiglu(_swiglu_fwd, "swiglu", x2, w, bias, y)
        ctx.save_for_backward(x2, w, bias)
        return y.reshape(*x.shape[:-1], nh)

    @staticmethod
    def backward(ctx, dy):
        x2, w, bias = ctx.saved_tensors
        m, k, nh = x2.shape[0], x2.shape[1], w.shape[0] // 2
        dy2 = dy.reshape(m, nh).contiguous()
        dh = torch.empty((m, 2 * nh), device=x2.device, dtype=x2.dtype)  # d[a, b]
        _run_swiglu(_swiglu_bwd, "swiglu_bwd", x2, w, bias, dy2, dh)
        dx = dh.mm(w)
        dw = dh.t().mm(x2)
        dbias = column_sum(dh, bias.dtype) if bias is not None else None
        return dx.reshape(*dy.shape[:-1], k), dw, dbias


def swiglu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``a, b = F.linear(x, weight, bias).chunk(2, -1); silu(a) * b`` in one kernel.

    x ``[*, K]``; weight ``[2 H, K]`` in x's dtype; bias ``[2 H]``. Returns ``[*, H]``.
    """
    if weight.dim() != 2 or weight.shape[1] != x.shape[-1] or weight.shape[0] % 2:
        raise ValueError(f"swiglu: weight must be [2 H, K={x.shape[-1]}], got "
                         f"{tuple(weight.shape)}")
    if weight.dtype != x.dtype:
        raise ValueError(f"swiglu: weight dtype {weight.dtype} != x dtype {x.dtype}")
    if bias is not None and bias.shape != (weight.shape[0],):
        raise ValueError(f"swiglu: bias must be [{weight.shape[0]}], got {tuple(bias.shape)}")
    tuning.require_device("swiglu", x, "fold_ops.reference.swiglu")
    check_rows("swiglu", x.shape)
    return nograd.apply(_SwiGLU, x, weight, bias)
