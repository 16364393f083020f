"""Triangle multiplication's gated projections (AF2 Alg. 11/12 lines 2-3, AF3 Alg. 12/13) as one
GEMM with the gate in its epilogue.

``a = (z W_pa^T + b_pa) * sigmoid(z W_ga^T + b_ga) * mask`` and ``b`` likewise, for the
normalized pair ``z [*, I, J, C]``, written channel-first ``[*, c, I, J]`` (the layout of the
batched product over k that follows). Computed as a channel-first GEMM ``proj [*, 4c, I, J]``
and then :func:`fold_kernels.triangle_gate.triangle_projection_gate`, the four projections
(twice the pair at c = C_z) are written once and read back once in the forward and read again
in the backward: at N = 384, c = 128 that is 151 MB each way. Here each program computes the
four ``[BLOCK_M pairs, BLOCK_N channels]`` accumulators of one tile (one read of the z tile, four
``tl.dot``) and writes only a and b; ``proj`` never reaches memory. The backward recomputes the
tile the same way (reading z, 4x smaller than proj) and writes the gradient of ``proj``
``[4c, *, I, J]``, which cuBLAS turns into ``d(z) = d(proj)^T W`` (channel-last, z's layout) and
``d(W) = d(proj) z``; the bias gradient is the fp32 sum of each program's tile as one partial row,
added in a fixed order (:func:`fold_kernels.reduce.sum_partials`: deterministic).

A tile is ``TILE_I x TILE_J`` pairs (``BLOCK_M`` = their product): the gradients of a and b
arrive in two layouts (the batched product's backward returns one of them transposed, I
fastest), and a tile of several rows i reads a run of ``TILE_I`` contiguous values from it.

``FOLD_KERNELS_TRI_PROJ=0``: the two-op path above (GEMM + gate kernel), for comparisons.
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
from fold_kernels.index32 import check_grid
from fold_kernels.ints import cdiv
from fold_kernels.launch import fast
from fold_kernels.reduce import sum_partials
from fold_kernels.triangle_gate import triangle_projection_gate

__all__ = ["triangle_projection"]

_FUSED = EnvVar("FOLD_KERNELS_TRI_PROJ", lambda v: (v if v is not None else "1") != "0")


@triton.jit
def _tile(I, J, C, TILE_I: tl.constexpr, TILE_J: tl.constexpr, BLOCK_N: tl.constexpr):
    """This program's pairs ``offs_i [TILE_I]``, ``offs_j [TILE_J]``, channels ``offs_n
    [BLOCK_N]`` and its tile index. Grid x is (tile, channel block), channel blocks fastest:
    the programs that read one z tile run together (z read from L2, not DRAM, after the first)."""
    n_nb = tl.cdiv(C, BLOCK_N)
    tile = tl.program_id(0) // n_nb
    n_tj = tl.cdiv(J, TILE_J)
    offs_i = (tile // n_tj) * TILE_I + tl.arange(0, TILE_I)
    offs_j = (tile % n_tj) * TILE_J + tl.arange(0, TILE_J)
    offs_n = (tl.program_id(0) % n_nb) * BLOCK_N + tl.arange(0, BLOCK_N)
    return offs_i, offs_j, offs_n, tile


@triton.jit
def _bias_tile(Bias, k, C, offs_n, n_valid):
    """``Bias[k C + n]`` as an fp32 ``[1, 1, BLOCK_N]`` (projection k of p_a, g_a, p_b, g_b)."""
    return tl.load(Bias + k * C + offs_n, mask=n_valid, other=0.0).to(tl.float32)[None, None, :]


@triton.jit
def _projections(Z, W, Bias, offs_i, offs_j, offs_n, I, J, K, C,
                 TILE_I: tl.constexpr, TILE_J: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr, PRECISION: tl.constexpr):
    """The tile's ``(p_a, g_a, p_b, g_b)`` with their biases, each fp32 ``[TILE_I, TILE_J,
    BLOCK_N]``, from ``Z`` (this batch entry's contiguous ``[I, J, K]``) and ``W [4C, K]``."""
    ij_valid = (offs_i < I)[:, None] & (offs_j < J)[None, :]
    rows = tl.reshape(offs_i.to(tl.int64)[:, None] * J + offs_j[None, :],
                      [TILE_I * TILE_J])  # i J + j, pairs row-major
    r_valid = tl.reshape(ij_valid, [TILE_I * TILE_J])
    n_valid = offs_n < C
    acc_pa = tl.zeros([TILE_I * TILE_J, BLOCK_N], tl.float32)
    acc_ga = tl.zeros([TILE_I * TILE_J, BLOCK_N], tl.float32)
    acc_pb = tl.zeros([TILE_I * TILE_J, BLOCK_N], tl.float32)
    acc_gb = tl.zeros([TILE_I * TILE_J, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_valid = offs_k < K
        z = tl.load(Z + rows[:, None] * K + offs_k[None, :],
                    mask=r_valid[:, None] & k_valid[None, :], other=0.0)  # [BLOCK_M, BLOCK_K]
        nk = n_valid[:, None] & k_valid[None, :]
        w = W + offs_n[:, None] * K + offs_k[None, :]  # W_pa's [BLOCK_N, BLOCK_K]
        ck = C * K  # from one projection's rows of W to the next
        acc_pa += mm(z, tl.trans(tl.load(w, mask=nk, other=0.0)), PRECISION)
        acc_ga += mm(z, tl.trans(tl.load(w + ck, mask=nk, other=0.0)), PRECISION)
        acc_pb += mm(z, tl.trans(tl.load(w + 2 * ck, mask=nk, other=0.0)), PRECISION)
        acc_gb += mm(z, tl.trans(tl.load(w + 3 * ck, mask=nk, other=0.0)), PRECISION)
    # [TILE_I, TILE_J, BLOCK_N]: the pairs row-major, as rows above
    return (tl.reshape(acc_pa, [TILE_I, TILE_J, BLOCK_N]) + _bias_tile(Bias, 0, C, offs_n, n_valid),
            tl.reshape(acc_ga, [TILE_I, TILE_J, BLOCK_N]) + _bias_tile(Bias, 1, C, offs_n, n_valid),
            tl.reshape(acc_pb, [TILE_I, TILE_J, BLOCK_N]) + _bias_tile(Bias, 2, C, offs_n, n_valid),
            tl.reshape(acc_gb, [TILE_I, TILE_J, BLOCK_N]) + _bias_tile(Bias, 3, C, offs_n, n_valid))


@triton.jit
def _at(base, offs_i, offs_j, offs_n, si, sj, sn):
    """Pointers ``[TILE_I, TILE_J, BLOCK_N]`` of a channel-first tensor read through strides."""
    return (base + offs_i.to(tl.int64)[:, None, None] * si
            + offs_j.to(tl.int64)[None, :, None] * sj + offs_n.to(tl.int64)[None, None, :] * sn)


@triton.jit
def _keep(Mask, offs_i, offs_j, I, J, smi, smj):
    """The mask's ``[TILE_I, TILE_J, 1]`` fp32 tile (0 outside the pair grid)."""
    valid = (offs_i < I)[:, None] & (offs_j < J)[None, :]
    keep = tl.load(Mask + offs_i.to(tl.int64)[:, None] * smi + offs_j.to(tl.int64)[None, :] * smj,
                   mask=valid, other=0.0)
    return keep.to(tl.float32)[:, :, None]


@fast
@triton.jit
def _tri_proj_fwd(Z, W, Bias, Mask, A, B, I, J, K, C, smb, smi, smj,
                  TILE_I: tl.constexpr, TILE_J: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr, PRECISION: tl.constexpr, PDL: tl.constexpr = False):
    """a, b: contiguous ``[Bt, C, I, J]``; Z contiguous ``[Bt, I, J, K]``; grid
    ``(tiles x channel blocks, Bt)``."""
    pdl.enter(PDL)
    offs_i, offs_j, offs_n, _ = _tile(I, J, C, TILE_I, TILE_J, BLOCK_N)
    bt = tl.program_id(1).to(tl.int64)
    ij = I.to(tl.int64) * J
    pa, ga, pb, gb = _projections(Z + bt * ij * K, W, Bias, offs_i, offs_j, offs_n, I, J, K, C,
                                  TILE_I, TILE_J, BLOCK_N, BLOCK_K, PRECISION)
    keep = _keep(Mask + bt * smb, offs_i, offs_j, I, J, smi, smj)
    a = pa * tl.sigmoid(ga) * keep
    b = pb * tl.sigmoid(gb) * keep
    valid = ((offs_i < I)[:, None, None] & (offs_j < J)[None, :, None]
             & (offs_n < C)[None, None, :])
    out = bt * C * ij  # this batch entry's [C, I, J]
    tl.store(_at(A + out, offs_i, offs_j, offs_n, J, 1, ij), a.to(A.dtype.element_ty),
             mask=valid)
    tl.store(_at(B + out, offs_i, offs_j, offs_n, J, 1, ij), b.to(B.dtype.element_ty),
             mask=valid)


@triton.jit
def _gate_grads(dy, p, g, keep):
    """d(p) and d(g) of ``p * sigmoid(g) * keep`` (biases already in p and g), fp32."""
    sig = tl.sigmoid(g)
    dy = dy.to(tl.float32) * keep
    dp = dy * sig
    return dp, dy * p * sig * (1.0 - sig)


@fast
@triton.jit
def _tri_proj_bwd(Z, W, Bias, Mask, DA, DB, DP, Partials, Bt, I, J, K, C, smb, smi, smj,
                  sab, sac, sai, saj, sbb, sbc, sbi, sbj,
                  TILE_I: tl.constexpr, TILE_J: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr, PRECISION: tl.constexpr, BIAS_GRAD: tl.constexpr,
                  PDL: tl.constexpr = False):
    """``DP``: contiguous ``[4C, Bt, I, J]`` (rows of ``d(proj)`` for cuBLAS); da, db read
    through their strides. ``BIAS_GRAD``: the tile's fp32 sums of the four gradients go to
    row ``bt * tiles + tile`` of ``Partials [Bt * tiles, 4C]``."""
    pdl.enter(PDL)
    offs_i, offs_j, offs_n, tile = _tile(I, J, C, TILE_I, TILE_J, BLOCK_N)
    bt = tl.program_id(1).to(tl.int64)
    ij = I.to(tl.int64) * J
    pa, ga, pb, gb = _projections(Z + bt * ij * K, W, Bias, offs_i, offs_j, offs_n, I, J, K, C,
                                  TILE_I, TILE_J, BLOCK_N, BLOCK_K, PRECISION)
    keep = _keep(Mask + bt * smb, offs_i, offs_j, I, J, smi, smj)
    n_valid = offs_n < C
    valid = ((offs_i < I)[:, None, None] & (offs_j < J)[None, :, None]
             & n_valid[None, None, :])
    da = tl.load(_at(DA + bt * sab, offs_i, offs_j, offs_n, sai, saj, sac), mask=valid,
                 other=0.0)
    db = tl.load(_at(DB + bt * sbb, offs_i, offs_j, offs_n, sbi, sbj, sbc), mask=valid,
                 other=0.0)
    # outside the tile's valid pairs keep = 0 and da = db = 0: every gradient there is 0
    dpa, dga = _gate_grads(da, pa, ga, keep)
    dpb, dgb = _gate_grads(db, pb, gb, keep)
    plane = Bt * ij  # from one row of d(proj) [4C, Bt, I, J] to the next
    out = DP + bt * ij
    ty = DP.dtype.element_ty
    tl.store(_at(out, offs_i, offs_j, offs_n, J, 1, plane), dpa.to(ty), mask=valid)
    tl.store(_at(out + C * plane, offs_i, offs_j, offs_n, J, 1, plane), dga.to(ty), mask=valid)
    tl.store(_at(out + 2 * C * plane, offs_i, offs_j, offs_n, J, 1, plane), dpb.to(ty),
             mask=valid)
    tl.store(_at(out + 3 * C * plane, offs_i, offs_j, offs_n, J, 1, plane), dgb.to(ty),
             mask=valid)
    if BIAS_GRAD:  # the fp32 values, not the rounded stored ones
        tiles = tl.num_programs(0) // tl.cdiv(C, BLOCK_N)
        row = Partials + (bt * tiles + tile) * 4 * C
        tl.store(row + offs_n, tl.sum(tl.sum(dpa, 0), 0), mask=n_valid)
        tl.store(row + C + offs_n, tl.sum(tl.sum(dga, 0), 0), mask=n_valid)
        tl.store(row + 2 * C + offs_n, tl.sum(tl.sum(dpb, 0), 0), mask=n_valid)
        tl.store(row + 3 * C + offs_n, tl.sum(tl.sum(dgb, 0), 0), mask=n_valid)


# Candidates (pairs a tile as TILE_I x TILE_J, channels, k-step, warps, stages). Forward: the
# outputs are J-contiguous, so long runs of j; backward: one of the two gradients arrives I-fast,
# so 8-16 rows i a tile (16-32 contiguous bytes of it a run).
_FWD = ((2, 64, 64, 64, 8, 3), (1, 64, 64, 64, 4, 3), (2, 64, 32, 64, 4, 3),
        (4, 32, 64, 128, 8, 2), (4, 64, 32, 64, 8, 3))
_BWD = ((16, 8, 32, 64, 4, 3), (16, 8, 64, 64, 8, 3), (8, 16, 32, 64, 4, 3),
        (16, 16, 32, 64, 8, 3), (8, 8, 64, 64, 4, 3))


def _configs(table, interpreting: bool) -> tuple[tuning.Config, ...]:
    if interpreting:  # tl.dot needs 16 in every dim
        return (tuning.Config(block_m=16, block_n=16, block_k=16, num_warps=1, num_stages=1,
                              tile_i=4),)
    return tuple(tuning.Config(block_m=ti * tj, block_n=bn, block_k=bk, num_warps=w,
                               num_stages=s, tile_i=ti) for ti, tj, bn, bk, w, s in table)


_FWD_CONFIGS = {flag: _configs(_FWD, flag) for flag in (False, True)}
_BWD_CONFIGS = {flag: _configs(_BWD, flag) for flag in (False, True)}


def _grid(cfg: tuning.Config, n_i: int, n_j: int, c: int, bt: int) -> tuple[int, int]:
    return (_tiles(cfg, n_i, n_j) * cdiv(c, cfg.block_n), bt)


def _tiles(cfg: tuning.Config, n_i: int, n_j: int) -> int:
    return cdiv(n_i, cfg.tile_i) * cdiv(n_j, cfg.block_m // cfg.tile_i)


def _meta(cfg: tuning.Config, dtype: torch.dtype) -> dict:
    return dict(TILE_I=cfg.tile_i, TILE_J=cfg.block_m // cfg.tile_i, BLOCK_N=cfg.block_n,
                BLOCK_K=cfg.block_k, PRECISION=precision(dtype), num_warps=cfg.num_warps,
                num_stages=cfg.num_stages)


def _flat(x: torch.Tensor, lead: tuple[int, ...]) -> torch.Tensor:
    """``x [*lead, ...]`` as ``[prod(lead), ...]`` (a view when the batch dims merge)."""
    return x.reshape(math.prod(lead), *x.shape[len(lead):])


class _TriangleProjection(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z, weight, bias, mask):
        *lead, n_i, n_j, k = z.shape
        lead = tuple(lead)
        c = weight.shape[0] // 4
        z = z if z.is_contiguous() else z.contiguous()
        bt = math.prod(lead)
        m = mask.view(torch.uint8) if mask.dtype == torch.bool else mask
        m = _flat(m.expand(*lead, n_i, n_j), lead)  # [Bt, I, J], broadcast dims stride 0
        a = torch.empty((*lead, c, n_i, n_j), device=z.device, dtype=z.dtype)
        b = torch.empty_like(a)
        w = weight.contiguous()

        def launch(cfg: tuning.Config):
            _tri_proj_fwd[_grid(cfg, n_i, n_j, c, bt)](z, w, bias, m, a, b, n_i, n_j, k, c,
                                                       *m.stride(), **_meta(cfg, z.dtype))

        key = (tuning.bucket(bt * n_i * n_j), n_j % 64 == 0, k, c, z.dtype, bias.dtype)
        launch(tuning.pick("tri_proj_fwd", key, _FWD_CONFIGS[tuning.interpreting()], launch))
        ctx.save_for_backward(z, w, bias, m)
        ctx.lead = lead
        return a, b

    @staticmethod
    def backward(ctx, da, db):
        z, w, bias, m = ctx.saved_tensors
        *_, n_i, n_j, k = z.shape
        c4 = w.shape[0]
        c, bt = c4 // 4, math.prod(ctx.lead)
        # autograd materializes the gradient of an unused output as zeros: never None here
        da, db = _flat(da, ctx.lead), _flat(db, ctx.lead)  # [Bt, c, I, J], read via strides
        dp = torch.empty((c4, bt, n_i, n_j), device=z.device, dtype=z.dtype)
        bias_grad = ctx.needs_input_grad[2]
        state = {}

        def launch(cfg: tuning.Config):
            tiles = _tiles(cfg, n_i, n_j)
            # one fp32 partial row per (batch entry, tile), every entry written by the kernel
            partials = (torch.empty((bt * tiles, c4), device=z.device, dtype=torch.float32)
                        if bias_grad else dp)  # unused without BIAS_GRAD
            _tri_proj_bwd[_grid(cfg, n_i, n_j, c, bt)](
                z, w, bias, m, da, db, dp, partials, bt, n_i, n_j, k, c, *m.stride(),
                *da.stride(), *db.stride(), BIAS_GRAD=bias_grad, **_meta(cfg, z.dtype))
            state["partials"] = partials

        # the layouts of da and db (which one is I-fast) are part of the key
        key = (tuning.bucket(bt * n_i * n_j), n_j % 64 == 0, k, c, z.dtype, bias.dtype,
               da.stride(-1) == 1, db.stride(-1) == 1, bias_grad)
        launch(tuning.pick("tri_proj_bwd", key, _BWD_CONFIGS[tuning.interpreting()], launch))
        dp2 = dp.view(c4, -1)  # [4c, M]: M = Bt I J, z's rows in order
        dz = dw = dbias = None
        if ctx.needs_input_grad[0]:
            dz = dp2.t().mm(w).view(z.shape)  # row-major [M, K]: z's channel-last layout
        if ctx.needs_input_grad[1]:
            dw = dp2.mm(z.view(-1, k))  # [4c, K]
        if bias_grad:
            dbias = sum_partials(state["partials"], bias.dtype)  # [4c]
        return dz, dw, dbias, None


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
        linear_channel_first(z, weight), bias, mask)``. Differentiable in z, weight and bias;
        ``d(z)`` is channel-last.
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
    if not _FUSED.get():  # the two-op path, for comparisons
        return triangle_projection_gate(linear_channel_first(z, weight), bias, mask)
    for what, programs in grid_sizes(z.shape).items():
        check_grid("triangle_projection", what, programs)
    return nograd.apply(_TriangleProjection, z, weight, bias, mask)

