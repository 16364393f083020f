"""fold-model's op registry and typed wrappers around :func:`dispatch`.

Model code calls these wrappers (``ops.attention(...)``, ``ops.layer_norm(...)``); each one
dispatches to the selected backend (the torch reference in :mod:`fold_model.ops.reference` is
always registered). See :mod:`fold_model.ops.registry` for selection rules and op signatures.
"""

from __future__ import annotations

import torch

from fold_model.ops.registry import (
    OPS,
    BackendUnavailable,
    backends,
    dispatch,
    register,
    resolve,
    use_backend,
)

__all__ = [
    "OPS",
    "BackendUnavailable",
    "backends",
    "dispatch",
    "register",
    "resolve",
    "use_backend",
    "linear",
    "attention",
    "attention_packed",
    "triangle_attention",
    "layer_norm",
    "layer_norm_linear",
    "softmax_mask_bias",
    "swiglu",
    "bias_sigmoid_gate",
    "bias_dropout_residual",
    "triangle_projection_gate",
    "linear_channel_first",
]


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    backend: str | None = None,
) -> torch.Tensor:
    """``F.linear(x, weight, bias)``; x ``[*, K]``, weight ``[N_out, K]``."""
    return dispatch("linear", x, weight, bias, backend=backend)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    scale: float | None = None,
    gate: torch.Tensor | None = None,
    *,
    backend: str | None = None,
) -> torch.Tensor:
    """``softmax(scale q k^T + bias + mask) v [* sigmoid(gate)]``; q/k/v/gate ``[*, R, H, N, D]``,
    bias ``[*, H, N_q, N_k]``, mask ``[*, R, N_k]``."""
    return dispatch("attention", q, k, v, bias, mask, scale, gate, backend=backend)


def attention_packed(
    proj: torch.Tensor,
    no_heads: int,
    bias: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    scale: float | None = None,
    gate_bias: torch.Tensor | None = None,
    gated: bool = True,
    *,
    backend: str | None = None,
) -> torch.Tensor:
    """Gated self-attention from packed projections ``proj [*, R, N, P*H*D]`` (q | k | v | gate)
    -> ``[*, R, N, H*D]``; bias ``[*, H, N, N]``, mask ``[*, R, N]``, gate_bias ``[H*D]``."""
    return dispatch("attention_packed", proj, no_heads, bias, mask, scale, gate_bias, gated,
                    backend=backend)


def triangle_attention(
    proj: torch.Tensor,
    no_heads: int,
    bias: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    scale: float | None = None,
    gate_bias: torch.Tensor | None = None,
    gated: bool = True,
    *,
    backend: str | None = None,
) -> torch.Tensor:
    """Triangle attention (AF2 Alg. 13-14) from packed projections: :func:`attention_packed`'s
    shapes; its reference dispatches to ``attention_packed``."""
    return dispatch("triangle_attention", proj, no_heads, bias, mask, scale, gate_bias, gated,
                    backend=backend)


def layer_norm(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float = 1e-5,
    *,
    backend: str | None = None,
) -> torch.Tensor:
    """LayerNorm over the last dim."""
    return dispatch("layer_norm", x, weight, bias, eps, backend=backend)


def layer_norm_linear(
    x: torch.Tensor,
    ln_weight: torch.Tensor | None,
    ln_bias: torch.Tensor | None,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
    *,
    backend: str | None = None,
) -> torch.Tensor:
    """``linear(layer_norm(x))``."""
    return dispatch("layer_norm_linear", x, ln_weight, ln_bias, weight, bias, eps, backend=backend)


def softmax_mask_bias(
    logits: torch.Tensor,
    mask: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    *,
    backend: str | None = None,
) -> torch.Tensor:
    """Softmax over the last dim of ``logits + bias`` excluding masked entries."""
    return dispatch("softmax_mask_bias", logits, mask, bias, backend=backend)


def swiglu(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    backend: str | None = None,
) -> torch.Tensor:
    """``silu(a) * b`` with ``a, b = linear(x).chunk(2, -1)``."""
    return dispatch("swiglu", x, weight, bias, backend=backend)


def bias_sigmoid_gate(
    x: torch.Tensor,
    gate: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    backend: str | None = None,
) -> torch.Tensor:
    """``x * sigmoid(gate + bias)``."""
    return dispatch("bias_sigmoid_gate", x, gate, bias, backend=backend)


def bias_dropout_residual(
    x: torch.Tensor,
    residual: torch.Tensor,
    bias: torch.Tensor | None = None,
    dropout_mask: torch.Tensor | None = None,
    *,
    backend: str | None = None,
) -> torch.Tensor:
    """``residual + (x + bias) * dropout_mask``."""
    return dispatch("bias_dropout_residual", x, residual, bias, dropout_mask, backend=backend)


def triangle_projection_gate(
    proj: torch.Tensor,
    bias: torch.Tensor,
    mask: torch.Tensor,
    *,
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``a, b`` of triangle multiplication from channel-first ``proj [*, 4c, I, J]`` (rows
    ``p_a, g_a, p_b, g_b``): ``a = (p_a + bias_pa) * sigmoid(g_a + bias_ga) * mask``."""
    return dispatch("triangle_projection_gate", proj, bias, mask, backend=backend)


def linear_channel_first(
    x: torch.Tensor,
    weight: torch.Tensor,
    *,
    backend: str | None = None,
) -> torch.Tensor:
    """Channel-first projection ``x [*, I, J, C]``, ``weight [O, C]`` -> ``[*, O, I, J]``,
    ``y[..., o, i, j] = sum_c weight[o, c] x[..., i, j, c]`` (no bias)."""
    return dispatch("linear_channel_first", x, weight, backend=backend)
