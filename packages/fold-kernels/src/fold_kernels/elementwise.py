"""AF2's elementwise fusions (FastFold 5.2): bias + sigmoid + gate, bias + dropout + residual.

Eager PyTorch runs ``gate + bias``, ``sigmoid``, ``x * .`` as three kernels with two
intermediates in memory; here each op is one pass reading its inputs once and writing ``y``
once (backward: one pass for all input gradients). Broadcast operands (a ``[C]`` bias, a dropout
mask shared along the rows of one dimension) are read through strides, never expanded in memory.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from fold_ops.env import EnvVar
from fold_ops.rounding import round_to

from fold_kernels import nograd, one_pass, pdl, tuning
from fold_kernels.broadcast import broadcast_shape, is_dense, reduce_to, row_layout, row_offsets
from fold_kernels.index32 import check_rows
from fold_kernels.ints import cdiv, next_power_of_2
from fold_kernels.launch import fast
from fold_kernels.one_pass import finish_sum

__all__ = ["bias_sigmoid_gate", "bias_dropout_residual"]

# ``FOLD_KERNELS_GATE_SUMS=0``: the gate backwards (here and EvoAttention's preprocess) leave
# their biases' gradients to column sums after them (for comparisons)
GATE_SUMS = EnvVar("FOLD_KERNELS_GATE_SUMS", lambda v: (v if v is not None else "1") != "0")


@triton.jit
def _tile(d0, d1, d2, C, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    valid = (rows < d0 * d1 * d2)[:, None] & (cols < C)[None, :]
    return rows, cols, valid


@triton.jit
def _ptrs(P, rows, cols, d1, d2, s0, s1, s2, sc):
    return P + row_offsets(rows, d1, d2, s0, s1, s2)[:, None] + cols.to(tl.int64)[None, :] * sc


@fast
@triton.jit
def _gate_fwd(X, G, Bias, XBias, Y, d0, d1, d2, C,
              xs0, xs1, xs2, xsc, gs0, gs1, gs2, gsc, bs0, bs1, bs2, bsc,
              HAS_BIAS: tl.constexpr, HAS_XBIAS: tl.constexpr, BLOCK_R: tl.constexpr,
              BLOCK_C: tl.constexpr, PDL: tl.constexpr = False):
    pdl.enter(PDL)
    rows, cols, valid = _tile(d0, d1, d2, C, BLOCK_R, BLOCK_C)
    x = tl.load(_ptrs(X, rows, cols, d1, d2, xs0, xs1, xs2, xsc), mask=valid, other=0.0)
    x = x.to(tl.float32)
    if HAS_XBIAS:  # x_bias [C]
        x += tl.load(XBias + cols, mask=cols < C, other=0.0).to(tl.float32)[None, :]
    z = tl.load(_ptrs(G, rows, cols, d1, d2, gs0, gs1, gs2, gsc), mask=valid, other=0.0)
    z = z.to(tl.float32)
    if HAS_BIAS:
        bias = tl.load(_ptrs(Bias, rows, cols, d1, d2, bs0, bs1, bs2, bsc), mask=valid, other=0.0)
        z += bias.to(tl.float32)
    y = x * tl.sigmoid(z)
    out = rows.to(tl.int64)[:, None] * C + cols[None, :]
    tl.store(Y + out, y.to(Y.dtype.element_ty), mask=valid)


@triton.jit
def _gate_bias_sums(Partials, Sums, Cnt, sum_x, sum_b, cols, c_valid, pid, n_prog, C,
                    SUM_X: tl.constexpr, SUM_B: tl.constexpr, GROUP: tl.constexpr,
                    BLOCK_C: tl.constexpr):
    """Stores this program's column sums of dx / dz as its row of ``Partials`` (dx's in the
    first C columns, then dz's) and arrives at column block j's counters; the last programs
    add the rows into ``Sums`` (:func:`one_pass.finish_sum`, both sets under one set of
    counters)."""
    N_SETS: tl.constexpr = SUM_X + SUM_B
    row = Partials + pid.to(tl.int64) * (N_SETS * C)
    if SUM_X:
        tl.store(row + cols, sum_x, mask=c_valid)
    if SUM_B:
        tl.store(row + SUM_X * C + cols, sum_b, mask=c_valid)
    col0 = tl.program_id(1) * BLOCK_C
    slots = 1 + tl.cdiv(n_prog, GROUP)
    finish_sum(Partials, Sums, Cnt + tl.program_id(1) * slots, pid, n_prog, N_SETS * C, col0,
               tl.minimum(BLOCK_C, C - col0), GROUP, GROUP, BLOCK_C, N_SETS, C)


@fast
@triton.jit
def _gate_bwd(X, G, Bias, XBias, DY, DX, DZ, Partials, Sums, Cnt, d0, d1, d2, C,
              xs0, xs1, xs2, xsc, gs0, gs1, gs2, gsc, bs0, bs1, bs2, bsc, ys0, ys1, ys2, ysc,
              HAS_BIAS: tl.constexpr, HAS_XBIAS: tl.constexpr, SUM_X: tl.constexpr,
              SUM_B: tl.constexpr, GROUP: tl.constexpr, BLOCK_R: tl.constexpr,
              BLOCK_C: tl.constexpr, PDL: tl.constexpr = False):
    """dx = dy * sig, dz = dy * x * sig * (1 - sig) for row tiles pid, pid + P, pid + 2P, ...
    of column block j (one tile a program unless the sums are on).

    ``SUM_X`` / ``SUM_B``: also the column sums of dx and dz (the gradients of a ``[C]`` x_bias
    and bias), added up in this launch (:func:`_gate_bias_sums`), so no column sum re-reads
    dx or dz. The sums take a small grid that walks the row tiles: each program's arrival at
    the counters costs (a release fence and an atomic), and with one tile a program the
    backward took 71 us at 256^2 x 128 on the H200 against 37 us with 2 programs per SM."""
    pdl.enter(PDL)
    pid = tl.program_id(0)
    n_prog = tl.num_programs(0)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    c_valid = cols < C
    if HAS_XBIAS:
        xb = tl.load(XBias + cols, mask=c_valid, other=0.0).to(tl.float32)[None, :]
    acc_x = tl.zeros([BLOCK_R, BLOCK_C], tl.float32)
    acc_b = tl.zeros([BLOCK_R, BLOCK_C], tl.float32)
    for t in range(pid, tl.cdiv(d0 * d1 * d2, BLOCK_R), n_prog):  # fixed order per program
        rows = t * BLOCK_R + tl.arange(0, BLOCK_R)
        valid = (rows < d0 * d1 * d2)[:, None] & c_valid[None, :]
        x = tl.load(_ptrs(X, rows, cols, d1, d2, xs0, xs1, xs2, xsc), mask=valid, other=0.0)
        x = x.to(tl.float32)
        if HAS_XBIAS:
            x += xb
        z = tl.load(_ptrs(G, rows, cols, d1, d2, gs0, gs1, gs2, gsc), mask=valid, other=0.0)
        z = z.to(tl.float32)
        if HAS_BIAS:
            bias = tl.load(_ptrs(Bias, rows, cols, d1, d2, bs0, bs1, bs2, bsc), mask=valid,
                           other=0.0)
            z += bias.to(tl.float32)
        out = rows.to(tl.int64)[:, None] * C + cols[None, :]
        dy = tl.load(_ptrs(DY, rows, cols, d1, d2, ys0, ys1, ys2, ysc), mask=valid, other=0.0)
        dy = dy.to(tl.float32)  # 0 outside the tile: so are dx and dz
        sig = tl.sigmoid(z)
        dx = dy * sig
        tl.store(DX + out, dx.to(DX.dtype.element_ty), mask=valid)
        dz = dx * x * (1.0 - sig)
        tl.store(DZ + out, dz.to(DZ.dtype.element_ty), mask=valid)
        if SUM_X:
            acc_x += dx
        if SUM_B:
            acc_b += dz
    if SUM_X or SUM_B:
        _gate_bias_sums(Partials, Sums, Cnt, tl.sum(acc_x, 0), tl.sum(acc_b, 0), cols, c_valid,
                        pid, n_prog, C, SUM_X, SUM_B, GROUP, BLOCK_C)


@triton.jit
def _keep(Mask, rows, cols, d1, d2, ms0, ms1, ms2, msc, valid, scale, SCALED: tl.constexpr):
    """The dropout mask's tile in fp32, times ``scale`` with ``SCALED`` (the scale already
    rounded to x's dtype by the host: a 0/1 mask gives the values of a mask pre-scaled in
    x's dtype)."""
    keep = tl.load(_ptrs(Mask, rows, cols, d1, d2, ms0, ms1, ms2, msc), mask=valid, other=0)
    keep = keep.to(tl.float32)
    if SCALED:
        keep *= scale
    return keep


