"""Triangle multiplication's gated projections (AF2 Alg. 11/12 lines 2-3, AF3 Alg. 12/13) as one
GEMM with the gate in its epilogue, for inference.

``a = (z W_pa^T + b_pa) * sigmoid(z W_ga^T + b_ga) * mask`` and ``b`` likewise, for the
normalized pair ``z [*, I, J, C]``, written channel-first ``[*, c, I, J]`` (the layout of the
batched product over k that follows). As a channel-first GEMM ``proj [*, 4c, I, J]`` and then
:func:`fold_kernels.triangle_gate.triangle_projection_gate`, the four projections (twice the
pair at c = C_z: 2.4 GB at N = 1536 in bf16) are written and read back. Here each program
computes the four ``[BLOCK_N channels, BLOCK_M pairs]`` accumulators of one tile (one read of
the z tile, four ``tl.dot``), gates them in registers and stores only a and b, in the layout the
accumulators leave the product.

Only without autograd (prediction, AutoChunk's chunk loops): on an H200 (bf16, c = C_z = 128)
the fused forward took 50 / 103 / 178 us against the two ops' 56 / 120 / 204 us at N = 256 /
384 / 512, but a fused backward (the tile recomputed from z, d(proj) written for cuBLAS) made
forward + backward 204 / 413 / 718 us against the two ops' 175 / 362 / 637 us (the two ops
keep proj for their backward). Training therefore runs the two ops.

``FOLD_KERNELS_TRI_PROJ=0``: the two ops without autograd too, for comparisons.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from fold_ops.env import EnvVar

from fold_kernels import nograd, pdl, tuning
from fold_kernels.channel_first import linear_channel_first
from fold_kernels.dot import mm, precision
from fold_kernels.index32 import check_grid, check_rows
from fold_kernels.ints import cdiv
from fold_kernels.launch import fast
from fold_kernels.triangle_gate import triangle_projection_gate

__all__ = ["triangle_projection"]

_FUSED = EnvVar("FOLD_KERNELS_TRI_PROJ", lambda v: (v if v is not None else "1") != "0")


@triton.jit
def _tile(M, C, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """This program's channels ``offs_n [BLOCK_N]`` and pairs ``offs_m [BLOCK_M]`` (m = i J +
    j). Grid x is (tile, channel block), channel blocks fastest: the programs that read one z
    tile run together (z read from L2, not DRAM, after the first)."""
    n_nb = tl.cdiv(C, BLOCK_N)
    offs_n = (tl.program_id(0) % n_nb) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = (tl.program_id(0) // n_nb) * BLOCK_M + tl.arange(0, BLOCK_M)
    return offs_n, offs_m


@triton.jit
def _projections(Z, W, Bias, offs_n, offs_m, M, K, C, BLOCK_N: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr):
    """The tile's ``(p_a, g_a, p_b, g_b)`` with their biases, each fp32 ``[BLOCK_N channels,
    BLOCK_M pairs]`` (the layout of the channel-first outputs), from ``Z`` (this batch entry's
    contiguous ``[M, K]``) and ``W [4C, K]``."""
    m_valid = offs_m < M
    n_valid = offs_n < C
    acc_pa = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
    acc_ga = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
    acc_pb = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
    acc_gb = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_valid = offs_k < K
        zt = tl.load(Z + offs_m.to(tl.int64)[None, :] * K + offs_k[:, None],
                     mask=k_valid[:, None] & m_valid[None, :], other=0.0)  # [BLOCK_K, BLOCK_M]
        nk = n_valid[:, None] & k_valid[None, :]
        w = W + offs_n[:, None] * K + offs_k[None, :]  # W_pa's [BLOCK_N, BLOCK_K]
        ck = C * K  # from one projection's rows of W to the next
        acc_pa += mm(tl.load(w, mask=nk, other=0.0), zt, PRECISION)
        acc_ga += mm(tl.load(w + ck, mask=nk, other=0.0), zt, PRECISION)
        acc_pb += mm(tl.load(w + 2 * ck, mask=nk, other=0.0), zt, PRECISION)
        acc_gb += mm(tl.load(w + 3 * ck, mask=nk, other=0.0), zt, PRECISION)
    return (acc_pa + _bias(Bias, 0, C, offs_n, n_valid),
            acc_ga + _bias(Bias, 1, C, offs_n, n_valid),
            acc_pb + _bias(Bias, 2, C, offs_n, n_valid),
            acc_gb + _bias(Bias, 3, C, offs_n, n_valid))


@triton.jit
def _bias(Bias, k, C, offs_n, n_valid):
    """``Bias[k C + n]`` as an fp32 ``[BLOCK_N, 1]`` (projection k of p_a, g_a, p_b, g_b)."""
    return tl.load(Bias + k * C + offs_n, mask=n_valid, other=0.0).to(tl.float32)[:, None]


@fast
@triton.jit
def _tri_proj_fwd(Z, W, Bias, Mask, A, B, M, K, C, smb, smm,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  PRECISION: tl.constexpr, PDL: tl.constexpr = False):
    """a, b: contiguous ``[Bt, C, M]``; Z contiguous ``[Bt, M, K]``; the mask ``[Bt, M]``
    through strides; grid ``(tiles x channel blocks, Bt)``."""
    pdl.enter(PDL)
    offs_n, offs_m = _tile(M, C, BLOCK_M, BLOCK_N)
    bt = tl.program_id(1).to(tl.int64)
    pa, ga, pb, gb = _projections(Z + bt * M * K, W, Bias, offs_n, offs_m, M, K, C, BLOCK_N,
                                  BLOCK_M, BLOCK_K, PRECISION)
    m_valid = offs_m < M
    keep = tl.load(Mask + bt * smb + offs_m.to(tl.int64) * smm, mask=m_valid, other=0.0)
    keep = keep.to(tl.float32)[None, :]
    valid = (offs_n < C)[:, None] & m_valid[None, :]
    out = bt * C * M + offs_n.to(tl.int64)[:, None] * M + offs_m[None, :]
    tl.store(A + out, (pa * tl.sigmoid(ga) * keep).to(A.dtype.element_ty), mask=valid)
    tl.store(B + out, (pb * tl.sigmoid(gb) * keep).to(B.dtype.element_ty), mask=valid)


# Candidates (pairs, channels, k-step, warps, stages): four fp32 accumulators of BLOCK_N x
# BLOCK_M live at once, at most 128 of a thread's registers.
_TABLE = ((128, 64, 64, 8, 3), (64, 64, 64, 4, 3), (64, 128, 64, 8, 3), (128, 64, 128, 8, 2),
          (64, 64, 128, 4, 2), (128, 32, 64, 4, 3))


def _configs(interpreting: bool) -> tuple[tuning.Config, ...]:
    if interpreting:  # tl.dot needs 16 in every dim
        return (tuning.Config(block_m=16, block_n=16, block_k=16, num_warps=1, num_stages=1),)
    return tuple(tuning.Config(block_m=bm, block_n=bn, block_k=bk, num_warps=w, num_stages=s)
                 for bm, bn, bk, w, s in _TABLE)


_CONFIGS = {flag: _configs(flag) for flag in (False, True)}


def _grid(cfg: tuning.Config, m: int, c: int, bt: int) -> tuple[int, int]:
    return (cdiv(m, cfg.block_m) * cdiv(c, cfg.block_n), bt)


def _meta(cfg: tuning.Config, dtype: torch.dtype) -> dict:
    return dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
                PRECISION=precision(dtype), num_warps=cfg.num_warps, num_stages=cfg.num_stages)


def _merge_pairs(x: torch.Tensor, bt: int) -> torch.Tensor:
    """The mask ``x [*lead, I, J]`` as ``[bt, I J]``: a view where (I, J) merge, which the
    model's masks do (a copy otherwise; broadcast batch dims keep stride 0)."""
    if x.stride(-2) != x.shape[-1] * x.stride(-1):
        x = x.contiguous()
    return x.reshape(bt, x.shape[-2] * x.shape[-1])


