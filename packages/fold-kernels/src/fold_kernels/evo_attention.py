"""EvoAttention: attention with a pair bias shared by R rows, FlashAttention-2 style.

``o = softmax(scale * q k^T + bias + mask_bias) v`` (then ``o * sigmoid(gate)``), with
q, k, v, gate ``[*, R, H, N, D]``, bias ``[*, H, N, N]`` shared by the R rows (MSA row attention,
triangle attention), key mask ``[*, R, N]`` (true = attend). The ``R x H x N x N`` logits are never
stored: the forward keeps a running max and sum per query (online softmax) and stores the
log-sum-exp in fp32; the backward recomputes the logits tile by tile.

Kernels (MegaFold III, FlashAttention-2), each program one tile of one or two rows:

* ``_fwd``     grid (N/BLOCK_M, R/rows, B*H). A program runs ``ROWS`` (1 or 2) rows r, r+1
  of the same query block, so each pair-bias tile is loaded and converted once for all of them
  (the bias is shared by the R rows: MegaFold re-reads it per row). The query block varies
  fastest, so the programs that read one row's K and V run together (L2 hits), and the head
  varies slowest, so one head's bias stays in L2 while all its rows are swept. Its logits stay
  in the natural-log domain with log2(e) folded into exp2's FMA (:func:`_fwd_step`); at head
  dim 32 the kernel is bound by instruction issue (about 16 SASS instructions per logit at the
  old 64 x 32 tiles, 11 at 128-query tiles with these changes), not by the tensor cores or the
  exp2 unit.
* ``_bwd_pre``  delta = rowsum(dO * O) and, with a gate, dO through the gate and d(gate).
* ``_bwd_dkdv`` grid (N/BLOCK_N, R/rows, B*H): dK, dV of one key block, looping over query blocks,
  on query-major tiles or key-major ones (S^T = K Q^T, no register transposes of P and dS;
  a tuning choice, ``FOLD_EVO_DKDV``).
* ``_bwd_dq``   grid (N/BLOCK_M, R/rows, B*H): dQ of one query block, looping over key blocks
  (``FOLD_EVO_DQ=pass``, deterministic). With ``FOLD_EVO_DQ=atomic`` (the default for head
  dims under 16 unless torch's deterministic mode is on) there is no ``_bwd_dq``:
  ``_bwd_dkdv`` adds each tile's ``dS K`` into an fp32 dQ with atomics, so the logits are
  rebuilt once, not twice, per backward. See :func:`dq_mode`.
* ``_bwd_dbias`` grid (N/BLOCK_N * splits, N/BLOCK_M, H * B_bias): one bias tile; the program
  loops over the R rows (and batch entries that share the bias), adding the dS tiles in
  registers, and stores the tile once. No atomics, so the result is deterministic; with
  ``splits > 1`` each split writes its partial sum to its own fp32 slab and the slabs are summed
  afterwards in a fixed order. The price is recomputing S and dP once more (two more products
  and one more exp per tile). This is ``FOLD_EVO_DBIAS=pass``.
* ``FOLD_EVO_DBIAS=atomic``: no ``_bwd_dbias``; ``_bwd_dkdv`` adds each dS tile (summed over its
  two rows first) into an fp32 ``[B_bias, H, N, N]`` buffer with atomics, as MegaFold and
  FlexAttention do: R/2 x H x N x N atomic adds instead of a third recomputation of the logits;
  the summation order varies, so dbias is not bit-reproducible. See :func:`dbias_mode`.

The forward stores, per query, the log2-sum-exp and (for a fully masked query) 1/l in fp32;
the backward rebuilds P = exp2(s log2(e) - lse) tile by tile (one FMA per logit, as the forward).

Packed inputs (:func:`evo_attention_packed`): q, k, v and the gate may be views of one
``[*, R, N, P*H*D]`` projection (the model's single GEMM of the stacked weights). The kernels take
two stride sets, q's (q, k, v, gate and their gradients) and the output's (o, dY, dO), so the parts
are read in place, the output is written dense ``[*, R, N, H*D]`` and the four gradients land in one
packed gradient.

Key runs (:func:`_mask_runs`, one small launch per call with a mask): per row, how many
leading keys the mask keeps and where its last kept key ends. The forward and dQ run the key
blocks inside the leading run without the mask (no mask load, conversion or select per logit)
and skip the blocks past the last kept key; dK/dV skips a key block past both rows' last kept
keys. A padded input's mask (each row keeps a prefix) and an all-ones mask take the unmasked
path almost everywhere; a mask with holes runs as before. The arithmetic is unchanged (a
masked key's weight is exactly 0 when the row keeps a key): the same bits in the interpreter;
compiled, the fp32 operations may be ordered or contracted differently (1e-8 to 2e-7 relative
on an H200). A program whose rows keep no key at all (padding rows: an MSA padded in depth, a
token padded to its bucket) reads V alone in the forward (their output is the mean of v), dO
alone in dK/dV (dV = (1/l) sum of dO; dK = 0) and stores dQ = 0 without a loop: no logits,
exponentials or bias for those rows, the same values up to fp32 summation order.
``FOLD_EVO_KEY_RUNS=0``: off. On an H200 (``benchmarks/results/tools/
key_runs_ab_h200.md``): EvoAttention at (768, 768, 4, 32) forward+backward 1.10x faster with
a padded mask, 1.06x with all ones, 0.99x with random holes (the launch and the second loop).

Masked keys have their logit *replaced* by a large negative constant (not added; -2^100 in the
forward, :data:`MASKED_NAT`): a query whose
keys are all masked therefore gets uniform weights (the mean of v) in any precision, and no
gradient flows to q, k or bias through a masked logit. Keys past N get ``-inf`` (weight 0).
Head dims under 16 are padded to 16 inside the kernel with masked loads (``tl.dot`` needs K >= 16).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import torch
import triton
import triton.language as tl
from fold_ops.env import EnvVar

from fold_kernels import nograd, one_pass, pdl, tuning
from fold_kernels.broadcast import broadcast_shape, is_dense
from fold_kernels.dot import mm as _mm
from fold_kernels.dot import precision as _precision
from fold_kernels.elementwise import GATE_SUMS
from fold_kernels.index32 import check_grid, pair_bias_fits, span_fits
from fold_kernels.ints import cdiv, next_power_of_2
from fold_kernels.launch import fast
from fold_kernels.one_pass import finish_sum
from fold_kernels.reduce import column_sum, sum_partials

__all__ = ["evo_attention", "evo_attention_packed", "dbias_mode", "dq_mode", "key_runs",
           "SUPPORTED_DTYPES", "MAX_HEAD_DIM", "DBIAS_MODES", "DQ_MODES"]

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
DBIAS_MODES = ("auto", "pass", "atomic")  # see dbias_mode()
DQ_MODES = ("auto", "pass", "atomic")  # see dq_mode()
DEFAULT_DBIAS_MODE = "auto"
MAX_HEAD_DIM = 128
LOG2E = tl.constexpr(1.4426950408889634)
# The replaced logit of a masked key in the forward (natural-log domain): -2^100, so that
# MASKED_NAT * log2(e) is exact in fp32 and a fully masked row gets exp2(0) = 1 for every key
# (uniform weights). The backward zeroes masked keys' P directly.
MASKED_NAT = tl.constexpr(-(2.0**100))


@triton.jit
def _bias_tile(Bias, b, h, offs_m, offs_n, m_valid, n_valid, sbb, sbh, sbi, sbj,
               EVEN: tl.constexpr):
    """The pair-bias tile as stored (natural-log domain), fp32 [BLOCK_M, BLOCK_N]; one load
    serves every row of the program (the bias is shared by the R rows). ``EVEN``: in bounds."""
    bptr = (Bias + b.to(tl.int64) * sbb + h.to(tl.int64) * sbh
            + offs_m[:, None] * sbi + offs_n[None, :] * sbj)  # in-tile terms: host-bounded
    return _load(bptr, m_valid[:, None] & n_valid[None, :], EVEN).to(tl.float32)


@triton.jit
def _bias_tile_t(Bias, b, h, offs_m, offs_n, m_valid, n_valid, sbb, sbh, sbi, sbj,
                 EVEN: tl.constexpr):
    """The pair-bias tile transposed, [BLOCK_N, BLOCK_M] (key-major), natural domain, fp32."""
    bptr = (Bias + b.to(tl.int64) * sbb + h.to(tl.int64) * sbh
            + offs_m[None, :] * sbi + offs_n[:, None] * sbj)
    return _load(bptr, n_valid[:, None] & m_valid[None, :], EVEN).to(tl.float32)


@triton.jit
def _base(b, r, h, sqb, sqr, sqh):
    """Offset of the [N, D] matrix (b, r, h) in a tensor with strides sqb, sqr, sqh over
    [B, R, H] (rows sqn apart, D contiguous). Two layouts exist: q's (q, k, v, gate and their
    gradients) and the output's (o, dY, dO), the same unless the inputs are packed."""
    h64 = h.to(tl.int64)
    return (h64 * 0 + b) * sqb + (h64 * 0 + r) * sqr + h64 * sqh


@triton.jit
def _keep(Mask, b, r, offs_n, n_valid, smb, smr, smj, HAS_MASK: tl.constexpr,
          EVEN: tl.constexpr):
    """Which keys of row r are attended, [BLOCK_N] (keys past N never are). ``EVEN``: every key
    of the block is < N, so the mask is loaded without a predicate."""
    if HAS_MASK:
        mrow = Mask + b.to(tl.int64) * smb + r.to(tl.int64) * smr
        keep = _load(mrow + offs_n * smj, n_valid, EVEN) != 0
    else:
        keep = n_valid
    return keep


@triton.jit
def _load(ptr, mask, FULL: tl.constexpr):
    """``tl.load`` of a tile known to be in bounds (``FULL``: no mask, no per-element predicate
    in the loop) or masked with zeros."""
    if FULL:
        x = tl.load(ptr)
    else:
        x = tl.load(ptr, mask=mask, other=0.0)
    return x