@fast
@triton.jit
def _bdr_fwd(X, Res, Bias, Mask, Y, d0, d1, d2, C,
             xs0, xs1, xs2, xsc, rs0, rs1, rs2, rsc, bs0, bs1, bs2, bsc,
             ms0, ms1, ms2, msc, scale,
             HAS_BIAS: tl.constexpr, HAS_MASK: tl.constexpr, SCALED: tl.constexpr,
             BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, PDL: tl.constexpr = False):
    pdl.enter(PDL)
    rows, cols, valid = _tile(d0, d1, d2, C, BLOCK_R, BLOCK_C)
    y = tl.load(_ptrs(X, rows, cols, d1, d2, xs0, xs1, xs2, xsc), mask=valid, other=0.0)
    y = y.to(tl.float32)
    if HAS_BIAS:
        bias = tl.load(_ptrs(Bias, rows, cols, d1, d2, bs0, bs1, bs2, bsc), mask=valid, other=0.0)
        y += bias.to(tl.float32)
    if HAS_MASK:
        y *= _keep(Mask, rows, cols, d1, d2, ms0, ms1, ms2, msc, valid, scale, SCALED)
    res = tl.load(_ptrs(Res, rows, cols, d1, d2, rs0, rs1, rs2, rsc), mask=valid, other=0.0)
    y += res.to(tl.float32)
    out = rows.to(tl.int64)[:, None] * C + cols[None, :]
    tl.store(Y + out, y.to(Y.dtype.element_ty), mask=valid)