def _forward(z: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
             mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """a, b ``[*, c, I, J]`` from the fused kernel (no autograd)."""
    *lead, n_i, n_j, k = z.shape
    c = weight.shape[0] // 4
    z = z if z.is_contiguous() else z.contiguous()
    bt, m = math.prod(lead), n_i * n_j
    keep = mask.view(torch.uint8) if mask.dtype == torch.bool else mask
    keep = _merge_pairs(keep.expand(*lead, n_i, n_j), bt)  # [Bt, M]
    a = torch.empty((*lead, c, n_i, n_j), device=z.device, dtype=z.dtype)
    b = torch.empty_like(a)
    w = weight.contiguous()

    def launch(cfg: tuning.Config):
        _tri_proj_fwd[_grid(cfg, m, c, bt)](z, w, bias, keep, a, b, m, k, c, *keep.stride(),
                                            **_meta(cfg, z.dtype))

    key = (tuning.bucket(bt * m), k, c, z.dtype, bias.dtype)
    launch(tuning.pick("tri_proj_fwd", key, _CONFIGS[tuning.interpreting()], launch))
    return a, b


def grid_sizes(shape: tuple[int, ...]) -> dict[str, int]:
    """The launch's grid y (the batch) for a ``[*, I, J, C]`` z."""
    return {"the batch": math.prod(shape[:-3])}


def triangle_projection(z: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                        mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated, masked operands of triangle multiplication from the normalized pair.

    Args:
        z: ``[*, I, J, C]`` (at least 3 dims; copied first when not contiguous).
        weight: ``[4c, C]`` in z's dtype, the rows of ``W_pa, W_ga, W_pb, W_gb``.
        bias: ``[4c]``, their biases (fp32 or z's dtype).
        mask: ``[*, I, J]`` (broadcasts to z's batch dims), bool or float; no gradient.

    Returns:
        ``a, b`` contiguous ``[*, c, I, J]`` in z's dtype: ``triangle_projection_gate(
        linear_channel_first(z, weight), bias, mask)``, one fused kernel without autograd.
        With autograd, those two ops (differentiable in z, weight and bias; ``d(z)`` is
        channel-last).
    """
    if z.dim() < 3:
        raise ValueError(f"triangle_projection: z must be [*, I, J, C] (3 dims or more), got "
                         f"{tuple(z.shape)}")
    if (weight.dim() != 2 or weight.shape[0] % 4 or weight.shape[1] != z.shape[-1]
            or weight.dtype != z.dtype):
        raise ValueError(f"triangle_projection: weight must be [4c, C={z.shape[-1]}] in "
                         f"{z.dtype}, got {tuple(weight.shape)} in {weight.dtype}")
    if bias.shape != (weight.shape[0],):
        raise ValueError(f"triangle_projection: bias must be [{weight.shape[0]}], got "
                         f"{tuple(bias.shape)}")
    if tuple(mask.shape[-2:]) != tuple(z.shape[-3:-1]) or mask.dim() > z.dim() - 1:
        raise ValueError(f"triangle_projection: mask must be [*, I, J] = "
                         f"[*, {z.shape[-3]}, {z.shape[-2]}], got {tuple(mask.shape)}")
    tuning.require_device("triangle_projection", z, "fold_ops.reference.triangle_projection")
    # training: the two ops (their backward reads the saved projections); or for comparisons
    if nograd.records(z, weight, bias) or not _FUSED.get():
        return triangle_projection_gate(linear_channel_first(z, weight), bias, mask)
    check_rows("triangle_projection", z.shape)
    for what, programs in grid_sizes(z.shape).items():
        check_grid("triangle_projection", what, programs)
    return _forward(z, weight, bias, mask)

