"""The PyTorch reference of every op of the contract (:mod:`fold_ops.contract`).

fold-model registers them as its backend ``"torch"``: the path that runs when nothing faster is
installed or when torch.fx traces a block. They are also the ground truth that every optimized
backend (fold-kernels' Triton ops) is tested against, on float64 copies.

Precision and memory: attention and LayerNorm run in the input dtype, as OpenFold's eager path
does. PyTorch's matmul, softmax and layer_norm kernels accumulate half-precision inputs in fp32
internally, so the statistics are fp32; what is rounded to bf16 are the stored logits and
probabilities. Upcasting to fp32 here would save fp32 copies of every ``R x H x N x N`` logit
tensor and every LayerNorm input for the backward pass and double the activation memory
(measured on an H100: 60 GiB vs 30 GiB for one Evoformer block at N_seq 1024, N_res 384). The
Triton kernels of fold-kernels keep logits in fp32 in registers and never store them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fold_ops.autocast import lower, projection_dtype
from fold_ops.rounding import round_to
from fold_ops.weight_casts import cast_weight

__all__ = [
    "linear",
    "attention",
    "attention_packed",
    "layer_norm",
    "layer_norm_fork",
    "layer_norm_pair_bias",
    "layer_norm_linear",
    "adaptive_layer_norm",
    "softmax_mask_bias",
    "swiglu",
    "bias_sigmoid_gate",
    "bias_dropout_residual",
    "triangle_projection_gate",
    "triangle_projection",
    "linear_channel_first",
    "triangle_multiplication",
    "MASKED_LOGIT",
]

# Logit given to masked keys. Every masked key gets exactly this value (not logit + bias), so a
# query with all keys masked sees equal logits and averages v, and unmasked logits keep full
# precision. 1e9 is far below any real fp32 logit and representable in bf16/fp16 after upcast.
MASKED_LOGIT = -1e9


def _param_as(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A weight or bias in its reader's ``dtype`` (a prediction's cast made once where it is
    the autocast dtype: :mod:`fold_ops.weight_casts`)."""
    return cast_weight(t, dtype).to(dtype)


def _upcast(x: torch.Tensor) -> torch.Tensor:
    """Half types to fp32; fp32 and fp64 unchanged (float64 reference tests stay float64)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def _keep(mask: torch.Tensor) -> torch.Tensor:
    """Boolean 'attend' mask from a bool or 0/1 float mask (no dtype branch: fx-traceable)."""
    return mask != 0


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
           ) -> torch.Tensor:
    """``x @ weight^T + bias``."""
    return F.linear(x, weight, bias)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    scale: float | None = None,
    gate: torch.Tensor | None = None,
) -> torch.Tensor:
    """Gated multi-head attention with a bias shared over rows and a key mask.

    q, k, v, gate: ``[*, R, H, N_q|N_k, D]``; bias: ``[*, H, N_q, N_k]`` (broadcast over R);
    mask: ``[*, R, N_k]`` (true/nonzero = attend). Returns ``[*, R, H, N_q, D]`` in v's dtype.
    """
    if scale is None:
        scale = q.shape[-1] ** -0.5
    logits = torch.matmul(q * scale, k.transpose(-1, -2))  # [*, R, H, N_q, N_k]
    if bias is not None:
        logits = logits + bias.unsqueeze(-4).to(logits.dtype)  # bias [*, 1, H, N_q, N_k]
    if mask is not None:
        keep = _keep(mask)[..., None, None, :]  # [*, R, 1, 1, N_k]
        logits = logits.masked_fill(~keep, MASKED_LOGIT)
    weights = torch.softmax(logits, dim=-1).to(v.dtype)
    o = torch.matmul(weights, v)  # [*, R, H, N_q, D]
    if gate is not None:
        o = o * torch.sigmoid(gate)
    return o


def attention_packed(
    proj: torch.Tensor,
    no_heads: int,
    bias: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    scale: float | None = None,
    gate_bias: torch.Tensor | None = None,
    gated: bool = True,
) -> torch.Tensor:
    """:func:`attention` of the q, k, v (and gate) packed in ``proj [*, R, N, P*H*D]`` (P = 4
    with the gate, else 3; each part head-major ``[H, D]``); returns ``[*, R, N, H*D]``."""
    # [*, R, N, P, H, D]; parts picked by index (a fixed count: torch.fx traces it)
    x = proj.unflatten(-1, (4 if gated else 3, no_heads, -1))
    q, k, v = (x[..., i, :, :].transpose(-2, -3) for i in range(3))  # [*, R, H, N, D]
    gate = None
    if gated:
        gate = x[..., 3, :, :]  # [*, R, N, H, D]
        if gate_bias is not None:  # in proj's dtype (bf16 under autocast, as linear_g gave)
            gate = gate + _param_as(gate_bias, proj.dtype).view(no_heads, -1)
        gate = gate.transpose(-2, -3)
    o = attention(q, k, v, bias, mask, scale, gate)  # [*, R, H, N, D]
    return o.transpose(-2, -3).flatten(-2)


def layer_norm(
    x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float = 1e-5
) -> torch.Tensor:
    """LayerNorm over the last dim, in x's dtype (PyTorch accumulates half inputs in fp32)."""
    w = _param_as(weight, x.dtype) if weight is not None else None
    b = _param_as(bias, x.dtype) if bias is not None else None
    return F.layer_norm(x, (x.shape[-1],), w, b, eps)


