"""EvoAttention's forward with its own key length: ``N_q`` queries attend to ``N_k`` keys.

AF3's atom transformers attend within sequence-local windows: each window of 32 queries reads
128 keys around it (Alg. 7), with a pair bias ``[B, K, H, 32, 128]`` per window that all the
samples share (the rows R of EvoAttention's layout) and a key mask ``[B, K, S, 128]``. Without a
kernel for ``N_q != N_k`` they ran on the PyTorch path: the logits, the fp32 softmax, the masking
and the copies that batch the products, a third of an AF3 sampler step's GPU time.

This is the forward only, for inference (``fold-train predict``): :func:`cross_attention` refuses
inputs that autograd would record (the backward kernels assume ``N_q = N_k``; training keeps the
PyTorch path). It runs :mod:`fold_kernels.evo_attention`'s online-softmax steps on separate query
and key strides: q and the gate ``[*, R, H, N_q, D]`` (any strides with D contiguous: the model's
heads are a transposed view of a projection), k and v ``[*, R, H, N_k, D]`` (one stride set),
bias ``[*, H, N_q, N_k]`` shared by the R rows, mask ``[*, R, N_k]``. The output is written
``[*, R, N_q, H, D]`` and returned as its ``[*, R, H, N_q, D]`` view, so the model's merge of
the heads (``transpose(-2, -3).flatten(-2)``) is a free view.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from fold_kernels import nograd, pdl, tuning
from fold_kernels.evo_attention import (
    _bias_operand,
    _block_d,
    _fwd_init,
    _fwd_keys,
    _fwd_store,
    _key_span,
    _mask_operand,
    _precision,
    key_runs,
)
from fold_kernels.index32 import check_grid, span_fits
from fold_kernels.ints import cdiv
from fold_kernels.launch import fast

__all__ = ["cross_attention"]


@fast
@triton.jit
def _fwd_cross(Q, K, V, G, Bias, Mask, Runs, O, LSE,
               sbb, sbh, sbi, sbj, smb, smr, smj, sqb, sqr, sqh, sqn, skb, skr, skh, skn,
               sob, sor, soh, son, R, H, NQ, NK, D, scale,
               HAS_BIAS: tl.constexpr, HAS_MASK: tl.constexpr, HAS_RUNS: tl.constexpr,
               HAS_GATE: tl.constexpr,
               ROWS: tl.constexpr, EVEN: tl.constexpr, EVEN_D: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
               PRECISION: tl.constexpr, PDL: tl.constexpr = False):
    """One query block of ``ROWS`` (1 or 2) rows sharing each bias tile, as ``_fwd`` (the same
    key loop, :func:`_fwd_keys`, and key runs), with the keys' own length ``NK`` and strides.
    ``EVEN``: NQ a multiple of BLOCK_M and NK of BLOCK_N."""
    pdl.enter(PDL)
    mb = tl.program_id(0)
    rp = tl.program_id(1)
    bh = tl.program_id(2)
    b = bh // H
    h = bh % H
    offs_m = mb * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    m_valid = offs_m < NQ
    md = m_valid[:, None] & (offs_d < D)[None, :]
    r0 = rp * ROWS
    r1 = tl.minimum(r0 + 1, R - 1)
    q0, _, acc0, m0, l0 = _fwd_init(Q, b, r0, h, offs_m, offs_d, md, sqb, sqr, sqh, sqn,
                                    BLOCK_M, BLOCK_D)
    h64 = h.to(tl.int64)
    kbase0 = (h64 * 0 + b) * skb + (h64 * 0 + r0) * skr + h64 * skh
    kbase1 = (h64 * 0 + b) * skb + (h64 * 0 + r1) * skr + h64 * skh
    if ROWS >= 2:
        q1, _, acc1, m1, l1 = _fwd_init(Q, b, r1, h, offs_m, offs_d, md, sqb, sqr, sqh, sqn,
                                        BLOCK_M, BLOCK_D)
    else:  # (passed through the loop unused)
        q1, acc1, m1, l1 = q0, acc0, m0, l0
    n_full, n_end, _ = _key_span(Runs, b, r0, r1, R, NK, HAS_RUNS, ROWS, BLOCK_N)
    acc0, m0, l0, acc1, m1, l1 = _fwd_keys(
        q0, q1, acc0, m0, l0, acc1, m1, l1, K, V, kbase0, kbase1, Bias, Mask, b, h, r0, r1,
        offs_m, offs_d, m_valid, sbb, sbh, sbi, sbj, smb, smr, smj, NK, D, skn, scale,
        n_full, n_end, HAS_BIAS, HAS_MASK, HAS_RUNS, ROWS, EVEN, EVEN_D, BLOCK_N, PRECISION)
    # the gate is read with q's strides; no gate bias, no pre-gate output (nothing to save)
    _fwd_store(acc0, m0, l0, G, G, O, O, LSE, b, r0, h, R, H, offs_m, offs_d, m_valid, md,
               NQ, D, sqb, sqr, sqh, sqn, sob, sor, soh, son, HAS_GATE, False)
    if ROWS >= 2:
        _fwd_store(acc1, m1, l1, G, G, O, O, LSE, b, r1, h, R, H, offs_m, offs_d, m_valid, md,
                   NQ, D, sqb, sqr, sqh, sqn, sob, sor, soh, son, HAS_GATE, False)


def _check_inference(q, k, v, bias, gate) -> None:
    """The rule of this forward-only path (shapes and dtypes: ``evo_attention._check``)."""
    if nograd.records(q, k, v, bias, gate):
        raise ValueError(f"evo_attention: N_q={q.shape[-2]} != N_k={k.shape[-2]} is served for "
                         f"inference only (no autograd through the inputs); the backward "
                         f"kernels need N_q = N_k: use fold_ops.reference.attention for training")


def _rows_view(t: torch.Tensor, b: int) -> torch.Tensor:
    """``[*, R, H, N, D]`` as ``[B, R, H, N, D]`` (a view for the model's layouts), D
    contiguous (a copy otherwise)."""
    t = t.reshape(b, *t.shape[-4:])
    return t if t.stride(-1) == 1 else t.contiguous()


def cross_attention(q, k, v, bias=None, mask=None, scale=None, gate=None) -> torch.Tensor:
    """:func:`fold_kernels.evo_attention.evo_attention` for ``N_q != N_k`` (module doc; its
    caller has checked the shapes and dtypes):
    q, gate ``[*, R, H, N_q, D]``, k, v ``[*, R, H, N_k, D]``, bias ``[*, H, N_q, N_k]``
    (leading dims broadcast to q's), mask ``[*, R, N_k]``. Returns ``[*, R, H, N_q, D]`` in q's
    dtype (a view of ``[*, R, N_q, H, D]``)."""
    _check_inference(q, k, v, bias, gate)
    *batch, r, h, nq, d = q.shape
    nk = k.shape[-2]
    nb = math.prod(batch)
    check_grid("evo_attention", f"R={r} rows", r)
    check_grid("evo_attention", f"B*H={nb}*{h}", nb * h)
    scale = d ** -0.5 if scale is None else float(scale)
    q_, k_, v_ = (_rows_view(t, nb) for t in (q, k, v))
    g_ = _rows_view(gate, nb) if gate is not None else None
    if v_.stride() != k_.stride():  # one stride set for the keys
        k_, v_ = k_.contiguous(), v_.contiguous()
    if g_ is not None and g_.stride() != q_.stride():  # the gate is read with q's strides
        q_, g_ = q_.contiguous(), g_.contiguous()
    if not (span_fits(nq, q_.stride(-2), d) and span_fits(nk, k_.stride(-2), d)):
        q_, k_, v_ = q_.contiguous(), k_.contiguous(), v_.contiguous()
        g_ = g_.contiguous() if g_ is not None else None
    bias_, _, sb = _bias_operand(bias, tuple(batch), nq)
    mask_, sm = _mask_operand(mask, tuple(batch), r, nk)
    out = torch.empty(nb, r, nq, h, d, device=q.device, dtype=q.dtype)  # [B, R, N_q, H, D]
    o = out.transpose(2, 3)  # [B, R, H, N_q, D] view
    lse = torch.empty(nb, r, h, 2, nq, device=q.device, dtype=torch.float32)
    dummy = q_
    block_d = _block_d(d)
    runs = key_runs(mask_, sm, nk)

    def launch(cfg: tuning.Config):
        if cfg.rows not in (1, 2):
            raise ValueError(f"evo_attention: the cross forward runs 1 or 2 rows per program, "
                             f"got a configuration with rows={cfg.rows}")
        even = nq % cfg.block_m == 0 and nk % cfg.block_n == 0
        grid = (cdiv(nq, cfg.block_m), cdiv(r, cfg.rows), nb * h)
        _fwd_cross[grid](q_, k_, v_, g_ if g_ is not None else dummy,
                         bias_ if bias_ is not None else dummy,
                         mask_ if mask_ is not None else dummy,
                         runs if runs is not None else dummy, o, lse,
                         *sb, *sm, *q_.stride()[:4], *k_.stride()[:4], *o.stride()[:4],
                         r, h, nq, nk, d, scale,
                         HAS_BIAS=bias_ is not None, HAS_MASK=mask_ is not None,
                         HAS_RUNS=runs is not None, HAS_GATE=g_ is not None, ROWS=cfg.rows,
                         EVEN=even,
                         EVEN_D=d == block_d, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
                         BLOCK_D=block_d, PRECISION=_precision(q.dtype),
                         num_warps=cfg.num_warps, num_stages=cfg.num_stages)

    cands = tuning._attention_configs("fwd_cross", tuning.arch(), d, q.dtype.itemsize)
    key = ("fwd_cross", r, nq, nk, d, q.dtype, bias is not None, mask is not None,
           runs is not None)
    launch(tuning.pick("evo_fwd_cross", key, cands, launch))
    return o.reshape(*batch, r, h, nq, d)