@fast
@triton.jit
def _bdr_bwd(DY, Mask, DX, d0, d1, d2, C, ms0, ms1, ms2, msc, ys0, ys1, ys2, ysc,
             xs0, xs1, xs2, xsc, scale, SCALED: tl.constexpr, BLOCK_R: tl.constexpr,
             BLOCK_C: tl.constexpr, PDL: tl.constexpr = False):
    """dx = dy * keep, dx written through its own strides (x's layout: see the caller)."""
    pdl.enter(PDL)
    rows, cols, valid = _tile(d0, d1, d2, C, BLOCK_R, BLOCK_C)
    dy = tl.load(_ptrs(DY, rows, cols, d1, d2, ys0, ys1, ys2, ysc), mask=valid, other=0.0)
    dy = dy.to(tl.float32)
    keep = _keep(Mask, rows, cols, d1, d2, ms0, ms1, ms2, msc, valid, scale, SCALED)
    tl.store(_ptrs(DX, rows, cols, d1, d2, xs0, xs1, xs2, xsc),
             (dy * keep).to(DX.dtype.element_ty), mask=valid)


def _blocks(c: int) -> tuple[int, int, int]:
    if tuning.interpreting():
        return 4, 32, 1
    block_c = min(next_power_of_2(c), 256)
    return max(1, 4096 // block_c), block_c, 8


def _grid(dims, c, block_r, block_c):
    return (cdiv(dims[0] * dims[1] * dims[2], block_r), cdiv(c, block_c))


def _broadcast(name: str, *tensors: torch.Tensor | None) -> tuple[int, ...]:
    shapes = [tuple(t.shape) for t in tensors if t is not None]
    shape = broadcast_shape(*shapes)
    if shape is None:
        raise ValueError(f"{name}: operand shapes {shapes} do not broadcast")
    check_rows(name, shape)  # the kernels' row index is int32
    return shape


def _reduce(grad: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Sum a full-shape gradient down to a broadcast operand's shape and dtype."""
    return reduce_to(grad, like.shape, like.dtype)


def _sum_programs(n_tiles: int, n_cblk: int, device: torch.device) -> int:
    """Programs per column block of a backward that also sums columns: about 2 (of 8 warps)
    per SM in all, each walking several row tiles (H200, gate backward at 256^2 x 128, us:
    1 per SM 41.2, 2 37.5, 4 43.2, 8 52.2, one tile each 71-73; at 512^2: 123.8, 99.8, 107.5,
    116.7, 123.7-251). 3 under the interpreter (its loop and two levels of groups are
    exercised)."""
    if tuning.interpreting():
        return min(n_tiles, 3)
    return max(1, min(n_tiles, 2 * tuning.multiprocessors(device) // n_cblk))


def _column_vector(t: torch.Tensor | None, c: int) -> bool:
    return t is not None and t.shape == (c,)


class _BiasSigmoidGate(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, gate, bias, x_bias):
        shape = _broadcast("bias_sigmoid_gate", x, gate, bias)
        c = shape[-1]
        if x_bias is not None and x_bias.shape != (c,):
            raise ValueError(f"bias_sigmoid_gate: x_bias must be [C={c}], got "
                             f"{tuple(x_bias.shape)}")
        lay = row_layout(shape, x, gate, bias)
        y = torch.empty(shape, device=x.device, dtype=x.dtype)
        block_r, block_c, warps = _blocks(c)
        xv, gv, bv = lay.operands
        _gate_fwd[_grid(lay.dims, c, block_r, block_c)](
            xv, gv, bv if bv is not None else xv, x_bias if x_bias is not None else xv, y,
            *lay.dims, c, *lay.strides[0], *lay.strides[1], *lay.strides[2],
            HAS_BIAS=bias is not None, HAS_XBIAS=x_bias is not None,
            BLOCK_R=block_r, BLOCK_C=block_c, num_warps=warps)
        ctx.save_for_backward(x, gate, bias, x_bias)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, gate, bias, x_bias = ctx.saved_tensors
        shape = dy.shape
        lay = row_layout(shape, x, gate, bias, dy)  # dy read through its strides: no copy
        dx = torch.empty(shape, device=dy.device, dtype=x.dtype)
        # d(gate) in gate's dtype when it is full-size (no extra cast pass), else fp32 to reduce
        dz_dtype = gate.dtype if gate.shape == shape else torch.float32
        dz = torch.empty(shape, device=dy.device, dtype=dz_dtype)
        c = shape[-1]
        block_r, block_c, warps = _blocks(c)
        n_tiles, n_cblk = _grid(lay.dims, c, block_r, block_c)
        # [C] biases: their gradients (column sums of dx and dz) in this launch
        want_x = x_bias is not None and ctx.needs_input_grad[3]
        want_b = _column_vector(bias, c) and ctx.needs_input_grad[2]
        n_prog, fused = n_tiles, False
        if (want_x or want_b) and GATE_SUMS.get():
            n_sum = _sum_programs(n_tiles, n_cblk, dy.device)
            fused = one_pass.fits(n_cblk, n_sum)  # one reduction (both sums) per block
            n_prog = n_sum if fused else n_tiles
        sum_x, sum_b = fused and want_x, fused and want_b
        partials = sums = cnt = dx  # stand-ins, never touched without the sums
        if fused:
            n_sets = sum_x + sum_b
            cnt = one_pass.counters(dy.device)
            partials = one_pass.partials(n_prog, n_sets * c, dy.device)
            dtypes = {t.dtype for t, on in ((x_bias, sum_x), (bias, sum_b)) if on}
            sums = torch.empty(n_sets * c, device=dy.device,
                               dtype=dtypes.pop() if len(dtypes) == 1 else torch.float32)
        xv, gv, bv, yv = lay.operands
        _gate_bwd[(n_prog, n_cblk)](
            xv, gv, bv if bv is not None else xv, x_bias if x_bias is not None else xv, yv,
            dx, dz, partials, sums, cnt, *lay.dims, c,
            *lay.strides[0], *lay.strides[1], *lay.strides[2], *lay.strides[3],
            HAS_BIAS=bias is not None, HAS_XBIAS=x_bias is not None, SUM_X=sum_x,
            SUM_B=sum_b, GROUP=one_pass.group_size() if fused else 1, BLOCK_R=block_r,
            BLOCK_C=block_c, num_warps=warps)
        dbias = None
        if bias is not None and ctx.needs_input_grad[2]:
            # the sums' dtype is the biases' own unless x_bias and bias differ (then a cast)
            dbias = sums[c * sum_x:].to(bias.dtype) if sum_b else _reduce(dz, bias)
        dx_bias = None
        if x_bias is not None and ctx.needs_input_grad[3]:
            dx_bias = sums[:c].to(x_bias.dtype) if sum_x else _reduce(dx, x_bias)
        return _reduce(dx, x), _reduce(dz, gate), dbias, dx_bias


def bias_sigmoid_gate(x: torch.Tensor, gate: torch.Tensor,
                      bias: torch.Tensor | None = None,
                      x_bias: torch.Tensor | None = None) -> torch.Tensor:
    """``(x + x_bias) * sigmoid(gate + bias)``; operands broadcast (e.g. bias ``[C]``), x_bias
    ``[C]``, y in x's dtype. The gradients of ``[C]`` biases are summed in the backward's own
    launch (a linear layer's bias passed here instead of to the layer saves its column sum)."""
    tuning.require_device("bias_sigmoid_gate", x, "fold_ops.reference.bias_sigmoid_gate")
    return nograd.apply(_BiasSigmoidGate, x, gate, bias, x_bias)


def _dropout_args(dropout_mask, dropout_scale, x_dtype) -> tuple:
    """(mask as the kernels read it, scale in x's dtype, SCALED): a bool mask read as bytes."""
    if dropout_mask is not None and dropout_mask.dtype == torch.bool:
        dropout_mask = dropout_mask.view(torch.uint8)
    scaled = dropout_scale != 1.0
    return dropout_mask, round_to(float(dropout_scale), x_dtype) if scaled else 1.0, scaled


class _BiasDropoutResidual(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, residual, bias, dropout_mask, dropout_scale):
        dropout_mask, scale, scaled = _dropout_args(dropout_mask, dropout_scale, x.dtype)
        shape = _broadcast("bias_dropout_residual", x, residual, bias, dropout_mask)
        lay = row_layout(shape, x, residual, bias, dropout_mask)
        y = torch.empty(shape, device=x.device, dtype=residual.dtype)
        c = shape[-1]
        block_r, block_c, warps = _blocks(c)
        xv, rv, bv, mv = lay.operands
        _bdr_fwd[_grid(lay.dims, c, block_r, block_c)](
            xv, rv, bv if bv is not None else xv, mv if mv is not None else xv, y, *lay.dims, c,
            *lay.strides[0], *lay.strides[1], *lay.strides[2], *lay.strides[3], scale,
            HAS_BIAS=bias is not None, HAS_MASK=dropout_mask is not None, SCALED=scaled,
            BLOCK_R=block_r, BLOCK_C=block_c, num_warps=warps)
        # Only the mask is saved: x and residual are needed for their shape and dtype alone,
        # and keeping x (a sub-layer's output) alive would pin one pair-sized tensor per
        # sub-layer that activation checkpointing otherwise frees (9 GiB in an AF3 step at
        # 384 tokens).
        ctx.save_for_backward(dropout_mask)
        ctx.scale = (scale, scaled)
        ctx.metas = [(t.shape, t.dtype) if t is not None else None for t in (x, residual, bias)]
        # x's layout when it is a permutation of a dense tensor (a transposed sub-layer output:
        # the ending-node triangle attention's): its gradient is written in it, so that the
        # transposes back leave the layer that made x a contiguous gradient, not one that its
        # backward copies (a strided pair-sized copy per step)
        ctx.x_stride = x.stride() if tuple(x.shape) == tuple(shape) and is_dense(x) else None
        return y

    @staticmethod
    def backward(ctx, dy):
        (dropout_mask,) = ctx.saved_tensors
        x, residual, bias = ctx.metas
        shape = dy.shape  # dy is passed on (or read through its strides): never copied
        if dropout_mask is None:
            dx = dy
        else:
            # in x's layout (a bias's column sum reads a permuted dense dx as its storage's
            # rows: broadcast.reduce_to)
            x_stride = ctx.x_stride
            dx = (torch.empty_strided(shape, x_stride, device=dy.device, dtype=dy.dtype)
                  if x_stride is not None else
                  torch.empty(shape, device=dy.device, dtype=dy.dtype))
            lay = row_layout(shape, dropout_mask, dy, dx)
            if lay.operands[2] is not dx:  # a layout the row dims cannot express: dense dx
                dx = torch.empty(shape, device=dy.device, dtype=dy.dtype)
                lay = row_layout(shape, dropout_mask, dy, dx)
            c = shape[-1]
            block_r, block_c, warps = _blocks(c)
            scale, scaled = ctx.scale
            _bdr_bwd[_grid(lay.dims, c, block_r, block_c)](
                lay.operands[1], lay.operands[0], dx, *lay.dims, c, *lay.strides[0],
                *lay.strides[1], *lay.strides[2], scale, SCALED=scaled, BLOCK_R=block_r,
                BLOCK_C=block_c, num_warps=warps)
        dbias = None if bias is None else reduce_to(dx, *bias)
        return reduce_to(dx, *x), reduce_to(dy, *residual), dbias, None, None


def bias_dropout_residual(x: torch.Tensor, residual: torch.Tensor,
                          bias: torch.Tensor | None = None,
                          dropout_mask: torch.Tensor | None = None,
                          dropout_scale: float = 1.0) -> torch.Tensor:
    """``residual + (x + bias) * dropout_mask * dropout_scale`` (mask broadcast: bool, 0/1
    bytes or floats, or pre-scaled with scale 1; mask * scale is taken in x's dtype).

    The mask gets no gradient; y is in residual's dtype. A 0/1 mask with its scale here needs
    no launch to scale it.
    """
    tuning.require_device("bias_dropout_residual", x,
                          "fold_ops.reference.bias_dropout_residual")
    return nograd.apply(_BiasDropoutResidual, x, residual, bias, dropout_mask, dropout_scale)