def layer_norm_fork(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float = 1e-5,
    branches: int = 1,
) -> tuple[torch.Tensor, ...]:
    """``(x, y, ..., y)``: x passed on and ``branches`` handles on ``y = layer_norm(x)``.

    For a residual stream whose LayerNorm feeds ``branches`` layers (the residual's sum reads the
    passed-on x): the gradients of x and of every y meet in this op, so a backend's backward can
    sum them while it computes LayerNorm's ``dx`` instead of autograd adding them pairwise (one
    pass over ``[*, C]`` less per extra reader). Here autograd adds them.

    Under autocast y is in the autocast dtype: its readers are projections, which autocast
    would cast it for (:func:`fold_ops.autocast.projection_dtype`).
    """
    if branches < 1:
        raise ValueError(f"layer_norm_fork: branches must be >= 1, got {branches}")
    y = layer_norm(x, weight, bias, eps).to(projection_dtype(x))
    return (x,) + (y,) * branches


def layer_norm_pair_bias(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    bias_weight: torch.Tensor,
    eps: float = 1e-5,
    branches: int = 1,
) -> tuple[torch.Tensor, ...]:
    """``(x, y_1, ..., y_branches, pair_bias)``: :func:`layer_norm_fork` with one more reader
    of ``y = layer_norm(x)``, the per-head pair bias ``pair_bias [*, H, I, J] =
    linear_channel_first(y, bias_weight)`` (``x [*, I, J, C]``, ``bias_weight [H, C]``): the
    LayerNorm of triangle attention and of AF3's attention with pair bias. A backend adds the
    bias's gradient times ``bias_weight`` to dy in LayerNorm's backward (no ``[*, C]``
    gradient of the projection's input is written). ``branches`` may be 0. Under autocast y
    (and so the bias) is in the autocast dtype, as in :func:`layer_norm_fork`."""
    if branches < 0:
        raise ValueError(f"layer_norm_pair_bias: branches must be >= 0, got {branches}")
    y = layer_norm(x, weight, bias, eps).to(projection_dtype(x))
    return (x,) + (y,) * branches + (linear_channel_first(y, bias_weight),)


def layer_norm_linear(
    x: torch.Tensor,
    ln_weight: torch.Tensor | None,
    ln_bias: torch.Tensor | None,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
) -> torch.Tensor:
    """``F.linear(layer_norm(x), weight, bias)`` (the linear follows autocast if active)."""
    return F.linear(layer_norm(x, ln_weight, ln_bias, eps), weight, bias)


