"""The op contract: the one place that states each op's name, signature and reference.

fold-model dispatches every op named here through its registry (``fold_model.ops``), and
fold-kernels implements them (``fold_kernels.registration``); both import this module and
neither states an op again. An op's signature is its reference's signature
(:mod:`fold_ops.reference`); every backend implements exactly it.

``attention(q, k, v, bias=None, mask=None, scale=None, gate=None) -> o``
    ``o = softmax(scale * q @ k^T + bias + mask_bias) @ v`` (then ``o * sigmoid(gate)`` if given).
    q, k, v, gate: ``[*, R, H, N_q|N_k, D]``; bias: ``[*, H, N_q, N_k]`` shared by the R rows (or
    None); mask: ``[*, R, N_k]``, bool or float, true/1 = attend (or None); scale defaults to
    ``D**-0.5``. A query whose keys are all masked gets the mean of v (uniform weights), as a
    masked softmax with a large negative bias gives.
``attention_packed(proj, no_heads, bias=None, mask=None, scale=None, gate_bias=None, gated=True)``
    self-attention whose q, k, v (and gate) are packed in one projection ``proj [*, R, N,
    P*H*D]`` (P = 4: q | k | v | gate, or 3 without ``gated``; each part head-major ``[H, D]``);
    the gate is ``sigmoid(gate + gate_bias)``. Returns ``[*, R, N, H*D]``. One GEMM of the
    stacked weights feeds it: a backend reads the parts in place and writes their gradients
    into one packed gradient (no split, no concatenation, no gradient sum over four GEMMs).
``triangle_attention(...)``
    triangle attention (AF2 Alg. 13-14): ``attention_packed``'s contract, an op of its own so a
    kernel for triangle attention alone is one registration. Until one is registered it
    *falls back* to ``attention_packed``: the registry's default implementation dispatches that
    op, so whichever backend serves attention serves it.
``linear(x, weight, bias=None) -> y``                ``F.linear``; a backend may compute the
    backward differently (fold-kernels: the bias gradient as a fast deterministic column sum).
``layer_norm(x, weight, bias, eps=1e-5) -> y``        over the last dim, like F.layer_norm.
``layer_norm_fork(x, weight, bias, eps=1e-5, branches=1) -> (x, y_1, ..., y_branches)``
    x passed on and ``branches`` handles on ``layer_norm(x)``: a residual stream and the layers
    its LayerNorm feeds. A backend sums the gradients of all of them in LayerNorm's backward.
``layer_norm_pair_bias(x, weight, bias, bias_weight, eps=1e-5, branches=1)``
    ``-> (x, y_1, ..., y_branches, pair_bias)``: ``layer_norm_fork`` and the per-head bias
    ``linear_channel_first(y, bias_weight)`` ``[*, H, I, J]`` of ``x [*, I, J, C]``. A backend
    adds the bias's gradient times ``bias_weight`` to dy in LayerNorm's backward.
``layer_norm_linear(x, ln_weight, ln_bias, weight, bias=None, eps=1e-5) -> y``
    ``F.linear(F.layer_norm(x), weight, bias)``.
``adaptive_layer_norm(a, cond, gate_bias=None, eps=1e-5) -> y``
    AF3's adaptive LayerNorm (Alg. 26) given the conditioning's projection
    ``cond [*, 2C] = gate | shift`` (one GEMM of the stacked weights):
    ``sigmoid(gate + gate_bias) * layer_norm(a) + shift`` over the last dim, no affine
    parameters; ``a [*, C]``, ``gate_bias [C]``. A backend writes the gradients of gate and
    shift into one ``[*, 2C]`` gradient (one GEMM backward, no concatenation).
``softmax_mask_bias(logits, mask=None, bias=None) -> p``
    softmax over the last dim of ``logits + bias + (mask - 1) * inf``; mask/bias broadcast.
``swiglu(x, weight, bias=None) -> y``
    ``a, b = F.linear(x, weight, bias).chunk(2, -1); y = silu(a) * b`` (AF3 transition).
``bias_sigmoid_gate(x, gate, bias=None, x_bias=None) -> y``
    ``(x + x_bias) * sigmoid(gate + bias)``; x_bias ``[C]``. Two linear layers' biases passed
    here (the output's as x_bias, the gate's as bias) let a backend sum their gradients in the
    gate's backward instead of a column sum per layer.
``bias_dropout_residual(x, residual, bias=None, dropout_mask=None, dropout_scale=1.0) -> y``
    ``residual + (x + bias) * dropout_mask * dropout_scale``; the mask broadcasts (AF2's
    shared row/column dropout): bool or 0/1 with ``dropout_scale = 1/(1-p)``, or pre-scaled
    with scale 1; the scale is taken in x's dtype (a 0/1 mask gives a pre-scaled mask's
    numbers).
``triangle_projection_gate(proj, bias, mask) -> (a, b)``
    the gated, masked operands of triangle multiplication from the channel-first projections
    ``proj [*, 4c, I, J]`` (rows ``p_a, g_a, p_b, g_b``), ``bias [4c]``, ``mask [*, I, J]``:
    ``a = (p_a + bias_pa) * sigmoid(g_a + bias_ga) * mask``, likewise b, each ``[*, c, I, J]``.
``triangle_projection(z, weight, bias, mask) -> (a, b)``
    ``triangle_projection_gate(linear_channel_first(z, weight), bias, mask)`` for the normalized
    pair ``z [*, I, J, C]``, ``weight [4c, C]``, ``bias [4c]``, ``mask [*, I, J]``: a backend
    may fuse the projection GEMM and the gate (the ``[*, 4c, I, J]`` projections never written).
``linear_channel_first(x, weight) -> y``
    ``y[..., o, i, j] = sum_c weight[o, c] x[..., i, j, c]``: x ``[*, I, J, C]``, weight
    ``[O, C]``, y ``[*, O, I, J]`` (no bias; triangle multiplication's projections). The torch
    reference is an einsum; fold-kernels returns ``d(x)`` in x's channel-last layout.
``triangle_multiplication(z, mask, ln_in_weight, ln_in_bias, proj_weight, proj_bias,``
``gate_weight, gate_bias, ln_out_weight, ln_out_bias, out_weight, out_bias, outgoing, eps=1e-5)``
    ``-> (update, z)``: the whole triangle multiplicative update of ``z [*, I, J, C]`` (its
    input LayerNorm, ``triangle_projection``, the product over k, the output LayerNorm, the two
    output projections and ``bias_sigmoid_gate``), z passed on for the residual sum. A backend
    runs it as one autograd node: in training, one node's host time instead of a dozen's.
    fold-model calls it only with autograd, unchunked and undistributed, where a backend
    other than the reference serves it; otherwise it composes the ops above itself.

Under autocast (:mod:`fold_ops.autocast`): the ops marked ``lowered`` (``linear``,
``linear_channel_first``, ``swiglu``, ``triangle_projection``) get their floating inputs in the
autocast dtype from the dispatcher, whatever the backend; ``layer_norm_fork``,
``layer_norm_pair_bias`` and ``adaptive_layer_norm`` return their ``y`` in the autocast dtype
(projections read it).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

from fold_ops import reference
from fold_ops.autocast import LOWERED

__all__ = ["Op", "OPS"]


@dataclass(frozen=True)
class Op:
    """One op: its ``name``, its PyTorch ``reference`` (whose signature is the op's) and, for an
    op that has no implementation of its own until a backend registers one, the op it
    ``falls_back_to`` (same signature). ``lowered``: under autocast the dispatcher casts its
    floating inputs to the autocast dtype before any backend runs (:mod:`fold_ops.autocast`)."""

    name: str
    reference: Callable
    falls_back_to: str | None = None
    lowered: bool = False

    @property
    def signature(self) -> inspect.Signature:
        return inspect.signature(self.reference)


def _op(reference_fn: Callable, name: str | None = None, falls_back_to: str | None = None) -> Op:
    name = name or reference_fn.__name__
    return Op(name, reference_fn, falls_back_to, lowered=name in LOWERED)


# A new op is one entry here and its reference in fold_ops.reference.
OPS: dict[str, Op] = {op.name: op for op in (
    _op(reference.linear),
    _op(reference.attention),
    _op(reference.attention_packed),
    _op(reference.attention_packed, "triangle_attention", falls_back_to="attention_packed"),
    _op(reference.layer_norm),
    _op(reference.layer_norm_fork),
    _op(reference.layer_norm_pair_bias),
    _op(reference.layer_norm_linear),
    _op(reference.adaptive_layer_norm),
    _op(reference.softmax_mask_bias),
    _op(reference.swiglu),
    _op(reference.bias_sigmoid_gate),
    _op(reference.bias_dropout_residual),
    _op(reference.triangle_projection_gate),
    _op(reference.triangle_projection),
    _op(reference.linear_channel_first),
    _op(reference.triangle_multiplication),
)}