@fast
@triton.jit
def _mask_runs(Mask, Runs, R, NK, smb, smr, smj, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    """Row ``b * R + r`` of the key mask: ``Runs[row] = (kept, end)``, int32: ``kept`` leading
    keys are attended (the first masked key's index, NK if none; -1 when the row attends no
    key); the last attended key is ``end - 1``, and ``end`` is NK when no key is (a fully
    masked row weights every key)."""
    pdl.enter(PDL)
    row = tl.program_id(0)
    b = row // R
    r = row % R
    mrow = Mask + b.to(tl.int64) * smb + r.to(tl.int64) * smr
    kept = NK
    end = 0
    for c in range(0, NK, BLOCK):
        offs = c + tl.arange(0, BLOCK)
        valid = offs < NK
        keep = tl.load(mrow + offs * smj, mask=valid, other=0) != 0
        kept = tl.minimum(kept, tl.min(tl.where(keep | ~valid, NK, offs), 0))
        end = tl.maximum(end, tl.max(tl.where(keep, offs + 1, 0), 0))
    kept = tl.where(end == 0, -1, kept)
    end = tl.where(end == 0, NK, end)
    tl.store(Runs + row.to(tl.int64) * 2, kept)
    tl.store(Runs + row.to(tl.int64) * 2 + 1, end)


@triton.jit
def _key_span(Runs, b, r0, r1, R, NK, HAS_RUNS: tl.constexpr, ROWS: tl.constexpr,
              BLOCK_N: tl.constexpr):
    """``(n_full, n_end, empty)`` for a program's ``ROWS`` rows r0, r1: the key blocks below
    ``n_full`` are attended in every row (whole blocks of the rows' shortest leading run),
    every key from ``n_end`` on is masked in every row that attends any key, and ``empty``:
    no row attends any key. Without runs: ``(0, NK, False)``, every block masked as the mask
    says."""
    if HAS_RUNS:
        i0 = (b.to(tl.int64) * R + r0) * 2
        kept = tl.load(Runs + i0)
        end = tl.load(Runs + i0 + 1)
        top = kept
        if ROWS >= 2:
            i1 = (b.to(tl.int64) * R + r1) * 2
            kept1 = tl.load(Runs + i1)
            kept = tl.minimum(kept, kept1)
            top = tl.maximum(top, kept1)
            end = tl.maximum(end, tl.load(Runs + i1 + 1))
        n_full = (tl.maximum(kept, 0) // BLOCK_N) * BLOCK_N
        n_end = end
        empty = top < 0
    else:
        n_full = 0
        n_end = NK
        empty = False
    return n_full, n_end, empty


@triton.jit
def _v_sums(V, base0, base1, offs_d, n_keys, NK, D, SKN, ROWS: tl.constexpr,
            BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """``sum_k V[k]`` of the program's rows, fp32 [BLOCK_D] each, over ``n_keys`` keys (NK, or
    0: zeros). For rows that attend no key, which weight every key by exactly 1
    (:data:`MASKED_NAT`): their output is the mean of v, made from V alone (no logits,
    exponentials, bias or products). A plain sum, not the masked loop's products with ones:
    a second loop of tensor-core products cost the main loops extra warp-group waits (Triton
    3.6, sm_90). Not pipelined (no shared memory beside the main loops')."""
    s0 = tl.zeros([BLOCK_D], tl.float32)
    s1 = tl.zeros([BLOCK_D], tl.float32)
    for start_n in tl.range(0, n_keys, BLOCK_N, num_stages=1):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        nd = (offs_n < NK)[:, None] & (offs_d < D)[None, :]
        v = tl.load(V + base0 + offs_n[:, None] * SKN + offs_d[None, :], mask=nd, other=0.0)
        s0 += tl.sum(v.to(tl.float32), 0)
        if ROWS >= 2:
            v = tl.load(V + base1 + offs_n[:, None] * SKN + offs_d[None, :], mask=nd, other=0.0)
            s1 += tl.sum(v.to(tl.float32), 0)
    return s0, s1


@triton.jit
def _fwd_init(Q, b, r, h, offs_m, offs_d, md, sqb, sqr, sqh, sqn,
              BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    """One row's query tile [BLOCK_M, BLOCK_D] and its empty online-softmax state."""
    base = _base(b, r, h, sqb, sqr, sqh)
    q = tl.load(Q + base + offs_m[:, None] * sqn + offs_d[None, :], mask=md, other=0.0)
    m = tl.full([BLOCK_M], -1.0e38, tl.float32)  # finite: a block of only -inf stays NaN-free
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    return q, base, acc, m, l_i


@triton.jit
def _fwd_step(q, K, V, base, offs_n, offs_d, nd, bias, keep, n_valid, acc, m_i, l_i,
              scale, SN, HAS_BIAS: tl.constexpr, HAS_MASK: tl.constexpr,
              EVEN: tl.constexpr, FULL_KV: tl.constexpr, PRECISION: tl.constexpr):
    """One key block of the online softmax for one row.

    The logits stay in the natural-log domain, ``s = scale * q k^T + bias`` (one FMA per element,
    the bias tile shared by the program's rows unscaled), and log2(e) goes into exp2's argument,
    ``exp2(s * log2e - m * log2e)`` (one FMA per element): no separate scaling of the product or
    of the bias. ``m_i`` is the running row max of s (natural domain). ``FULL_KV``: the K and V
    tiles are in bounds (N a multiple of the blocks, D of BLOCK_D), loaded without predicates."""
    k = _load(K + base + offs_n[:, None] * SN + offs_d[None, :], nd, FULL_KV)
    v = _load(V + base + offs_n[:, None] * SN + offs_d[None, :], nd, FULL_KV)
    qk = _mm(q, tl.trans(k), PRECISION)  # [BLOCK_M, BLOCK_N]
    if HAS_BIAS:
        s = tl.fma(qk, scale, bias)
    else:
        s = qk * scale
    if HAS_MASK:
        # replaced, not added: all masked -> uniform. MASKED_NAT * log2e is exact (a power of
        # two times log2e), so in a fully masked row exp2's FMA gives exactly 0 -> p = 1.
        s = tl.where(keep[None, :], s, MASKED_NAT)
    if not EVEN:  # keys past N (only when N is not a multiple of the block)
        s = tl.where(n_valid[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m2 = m_new * LOG2E  # [BLOCK_M], log2 domain
    alpha = tl.exp2(m_i * LOG2E - m2)
    p = tl.exp2(tl.fma(s, LOG2E, -m2[:, None]))
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + _mm(p.to(v.dtype), v, PRECISION)
    return acc, m_new, l_i


@triton.jit
def _fwd_store(acc, m_i, l_i, G, GB, O, OPre, LSE, b, r, h, R, H, offs_m, offs_d, m_valid,
               md, N, D, sqb, sqr, sqh, SN, sob, sor, soh, SON, HAS_GATE: tl.constexpr,
               HAS_GATE_BIAS: tl.constexpr):
    """Normalise one row's output, gate it, store it and its log2-sum-exp.

    LSE[.., 0, :] = log2-sum-exp; LSE[.., 1, :] = 1/l for a fully masked row (else 0): its keys
    all sit at MASKED_NAT, where m + log2(l) would lose log2(l), so the backward uses 1/l."""
    slab = (b.to(tl.int64) * R + r) * H + h  # which [N, D] matrix of [B, R, H, N, D]
    all_masked = m_i < -1.0e29
    lse = tl.where(all_masked, float("inf"),  # inf: exp2(s - lse) = 0
                   m_i * LOG2E + tl.log2(l_i))
    tl.store(LSE + slab * 2 * N + offs_m, lse, mask=m_valid)
    tl.store(LSE + slab * 2 * N + N + offs_m, tl.where(all_masked, 1.0 / l_i, 0.0), mask=m_valid)
    o = acc / l_i[:, None]
    optrs = _base(b, r, h, sob, sor, soh) + offs_m[:, None] * SON + offs_d[None, :]
    if HAS_GATE:
        tl.store(OPre + optrs, o.to(OPre.dtype.element_ty), mask=md)
        base = _base(b, r, h, sqb, sqr, sqh)
        g = tl.load(G + base + offs_m[:, None] * SN + offs_d[None, :], mask=md, other=0.0)
        g = g.to(tl.float32)
        if HAS_GATE_BIAS:
            g += tl.load(GB + h * D + offs_d, mask=offs_d < D, other=0.0).to(tl.float32)[None, :]
        o = o * tl.sigmoid(g)
    tl.store(O + optrs, o.to(O.dtype.element_ty), mask=md)


@triton.jit
def _key_tile(Bias, b, h, start_n, offs_m, offs_d, m_valid, NK, D, sbb, sbh, sbi, sbj,
              HAS_BIAS: tl.constexpr, EVEN: tl.constexpr, BLOCK_N: tl.constexpr):
    """Keys ``[start_n, start_n + BLOCK_N)`` of a key loop (forward, dQ): their offsets, which
    are < NK, the K / V tile's predicate [BLOCK_N, BLOCK_D] and the bias tile (0.0 without a
    bias; ``EVEN``: loaded without predicates)."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    n_valid = offs_n < NK
    nd = n_valid[:, None] & (offs_d < D)[None, :]
    if HAS_BIAS:
        bias = _bias_tile(Bias, b, h, offs_m, offs_n, m_valid, n_valid, sbb, sbh, sbi, sbj,
                          EVEN)
    else:
        bias = 0.0
    return offs_n, n_valid, nd, bias


@triton.jit
def _fwd_block(start_n, q0, q1, acc0, m0, l0, acc1, m1, l1, K, V, kbase0, kbase1, Bias, Mask,
               b, h, r0, r1, offs_m, offs_d, m_valid, sbb, sbh, sbi, sbj, smb, smr, smj, NK, D,
               SKN, scale, HAS_BIAS: tl.constexpr, HAS_MASK: tl.constexpr, ROWS: tl.constexpr,
               EVEN: tl.constexpr, IN_BOUNDS: tl.constexpr, EVEN_D: tl.constexpr,
               BLOCK_N: tl.constexpr, PRECISION: tl.constexpr):
    """Keys ``[start_n, start_n + BLOCK_N)`` of :func:`_fwd_keys` for the program's rows.
    ``IN_BOUNDS``: every key of the block is < NK (K, V and the mask loaded without predicates,
    no key-boundary select); ``EVEN``: the bias tile too (queries and keys)."""
    offs_n, n_valid, nd, bias = _key_tile(Bias, b, h, start_n, offs_m, offs_d, m_valid, NK, D,
                                          sbb, sbh, sbi, sbj, HAS_BIAS, EVEN, BLOCK_N)
    keep = _keep(Mask, b, r0, offs_n, n_valid, smb, smr, smj, HAS_MASK, IN_BOUNDS)
    acc0, m0, l0 = _fwd_step(q0, K, V, kbase0, offs_n, offs_d, nd, bias, keep, n_valid,
                             acc0, m0, l0, scale, SKN, HAS_BIAS, HAS_MASK, IN_BOUNDS,
                             IN_BOUNDS and EVEN_D, PRECISION)
    if ROWS >= 2:
        keep = _keep(Mask, b, r1, offs_n, n_valid, smb, smr, smj, HAS_MASK, IN_BOUNDS)
        acc1, m1, l1 = _fwd_step(q1, K, V, kbase1, offs_n, offs_d, nd, bias, keep, n_valid,
                                 acc1, m1, l1, scale, SKN, HAS_BIAS, HAS_MASK, IN_BOUNDS,
                                 IN_BOUNDS and EVEN_D, PRECISION)
    return acc0, m0, l0, acc1, m1, l1


@triton.jit
def _fwd_keys(q0, q1, acc0, m0, l0, acc1, m1, l1, K, V, kbase0, kbase1, Bias, Mask, b, h, r0, r1,
              offs_m, offs_d, m_valid, sbb, sbh, sbi, sbj, smb, smr, smj, NK, D, SKN, scale,
              n_full, n_end, HAS_BIAS: tl.constexpr, HAS_MASK: tl.constexpr,
              HAS_RUNS: tl.constexpr, ROWS: tl.constexpr, EVEN: tl.constexpr,
              EVEN_D: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr):
    """The key loop of one query block for ``ROWS`` (1 or 2) rows r0, r1: each bias tile loaded
    and converted once for both. K and V rows are ``SKN`` apart from ``kbase0`` / ``kbase1``
    (the query's own layout for self-attention; their own with another key length ``NK``). With
    one row the second row's state is passed through untouched.

    With ``HAS_RUNS`` (:func:`_key_span`): the blocks below ``n_full`` run without the mask, in
    bounds; the blocks from ``n_end`` on are skipped (their keys' weights are exactly 0: each
    block would leave the running max, the sum and the accumulator as they were)."""
    if HAS_RUNS:
        for start_n in range(0, n_full, BLOCK_N):
            acc0, m0, l0, acc1, m1, l1 = _fwd_block(
                start_n, q0, q1, acc0, m0, l0, acc1, m1, l1, K, V, kbase0, kbase1, Bias, Mask,
                b, h, r0, r1, offs_m, offs_d, m_valid, sbb, sbh, sbi, sbj, smb, smr, smj, NK, D,
                SKN, scale, HAS_BIAS, False, ROWS, EVEN, True, EVEN_D, BLOCK_N, PRECISION)
    for start_n in range(n_full, n_end, BLOCK_N):
        acc0, m0, l0, acc1, m1, l1 = _fwd_block(
            start_n, q0, q1, acc0, m0, l0, acc1, m1, l1, K, V, kbase0, kbase1, Bias, Mask,
            b, h, r0, r1, offs_m, offs_d, m_valid, sbb, sbh, sbi, sbj, smb, smr, smj, NK, D,
            SKN, scale, HAS_BIAS, HAS_MASK, ROWS, EVEN, EVEN, EVEN_D, BLOCK_N, PRECISION)
    return acc0, m0, l0, acc1, m1, l1


@fast
@triton.jit
def _fwd(Q, K, V, G, GB, Bias, Mask, Runs, O, OPre, LSE,
         sbb, sbh, sbi, sbj, smb, smr, smj, sqb, sqr, sqh, sqn, sob, sor, soh, son,
         R, H, N, D, scale,
         HAS_BIAS: tl.constexpr, HAS_MASK: tl.constexpr, HAS_RUNS: tl.constexpr,
         HAS_GATE: tl.constexpr,
         HAS_GATE_BIAS: tl.constexpr, ROWS: tl.constexpr, EVEN: tl.constexpr,
         EVEN_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
         BLOCK_D: tl.constexpr, PRECISION: tl.constexpr, PDL: tl.constexpr = False):
    """One query block of ``ROWS`` (1 or 2) rows r0, r0+1 of R: each bias tile is loaded and
    converted once for all of them (the bias is shared by the R rows), dividing the bias's L2
    traffic and conversions by ROWS. Rows past R-1 repeat the last row (same values stored).
    ``EVEN`` (N a multiple of both blocks) and ``EVEN_D`` (D == BLOCK_D): the loop's tiles are
    in bounds and loaded without masks."""
    pdl.enter(PDL)
    mb = tl.program_id(0)
    rp = tl.program_id(1)
    bh = tl.program_id(2)
    b = bh // H
    h = bh % H
    offs_m = mb * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    m_valid = offs_m < N
    md = m_valid[:, None] & (offs_d < D)[None, :]
    r0 = rp * ROWS
    r1 = tl.minimum(r0 + 1, R - 1)
    q0, base0, acc0, m0, l0 = _fwd_init(Q, b, r0, h, offs_m, offs_d, md, sqb, sqr, sqh, sqn,
                                        BLOCK_M, BLOCK_D)
    if ROWS >= 2:
        q1, base1, acc1, m1, l1 = _fwd_init(Q, b, r1, h, offs_m, offs_d, md, sqb, sqr, sqh,
                                            sqn, BLOCK_M, BLOCK_D)
    else:  # (passed through the loop unused)
        q1, base1, acc1, m1, l1 = q0, base0, acc0, m0, l0
    n_full, n_end, empty = _key_span(Runs, b, r0, r1, R, N, HAS_RUNS, ROWS, BLOCK_N)
    if HAS_RUNS:
        # rows that attend no key (padding) weight every key by 1: their state is the masked
        # loop's end state, made from V alone, and the key loops below run no block for them
        s0, s1 = _v_sums(V, base0, base1, offs_d, tl.where(empty, N, 0), N, D, sqn, ROWS,
                         BLOCK_N, BLOCK_D)
        n_end = tl.where(empty, 0, n_end)
        acc0 += s0[None, :]  # zeros unless empty
        n_f = tl.zeros([BLOCK_M], tl.float32) + N  # (N may be a constant: Triton's N == 1)
        l0 = tl.where(empty, n_f, l0)
        m0 = tl.where(empty, MASKED_NAT, m0)  # "all masked", as the masked loop leaves it
        if ROWS >= 2:
            acc1 += s1[None, :]
            l1 = tl.where(empty, n_f, l1)
            m1 = tl.where(empty, MASKED_NAT, m1)
    acc0, m0, l0, acc1, m1, l1 = _fwd_keys(
        q0, q1, acc0, m0, l0, acc1, m1, l1, K, V, base0, base1, Bias, Mask, b, h, r0, r1,
        offs_m, offs_d, m_valid, sbb, sbh, sbi, sbj, smb, smr, smj, N, D, sqn, scale,
        n_full, n_end, HAS_BIAS, HAS_MASK, HAS_RUNS, ROWS, EVEN, EVEN_D, BLOCK_N, PRECISION)
    _fwd_store(acc0, m0, l0, G, GB, O, OPre, LSE, b, r0, h, R, H, offs_m, offs_d, m_valid, md,
               N, D, sqb, sqr, sqh, sqn, sob, sor, soh, son, HAS_GATE, HAS_GATE_BIAS)
    if ROWS >= 2:
        _fwd_store(acc1, m1, l1, G, GB, O, OPre, LSE, b, r1, h, R, H, offs_m, offs_d, m_valid,
                   md, N, D, sqb, sqr, sqh, sqn, sob, sor, soh, son, HAS_GATE, HAS_GATE_BIAS)


@fast
@triton.jit
def _bwd_pre(DY, OPre, G, GB, DO, DG, Delta, GBP, DGB, Cnt, Z32, z_size, z_chunk, DQ32,
             R, H, N, D, sqb, sqr, sqh, sqn,
             sob, sor, soh, son, HAS_GATE: tl.constexpr, HAS_GATE_BIAS: tl.constexpr,
             GB_SUM: tl.constexpr, GROUP: tl.constexpr, ZERO: tl.constexpr,
             ZERO_DQ: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
             PDL: tl.constexpr = False):
    """delta = rowsum(dO * O); with a gate, dO = dY * sigmoid(g), dg = dY * O * sig'(g).

    Program (slab, j): queries ``[j * BLOCK_R, (j + 1) * BLOCK_R)`` of one (b, r, h) slab
    (Delta's ``[B, R, H, N]`` layout), so b, r and h are divided out once per program, not per
    row (64-bit divisions per row made the kernel bound by instruction issue). dY, O and dO are
    read in the output layout, the gate and its gradient in q's.

    With ``GB_SUM`` it also reduces dg over every row to the gate bias's gradient ``DGB [H*D]``:
    the programs of head h store their column sums as rows of ``GBP [n_prog + groups, H*D]``
    (fp32) and the last to finish adds them in order (:func:`one_pass.finish_sum`, head h's
    counters at ``Cnt + h * (1 + cdiv(n_prog, GROUP))``), instead of a column sum re-reading the
    whole dg in a launch of its own.

    ``ZERO``: the program also zeroes its ``z_chunk`` values of ``Z32 [z_size]`` (the fp32
    buffer dK/dV's atomics add the bias gradient into); ``ZERO_DQ``: its own queries' rows of
    ``DQ32 [B, R, H, N, D]`` (dQ's atomics). The next kernel on the stream adds into them, so
    no memset launches of their own."""
    pdl.enter(PDL)
    if ZERO:
        pid_all = (tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)).to(tl.int64)
        z_lo = pid_all * z_chunk
        z_hi = tl.minimum(z_lo + z_chunk, z_size)
        zeros = tl.zeros([1024], tl.float32)
        for z0 in range(z_lo, z_hi, 1024):
            offs_z = z0 + tl.arange(0, 1024)
            tl.store(Z32 + offs_z, zeros, mask=offs_z < z_hi)
    slab = tl.program_id(0)
    h = slab % H
    br = slab // H  # b * R + r
    r = br % R
    b = br // R
    offs_n = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_d = tl.arange(0, BLOCK_D)
    nd = (offs_n < N)[:, None] & (offs_d < D)[None, :]
    n64 = offs_n.to(tl.int64)[:, None]
    obase = b.to(tl.int64) * sob + r.to(tl.int64) * sor + h.to(tl.int64) * soh
    optrs = obase + n64 * son + offs_d[None, :]
    dy = tl.load(DY + optrs, mask=nd, other=0.0).to(tl.float32)
    o = tl.load(OPre + optrs, mask=nd, other=0.0).to(tl.float32)
    if HAS_GATE:
        qbase = b.to(tl.int64) * sqb + r.to(tl.int64) * sqr + h.to(tl.int64) * sqh
        gptrs = qbase + n64 * sqn + offs_d[None, :]
        g = tl.load(G + gptrs, mask=nd, other=0.0).to(tl.float32)
        if HAS_GATE_BIAS:
            g += tl.load(GB + h * D + offs_d, mask=offs_d < D, other=0.0).to(tl.float32)[None, :]
        sig = tl.sigmoid(g)
        dg = dy * o * sig * (1.0 - sig)  # 0 outside the tile (dy, o loaded as 0)
        tl.store(DG + gptrs, dg.to(DG.dtype.element_ty), mask=nd)
        if GB_SUM:
            n_prog = tl.num_programs(0) // H * tl.num_programs(1)  # programs of one head
            pid = br * tl.num_programs(1) + tl.program_id(1)
            cols = h * D + offs_d
            tl.store(GBP + pid.to(tl.int64) * (H * D) + cols, tl.sum(dg, 0), mask=offs_d < D)
            finish_sum(GBP, DGB, Cnt + h * (1 + tl.cdiv(n_prog, GROUP)), pid, n_prog, H * D,
                       h * D, D, GROUP, GROUP, BLOCK_D)
        do = dy * sig
        tl.store(DO + optrs, do.to(DO.dtype.element_ty), mask=nd)
    else:
        do = dy
    tl.store(Delta + slab.to(tl.int64) * N + offs_n, tl.sum(do * o, 1), mask=offs_n < N)
    if ZERO_DQ:  # dense [B, R, H, N, D]: slab-major
        dq_ptrs = DQ32 + slab.to(tl.int64) * N * D + n64 * D + offs_d[None, :]
        tl.store(dq_ptrs, tl.zeros([BLOCK_R, BLOCK_D], tl.float32), mask=nd)


@triton.jit
def _ds_tile(q, k, do, v, lse, delta, bias, keep, scale, HAS_BIAS: tl.constexpr,
             NEED_KEEP: tl.constexpr, PRECISION: tl.constexpr):
    """P (attended keys only) and dS = P * (dO V^T - delta) of one tile, [BLOCK_M, BLOCK_N].

    As in the forward, s = scale q k^T + bias stays in the natural-log domain (one FMA) and
    P = exp2(s log2e - lse) takes log2(e) and the log2-sum-exp in one more FMA."""
    qk = _mm(q, tl.trans(k), PRECISION)
    if HAS_BIAS:
        s = tl.fma(qk, scale, bias)
    else:
        s = qk * scale
    p = tl.exp2(tl.fma(s, LOG2E, -lse[:, None]))
    if NEED_KEEP:
        p = tl.where(keep[None, :], p, 0.0)
    dp = _mm(do, tl.trans(v), PRECISION)
    return p, p * (dp - delta[:, None])


@triton.jit
def _lse_delta(LSE, Delta, slab, offs_m, m_valid, N, EVEN: tl.constexpr):
    """The log2-sum-exp and delta of queries offs_m of one row, [BLOCK_M] each (queries past N:
    lse inf, so their P is 0)."""
    if EVEN:
        lse = tl.load(LSE + slab * 2 * N + offs_m)
        delta = tl.load(Delta + slab * N + offs_m)
    else:
        lse = tl.load(LSE + slab * 2 * N + offs_m, mask=m_valid, other=float("inf"))
        delta = tl.load(Delta + slab * N + offs_m, mask=m_valid, other=0.0)
    return lse, delta


@triton.jit
def _dkdv_step(Q, DO, LSE, Delta, slab, base, obase, offs_m, offs_d, md, m_valid, k, v, bias2,
               keep, uniform, n_valid, dk, dv, scale, N, SN, SON, HAS_BIAS: tl.constexpr,
               HAS_MASK: tl.constexpr, EVEN: tl.constexpr, EVEN_D: tl.constexpr,
               PRECISION: tl.constexpr):
    q = _load(Q + base + offs_m[:, None] * SN + offs_d[None, :], md, EVEN and EVEN_D)
    do = _load(DO + obase + offs_m[:, None] * SON + offs_d[None, :], md, EVEN and EVEN_D)
    lse, delta = _lse_delta(LSE, Delta, slab, offs_m, m_valid, N, EVEN)
    p, ds = _ds_tile(q, k, do, v, lse, delta, bias2, keep, scale, HAS_BIAS,
                     HAS_MASK or not EVEN, PRECISION)
    if HAS_MASK:  # a fully masked row spreads 1/l over every key, masked ones included
        if uniform > 0.0:  # rare: a scalar test, hoisted out of the loop by the caller
            p += tl.where(n_valid[None, :] & (keep == 0)[None, :], uniform, 0.0)
    dv += _mm(tl.trans(p.to(do.dtype)), do, PRECISION)
    dk += _mm(tl.trans(ds.to(q.dtype)), q, PRECISION)
    return dk, dv, ds


@triton.jit
def _dkdv_step_t(Q, DO, LSE, Delta, slab, base, obase, offs_m, offs_d, md, m_valid, k, v, bias_t,
                 keep, uniform, n_valid, dk, dv, scale, N, SN, SON, HAS_BIAS: tl.constexpr,
                 HAS_MASK: tl.constexpr, EVEN: tl.constexpr, EVEN_D: tl.constexpr,
                 PRECISION: tl.constexpr):
    """:func:`_dkdv_step` on the transposed tile: S^T = K Q^T [BLOCK_N, BLOCK_M] is computed
    directly (q read as Q^T [BLOCK_D, BLOCK_M]), so P^T and dS^T, the left operands of dV and
    dK, come out of the products in registers instead of being transposed (FlashAttention-2's
    Triton backward does the same). Returns dk, dv and dS^T."""
    q_t = _load(Q + base + offs_m[None, :] * SN + offs_d[:, None], tl.trans(md),
                EVEN and EVEN_D)  # [BLOCK_D, BLOCK_M]
    do = _load(DO + obase + offs_m[:, None] * SON + offs_d[None, :], md, EVEN and EVEN_D)
    lse, delta = _lse_delta(LSE, Delta, slab, offs_m, m_valid, N, EVEN)
    qk_t = _mm(k, q_t, PRECISION)  # [BLOCK_N, BLOCK_M]
    if HAS_BIAS:
        s_t = tl.fma(qk_t, scale, bias_t)  # natural-log domain, as in _ds_tile
    else:
        s_t = qk_t * scale
    p_t = tl.exp2(tl.fma(s_t, LOG2E, -lse[None, :]))
    if HAS_MASK or not EVEN:
        p_t = tl.where(keep[:, None], p_t, 0.0)
    dp_t = _mm(v, tl.trans(do), PRECISION)  # [BLOCK_N, BLOCK_M]
    ds_t = p_t * (dp_t - delta[None, :])
    if HAS_MASK:  # a fully masked row spreads 1/l over every key, masked ones included
        if uniform > 0.0:
            p_t += tl.where(n_valid[:, None] & (keep == 0)[:, None], uniform, 0.0)
    dv += _mm(p_t.to(do.dtype), do, PRECISION)
    dk += _mm(ds_t.to(q_t.dtype), tl.trans(q_t), PRECISION)
    return dk, dv, ds_t


@triton.jit
def _dq_atomic(DQ, slab, offs_m, offs_d, md, ds, k, scale, N, D, TRANSPOSE: tl.constexpr,
               PRECISION: tl.constexpr):
    """Add one tile's dQ part, ``scale * dS K`` [BLOCK_M, BLOCK_D], into the fp32 dense
    ``DQ [B, R, H, N, D]`` (``ds`` is dS^T [BLOCK_N, BLOCK_M] on key-major tiles)."""
    if TRANSPOSE:
        dq = _mm(tl.trans(ds.to(k.dtype)), k, PRECISION)
    else:
        dq = _mm(ds.to(k.dtype), k, PRECISION)
    dptr = DQ + slab * N * D + offs_m[:, None] * D + offs_d[None, :]
    tl.atomic_add(dptr, dq * scale, mask=md, sem="relaxed")


@triton.jit
def _do_sums(DO, obase0, obase1, offs_d, d_valid, N, SON, n_blocks, TWO_ROWS: tl.constexpr,
             BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    """``sum_q dO[q]`` of the program's rows, fp32 [BLOCK_D] each, over ``n_blocks`` query
    blocks (all of them, or 0: zeros). For rows that attend no key, where every key has the
    weight 1/l for every query and P = dS = 0 elsewhere: dV = (1/l) sum_q dO[q] for every
    key, and dK, the bias gradient and dQ get nothing. A plain sum, as :func:`_v_sums` (not
    pipelined)."""
    s0 = tl.zeros([BLOCK_D], tl.float32)
    s1 = tl.zeros([BLOCK_D], tl.float32)
    for mb in tl.range(0, n_blocks, num_stages=1):
        offs_m = mb * BLOCK_M + tl.arange(0, BLOCK_M)
        md = (offs_m < N)[:, None] & d_valid[None, :]
        do_off = offs_m[:, None] * SON + offs_d[None, :]
        s0 += tl.sum(tl.load(DO + obase0 + do_off, mask=md, other=0.0).to(tl.float32), 0)
        if TWO_ROWS:
            s1 += tl.sum(tl.load(DO + obase1 + do_off, mask=md, other=0.0).to(tl.float32), 0)
    return s0, s1


@fast
@triton.jit
def _bwd_dkdv(Q, K, V, Bias, Mask, Runs, DO, LSE, Delta, DK, DV, DBias, DQ,
              sbb, sbh, sbi, sbj, smb, smr, smj, sqb, sqr, sqh, sqn, sob, sor, soh, son,
              R, H, N, D, scale, sdbb,
              HAS_BIAS: tl.constexpr, HAS_MASK: tl.constexpr, HAS_RUNS: tl.constexpr,
              TWO_ROWS: tl.constexpr,
              EVEN: tl.constexpr, EVEN_D: tl.constexpr, DBIAS_ATOMIC: tl.constexpr,
              DQ_ATOMIC: tl.constexpr,
              TRANSPOSE: tl.constexpr, STAGGER: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
              PRECISION: tl.constexpr, PDL: tl.constexpr = False):
    """dK, dV of one key block; with ``DBIAS_ATOMIC`` also the bias gradient, each program
    adding its rows' dS tiles (both rows summed first) into the fp32 ``DBias [B_bias, H, N, N]``
    (zeroed; batch stride ``sdbb``, 0 when the bias is shared) with one atomic add per element:
    no separate dbias pass, but the order of the additions, hence the rounding, varies.
    With ``DQ_ATOMIC`` also dQ: each tile's ``scale * dS K`` [BLOCK_M, D] is added with fp32
    atomics into the zeroed dense ``DQ [B, R, H, N, D]`` (FlashAttention-2's original backward),
    so S and P are recomputed once instead of again in :func:`_bwd_dq` (not bit-reproducible).
    ``TRANSPOSE``: the tiles are computed key-major (:func:`_dkdv_step_t`).
    ``STAGGER``: each program starts its walk over the query blocks at block ``(rp + nb) % n_m``
    instead of 0, so that the programs running at the same time (same key block, other rows)
    add into different dbias tiles instead of all into the same one.
    ``HAS_RUNS``: a key block past the last attended key of both rows (each attending some
    key) has P = dS = 0 in every tile, so its program skips the walk and stores dK = dV = 0;
    rows that attend no key take :func:`_do_sums` instead of the walk."""
    pdl.enter(PDL)
    nb = tl.program_id(0)
    rp = tl.program_id(1)
    bh = tl.program_id(2)
    b = bh // H
    h = bh % H
    if TWO_ROWS:
        r0 = rp * 2
        r1 = tl.minimum(r0 + 1, R - 1)
    else:
        r0 = rp
        r1 = rp
    offs_n = nb * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    n_valid = offs_n < N
    d_valid = offs_d < D
    nd = n_valid[:, None] & d_valid[None, :]
    kv_off = offs_n[:, None] * sqn + offs_d[None, :]
    slab0 = (b.to(tl.int64) * R + r0) * H + h
    base0 = _base(b, r0, h, sqb, sqr, sqh)
    obase0 = _base(b, r0, h, sob, sor, soh)
    k0 = tl.load(K + base0 + kv_off, mask=nd, other=0.0)
    v0 = tl.load(V + base0 + kv_off, mask=nd, other=0.0)
    keep0 = _keep(Mask, b, r0, offs_n, n_valid, smb, smr, smj, HAS_MASK, False)
    # 1/l of a fully masked row (else 0): every query of a row shares its key mask, so query 0's
    # value holds for the row, read once instead of a load and a reduction per query block
    uni0 = tl.load(LSE + slab0 * 2 * N + N)
    dk0 = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv0 = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    if TWO_ROWS:
        slab1 = (b.to(tl.int64) * R + r1) * H + h
        base1 = _base(b, r1, h, sqb, sqr, sqh)
        obase1 = _base(b, r1, h, sob, sor, soh)
        k1 = tl.load(K + base1 + kv_off, mask=nd, other=0.0)
        v1 = tl.load(V + base1 + kv_off, mask=nd, other=0.0)
        keep1 = _keep(Mask, b, r1, offs_n, n_valid, smb, smr, smj, HAS_MASK, False)
        uni1 = tl.load(LSE + slab1 * 2 * N + N)
        dk1 = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
        dv1 = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    else:  # one row: the second row's dO stands in for _do_sums (never read)
        obase1 = obase0
    n_m = tl.cdiv(N, BLOCK_M)
    first = (rp + nb) % n_m if STAGGER else 0
    n_walk = n_m
    if HAS_RUNS:
        _, n_end, empty = _key_span(Runs, b, r0, r1, R, N, True, 2 if TWO_ROWS else 1, BLOCK_N)
        n_walk = tl.where((nb * BLOCK_N >= n_end) | empty, 0, n_m)
        # rows that attend no key: dK = 0, dV = (1/l) sum of dO, from dO alone (1/l in the
        # dO dtype, as the walk's products take it)
        s0, s1 = _do_sums(DO, obase0, obase1, offs_d, d_valid, N, son, tl.where(empty, n_m, 0),
                          TWO_ROWS, BLOCK_M, BLOCK_D)
        uw0 = tl.where(empty & n_valid, uni0.to(DO.dtype.element_ty).to(tl.float32), 0.0)
        dv0 += uw0[:, None] * s0[None, :]
        if TWO_ROWS:
            uw1 = tl.where(empty & n_valid, uni1.to(DO.dtype.element_ty).to(tl.float32), 0.0)
            dv1 += uw1[:, None] * s1[None, :]
    for i in range(0, n_walk):
        mb = i + first
        mb = tl.where(mb >= n_m, mb - n_m, mb)  # (i + first) mod n_m
        offs_m = mb * BLOCK_M + tl.arange(0, BLOCK_M)
        m_valid = offs_m < N
        md = m_valid[:, None] & d_valid[None, :]
        if TRANSPOSE:  # key-major tiles [BLOCK_N, BLOCK_M]
            if HAS_BIAS:
                bias2 = _bias_tile_t(Bias, b, h, offs_m, offs_n, m_valid, n_valid,
                                     sbb, sbh, sbi, sbj, EVEN)
            else:
                bias2 = 0.0
            dk0, dv0, ds = _dkdv_step_t(Q, DO, LSE, Delta, slab0, base0, obase0, offs_m, offs_d,
                                        md, m_valid, k0, v0, bias2, keep0, uni0, n_valid, dk0,
                                        dv0, scale, N, sqn, son, HAS_BIAS, HAS_MASK, EVEN,
                                        EVEN_D, PRECISION)
            if TWO_ROWS:
                dk1, dv1, ds1 = _dkdv_step_t(Q, DO, LSE, Delta, slab1, base1, obase1, offs_m,
                                             offs_d, md, m_valid, k1, v1, bias2, keep1, uni1,
                                             n_valid, dk1, dv1, scale, N, sqn, son, HAS_BIAS,
                                             HAS_MASK, EVEN, EVEN_D, PRECISION)
        else:  # query-major tiles [BLOCK_M, BLOCK_N]
            if HAS_BIAS:
                bias2 = _bias_tile(Bias, b, h, offs_m, offs_n, m_valid, n_valid,
                                   sbb, sbh, sbi, sbj, EVEN)
            else:
                bias2 = 0.0
            dk0, dv0, ds = _dkdv_step(Q, DO, LSE, Delta, slab0, base0, obase0, offs_m, offs_d,
                                      md, m_valid, k0, v0, bias2, keep0, uni0, n_valid, dk0,
                                      dv0, scale, N, sqn, son, HAS_BIAS, HAS_MASK, EVEN,
                                      EVEN_D, PRECISION)
            if TWO_ROWS:
                dk1, dv1, ds1 = _dkdv_step(Q, DO, LSE, Delta, slab1, base1, obase1, offs_m,
                                           offs_d, md, m_valid, k1, v1, bias2, keep1, uni1,
                                           n_valid, dk1, dv1, scale, N, sqn, son, HAS_BIAS,
                                           HAS_MASK, EVEN, EVEN_D, PRECISION)
        if DQ_ATOMIC:
            _dq_atomic(DQ, slab0, offs_m, offs_d, md, ds, k0, scale, N, D, TRANSPOSE,
                       PRECISION)
            if TWO_ROWS:  # odd R: the repeated last row adds its dQ once (masked off)
                last = (offs_m * 0 + r0 + 1 < R)[:, None]
                _dq_atomic(DQ, slab1, offs_m, offs_d, md & last, ds1, k1, scale, N, D,
                           TRANSPOSE, PRECISION)
        if DBIAS_ATOMIC:
            if TWO_ROWS:  # odd R: the repeated last row counts once (weight 0: one FMA)
                ds = tl.fma(ds1, (r0 + 1 < R).to(tl.float32), ds)
            if TRANSPOSE:
                dptr = (DBias + b.to(tl.int64) * sdbb + h.to(tl.int64) * N * N
                        + offs_m[None, :] * N + offs_n[:, None])  # [BLOCK_N, BLOCK_M]
                dmask = n_valid[:, None] & m_valid[None, :]
            else:
                dptr = (DBias + b.to(tl.int64) * sdbb + h.to(tl.int64) * N * N
                        + offs_m[:, None] * N + offs_n[None, :])  # [BLOCK_M, BLOCK_N]
                dmask = m_valid[:, None] & n_valid[None, :]
            tl.atomic_add(dptr, ds, mask=dmask, sem="relaxed")
    tl.store(DK + base0 + kv_off, (dk0 * scale).to(DK.dtype.element_ty), mask=nd)
    tl.store(DV + base0 + kv_off, dv0.to(DV.dtype.element_ty), mask=nd)
    if TWO_ROWS:
        tl.store(DK + base1 + kv_off, (dk1 * scale).to(DK.dtype.element_ty), mask=nd)
        tl.store(DV + base1 + kv_off, dv1.to(DV.dtype.element_ty), mask=nd)


@triton.jit
def _dq_step(K, V, base, offs_n, offs_d, nd, q, do, lse, delta, bias2, keep, dq, scale, SN,
             HAS_BIAS: tl.constexpr, NEED_KEEP: tl.constexpr, FULL_KV: tl.constexpr,
             PRECISION: tl.constexpr):
    k = _load(K + base + offs_n[:, None] * SN + offs_d[None, :], nd, FULL_KV)
    v = _load(V + base + offs_n[:, None] * SN + offs_d[None, :], nd, FULL_KV)
    p, ds = _ds_tile(q, k, do, v, lse, delta, bias2, keep, scale, HAS_BIAS, NEED_KEEP,
                     PRECISION)
    return dq + _mm(ds.to(k.dtype), k, PRECISION)


@triton.jit
def _dq_block(start_n, q0, do0, lse0, delta0, dq0, q1, do1, lse1, delta1, dq1, K, V, base0,
              base1, Bias, Mask, b, h, r0, r1, offs_m, offs_d, m_valid,
              sbb, sbh, sbi, sbj, smb, smr, smj, N, D, scale, sqn, HAS_BIAS: tl.constexpr,
              HAS_MASK: tl.constexpr, TWO_ROWS: tl.constexpr, EVEN: tl.constexpr,
              IN_BOUNDS: tl.constexpr, EVEN_D: tl.constexpr, BLOCK_N: tl.constexpr,
              PRECISION: tl.constexpr):
    """Keys ``[start_n, start_n + BLOCK_N)`` of :func:`_bwd_dq`'s loop for its rows
    (``IN_BOUNDS``: every key < N; ``EVEN``: the bias tile's queries too)."""
    offs_n, n_valid, nd, bias2 = _key_tile(Bias, b, h, start_n, offs_m, offs_d, m_valid, N,
                                           D, sbb, sbh, sbi, sbj, HAS_BIAS, EVEN, BLOCK_N)
    keep0 = _keep(Mask, b, r0, offs_n, n_valid, smb, smr, smj, HAS_MASK, IN_BOUNDS)
    dq0 = _dq_step(K, V, base0, offs_n, offs_d, nd, q0, do0, lse0, delta0, bias2, keep0,
                   dq0, scale, sqn, HAS_BIAS, HAS_MASK or not IN_BOUNDS, IN_BOUNDS and EVEN_D,
                   PRECISION)
    if TWO_ROWS:
        keep1 = _keep(Mask, b, r1, offs_n, n_valid, smb, smr, smj, HAS_MASK, IN_BOUNDS)
        dq1 = _dq_step(K, V, base1, offs_n, offs_d, nd, q1, do1, lse1, delta1, bias2,
                       keep1, dq1, scale, sqn, HAS_BIAS, HAS_MASK or not IN_BOUNDS,
                       IN_BOUNDS and EVEN_D, PRECISION)
    return dq0, dq1


@fast
@triton.jit
def _bwd_dq(Q, K, V, Bias, Mask, Runs, DO, LSE, Delta, DQ,
            sbb, sbh, sbi, sbj, smb, smr, smj, sqb, sqr, sqh, sqn, sob, sor, soh, son,
            R, H, N, D, scale,
            HAS_BIAS: tl.constexpr, HAS_MASK: tl.constexpr, HAS_RUNS: tl.constexpr,
            TWO_ROWS: tl.constexpr, EVEN: tl.constexpr, EVEN_D: tl.constexpr,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
            PRECISION: tl.constexpr, PDL: tl.constexpr = False):
    """dQ of one query block, looping over the key blocks; with ``HAS_RUNS`` as the forward
    (:func:`_fwd_keys`): the blocks below ``n_full`` without the mask, none from ``n_end`` on
    (their P and dS are 0)."""
    pdl.enter(PDL)
    mb = tl.program_id(0)
    rp = tl.program_id(1)
    bh = tl.program_id(2)
    b = bh // H
    h = bh % H
    if TWO_ROWS:
        r0 = rp * 2
        r1 = tl.minimum(r0 + 1, R - 1)
    else:
        r0 = rp
        r1 = rp
    offs_m = mb * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    m_valid = offs_m < N
    d_valid = offs_d < D
    md = m_valid[:, None] & d_valid[None, :]
    qo_off = offs_m[:, None] * sqn + offs_d[None, :]
    do_off = offs_m[:, None] * son + offs_d[None, :]
    slab0 = (b.to(tl.int64) * R + r0) * H + h
    base0 = _base(b, r0, h, sqb, sqr, sqh)
    q0 = tl.load(Q + base0 + qo_off, mask=md, other=0.0)
    do0 = tl.load(DO + _base(b, r0, h, sob, sor, soh) + do_off, mask=md, other=0.0)
    lse0 = tl.load(LSE + slab0 * 2 * N + offs_m, mask=m_valid, other=float("inf"))
    delta0 = tl.load(Delta + slab0 * N + offs_m, mask=m_valid, other=0.0)
    dq0 = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    if TWO_ROWS:
        slab1 = (b.to(tl.int64) * R + r1) * H + h
        base1 = _base(b, r1, h, sqb, sqr, sqh)
        q1 = tl.load(Q + base1 + qo_off, mask=md, other=0.0)
        do1 = tl.load(DO + _base(b, r1, h, sob, sor, soh) + do_off, mask=md, other=0.0)
        lse1 = tl.load(LSE + slab1 * 2 * N + offs_m, mask=m_valid, other=float("inf"))
        delta1 = tl.load(Delta + slab1 * N + offs_m, mask=m_valid, other=0.0)
        dq1 = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    else:  # (passed through the loop unused)
        base1, q1, do1, lse1, delta1, dq1 = base0, q0, do0, lse0, delta0, dq0
    n_full, n_end, empty = _key_span(Runs, b, r0, r1, R, N, HAS_RUNS, 2 if TWO_ROWS else 1,
                                     BLOCK_N)
    if HAS_RUNS:
        # rows that attend no key: their logits are constants, dQ is 0 (n_full is 0 then)
        n_end = tl.where(empty, 0, n_end)
        for start_n in range(0, n_full, BLOCK_N):
            dq0, dq1 = _dq_block(start_n, q0, do0, lse0, delta0, dq0, q1, do1, lse1, delta1,
                                 dq1, K, V, base0, base1, Bias, Mask, b, h, r0, r1, offs_m,
                                 offs_d, m_valid, sbb, sbh, sbi, sbj, smb, smr, smj, N, D,
                                 scale, sqn, HAS_BIAS, False, TWO_ROWS, EVEN, True, EVEN_D,
                                 BLOCK_N, PRECISION)
    for start_n in range(n_full, n_end, BLOCK_N):
        dq0, dq1 = _dq_block(start_n, q0, do0, lse0, delta0, dq0, q1, do1, lse1, delta1, dq1,
                             K, V, base0, base1, Bias, Mask, b, h, r0, r1, offs_m, offs_d,
                             m_valid, sbb, sbh, sbi, sbj, smb, smr, smj, N, D, scale, sqn,
                             HAS_BIAS, HAS_MASK, TWO_ROWS, EVEN, EVEN, EVEN_D, BLOCK_N,
                             PRECISION)
    tl.store(DQ + base0 + qo_off, (dq0 * scale).to(DQ.dtype.element_ty), mask=md)
    if TWO_ROWS:
        tl.store(DQ + base1 + qo_off, (dq1 * scale).to(DQ.dtype.element_ty), mask=md)


@fast
@triton.jit
def _bwd_dbias(Q, K, V, Bias, Mask, DO, LSE, Delta, DBias,
               sbb, sbh, sbi, sbj, smb, smr, smj, sqb, sqr, sqh, sqn, sob, sor, soh, son,
               R, H, N, D, scale, rows_per_bias, rows_per_split, n_blocks_n,
               HAS_MASK: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
               PRECISION: tl.constexpr, PDL: tl.constexpr = False):
    """dbias[bb, h, i, j] = sum over the rows (r, and b when the bias is broadcast) of dS."""
    pdl.enter(PDL)
    split = tl.program_id(0) // n_blocks_n
    nb = tl.program_id(0) % n_blocks_n
    mb = tl.program_id(1)
    bbh = tl.program_id(2)
    bb = bbh // H
    h = bbh % H
    offs_m = mb * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = nb * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    m_valid = offs_m < N
    n_valid = offs_n < N
    d_valid = offs_d < D
    md = m_valid[:, None] & d_valid[None, :]
    nd = n_valid[:, None] & d_valid[None, :]
    # the bias tile is the same for every row: load it once, outside the loop over rows
    bias2 = _bias_tile(Bias, bb, h, offs_m, offs_n, m_valid, n_valid, sbb, sbh, sbi, sbj, False)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    t0 = split * rows_per_split
    t1 = tl.minimum(t0 + rows_per_split, rows_per_bias)
    for t in range(t0, t1):
        b = bb * (rows_per_bias // R) + t // R  # the bias batch entry bb serves these b
        r = t % R
        slab = (b.to(tl.int64) * R + r) * H + h
        base = _base(b, r, h, sqb, sqr, sqh)
        q = tl.load(Q + base + offs_m[:, None] * sqn + offs_d[None, :], mask=md, other=0.0)
        obase = _base(b, r, h, sob, sor, soh)
        do = tl.load(DO + obase + offs_m[:, None] * son + offs_d[None, :], mask=md, other=0.0)
        k = tl.load(K + base + offs_n[:, None] * sqn + offs_d[None, :], mask=nd, other=0.0)
        v = tl.load(V + base + offs_n[:, None] * sqn + offs_d[None, :], mask=nd, other=0.0)
        lse = tl.load(LSE + slab * 2 * N + offs_m, mask=m_valid, other=float("inf"))
        delta = tl.load(Delta + slab * N + offs_m, mask=m_valid, other=0.0)
        keep = _keep(Mask, b, r, offs_n, n_valid, smb, smr, smj, HAS_MASK, False)
        p, ds = _ds_tile(q, k, do, v, lse, delta, bias2, keep, scale, True, True, PRECISION)
        acc += ds
    out = (split * (tl.num_programs(2)) + bbh).to(tl.int64) * N * N
    tl.store(DBias + out + offs_m[:, None] * N + offs_n[None, :],
             acc.to(DBias.dtype.element_ty), mask=m_valid[:, None] & n_valid[None, :])


# ----------------------------------------------------------------------------- host side


def _block_d(d: int) -> int:
    return max(16, next_power_of_2(d))


def _check(q, k, v, bias, mask, gate) -> None:
    """Shapes and dtypes of :func:`evo_attention`: k, v ``[*, R, H, N_k, D]``, q's shape but
    for the key length (N_k != N: :mod:`fold_kernels.evo_attention_cross`)."""
    if q.dim() < 4:
        raise ValueError(f"evo_attention: q must be [*, R, H, N, D], got shape {tuple(q.shape)}")
    if (k.shape != v.shape or k.dim() != q.dim() or k.shape[:-2] != q.shape[:-2]
            or k.shape[-1] != q.shape[-1]):
        raise ValueError(f"evo_attention: k and v must have one shape, q's but for the key "
                         f"length [*, R, H, N_k, D] (q {tuple(q.shape)}), got {tuple(k.shape)} "
                         f"and {tuple(v.shape)}")
    if gate is not None and gate.shape != q.shape:
        raise ValueError(f"evo_attention: gate must have q's shape {tuple(q.shape)}, "
                         f"got {tuple(gate.shape)}")
    if q.dtype not in SUPPORTED_DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"evo_attention: q, k, v must share a dtype among {SUPPORTED_DTYPES}")
    if q.shape[-1] > MAX_HEAD_DIM:
        raise ValueError(f"evo_attention: head dim {q.shape[-1]} > {MAX_HEAD_DIM}")
    *_, h, n, _ = q.shape
    _check_bias_mask("evo_attention", h, n, bias, mask, k.shape[-2])
    tuning.require_device("evo_attention", q, "fold_ops.reference.attention")


def _check_bias_mask(op: str, h: int, n: int, bias, mask, n_k: int | None = None) -> None:
    """bias ``[*, H, N, N_k]`` and mask ``[*, R, N_k]`` (``n_k``: the key length, N if None)."""
    n_k = n if n_k is None else n_k
    if bias is not None and tuple(bias.shape[-3:]) != (h, n, n_k):
        raise ValueError(f"{op}: bias must be [*, H={h}, N={n}, N_k={n_k}], "
                         f"got {tuple(bias.shape)}")
    if mask is not None and mask.shape[-1] != n_k:
        raise ValueError(f"{op}: mask must be [*, R, N_k={n_k}], got {tuple(mask.shape)}")
    if bias is not None and not pair_bias_fits(max(n, n_k)):
        raise ValueError(f"{op}: N={n}, N_k={n_k}: the kernels index the bias tile in 32 bits "
                         f"(N <= 46340, N_k <= 46340)")


def _bias_view(bias: torch.Tensor, batch: tuple[int, ...]) -> tuple[torch.Tensor, int]:
    """The bias as [B_bias, H, N, N_k] (B_bias 1 if shared by every batch entry, else B)."""
    h, n, n_k = bias.shape[-3:]
    lead = tuple(bias.shape[:-3])
    nb = math.prod(batch)
    if len(lead) > len(batch):  # the output would broadcast beyond q's shape
        raise ValueError(f"evo_attention: bias batch dims {lead} have more dims than q's "
                         f"batch {batch}")
    if math.prod(lead) == 1:
        return bias.reshape(1, h, n, n_k), 1
    if broadcast_shape(lead, batch) != batch:
        raise ValueError(f"evo_attention: bias batch dims {lead} do not broadcast to {batch}")
    return bias.expand(*batch, h, n, n_k).reshape(nb, h, n, n_k), nb


def _mask_view(mask: torch.Tensor, batch: tuple[int, ...], r: int, n: int) -> torch.Tensor:
    """The key mask as a [B, R, N] view (broadcast dims keep stride 0) in its own dtype: the
    kernels test ``!= 0``, so a float or bool mask is read in place, never converted per call
    (a bool mask is reinterpreted as uint8, a free view)."""
    m = mask.view(torch.uint8) if mask.dtype == torch.bool else mask
    return m.expand(*batch, r, n).reshape(-1, r, n)


# FOLD_EVO_KEY_RUNS=0: every key block runs masked as the mask says (no _mask_runs launch)
_KEY_RUNS = EnvVar("FOLD_EVO_KEY_RUNS", lambda v: (v if v is not None else "1") != "0")


def key_runs(mask: torch.Tensor | None, strides: list, n_k: int) -> torch.Tensor | None:
    """The key runs of a ``[B, R, N_k]`` mask operand, ``[B * R, 2]`` int32 (:func:`_mask_runs`;
    one launch), or None without a mask or with ``FOLD_EVO_KEY_RUNS=0``."""
    if mask is None or not _KEY_RUNS.get():
        return None
    rows = mask.shape[0] * mask.shape[1]
    runs = torch.empty((rows, 2), device=mask.device, dtype=torch.int32)
    block = min(next_power_of_2(n_k), 16 if tuning.interpreting() else 1024)
    _mask_runs[(rows,)](mask, runs, mask.shape[1], n_k, *strides, BLOCK=block)
    return runs


def _bias_operand(bias, batch: tuple[int, ...], n: int) -> tuple[torch.Tensor | None, int, list]:
    """``(bias [B_bias, H, N, N_k], B_bias, its strides)`` as the kernels read it (None, 1,
    zeros without a bias): a shared bias gets batch stride 0."""
    if bias is None:
        return None, 1, [0, 0, 0, 0]
    view, nb = _bias_view(bias, batch)
    if view.stride(-1) != 1 or not span_fits(n, view.stride(-2)):
        # The model's bias is a head-last projection viewed [H, N, N] (movedim): its tiles
        # would be read H elements apart, once per row and query block (3x slower kernels at
        # N 768); one copy of H x N x N costs far less. A query stride whose in-tile offsets
        # overflow int32 is copied too (index32).
        view = view.contiguous()
    strides = list(view.stride())
    if nb == 1:
        strides[0] = 0
    return view, nb, strides


def _mask_operand(mask, batch: tuple[int, ...], r: int, n_k: int
                  ) -> tuple[torch.Tensor | None, list]:
    """``(mask [B, R, N_k], its strides)`` as the kernels read it (None, zeros without one)."""
    if mask is None:
        return None, [0, 0, 0]
    view = _mask_view(mask, batch, r, n_k)
    if not span_fits(n_k, view.stride(-1)):  # in-tile key offsets: int32
        view = view.contiguous()
    return view, list(view.stride())


class _Launch:
    """Flattened tensors and the scalars shared by the forward and backward launches.

    Two layouts (strides of a [B, R, H, N, D] tensor): ``layout`` for q, k, v, gate and their
    gradients, ``out_layout`` for o, dY and dO. They are the same for separate q/k/v; with
    packed projections (:func:`evo_attention_packed`) the inputs are views of one
    ``[B, R, N, P*H*D]`` tensor and the output is a dense ``[B, R, N, H*D]``.
    """

    def __init__(self, q, bias, mask, scale):
        *batch, self.R, self.H, self.N, self.D = q.shape
        self.batch = tuple(batch)
        self.B = math.prod(self.batch)
        check_grid("evo_attention", f"R={self.R} rows", self.R)  # grid y: R (or R/rows) programs
        check_grid("evo_attention", f"B*H={self.B}*{self.H}", self.B * self.H)  # grid z
        self.scale = float(scale)
        self.block_d = _block_d(self.D)
        self.precision = _precision(q.dtype)
        self.bias_shape = None if bias is None else bias.shape
        self.bias, self.Bb, self.bias_strides = _bias_operand(bias, self.batch, self.N)
        self.mask, self.mask_strides = _mask_operand(mask, self.batch, self.R, self.N)
        self.runs: torch.Tensor | None = None  # the mask's key runs (set by _forward)
        self.dtype = q.dtype
        self.layout: tuple[int, ...] = ()  # q's layout (set_layout / packed)
        self.out_layout: tuple[int, ...] = ()  # o's layout
        self.packed = False

    def set_layout(self, q, k, v, gate):
        """Adopt q's strides for q, k, v, gate, o, dO and the gradients when they share them and
        are dense with D contiguous (the model's heads are a transposed view of a projection
        ``[*, R, N, H, D]``: read and written in place, no copies); else copy to contiguous."""
        tensors = [t for t in (q, k, v, gate) if t is not None]
        stride = q.stride()
        if not (is_dense(q) and all(t.stride() == stride for t in tensors)
                and span_fits(self.N, stride[-2], self.D)):  # in-tile offsets: int32
            q, k, v = (t.contiguous() for t in (q, k, v))
            gate = gate.contiguous() if gate is not None else None
            stride = q.stride()
        self.layout = self.out_layout = tuple(stride)
        return q, k, v, gate

    def set_packed_layout(self, q):
        """q, k, v, gate are views of one packed ``[B, R, N, P*H*D]`` projection (q's strides);
        the output is a dense ``[B, R, N, H, D]`` seen as [B, R, H, N, D]."""
        self.layout = tuple(q.stride())
        n_hd = self.H * self.D
        self.out_layout = (self.R * self.N * n_hd, self.N * n_hd, self.D, n_hd, 1)
        self.packed = True

    def empty(self, like: torch.Tensor) -> torch.Tensor:
        """A new [B, R, H, N, D] tensor in q's layout (separate q/k/v only)."""
        return torch.empty_strided(like.shape, self.layout, device=like.device, dtype=like.dtype)

    def empty_out(self, like: torch.Tensor) -> torch.Tensor:
        """A new [B, R, H, N, D] tensor in the output layout."""
        return torch.empty_strided(like.shape, self.out_layout, device=like.device,
                                   dtype=like.dtype)

    def conform(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` (an output-side tensor: dY) in the output layout (a copy only when its strides
        differ)."""
        if t.stride() == self.out_layout:
            return t
        out = self.empty_out(t)
        out.copy_(t)
        return out

    def even(self, cfg: tuning.Config) -> bool:
        """N is a multiple of both block sizes: no key-boundary selects needed."""
        return self.N % cfg.block_m == 0 and self.N % cfg.block_n == 0

    def strides(self):
        return (*self.bias_strides, *self.mask_strides, *self.layout[:4], *self.out_layout[:4])

    def key(self, kernel: str) -> tuple:
        return (kernel, self.R, self.N, self.D, self.dtype, self.bias is not None,
                self.mask is not None, self.packed)


def _parse_dkdv_tiles(value: str | None) -> str:
    mode = (value or "auto").strip().lower()
    if mode not in ("auto", "query", "key"):
        raise ValueError(f"FOLD_EVO_DKDV={value!r}: expected auto, query or key")
    return mode


_DKDV_TILES = EnvVar("FOLD_EVO_DKDV", _parse_dkdv_tiles)
# FOLD_EVO_STAGGER=0: every dK/dV program walks the query blocks from 0 (see _bwd_dkdv); the
# staggered walk is used only with the bias gradient's atomics and dQ by its own pass
_STAGGER = EnvVar("FOLD_EVO_STAGGER", lambda v: (v if v is not None else "1") != "0")


@functools.cache
def _dkdv_candidates(kernel: str, arch: str, d: int, tiles: str) -> tuple[tuning.Config, ...]:
    """dK/dV's candidates, all (``auto``: the tuner picks) or only query-major (``query``) or
    key-major (``key``) tiles (``FOLD_EVO_DKDV``: both timed side by side in one process)."""
    cands = tuning._attention_configs(kernel, arch, d)
    if tiles == "auto":
        return cands
    if arch == "interpreter":  # one candidate there: the same tiles in the asked order
        return (dataclasses.replace(cands[0], transpose=tiles == "key"),)
    return tuple(c for c in cands if c.transpose == (tiles == "key"))


def _cfg(kernel: str, lp: _Launch, launch, *variant) -> tuning.Config:
    """The tuned configuration of ``kernel``; ``variant``: switches that change the kernel
    (tuned apart, part of the key)."""
    if kernel.startswith("dkdv"):
        cands = _dkdv_candidates(kernel, tuning.arch(), lp.D, _DKDV_TILES.get())
    else:  # memoised tuple
        cands = tuning._attention_configs(kernel, tuning.arch(), lp.D, lp.dtype.itemsize)
    return tuning.pick(f"evo_{kernel}", lp.key(kernel) + variant, cands, launch)


def _check_rows(cfg: tuning.Config, allowed: tuple[int, ...], kernel: str) -> None:
    """A configuration's rows per program must be one the kernel runs (the grid divides R by
    it: any other value would leave rows uncomputed)."""
    if cfg.rows not in allowed:
        raise ValueError(f"evo_attention: the {kernel} kernel runs {allowed} rows per program, "
                         f"got a configuration with rows={cfg.rows}")


def _forward(q, k, v, gate, gate_bias, lp: _Launch):
    o = lp.empty_out(q)
    o_pre = lp.empty_out(q) if gate is not None else o
    lse = torch.empty((lp.B, lp.R, lp.H, 2, lp.N), device=q.device, dtype=torch.float32)
    dummy = q
    lp.runs = key_runs(lp.mask, lp.mask_strides, lp.N)  # for the backward too
    runs = lp.runs is not None

    def launch(cfg: tuning.Config):
        _check_rows(cfg, (1, 2), "forward")
        grid = (cdiv(lp.N, cfg.block_m), cdiv(lp.R, cfg.rows), lp.B * lp.H)
        _fwd[grid](q, k, v, gate if gate is not None else dummy,
                   gate_bias if gate_bias is not None else dummy,
                   lp.bias if lp.bias is not None else dummy,
                   lp.mask if lp.mask is not None else dummy,
                   lp.runs if runs else dummy,
                   o, o_pre, lse, *lp.strides(), lp.R, lp.H, lp.N, lp.D, lp.scale,
                   HAS_BIAS=lp.bias is not None, HAS_MASK=lp.mask is not None,
                   HAS_RUNS=runs, HAS_GATE=gate is not None, HAS_GATE_BIAS=gate_bias is not None,
                   ROWS=cfg.rows, EVEN=lp.even(cfg), EVEN_D=lp.D == lp.block_d,
                   BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
                   BLOCK_D=lp.block_d, PRECISION=lp.precision,
                   num_warps=cfg.num_warps, num_stages=cfg.num_stages)

    launch(_cfg("fwd", lp, launch, runs))
    return o, o_pre, lse


def _backward(dy, q, k, v, gate, gate_bias, o_pre, lse, lp: _Launch, need_dbias: bool,
              grads=None, need_dgate_bias: bool = False):
    """dq, dk, dv, dbias, dgate, dgate_bias; ``grads`` = (dq, dk, dv, dgate) to write into
    (views of one packed gradient), else they are allocated in q's layout. ``dgate_bias``
    (with ``need_dgate_bias`` and a gate bias) is reduced by the preprocess kernel in the same
    launch where its counters fit, else None: the caller sums dgate itself."""
    dy = lp.conform(dy)
    delta = torch.empty((lp.B, lp.R, lp.H, lp.N), device=q.device, dtype=torch.float32)
    if grads is None:
        grads = (lp.empty(q), lp.empty(k), lp.empty(v),
                 lp.empty(gate) if gate is not None else None)
    dq, dk, dv, dgate = grads
    do = lp.empty_out(q) if gate is not None else dy
    block_r = 16 if tuning.interpreting() else 64
    n_blocks = cdiv(lp.N, block_r)
    check_grid("evo_attention", f"N = {lp.N} queries", n_blocks)
    # the gate bias's gradient in this launch: one partial row per program of a head, added by
    # the last programs (one_pass), when every head's counters fit
    n_pre = lp.B * lp.R * n_blocks  # programs per head
    gb_sum = (need_dgate_bias and gate is not None and gate_bias is not None
              and GATE_SUMS.get() and one_pass.fits(lp.H, n_pre))
    dgate_bias = gb_partials = cnt = dy  # stand-ins, never touched without GB_SUM
    if gb_sum:
        gb_partials = one_pass.partials(n_pre, lp.H * lp.D, q.device)
        dgate_bias = torch.empty(lp.H * lp.D, device=q.device, dtype=gate_bias.dtype)
        cnt = one_pass.counters(q.device)
    dummy = q
    want_dbias = need_dbias and lp.bias is not None
    atomic = want_dbias and dbias_mode() == "atomic"
    # atomic mode: dK/dV's pass adds every dS tile into one fp32 [B_bias, H, N, N] buffer
    dbias32 = (torch.empty((lp.Bb, lp.H, lp.N, lp.N), device=q.device, dtype=torch.float32)
               if atomic else dummy)
    sdbb = lp.H * lp.N * lp.N if lp.Bb > 1 else 0
    # dq_mode() "atomic": dK/dV's pass also adds dQ into a dense fp32 [B, R, H, N, D] buffer
    dq_atomic = dq_mode(lp.D) == "atomic"
    dq32 = (torch.empty((lp.B, lp.R, lp.H, lp.N, lp.D), device=q.device, dtype=torch.float32)
            if dq_atomic else dummy)
    # the preprocess zeroes both buffers (each program a chunk of dbias32, its own rows of
    # dq32): two memset launches fewer
    z_size = dbias32.numel() if atomic else 0
    _bwd_pre[(lp.B * lp.R * lp.H, n_blocks)](
        dy, o_pre, gate if gate is not None else dy,
        gate_bias if gate_bias is not None else dy, do, dgate if gate is not None else dy,
        delta, gb_partials, dgate_bias, cnt, dbias32, z_size, cdiv(z_size, n_pre * lp.H), dq32,
        lp.R, lp.H, lp.N, lp.D, *lp.layout[:4],
        *lp.out_layout[:4], HAS_GATE=gate is not None, HAS_GATE_BIAS=gate_bias is not None,
        GB_SUM=gb_sum, GROUP=one_pass.group_size() if gb_sum else 1, ZERO=atomic,
        ZERO_DQ=dq_atomic, BLOCK_R=block_r, BLOCK_D=lp.block_d)
    dgate_bias = dgate_bias if gb_sum else None

    bias = lp.bias if lp.bias is not None else dummy
    mask = lp.mask if lp.mask is not None else dummy
    runs = lp.runs if lp.runs is not None else dummy  # the forward's (None: it took none)
    flags = dict(HAS_BIAS=lp.bias is not None, HAS_MASK=lp.mask is not None,
                 HAS_RUNS=lp.runs is not None, BLOCK_D=lp.block_d, PRECISION=lp.precision)
    fresh = [True]  # the preprocess zeroed the buffers for the first dK/dV launch only

    def launch_dkdv(cfg: tuning.Config):
        _check_rows(cfg, (1, 2), "dK/dV")
        grid = (cdiv(lp.N, cfg.block_n), cdiv(lp.R, cfg.rows), lp.B * lp.H)
        if fresh:
            fresh.clear()
        else:  # the tuner runs candidates one after another: each adds into zeros again
            if atomic:
                dbias32.zero_()
            if dq_atomic:
                dq32.zero_()
        _bwd_dkdv[grid](q, k, v, bias, mask, runs, do, lse, delta, dk, dv, dbias32, dq32,
                        *lp.strides(), lp.R, lp.H, lp.N, lp.D, lp.scale, sdbb,
                        TWO_ROWS=cfg.rows == 2, EVEN=lp.even(cfg), EVEN_D=lp.D == lp.block_d,
                        DBIAS_ATOMIC=atomic,
                        DQ_ATOMIC=dq_atomic, TRANSPOSE=cfg.transpose, STAGGER=stagger,
                        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, **flags,
                        num_warps=cfg.num_warps, num_stages=cfg.num_stages)

    def launch_dq(cfg: tuning.Config):
        _check_rows(cfg, (1, 2), "dQ")
        grid = (cdiv(lp.N, cfg.block_m), cdiv(lp.R, cfg.rows), lp.B * lp.H)
        _bwd_dq[grid](q, k, v, bias, mask, runs, do, lse, delta, dq, *lp.strides(),
                      lp.R, lp.H, lp.N, lp.D, lp.scale,
                      TWO_ROWS=cfg.rows == 2, EVEN=lp.even(cfg), EVEN_D=lp.D == lp.block_d,
                      BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, **flags,
                      num_warps=cfg.num_warps, num_stages=cfg.num_stages)

    kernel = "dkdv" + ("_atomic" if atomic else "") + ("_dq" if dq_atomic else "")
    # a staggered walk: 1.006-1.011x faster replays with the bias gradient's atomics at D 32
    # (H 4-8, N 256-768), 0.987x with dQ's atomics too at D 8 (H200:
    # benchmarks/results/tools/stagger_ab_h200.md)
    stagger = atomic and not dq_atomic and _STAGGER.get()
    has_runs = lp.runs is not None
    launch_dkdv(_cfg(kernel, lp, launch_dkdv, stagger, has_runs))
    if dq_atomic:
        dq.copy_(dq32)  # into q's dtype and layout (a view of the packed gradient too)
    else:
        launch_dq(_cfg("dq", lp, launch_dq, has_runs))

    dbias = None
    if atomic:
        dbias = dbias32 if lp.bias.dtype == torch.float32 else dbias32.to(lp.bias.dtype)
    elif want_dbias:
        rows_per_bias = lp.R * (lp.B // lp.Bb)
        state = {}

        def launch_dbias(cfg: tuning.Config):
            n_m, n_n = cdiv(lp.N, cfg.block_m), cdiv(lp.N, cfg.block_n)
            splits = _dbias_splits(n_m * n_n * lp.H * lp.Bb, rows_per_bias, q.device)
            per_split = cdiv(rows_per_bias, splits)
            # one split: the kernel stores the bias's dtype directly; more: fp32 partials
            out = torch.empty((splits, lp.Bb, lp.H, lp.N, lp.N), device=q.device,
                              dtype=lp.bias.dtype if splits == 1 else torch.float32)
            _bwd_dbias[(n_n * splits, n_m, lp.H * lp.Bb)](
                q, k, v, bias, mask, do, lse, delta, out, *lp.strides(),
                lp.R, lp.H, lp.N, lp.D, lp.scale, rows_per_bias, per_split, n_n,
                HAS_MASK=lp.mask is not None, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
                BLOCK_D=lp.block_d, PRECISION=lp.precision,
                num_warps=cfg.num_warps, num_stages=cfg.num_stages)
            state["out"] = out

        launch_dbias(_cfg("dbias", lp, launch_dbias))
        out = state["out"]
        dbias = sum_partials(out, lp.bias.dtype)  # fixed order: deterministic, one launch
    return dq, dk, dv, dbias, dgate, dgate_bias


def _parse_dbias_mode(value: str | None) -> str:
    mode = (value or DEFAULT_DBIAS_MODE).strip().lower()
    if mode not in DBIAS_MODES:
        raise ValueError(f"FOLD_EVO_DBIAS={value!r}: expected one of {DBIAS_MODES}")
    return mode


_DBIAS_MODE = EnvVar("FOLD_EVO_DBIAS", _parse_dbias_mode)


def dbias_mode() -> str:
    """How the backward reduces the bias gradient over the R rows (``FOLD_EVO_DBIAS``):

    * ``pass``: a separate kernel per bias tile loops over the rows in a fixed order
      (deterministic; recomputes the logits and dP once more);
    * ``atomic``: dK/dV's pass adds each dS tile with fp32 atomics (one pass fewer; the
      summation order, so the last bits of dbias, vary from run to run);
    * ``auto`` (default): ``pass`` under ``torch.use_deterministic_algorithms(True)``, else
      ``atomic`` (faster on an H100 at every measured shape but the smallest:
      benchmarks/results/kernels/kernels_attention.md), PyTorch's own convention for atomics.
    """
    mode = _DBIAS_MODE.get()
    if mode == "auto":
        return "pass" if torch.are_deterministic_algorithms_enabled() else "atomic"
    return mode


def _parse_dq_mode(value: str | None) -> str:
    mode = (value or "auto").strip().lower()
    if mode not in DQ_MODES:
        raise ValueError(f"FOLD_EVO_DQ={value!r}: expected one of {DQ_MODES}")
    return mode


_DQ_MODE = EnvVar("FOLD_EVO_DQ", _parse_dq_mode)


def dq_mode(head_dim: int) -> str:
    """How the backward computes dQ for heads of ``head_dim`` (``FOLD_EVO_DQ``):

    * ``pass``: :func:`_bwd_dq`, one program per query block looping over the keys
      (deterministic; recomputes S, P and dP a second time);
    * ``atomic``: dK/dV's pass adds each tile's ``dS K`` into an fp32 ``[B, R, H, N, D]``
      buffer with atomics, as FlashAttention-2's original kernel does (one recomputation fewer,
      a zeroed buffer and a copy more; the summation order, so the last bits of dQ, vary);
    * ``auto`` (default): ``pass`` under ``torch.use_deterministic_algorithms(True)``; else
      ``atomic`` for head dims under 16 and ``pass`` from 16 up. Measured on an H100 (bf16,
      benchmarks/results/kernels/kernels_attention_dq.md): at D 8 (extra MSA) ``atomic`` is
      7-8% faster forward+backward; at D 32 the dQ atomics cost as much as the pass they
      replace (up to 6% slower from N 256 to 768, within 2% at 1536) and the fp32 buffer adds
      R H N D x 4 bytes.
    """
    mode = _DQ_MODE.get()
    if mode == "auto":
        if torch.are_deterministic_algorithms_enabled():
            return "pass"
        return "atomic" if head_dim < 16 else "pass"
    return mode


def _dbias_splits(tiles: int, rows: int, device: torch.device) -> int:
    """How many slabs the R-reduction is split into so that the grid fills the GPU."""
    if tuning.interpreting() or device.type != "cuda":
        return 2 if rows > 2 else 1  # exercise the two-stage path in CPU tests too
    sms = tuning.multiprocessors(device)
    want = max(1, (2 * sms) // max(tiles, 1))
    return int(min(want, max(rows // 32, 1), 16))


def _dbias_shape(dbias: torch.Tensor | None, lp: _Launch) -> torch.Tensor | None:
    """The bias gradient ``[B_bias, H, N, N]`` in the bias's own shape."""
    if dbias is None:
        return None
    if lp.Bb == 1:  # one bias for every batch entry: its leading dims are all 1
        return dbias.reshape(lp.bias_shape)
    # [B, H, N, N] -> [*batch, H, N, N], summed over the bias's broadcast dims
    return dbias.reshape(*lp.batch, lp.H, lp.N, lp.N).sum_to_size(lp.bias_shape)


class _EvoAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, bias, mask, gate, scale):
        lp = _Launch(q, bias, mask, scale)
        shape = q.shape
        flat = (lp.B, lp.R, lp.H, lp.N, lp.D)
        q_, k_, v_ = (t.reshape(flat) for t in (q, k, v))  # views for the usual layouts
        g_ = gate.reshape(flat) if gate is not None else None
        q_, k_, v_, g_ = lp.set_layout(q_, k_, v_, g_)
        o, o_pre, lse = _forward(q_, k_, v_, g_, None, lp)
        ctx.save_for_backward(q_, k_, v_, g_, o_pre, lse)
        ctx.lp = lp
        ctx.shape = shape
        return o.reshape(shape)

    @staticmethod
    def backward(ctx, dy):
        q, k, v, g, o_pre, lse = ctx.saved_tensors
        lp: _Launch = ctx.lp
        need_dbias = ctx.needs_input_grad[3]
        dq, dk, dv, dbias, dgate, _ = _backward(dy.reshape(q.shape), q, k, v, g, None, o_pre,
                                                lse, lp, need_dbias)
        shape = ctx.shape
        return (dq.reshape(shape), dk.reshape(shape), dv.reshape(shape), _dbias_shape(dbias, lp),
                None, None if dgate is None else dgate.reshape(shape), None)


def _unpack(proj: torch.Tensor, parts: int, no_heads: int) -> tuple[torch.Tensor, ...]:
    """``proj [B, R, N, parts*H*D]`` (contiguous) -> ``parts`` views ``[B, R, H, N, D]`` (q, k,
    v[, gate]), all with the same strides (rows ``parts*H*D`` apart). Three view calls for all
    parts: this runs three times per attention call, on the eager path's host time."""
    b, r, n, _ = proj.shape
    # [B, R, N, P*H*D] -> [B, R, N, P, H, D] -> [P, B, R, H, N, D] -> P x [B, R, H, N, D]
    return proj.view(b, r, n, parts, no_heads, -1).permute(3, 0, 1, 4, 2, 5).unbind(0)


class _EvoAttentionPacked(torch.autograd.Function):
    """Self-attention from one packed projection: the kernels read q, k, v and the gate in place
    and write their gradients into one packed gradient, so the model's single GEMM for the four
    projections needs no split in the forward and no concatenation (or gradient sum over four
    GEMMs) in the backward."""

    @staticmethod
    def forward(ctx, proj, bias, mask, gate_bias, scale, no_heads, gated):
        *batch, r, n, width = proj.shape
        parts = 4 if gated else 3
        flat = proj.reshape(math.prod(batch), r, n, width)  # [B, R, N, P*H*D]
        # contiguous (the kernels write the packed gradient through flat's strides, into a
        # dense buffer that the gate bias's column sum views as [B*R*N, P*H*D]), with the key
        # offsets of a tile within int32 (index32); a sliced or permuted projection is copied
        if not flat.is_contiguous() or not span_fits(n, flat.stride(-2), width):
            flat = flat.contiguous()
        views = _unpack(flat, parts, no_heads)  # q, k, v[, gate]: [B, R, H, N, D]
        q, k, v = views[:3]
        g = views[3] if gated else None
        lp = _Launch(q.reshape(*batch, *q.shape[1:]), bias, mask, scale)
        lp.set_packed_layout(q)
        o, o_pre, lse = _forward(q, k, v, g, gate_bias, lp)
        ctx.save_for_backward(flat, gate_bias, o_pre, lse)
        ctx.lp, ctx.parts, ctx.no_heads, ctx.shape = lp, parts, no_heads, proj.shape
        # o is dense [B, R, N, H, D] seen as [B, R, H, N, D]: back to [*, R, N, H*D], a view
        return o.transpose(2, 3).reshape(*batch, r, n, -1)

    @staticmethod
    def backward(ctx, dy):
        flat, gate_bias, o_pre, lse = ctx.saved_tensors
        lp: _Launch = ctx.lp
        views = _unpack(flat, ctx.parts, ctx.no_heads)
        q, k, v = views[:3]
        g = views[3] if ctx.parts == 4 else None
        dflat = torch.empty_like(flat)  # [B, R, N, P*H*D], flat's (contiguous) strides
        grads = _unpack(dflat, ctx.parts, ctx.no_heads)
        dy = dy.reshape(lp.B, lp.R, lp.N, lp.H, lp.D).transpose(2, 3)  # [B, R, H, N, D]
        want_dgb = gate_bias is not None and ctx.needs_input_grad[3]
        _, _, _, dbias, _, dgate_bias = _backward(
            dy, q, k, v, g, gate_bias, o_pre, lse, lp, ctx.needs_input_grad[1],
            grads=(*grads[:3], grads[3] if g is not None else None), need_dgate_bias=want_dgb)
        if want_dgb and dgate_bias is None:  # the preprocess's counters did not fit
            n_hd = lp.H * lp.D
            dg = dflat.view(-1, dflat.shape[-1])[:, 3 * n_hd:]  # [B*R*N, H*D], strided rows
            dgate_bias = column_sum(dg, gate_bias.dtype)
        return (dflat.reshape(ctx.shape), _dbias_shape(dbias, lp), None, dgate_bias, None, None,
                None)


def evo_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  bias: torch.Tensor | None = None, mask: torch.Tensor | None = None,
                  scale: float | None = None, gate: torch.Tensor | None = None) -> torch.Tensor:
    """Attention with a pair bias shared over R rows, optionally gated (AF2 gated attention).

    Args:
        q, k, v: ``[*, R, H, N, D]``, fp16/bf16/fp32, D <= 128 (8, 16, 32, 64 are tuned). For
            inference k and v may have their own key length ``[*, R, H, N_k, D]`` (AF3's atom
            windows; :mod:`fold_kernels.evo_attention_cross`, forward only).
        bias: ``[*, H, N, N]`` (leading dims broadcast to q's), or None (MSA column attention).
        mask: ``[*, R, N]`` bool or float, true/1 = attend; None attends to every key.
        scale: multiplies ``q k^T``; defaults to ``D ** -0.5``.
        gate: ``[*, R, H, N, D]`` or None; the output becomes ``o * sigmoid(gate)``.

    Returns:
        ``[*, R, H, N, D]`` in q's dtype. Differentiable in q, k, v, bias and gate (with
        ``N_k = N``).
    """
    _check(q, k, v, bias, mask, gate)
    if k.shape[-2] != q.shape[-2]:
        from fold_kernels.evo_attention_cross import cross_attention

        return cross_attention(q, k, v, bias, mask, scale, gate)
    if scale is None:
        scale = q.shape[-1] ** -0.5
    return nograd.apply(_EvoAttention, q, k, v, bias, mask, gate, scale)


def evo_attention_packed(proj: torch.Tensor, no_heads: int, bias: torch.Tensor | None = None,
                         mask: torch.Tensor | None = None, scale: float | None = None,
                         gate_bias: torch.Tensor | None = None, gated: bool = True
                         ) -> torch.Tensor:
    """Self-attention whose q, k, v (and gate) come packed in one projection.

    Args:
        proj: ``[*, R, N, P*H*D]`` with P = 4 (``gated``: q | k | v | gate) or 3 (q | k | v),
            each part head-major ``[H, D]``: the output of one linear layer with the four
            weight matrices stacked.
        no_heads: H.
        bias, mask, scale: as :func:`evo_attention` (bias ``[*, H, N, N]``, mask ``[*, R, N]``).
        gate_bias: ``[H*D]`` added to the gate before the sigmoid, or None.

    Returns:
        ``o [*, R, N, H*D]`` (heads merged, ready for the output projection), gated by
        ``sigmoid(gate + gate_bias)`` when ``gated``. Differentiable in proj, bias and gate_bias.
    """
    _check_packed(proj, no_heads, bias, mask, gate_bias, gated)
    d = proj.shape[-1] // ((4 if gated else 3) * no_heads)
    if scale is None:
        scale = d ** -0.5
    return nograd.apply(_EvoAttentionPacked, proj, bias, mask, gate_bias, scale, no_heads, gated)


def _check_packed(proj, no_heads, bias, mask, gate_bias, gated) -> None:
    parts = 4 if gated else 3
    if proj.dim() < 3:
        raise ValueError(f"evo_attention_packed: proj must be [*, R, N, P*H*D], got shape "
                         f"{tuple(proj.shape)}")
    if no_heads < 1 or proj.shape[-1] % (parts * no_heads):
        raise ValueError(f"evo_attention_packed: the last dim {proj.shape[-1]} of proj is not "
                         f"{parts} x H={no_heads} x D")
    d = proj.shape[-1] // (parts * no_heads)
    if gate_bias is not None and (not gated or gate_bias.shape != (no_heads * d,)):
        raise ValueError(f"evo_attention_packed: gate_bias must be [H*D={no_heads * d}] with "
                         f"gated=True, got {tuple(gate_bias.shape)} (gated={gated})")
    if proj.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"evo_attention_packed: proj must be one of {SUPPORTED_DTYPES}, got "
                         f"{proj.dtype}")
    if d > MAX_HEAD_DIM:
        raise ValueError(f"evo_attention_packed: head dim {d} > {MAX_HEAD_DIM}")
    _check_bias_mask("evo_attention_packed", no_heads, proj.shape[-2], bias, mask)
    tuning.require_device("evo_attention_packed", proj,
                          "fold_ops.reference.attention_packed")