def adaptive_layer_norm(
    a: torch.Tensor, cond: torch.Tensor, gate_bias: torch.Tensor | None = None,
    eps: float = 1e-5,
) -> torch.Tensor:
    """AF3's adaptive LayerNorm (Alg. 26) given its projection of the conditioning
    ``cond [*, 2C] = gate | shift`` (one GEMM of the stacked ``Linear`` and ``LinearNoBias``
    weights): ``sigmoid(gate + gate_bias) * layer_norm(a) + shift``, the LayerNorm of
    ``a [*, C]`` without affine parameters. ``cond`` broadcasts against a's batch dims. Under
    autocast y is in the autocast dtype, as a LayerNorm fork's (its readers are projections)."""
    gate, shift = cond.chunk(2, -1)  # [*, C] each
    if gate_bias is not None:  # in cond's dtype (bf16 under autocast, as the Linear gave)
        gate = gate + _param_as(gate_bias, cond.dtype)
    y = torch.sigmoid(gate) * layer_norm(a, None, None, eps) + shift
    return y.to(projection_dtype(a))


def softmax_mask_bias(
    logits: torch.Tensor, mask: torch.Tensor | None = None, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """Softmax over the last dim of ``logits + bias`` with masked entries excluded.

    Computed in fp32, returned in the logits' dtype. A fully masked row is uniform.
    """
    x = _upcast(logits)
    if bias is not None:
        x = x + _upcast(bias)
    if mask is not None:
        keep = _keep(mask)
        x = torch.where(keep, x, torch.full_like(x, MASKED_LOGIT))
    return torch.softmax(x, dim=-1).to(logits.dtype)


def swiglu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``silu(a) * b`` with ``a, b = F.linear(x, weight, bias).chunk(2, -1)``."""
    a, b = F.linear(x, weight, bias).chunk(2, dim=-1)
    return F.silu(a) * b


def bias_sigmoid_gate(
    x: torch.Tensor,
    gate: torch.Tensor,
    bias: torch.Tensor | None = None,
    x_bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """``(x + x_bias) * sigmoid(gate + bias)``. Each bias is added in its operand's dtype (under
    autocast, as a linear layer adds its bias), so y stays in x's dtype."""
    if bias is not None:
        gate = gate + _param_as(bias, gate.dtype)
    if x_bias is not None:
        x = x + _param_as(x_bias, x.dtype)
    return x * torch.sigmoid(gate)


def bias_dropout_residual(
    x: torch.Tensor,
    residual: torch.Tensor,
    bias: torch.Tensor | None = None,
    dropout_mask: torch.Tensor | None = None,
    dropout_scale: float = 1.0,
) -> torch.Tensor:
    """``residual + (x + bias) * dropout_mask * dropout_scale``; the mask broadcasts (bool or
    integer 0/1, or floats, e.g. pre-scaled with scale 1). The scale is taken in x's dtype, so
    that a 0/1 mask gives the numbers of the mask pre-scaled in x's dtype."""
    if bias is not None:
        x = x + bias
    if dropout_mask is not None:
        keep = dropout_mask
        if not keep.is_floating_point():
            keep = keep.to(x.dtype)
        if dropout_scale != 1.0:  # in the mask's own (small) shape
            keep = keep * round_to(dropout_scale, x.dtype)
        x = x * keep
    return residual + x


def triangle_projection_gate(
    proj: torch.Tensor, bias: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated, masked operands of triangle multiplication (Alg. 11/12 lines 2-3) from the
    channel-first projections ``proj [*, 4c, I, J]`` (rows ``p_a, g_a, p_b, g_b``), their
    biases ``[4c]`` and ``mask [*, I, J]``: ``a = (p_a + bias_pa) * sigmoid(g_a + bias_ga) *
    mask``, likewise b, each ``[*, c, I, J]``. The biases and the 0/1 mask are cast to proj's
    dtype (bf16 under autocast: no promotion of the products to fp32)."""
    p_a, g_a, p_b, g_b = (proj + _param_as(bias, proj.dtype)[:, None, None]).chunk(4, dim=-3)
    keep = mask.unsqueeze(-3).to(proj.dtype)  # [*, 1, I, J]
    return p_a * torch.sigmoid(g_a) * keep, p_b * torch.sigmoid(g_b) * keep


def triangle_projection(
    z: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated, masked operands of triangle multiplication (Alg. 11/12 lines 2-3) from the
    normalized pair ``z [*, I, J, C]``: ``triangle_projection_gate(linear_channel_first(z,
    weight), bias, mask)``, ``weight [4c, C]`` the rows of ``W_pa, W_ga, W_pb, W_gb``, ``bias
    [4c]``; a and b each ``[*, c, I, J]``. A backend may compute it as one GEMM with the gate in
    its epilogue, never writing the ``[*, 4c, I, J]`` projections."""
    return triangle_projection_gate(linear_channel_first(z, weight), bias, mask)


def linear_channel_first(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x [*, I, J, C]``, ``weight [O, C]`` -> ``[*, O, I, J]``: one GEMM over the merged
    (I, J) dims writing the transposed layout. An einsum, not a reshape to ``[M, C]``: torch.fx
    traces this path and AutoChunk follows the row dim I through it as a dim of its own. Under
    autocast it runs in the autocast dtype."""
    return torch.einsum("oc,...ijc->...oij", weight, x)



def triangle_multiplication(
    z: torch.Tensor,
    mask: torch.Tensor,
    ln_in_weight: torch.Tensor,
    ln_in_bias: torch.Tensor,
    proj_weight: torch.Tensor,
    proj_bias: torch.Tensor,
    gate_weight: torch.Tensor,
    gate_bias: torch.Tensor,
    ln_out_weight: torch.Tensor,
    ln_out_bias: torch.Tensor,
    out_weight: torch.Tensor,
    out_bias: torch.Tensor,
    outgoing: bool,
    eps: float = 1e-5,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The triangle multiplicative update (AF2 Alg. 11/12, AF3 Alg. 12/13) of ``z [*, I, J,
    C]`` as one op: ``(update, z)``, z passed on for the residual sum (as
    :func:`layer_norm_fork` passes it: a backend adds its gradient in LayerNorm's pass).

    ``z_ln = LN(z)``; ``a, b = triangle_projection(z_ln, proj_weight [4c, C], proj_bias [4c],
    mask [*, I, J])`` channel-first ``[*, c, I, J]``; ``x = a b^T`` (outgoing, ``sum_k a_ik
    b_jk``) or ``a^T b`` (incoming, ``sum_k a_ki b_kj``); ``update = (LN_out(x) W_out^T +
    out_bias) * sigmoid(z_ln W_gate^T + gate_bias)`` with ``out_weight [C, c]``, ``gate_weight
    [C, C]``. Each step is the op of this contract that fold-model's layer composes, in the
    same dtypes: under autocast z_ln is in the autocast dtype and the projection's inputs are
    lowered as the dispatcher lowers ``triangle_projection``'s."""
    z, z_ln = layer_norm_fork(z, ln_in_weight, ln_in_bias, eps)
    (z_ln, proj_weight, proj_bias, mask), _ = lower((z_ln, proj_weight, proj_bias, mask), {})
    a, b = triangle_projection(z_ln, proj_weight, proj_bias, mask)  # [*, c, I, J] each
    x = a @ b.mT if outgoing else a.mT @ b  # [*, c, I, J]
    x = F.linear(layer_norm(x.movedim(-3, -1), ln_out_weight, ln_out_bias, eps), out_weight)
    g = F.linear(z_ln, gate_weight)  # [*, I, J, C] each
    return bias_sigmoid_gate(x, g, gate_bias, out_bias), z
